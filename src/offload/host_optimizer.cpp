#include "offload/host_optimizer.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "anvil/error.hpp"

namespace anvil::offload {
namespace {

// Elements cast per copy of the weights to the device (64 MB of 16-bit weights).
constexpr size_t kCastChunk = size_t(32) << 20;

// The master weights first, then the optimizer's state and range table (not under NVMe offload, whose
// state is in the swap file); returns the master's index.
size_t plan_master_and_state(MemoryPlan& plan, Optimizer& opt, bool state) {
  const bool sharded = opt.numel() != opt.layout().total_numel();
  const size_t i =
      plan.add(sharded ? "master weights (fp32, host, this rank's shard)" : "master weights (fp32, host)",
               MemoryCategory::MasterWeights, opt.numel() * sizeof(float));
  if (state) opt.plan_memory(plan);
  return i;
}

size_t swap_buffer_bytes(const PagedOptimizerState::Sizes& s) {
  return s.buffers * s.buffer_bytes;
}

const char* kSwapBuffersName = "optimizer state swap buffers (NVMe offload: up to two sub-groups)";

}  // namespace

MemoryPlan HostOptimizer::plan_host_memory(const ParamLayout& layout, OptimizerKind kind,
                                           const OptimizerHyper& h, OpsPrecision kept,
                                           std::optional<ParamRange> shard, bool weights_on_host,
                                           bool grads_on_host, std::optional<size_t> nvme_sub_group_size,
                                           std::optional<PagedWeights::Sizes> weight_pages) {
  MemoryPlan plan;
  const std::unique_ptr<Optimizer> opt = make_optimizer(kind, layout, h, shard);
  plan_master_and_state(plan, *opt, !nvme_sub_group_size);
  if (nvme_sub_group_size)
    plan.add(
        kSwapBuffersName, MemoryCategory::OptimizerState,
        swap_buffer_bytes(PagedOptimizerState::sizes(kind, layout, h, opt->shard(), *nvme_sub_group_size)));
  const size_t n = opt->numel();
  plan.add(grads_on_host ? "gradients (offloaded, pinned)" : "gradients (host staging, pinned)",
           MemoryCategory::Gradients, dtype_bytes(kept.grad, n));
  if (weight_pages)
    plan.add(fmt::format("weights (offload_param nvme, {} buffers)", weight_pages->buffers),
             MemoryCategory::Weights, weight_pages->buffers * (weight_pages->buffer_bytes + kSwapAlign));
  else if (weights_on_host)
    plan.add("weights (offload_param, pinned)", MemoryCategory::Weights, dtype_bytes(kept.compute, n));
  else if (kept.compute != DType::F32)
    plan.add("weights (host staging, pinned)", MemoryCategory::Weights, dtype_bytes(kept.compute, n));
  return plan;
}

HostOptimizer::HostOptimizer(Device& dev, ParamStore& store, OptimizerKind kind, const OptimizerHyper& h,
                             OpsPrecision kept, const std::optional<NvmeOptions>& nvme)
    : dev_(dev), store_(store), kept_(kept), host_(make_cpu_device()) {
  const ParamLayout& layout = store.optimizer_layout();
  ANVIL_ASSERT(store.master_on_host(), "optimizer offload: the store keeps its master weights on the host");
  opt_ = make_optimizer(kind, layout, h,
                        store.master_sharded() ? std::optional(store.master_range()) : std::nullopt);
  MemoryPlan plan;
  i_master_ = plan_master_and_state(plan, *opt_, !nvme);
  host_plan_ = plan;
  arena_ = std::make_unique<Arena>(*host_, std::move(plan));
  if (nvme) {
    paged_ = std::make_unique<PagedOptimizerState>(kind, layout, h, opt_->shard(), *nvme);
    host_plan_.add(kSwapBuffersName, MemoryCategory::OptimizerState, swap_buffer_bytes(paged_->size()));
  } else {
    opt_->bind(*arena_);
  }
  ops_ = make_cpu_ops(*host_, kept);
  const size_t n = opt_->numel();
  grads_host_.emplace(dev, dtype_bytes(kept.grad, n));
  // Parameter offload: this buffer is the store's weights (the gathers read it); else a staging copy. To
  // NVMe: the store's pages hold them.
  const bool paged_weights = store.weight_pages() != nullptr;
  if (!paged_weights && (kept.compute != DType::F32 || store.weights_on_host()))
    weights_host_.emplace(dev, dtype_bytes(kept.compute, n));
  store.bind_host_master(arena_->get<float>(i_master_));
  if (store.weights_on_host() && !paged_weights) store.bind_host_weights(weights_host_->get());
  if (store.grads_on_host()) store.bind_host_grads(grads_host_->get());
}

OptimizerStateParts HostOptimizer::state_parts(bool writable) {
  return paged_ ? paged_->map(*opt_, writable) : OptimizerStateParts(*opt_);
}

void HostOptimizer::reset() {
  if (paged_)
    paged_->reset(*host_);
  else
    opt_->reset(*host_);
  if (grads_host_->size() > 0) std::memset(grads_host_->get(), 0, grads_host_->size());
}

void HostOptimizer::step(float lr, int64_t step, const float* grad_scale_device) {
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const ParamRange shard = store_.master_range();
  const size_t n = shard.numel();
  // Both copies wait for the work queued before them (backward, the norm and its clip factor).
  Clock::time_point t = Clock::now();
  float scale = 0;
  dev_.copy_to_host(&scale, grad_scale_device, sizeof(float));
  // (Offloaded gradients are in the buffer already: the copy of the scale waited for their last writes.)
  if (n > 0 && !store_.grads_on_host())
    dev_.copy_to_host(grads_host_->get(), store_.reduced_grad_at(shard.begin), dtype_bytes(kept_.grad, n));
  seconds_.grads_down += seconds_since(t);
  ++seconds_.steps;
  if (n == 0) return;  // an empty ZeRO shard
  t = Clock::now();
  if (paged_) {  // sub-group by sub-group, each one's state read in and written back
    paged_->for_each_group([&](Optimizer& o, ParamRange r) {
      const size_t at = r.begin - shard.begin;
      o.step(*ops_, store_.master() + at,
             static_cast<const char*>(grads_host_->get()) + dtype_bytes(kept_.grad, at), lr, step, scale);
    });
  } else {
    opt_->step(*ops_, store_.master(), grads_host_->get(), lr, step, scale);
  }
  seconds_.update += seconds_since(t);
  t = Clock::now();
  if (WeightPages* pages = store_.weight_pages()) {  // parameter offload to NVMe: into the swap file
    pages->write(store_.master());
    seconds_.weights_up += seconds_since(t);
    return;
  }
  if (store_.weights_on_host()) {  // parameter offload: the weights are host memory; nothing to copy
    if (kept_.compute == DType::F32)
      std::copy_n(store_.master(), n, static_cast<float*>(store_.weights()));
    else
      ops_->cast_weights(store_.weights(), store_.master(), n, 0, nullptr);
    seconds_.weights_up += seconds_since(t);
    return;
  }
  // The shard's place in the compute-type weights: all of them (ZeRO stage 3: the shard is all they hold).
  char* weights =
      static_cast<char*>(store_.weights_sharded() ? store_.weights() : store_.weight_at(shard.begin));
  if (kept_.compute == DType::F32) {
    dev_.copy_to_device(weights, store_.master(), n * sizeof(float));
  } else {
    // Each chunk's copy (on the copy stream, from pinned memory) runs while the next chunk is cast.
    char* staged = static_cast<char*>(weights_host_->get());
    const DType t16 = kept_.compute;
    for (size_t at = 0; at < n; at += kCastChunk) {
      const size_t m = std::min(kCastChunk, n - at);
      ops_->cast_weights(staged + dtype_bytes(t16, at), store_.master() + at, m, 0, nullptr);
      dev_.copy_to_device_async(weights + dtype_bytes(t16, at), staged + dtype_bytes(t16, at),
                                dtype_bytes(t16, m));
    }
    dev_.wait_for_copies();  // the next step's compute reads the weights after the copies
    dev_.sync_copies();
  }
  seconds_.weights_up += seconds_since(t);
}

}  // namespace anvil::offload
