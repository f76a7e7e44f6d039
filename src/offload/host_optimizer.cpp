#include "offload/host_optimizer.hpp"

#include "anvil/error.hpp"

namespace anvil::offload {
namespace {

// The master weights first, then the optimizer's state and range table; returns the master's index.
size_t plan_master_and_state(MemoryPlan& plan, Optimizer& opt) {
  const size_t i = plan.add("master weights (fp32, host)", MemoryCategory::MasterWeights,
                            opt.layout().total_numel() * sizeof(float));
  opt.plan_memory(plan);
  return i;
}

}  // namespace

MemoryPlan HostOptimizer::plan_host_memory(const ParamLayout& layout, OptimizerKind kind,
                                           const OptimizerHyper& h, OpsPrecision kept) {
  MemoryPlan plan;
  const std::unique_ptr<Optimizer> opt = make_optimizer(kind, layout, h);
  plan_master_and_state(plan, *opt);
  const size_t n = layout.total_numel();
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
  opt_ = make_optimizer(kind, layout, h);
  MemoryPlan plan;
  i_master_ = plan_master_and_state(plan, *opt_);
  arena_ = std::make_unique<Arena>(*host_, std::move(plan));
  opt_->bind(*arena_);
  ops_ = make_cpu_ops(*host_, kept);
  const size_t n = layout.total_numel();
  grads_host_.emplace(dev, dtype_bytes(kept.grad, n));
  if (kept.compute != DType::F32) weights_host_.emplace(dev, dtype_bytes(kept.compute, n));
  store.bind_host_master(arena_->get<float>(i_master_));
}

void HostOptimizer::reset() {
  opt_->reset(*host_);
}

void HostOptimizer::step(float lr, int64_t step, const float* grad_scale_device) {
  const size_t n = store_.numel();
  // Both copies wait for the work queued before them (backward, the norm and its clip factor).
  float scale = 0;
  dev_.copy_to_host(&scale, grad_scale_device, sizeof(float));
  dev_.copy_to_host(grads_host_->get(), store_.grads(), dtype_bytes(kept_.grad, n));
  opt_->step(*ops_, store_.master(), grads_host_->get(), lr, step, scale);
  if (kept_.compute == DType::F32) {
    dev_.copy_to_device(store_.weights(), store_.master(), n * sizeof(float));
    return;
  }
  ops_->cast_weights(weights_host_->get(), store_.master(), n, 0, nullptr);
  dev_.copy_to_device(store_.weights(), weights_host_->get(), dtype_bytes(kept_.compute, n));
}

}  // namespace anvil::offload
