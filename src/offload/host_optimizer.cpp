#include "offload/host_optimizer.hpp"

#include "anvil/error.hpp"

namespace anvil::offload {
namespace {

// The master weights first, then the optimizer's state and range table; returns the master's index.
size_t plan_master_and_state(MemoryPlan& plan, Optimizer& opt) {
  const bool sharded = opt.numel() != opt.layout().total_numel();
  const size_t i =
      plan.add(sharded ? "master weights (fp32, host, this rank's shard)" : "master weights (fp32, host)",
               MemoryCategory::MasterWeights, opt.numel() * sizeof(float));
  opt.plan_memory(plan);
  return i;
}

}  // namespace

MemoryPlan HostOptimizer::plan_host_memory(const ParamLayout& layout, OptimizerKind kind,
                                           const OptimizerHyper& h, OpsPrecision kept,
                                           std::optional<ParamRange> shard) {
  MemoryPlan plan;
  const std::unique_ptr<Optimizer> opt = make_optimizer(kind, layout, h, shard);
  plan_master_and_state(plan, *opt);
  const size_t n = opt->numel();
  plan.add("gradients (host staging, pinned)", MemoryCategory::Gradients, dtype_bytes(kept.grad, n));
  if (kept.compute != DType::F32)
    plan.add("weights (host staging, pinned)", MemoryCategory::Weights, dtype_bytes(kept.compute, n));
  return plan;
}

HostOptimizer::HostOptimizer(Device& dev, ParamStore& store, OptimizerKind kind, const OptimizerHyper& h,
                             OpsPrecision kept)
    : dev_(dev), store_(store), kept_(kept), host_(make_cpu_device()) {
  const ParamLayout& layout = store.optimizer_layout();
  ANVIL_ASSERT(store.master_on_host(), "optimizer offload: the store keeps its master weights on the host");
  opt_ = make_optimizer(kind, layout, h,
                        store.master_sharded() ? std::optional(store.master_range()) : std::nullopt);
  MemoryPlan plan;
  i_master_ = plan_master_and_state(plan, *opt_);
  arena_ = std::make_unique<Arena>(*host_, std::move(plan));
  opt_->bind(*arena_);
  ops_ = make_cpu_ops(*host_, kept);
  const size_t n = opt_->numel();
  grads_host_.emplace(dev, dtype_bytes(kept.grad, n));
  if (kept.compute != DType::F32) weights_host_.emplace(dev, dtype_bytes(kept.compute, n));
  store.bind_host_master(arena_->get<float>(i_master_));
}

void HostOptimizer::reset() {
  opt_->reset(*host_);
}

void HostOptimizer::step(float lr, int64_t step, const float* grad_scale_device) {
  const ParamRange shard = store_.master_range();
  const size_t n = shard.numel();
  // Both copies wait for the work queued before them (backward, the norm and its clip factor).
  float scale = 0;
  dev_.copy_to_host(&scale, grad_scale_device, sizeof(float));
  if (n == 0) return;  // an empty ZeRO shard
  dev_.copy_to_host(grads_host_->get(), store_.reduced_grad_at(shard.begin), dtype_bytes(kept_.grad, n));
  opt_->step(*ops_, store_.master(), grads_host_->get(), lr, step, scale);
  // The shard's place in the compute-type weights: all of them (ZeRO stage 3: the shard is all they hold).
  void* weights = store_.weights_sharded() ? store_.weights() : store_.weight_at(shard.begin);
  if (kept_.compute == DType::F32) {
    dev_.copy_to_device(weights, store_.master(), n * sizeof(float));
    return;
  }
  ops_->cast_weights(weights_host_->get(), store_.master(), n, 0, nullptr);
  dev_.copy_to_device(weights, weights_host_->get(), dtype_bytes(kept_.compute, n));
}

}  // namespace anvil::offload
