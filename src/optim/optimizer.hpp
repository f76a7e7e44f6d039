// The optimizer interface over the flat per-unit parameter buffer (DESIGN principle 2). Every optimizer
// updates the fp32 master weights from gradients in the ops' gradient type, in one (or a few) fused
// launches over the whole buffer: the parameter groups are ranges of the flat buffer, looked up on the
// device from a small table, never one launch per tensor.
//
// Parameter groups (as the seeds recommend): "decay" (matrices), "no_decay" (biases and norm weights: no
// weight decay) and "embedding" (token and position embeddings: weight decay like the matrices; a group of
// its own so it can get its own learning-rate multiplier, and so 8-bit AdamW can keep it in 32 bits, the
// bitsandbytes advice for embedding stability).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "anvil/memory_plan.hpp"
#include "kernels/ops.hpp"
#include "model/param_layout.hpp"
#include "optim/optimizer_kind.hpp"
#include "runtime/arena.hpp"

namespace anvil {

enum class ParamGroup : uint8_t { Decay = 0, NoDecay = 1, Embedding = 2 };
constexpr int kNumParamGroups = 3;
const char* param_group_name(ParamGroup g);

// Every optimizer's hyper-parameters (each optimizer reads its own; defaults are PyTorch's / HF's).
struct OptimizerHyper {
  float weight_decay = 0;                                  // decay and embedding groups
  float lr_multiplier[kNumParamGroups] = {1.f, 1.f, 1.f};  // per group, times the scheduled lr
  // AdamW and 8-bit AdamW.
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  bool adamw_bf16_moments = false;  // AdamW: store m and v in bf16 (stochastic rounding): 4 bytes/param
  // 8-bit AdamW (bitsandbytes semantics).
  size_t min_8bit_size = 4096;        // tensors with fewer elements keep fp32 states
  bool embedding_fp32_states = true;  // the embedding group keeps fp32 states
  // SGD (PyTorch semantics).
  float momentum = 0, dampening = 0;
  bool nesterov = false;
  // Adafactor (transformers.optimization.Adafactor semantics and defaults).
  float adafactor_eps1 = 1e-30f, adafactor_eps2 = 1e-3f;
  float clip_threshold = 1.0f, decay_rate = -0.8f;
  std::optional<float> adafactor_beta1;  // none: no first moment
  bool scale_parameter = true, relative_step = true, warmup_init = false;
  // The real vocabulary (rows of the token embedding that are not padding; 0: all rows), so statistics
  // over whole tensors (Adafactor's RMS) match Hugging Face's unpadded tensors.
  int64_t vocab_size = 0;
};

// A state buffer as checkpoints see it: saved under "<name>" as a 1-D tensor of `dtype` with `count`
// elements, from/to device memory at `data`.
struct OptimizerStateTensor {
  std::string name;
  DType dtype = DType::F32;
  size_t count = 0;
  void* data = nullptr;
};
// Under ZeRO (shards cut by dist/zero_partition.hpp's rules) every state tensor of a shard is the slice of
// the whole buffer's that the earlier shards do not hold: concatenated in rank order, the shards' tensors
// are the one-process tensors (elementwise states; 8-bit blocks; Adafactor's per-tensor rows, columns and
// vectors, each laid out in tensor order). Checkpoints rely on it to resume on any partition.

// The group of every element of the flat buffer, as ranges: range i is [begins[i], begins[i+1]) (the last
// one runs to the end) in group groups[i], or kSkipGroup for frozen tensors (ParamTensor::trainable), which
// no optimizer kernel touches. Built from the layout; uploaded to the device by the optimizer.
// With frozen tensors the elementwise states (AdamW's moments, SGD's momentum) are compact: state_begins[i]
// is range i's first state element (skipped ranges hold none: theirs is the next range's), state_numel the
// states' length (the trainable elements), and compact_base the whole buffer's compact index of the shard's
// first state element (so a shard's bf16-moment rounding draws what one process draws). Without frozen
// tensors state_begins is empty and states mirror the flat buffer.
struct ParamRangeTable {
  std::vector<uint64_t> begins;
  std::vector<uint8_t> groups;
  std::vector<uint64_t> state_begins;
  size_t state_numel = 0;
  size_t compact_base = 0;
  static ParamRangeTable from_layout(const ParamLayout& layout);
  // The table of the elements of `shard` only, with offsets from the shard's begin (ZeRO).
  static ParamRangeTable from_layout(const ParamLayout& layout, ParamRange shard);
  // The bytes the device copy takes (begins, state_begins when present, then groups; each 8-byte aligned).
  size_t device_bytes() const;
};

// An optimizer updates the parameters of one range of the flat buffer, its shard: the whole buffer with one
// process and under ZeRO stage 0, the rank's share under stages 1-3 (dist/zero_partition.hpp). Its state,
// range tables and step() cover the shard only: step() receives the shard's parameters and gradients
// (element 0 = the shard's first element), and its state tensors are the slices of the whole-buffer ones.
class Optimizer {
 public:
  Optimizer(const ParamLayout& layout, const OptimizerHyper& h, ParamRange shard);
  virtual ~Optimizer() = default;
  virtual OptimizerKind kind() const = 0;

  // Adds the optimizer's state (and its range table) to the plan; bind() takes the pointers.
  void plan_memory(MemoryPlan& plan);
  void bind(const Arena& arena);
  // The same from memory laid out by `plan` (the plan given to plan_memory) at `base`: the state may move
  // between steps (NVMe offload swaps it through a buffer), bound again before each use.
  void bind(void* base, const MemoryPlan& plan);
  // Zeroes the state and uploads the range table (before the first step).
  void reset(Device& dev);

