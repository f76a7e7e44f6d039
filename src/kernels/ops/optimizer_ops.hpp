// Optimizer kernels: the fused steps over the flat parameter buffer (AdamW, SGD, Adafactor, 8-bit AdamW)
// with their argument structs and parameter-group tables, and the cast of the fp32 master weights into the
// compute type (optionally with stochastic rounding).
//
// Part of the Ops contract (kernels/ops.hpp: memory, storage types, the `[grad]` pointer marks, and the
// gradient convention: parameter gradients accumulate, activation gradients are overwritten unless a
// comment says otherwise). Ops inherits this interface; CpuOps and CudaOps implement it.
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "anvil/dtype.hpp"
#include "kernels/step_values.hpp"

namespace anvil {

// Parameter groups of a flat buffer, for the fused optimizer kernels (device memory): range i covers
// elements [begins[i], begins[i+1]) (the last runs to n) and belongs to group groups[i]
// (< kMaxParamGroups), or is skipped when groups[i] == kSkipGroup. Its optimizer state starts at element
// state_begins[i] of the state buffers (null: the same index as the parameter), so states can be compact.
struct ParamGroupTable {
  const uint64_t* begins = nullptr;
  const uint8_t* groups = nullptr;
  const uint64_t* state_begins = nullptr;
  int count = 0;
};
constexpr int kMaxParamGroups = 4;
constexpr uint8_t kSkipGroup = 255;

// The gradient scale of every optimizer step below: the kernels multiply the gradients by grad_scale, times
// *grad_scale_device when that pointer is set (one fp32 value in the backend's memory, read by the kernels
// when they run). A training step computes its clipping factor on the device (Ops::grad_clip_scale) and
// hands it over this way, so the host never reads the gradient norm before the optimizer: nothing in the
// step has to wait for the device.

// One fused AdamW step over every range of a ParamGroupTable: per-group lr and weight decay.
struct FusedAdamWArgs {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  int64_t step = 1;
  float grad_scale = 1.f;
  const float* grad_scale_device = nullptr;  // null, or a device multiplier of grad_scale
  float lr[kMaxParamGroups] = {};
  float weight_decay[kMaxParamGroups] = {};
  uint64_t rounding_seed = 0;  // BF16 moments: the stochastic-rounding seed of this step (nonzero)
  uint64_t index_base = 0;     // BF16 moments: StepValues::moment_index_base
  // Null, or the step's values in device memory (lr, step, bias terms, seed: kernels/step_values.hpp), read
  // by the kernels when they run instead of the fields above (a CUDA graph replays the host's latest).
  const StepValues* step_values = nullptr;
};

// SGD with momentum (PyTorch semantics): g = grad * grad_scale + wd * p; with momentum,
// buf = g on the first step, else momentum * buf + (1 - dampening) * g; g = nesterov ? g + momentum * buf
// : buf; p -= lr * g.
struct SgdArgs {
  float momentum = 0, dampening = 0;
  bool nesterov = false;
  bool first_step = true;
  float grad_scale = 1.f;
  const float* grad_scale_device = nullptr;  // null, or a device multiplier of grad_scale
  float lr[kMaxParamGroups] = {};
  float weight_decay[kMaxParamGroups] = {};
  // Null, or the step's values in device memory (lr and step: step 1 is the first: kernels/step_values.hpp),
  // read by the kernels when they run instead of the fields above (a CUDA graph replays the host's latest).
  const StepValues* step_values = nullptr;
};

// 8-bit AdamW (bitsandbytes' AdamW8bit, block_wise=True): the moments of the ranges of a ParamGroupTable
// that are not skipped are stored block-wise quantised. State element s of m is m_map[m_codes[s]] *
// m_absmax[s / kAdamW8bitBlockSize] (m_map: the signed dynamic map, 256 sorted values in [-1, 1]); v likewise
// with v_map (the unsigned dynamic map, in [0, 1]). Per element, with g = grad * grad_scale:
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  p *= 1 - lr wd;
//   p -= lr sqrt(1-b2^t) / (1-b1^t) * m / (sqrt(v) + eps sqrt(1-b2^t))   (bitsandbytes' form)
// then per block the new absmax is max |m| (max v) and each code is the map value nearest m / absmax (a
// negative m never rounds to 0 or above, as in bitsandbytes). An element whose g is not finite keeps p and
// gets m = v = 0 (bitsandbytes). Each range's state starts at a block boundary and takes whole blocks.
constexpr size_t kAdamW8bitBlockSize = 256;
struct AdamW8bitArgs {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  int64_t step = 1;
  float grad_scale = 1.f;
  const float* grad_scale_device = nullptr;  // null, or a device multiplier of grad_scale
  float lr[kMaxParamGroups] = {};
  float weight_decay[kMaxParamGroups] = {};
  // Null, or the step's values in device memory (lr and bias terms: kernels/step_values.hpp), read
  // by the kernels when they run instead of the fields above (a CUDA graph replays the host's latest).
  const StepValues* step_values = nullptr;
};

// Adafactor (transformers.optimization.Adafactor): one tensor of the flat buffer as the fused step sees it
// (an array of them in device memory). Its elements are param[offset + r * cols + c]. A factored tensor (a
// matrix) keeps its second moment as `rows` running averages of the row means of g^2 + eps1
// (exp_avg_sq_row, at sq[row_state]) and `cols` of the column means (exp_avg_sq_col, at sq[col_state]); an
// unfactored one (a vector: rows = 1, cols = numel) keeps a full one (exp_avg_sq, at sq[row_state]). The
// first moment, when there is one, is indexed like the parameter.
struct AdafactorTensor {
  uint64_t offset = 0;
  uint64_t rows = 1, cols = 0;
  uint64_t row_state = 0, col_state = 0;
  uint32_t factored = 0;
  uint32_t group = 0;  // < kMaxParamGroups: picks step_size and weight_decay
};

// One Adafactor step. Per tensor, with g = grad * grad_scale and p the parameter before the step:
//   lr = step_size[group] * (scale_parameter ? max(eps2, RMS(p)) : 1);  u = g^2 + eps1;
//   factored: row = beta2t row + (1 - beta2t) mean_c(u), col = beta2t col + (1 - beta2t) mean_r(u),
//             u = rsqrt(row[r] / mean(row)) * rsqrt(col[c]) * g;
//   else:     v = beta2t v + (1 - beta2t) u, u = rsqrt(v) * g;
//   u /= max(1, RMS(u) / clip_threshold);  u *= lr;  with a first moment: m = beta1 m + (1 - beta1) u, u = m;
//   p -= weight_decay[group] * lr * p;  p -= u.
struct AdafactorArgs {
  float grad_scale = 1.f;
  const float* grad_scale_device = nullptr;  // null, or a device multiplier of grad_scale
  float eps1 = 1e-30f, eps2 = 1e-3f;
  float clip_threshold = 1.f;
  float beta2t = 0;  // 1 - step^decay_rate
  float beta1 = 0;
  bool first_moment = false;
  bool scale_parameter = true;
  float step_size[kMaxParamGroups] =
      {};  // HF's relative step size or external lr, times the group's multiplier
  float weight_decay[kMaxParamGroups] = {};
  // Null, or the step's values in device memory (step sizes in lr, beta2t: kernels/step_values.hpp), read
  // by the kernels when they run instead of the fields above (a CUDA graph replays the host's latest).
  const StepValues* step_values = nullptr;
};

// The step's values of each optimizer's by-value arguments: what its kernels use when no step_values
// pointer is given, and what the optimizers write into a device copy (one place for the fp64 bias terms).
inline void fill_step_values(const FusedAdamWArgs& a, StepValues& sv) {
  for (int g = 0; g < kMaxParamGroups; ++g) sv.lr[g] = a.lr[g];
  sv.step = a.step;
  sv.bias1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  sv.bias2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  sv.moment_seed = a.rounding_seed;
  sv.moment_index_base = a.index_base;
}
inline void fill_step_values(const SgdArgs& a, StepValues& sv) {
  for (int g = 0; g < kMaxParamGroups; ++g) sv.lr[g] = a.lr[g];
  sv.step = a.first_step ? 1 : 2;  // SGD only tells the first step from the others
}
inline void fill_step_values(const AdamW8bitArgs& a, StepValues& sv) {
  for (int g = 0; g < kMaxParamGroups; ++g) sv.lr[g] = a.lr[g];
  sv.step = a.step;
  sv.bias1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  sv.bias2 = 1.0 - std::pow(double(a.beta2), double(a.step));
}
inline void fill_step_values(const AdafactorArgs& a, StepValues& sv) {
  for (int g = 0; g < kMaxParamGroups; ++g) sv.lr[g] = a.step_size[g];
  sv.beta2t = a.beta2t;
}
// The device scratch adafactor_step needs, per tensor (contents unspecified between calls).
constexpr size_t kAdafactorScratchBytesPerTensor = 64;

class OptimizerOps {
 public:
  virtual ~OptimizerOps() = default;

