// Optimizer offload to the CPU (DeepSpeed's ZeRO-Offload, `offload_optimizer: cpu`; docs/memory.md): the fp32
// master weights and the optimizer state live in host memory and the update runs on the CPU, with the CPU
// backend's optimizer kernels (the same AdamW / 8-bit AdamW / Adafactor / SGD as a CPU run, OpenMP). The
// device keeps the compute-type weights, the gradients and the activations. Under ZeRO each rank offloads
// its shard (ParamStore::master_range): the master weights, the state and the staging copies cover it only,
// and the step's updated shard goes into its place in the weights (stage 3: the weights are the shard),
// from where dist::ZeroSync all-gathers it as after an update on the device. Under parameter offload
// (ParamStore::weights_on_host) the pinned weights buffer is the store's shard of the weights: the update
// is cast into it and nothing goes back to the device (the gathers copy from it).
//
// Gradient offload (ParamStore::grads_on_host: ZeRO stage 2 or 3, with one process too): the pinned
// gradients buffer is the store's reduced gradients, which the device writes unit by unit during backward
// (dist::GradSync), so the device keeps no gradient shard and step() copies nothing down.
//
// NVMe offload (`nvme`: offload_optimizer nvme): the optimizer state lives in a swap file instead
// (PagedOptimizerState), read and written sub-group by sub-group during the update; the master weights and
// the gradients stay in host memory.
//
// Parameter offload to NVMe (ParamStore::weight_pages): the update is written through the store's pages
// into their swap file (offload::PagedWeights::write), rounded there.
//
// A step: backward and the gradient norm (with the clip factor) run on the device as always; then step()
// copies the gradients (the shard's, reduced) into a pinned host buffer, reads the clip x unscale factor,
// updates the master weights on the host, rounds them into the compute type there (fp32: as they are) and
// copies them into the device's weights (in chunks: each chunk's copy runs while the next one is cast). The
// gradients' copy and the update are not overlapped with the device's work.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>

#include "anvil/memory_plan.hpp"
#include "kernels/ops.hpp"
#include "model/param_store.hpp"
#include "offload/paged_state.hpp"
#include "offload/paged_weights.hpp"
#include "optim/optimizer.hpp"
#include "runtime/arena.hpp"
#include "runtime/device.hpp"

namespace anvil::offload {

class HostOptimizer {
 public:
  // For `store` (after ParamStore::set_master_on_host) on `dev`: plans and allocates the host memory (the
  // fp32 master weights and the optimizer's state, pageable; the gradients' and the compute-type weights'
  // staging copies, pinned where `dev` pins) and hands the store its master weights
  // (ParamStore::bind_host_master). `kept` is the store's precision (gradients in kept.grad).
  // With `nvme` the optimizer state goes to a swap file there instead of host memory.
  HostOptimizer(Device& dev, ParamStore& store, OptimizerKind kind, const OptimizerHyper& h,
                OpsPrecision kept, const std::optional<NvmeOptions>& nvme = std::nullopt);

  // The shard's optimizer (under NVMe offload its state is in the sub-groups' optimizers: state_parts()).
  Optimizer& optimizer() { return *opt_; }
  const Optimizer& optimizer() const { return *opt_; }
  // The state for checkpoints (through host_device()): the optimizer itself, or the NVMe sub-groups bound
  // to a mapping of the swap file while the result lives (`writable` for a resume).
  OptimizerStateParts state_parts(bool writable);
  // The NVMe-offloaded state, or null.
  const PagedOptimizerState* paged() const { return paged_.get(); }
  // The device the optimizer's state belongs to (checkpoints copy it through this one).
  Device& host_device() { return *host_; }
  // The host memory it holds: the master weights and the optimizer state, or under NVMe offload the state's
  // two swap buffers (the staging copies apart).
  const MemoryPlan& host_plan() const { return host_plan_; }
  // Bytes of the two pinned staging copies.
  size_t staging_bytes() const { return grads_host_->size() + (weights_host_ ? weights_host_->size() : 0); }

  // Zeroes the state and the gradients' buffer (before the first step).
  void reset();

  // Wall-clock seconds of the steps so far, by phase: the gradients' copy to the host (waiting first for the
  // device's queued work), the update on the CPU, and the weights' cast and copy back to the device.
  struct Seconds {
    double grads_down = 0, update = 0, weights_up = 0;
    int64_t steps = 0;
  };
  const Seconds& seconds() const { return seconds_; }
  // One update with the scheduled `lr` at 1-based `step`: waits for the device's queued work, then as above.
  // `grad_scale_device`: the step's clip x unscale factor (one fp32 in device memory: StepScalars).
  void step(float lr, int64_t step, const float* grad_scale_device);

  // The host memory a run with these settings holds: the master weights and the optimizer's state (what
  // the constructor plans), then the two staging copies (pinned where the device pins); of `shard` only
  // under ZeRO. `weights_on_host` (parameter offload): the weights' copy is the store's weights, in the
  // compute type whatever it is; `grads_on_host` (gradient offload): the gradients' copy is the store's
  // gradients (the same bytes either way).
  // `nvme_sub_group_size` (NVMe offload): the state is the two swap buffers of sub-groups of that size.
  // `weight_pages` (parameter offload to NVMe): the weights are those pinned buffers, not the shard.
  static MemoryPlan plan_host_memory(const ParamLayout& layout, OptimizerKind kind, const OptimizerHyper& h,
                                     OpsPrecision kept, std::optional<ParamRange> shard = std::nullopt,
                                     bool weights_on_host = false, bool grads_on_host = false,
                                     std::optional<size_t> nvme_sub_group_size = std::nullopt,
                                     std::optional<PagedWeights::Sizes> weight_pages = std::nullopt);

 private:
  Device& dev_;
  ParamStore& store_;
  OpsPrecision kept_;
  std::unique_ptr<Device> host_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<PagedOptimizerState> paged_;
  MemoryPlan host_plan_;
  size_t i_master_ = 0;
  // The gradients in kept.grad; the weights in kept.compute (16-bit compute only: fp32 weights are the master
  // weights' copy).
  std::optional<PinnedBuffer> grads_host_, weights_host_;
  Seconds seconds_;
};

}  // namespace anvil::offload