  // One update of every (fp32 master) parameter from gradients in the ops' gradient type. `lr` is the
  // scheduled learning rate (each group multiplies it by its lr_multiplier; Adafactor with relative_step
  // ignores it); `step` is the 1-based count of applied updates; `grad_scale` multiplies the gradients, times
  // *grad_scale_device when that is set: one fp32 value in device memory that the kernels read when they
  // run (the trainer's clip factor, computed on the device so that the host never waits for the gradient
  // norm inside a step). With `step_values` (device memory) the kernels read the learning rates, step and
  // seeds there when they run, and `lr` and `step` are ignored: a step recorded in a CUDA graph replays
  // with the values the host last copied there (fill_step_values).
  void step(Ops& ops, float* params, const void* grads, float lr, int64_t step, float grad_scale,
            const float* grad_scale_device = nullptr, const StepValues* step_values = nullptr) {
    if (numel() == 0) return;  // an empty ZeRO shard (a tiny model on many ranks): no launch of no work
    update(ops, params, grads, lr, step, grad_scale, grad_scale_device, step_values);
  }
  // Writes this optimizer's fields of the step values for (lr, step): a step() given a device copy of
  // them updates exactly as step() with this lr and step. Other fields are left as they are.
  virtual void fill_step_values(float lr, int64_t step, StepValues& out) const = 0;

  // The state buffers, for checkpoints (names are stable across versions of the same optimizer).
  virtual std::vector<OptimizerStateTensor> state_tensors() const = 0;
  // Bytes of optimizer state per device (what `anvil estimate` reports under optimizer_states).
  size_t state_bytes() const;

  const ParamLayout& layout() const { return layout_; }
  const OptimizerHyper& hyper() const { return h_; }
  // The elements it updates (its shard's).
  size_t numel() const { return shard_.numel(); }
  ParamRange shard() const { return shard_; }
  // Elements of an elementwise state buffer (AdamW's moments, SGD's momentum): the shard's trainable ones.
  size_t state_numel() const { return ranges_.state_numel; }

 protected:
  // Each optimizer's step() (the public step() is not virtual, so its default argument lives in one place).
  virtual void update(Ops& ops, float* params, const void* grads, float lr, int64_t step, float grad_scale,
                      const float* grad_scale_device, const StepValues* step_values) = 0;
  // Each optimizer's buffers, in a fixed order (name, bytes); bind_state() receives their pointers.
  virtual std::vector<std::pair<std::string, size_t>> state_buffers() const = 0;
  virtual void bind_state(const std::vector<void*>& buffers) = 0;
  // Called at the end of reset(), after the state buffers (constant tables included) were zeroed: the
  // place to upload an optimizer's own constants.
  virtual void after_reset(Device& dev) {}
  // The device range table (valid after bind).
  ParamGroupTable groups() const {
    return {range_begins_, range_groups_, range_states_, int(ranges_.begins.size())};
  }

  // Kernel arguments `a` with the fields every update sets per call: the gradient scale (and its device
  // factor) and the step values.
  template <class Args>
  static Args with_call_fields(Args a, float grad_scale, const float* grad_scale_device,
                               const StepValues* step_values) {
    a.grad_scale = grad_scale;
    a.grad_scale_device = grad_scale_device;
    a.step_values = step_values;
    return a;
  }
  // Per-group lr and weight decay for this step.
  void group_args(float lr, float out_lr[kNumParamGroups], float out_wd[kNumParamGroups]) const;

  const ParamLayout& layout_;
  OptimizerHyper h_;
  const ParamRange shard_;
  ParamRangeTable ranges_;  // of the shard

 private:
  std::vector<size_t> i_state_;
  size_t i_ranges_ = 0;
  std::vector<void*> state_ptrs_;
  std::vector<size_t> state_sizes_;
  const uint64_t* range_begins_ = nullptr;
  const uint64_t* range_states_ = nullptr;  // null without frozen tensors
  const uint8_t* range_groups_ = nullptr;
  void* range_table_ = nullptr;
  template <class Pointer>
  void bind_pointers(Pointer&& pointer);
};

// An optimizer's state as checkpoints read and write it: the optimizers of consecutive ranges of one shard,
// in order, each bound to its state. One part: the optimizer itself. NVMe offload: its sub-groups, bound
// to a mapping of the swap file that `keep` holds while this lives. Concatenated in order, the parts' state
// tensors are the shard's (the ZeRO partition's rules, dist/zero_partition.hpp).
class OptimizerStateParts {
 public:
  explicit OptimizerStateParts(Optimizer& whole) : whole_(&whole), parts_{&whole} {}
  // `whole`: the shard's optimizer (its kind, layout and sizes; its own state unused). `sync` (may be
  // empty) makes what was written to the parts' state durable, throwing on failure.
  OptimizerStateParts(const Optimizer& whole, std::vector<Optimizer*> parts, std::shared_ptr<void> keep,
                      std::function<void()> sync)
      : whole_(&whole), parts_(std::move(parts)), keep_(std::move(keep)), sync_(std::move(sync)) {}
  const Optimizer& whole() const { return *whole_; }
  // In shard order; none for an empty shard.
  const std::vector<Optimizer*>& parts() const { return parts_; }
  // After writing the state (a resume): an error writing it back is raised here, not lost.
  void sync() const {
    if (sync_) sync_();
  }

 private:
  const Optimizer* whole_;
  std::vector<Optimizer*> parts_;
  std::shared_ptr<void> keep_;
  std::function<void()> sync_;
};

// An optimizer of the whole buffer, or (ZeRO) of `shard`.
std::unique_ptr<Optimizer> make_optimizer(OptimizerKind kind, const ParamLayout& layout,
                                          const OptimizerHyper& h, std::optional<ParamRange> shard = {});

}  // namespace anvil