  // --- precision ------------------------------------------------------------------------------------
  // out[i] = master[i] in the compute type (a copy when it is F32). With a nonzero `rounding_seed` and
  // BF16, rounds stochastically with the bits of rounding_bits(rounding_seed, i) (core/half.hpp), the
  // same on every backend; otherwise to nearest even.
  // With `step_values` set, a nonzero rounding_seed only selects stochastic rounding: the seed is
  // step_values->cast_seed, read when the op runs.
  virtual void cast_weights(void* out, const float* master, size_t n, uint64_t rounding_seed,
                            const StepValues* step_values) = 0;

  // --- optimizer ---------------------------------------------------------------------------------------
  // PyTorch AdamW (decoupled weight decay) over every range of `g` in one launch, per element with the
  // range's group's lr and wd, g = grad * a.grad_scale (grad of the gradient type):
  //   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
  //   p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
  // `param` is fp32 (the master weights); m and v are of `moment_dtype`: F32, or BF16 (rounded stochastically
  // with rounding_bits(a.rounding_seed, state index) and a second stream for v) to halve the state.
  virtual void adamw_fused_step(float* param, const void* grad, void* m, void* v, DType moment_dtype,
                                size_t n, const ParamGroupTable& g, const FusedAdamWArgs& a) = 0;
  // SGD over every range of `g` in one launch; `momentum_buf` (fp32, state-indexed) is unused (may be
  // null) when a.momentum == 0.
  virtual void sgd_step(float* param, const void* grad, float* momentum_buf, size_t n,
                        const ParamGroupTable& g, const SgdArgs& a) = 0;
  // [adafactor ops]
  // Adafactor (AdafactorArgs) over the `num_tensors` tensors of `tensors` in a fixed number of launches.
  // `sq`: the second moments; `exp_avg`: the first moment (null unless a.first_moment); `scratch`:
  // kAdafactorScratchBytesPerTensor * num_tensors bytes. The CPU reduces in a fixed order (deterministic).
  virtual void adafactor_step(float* param, const void* grad, float* sq, float* exp_avg,
                              const AdafactorTensor* tensors, int num_tensors, void* scratch,
                              const AdafactorArgs& a) = 0;
  // [adamw8bit ops]
  // 8-bit AdamW (AdamW8bitArgs) over the ranges of `g` that are not skipped, fused: one launch, one thread
  // block per quantisation block (dequantise, update, new absmax, requantise). `num_blocks` blocks of
  // kAdamW8bitBlockSize state elements; the codes hold num_blocks * kAdamW8bitBlockSize bytes, the absmax
  // arrays num_blocks floats. g.state_begins (required) must be multiples of the block size for the 8-bit
  // ranges and non-decreasing over all ranges (a skipped range's: that of the next 8-bit range, or the end).
  virtual void adamw8bit_step(float* param, const void* grad, uint8_t* m_codes, float* m_absmax,
                              uint8_t* v_codes, float* v_absmax, const float* m_map, const float* v_map,
                              size_t n, size_t num_blocks, const ParamGroupTable& g,
                              const AdamW8bitArgs& a) = 0;
};

}  // namespace anvil
