// The operator contract shared by the CPU reference backend and the CUDA backend. All pointers are in
// the owning Device's memory; all tensors are row-major and contiguous; all math is fp32 over fp32, bf16 or
// fp16 storage (see OpsPrecision; on CUDA, fp32 GEMMs may use TF32 tensor cores, as TF32 or 3xTF32:
// Fp32Matmul). Work is
// queued in order on the device's compute stream.
//
// Gradient convention: parameter gradients (dw, db, dwte, dwpe) ACCUMULATE (+=), so micro-batches sum
// into one buffer; activation gradients are OVERWRITTEN unless the comment says "accumulates".
//
// Op families (one implementation file per family under cpu/ and cuda/):
//   embedding (GPT-2's; BERT's with token types), layernorm, rmsnorm, matmul, attention, rope, generation
//   (KV-cache writes and attention over the cache, at per-sequence positions), activation
//   (gelu, exact erf gelu, tanh, swiglu, residual, first-token rows), loss (softmax cross-entropy; sequence classification),
//   reduction (sums, sums of squares, the gradient-clipping factor), precision (weight casts), optimizer
//   (AdamW, SGD, Adafactor, 8-bit AdamW).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "kernels/dropout.hpp"
#include "kernels/gemm_tuning_cache.hpp"
#include "kernels/split_gemm_plan.hpp"
#include "kernels/step_values.hpp"
#include "runtime/device.hpp"

namespace anvil {

constexpr float kLayerNormEps = 1e-5f;
constexpr int32_t kIgnoreIndex = -100;

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

// Which keys each query of an attention call sees. `causal`: query t sees keys t2 <= t. `lengths` (null, or
// [B] int32 in the backend's memory): sequence b has lengths[b] real tokens followed by padding; no query
// sees a padding key, and the rows of padding queries (t >= lengths[b]) are 0 in out, lse and dqkv.
// `dropout` > 0 (training): out = dropout(softmax(q k^T / sqrt(HS))) v, the probabilities dropped as
// Ops::dropout drops (the state and site as there; element index ((b * NH + h) * T + query) * T + key); lse
// is the undropped softmax's. The backward regenerates the same mask.
struct AttentionMask {
  bool causal = true;
  const int32_t* lengths = nullptr;
  float dropout = 0;
  const DropoutState* dropout_state = nullptr;
  uint32_t dropout_site = 0;
  // Sliding window (Mistral's sliding_window): > 0 lets query t see only keys t2 with t - t2 < window (on
  // top of `causal`, which it requires); 0: no window.
  int window = 0;
};

// The shape of one self-attention call. qkv rows hold NH query heads, then NKV key heads, then NKV value
// heads, each of HS elements: [B, T, (NH + 2 NKV) HS]; the output rows hold the NH heads side by side
// [B, T, NH HS]. Grouped-query attention (NKV < NH, NH a multiple of NKV): query head h reads key/value head
// h / (NH / NKV). Multi-head attention: NKV == NH. HS need not be C / NH of the model (Llama's head_dim).
struct AttentionShape {
  int B = 0, T = 0, NH = 0, NKV = 0, HS = 0;
  int q_width() const { return NH * HS; }
  int qkv_width() const { return (NH + 2 * NKV) * HS; }
  // The multi-head shape of the older int-argument forms: C = NH * HS, NKV = NH.
  static AttentionShape mha(int B, int T, int C, int NH) { return {B, T, NH, NH, C / NH}; }
};

// One layer's KV cache (generation): k and v, each [B, S, NKV, HS] in the compute type, S the cache's
// capacity in positions. k[b, p, g, :] is key head g of sequence b at position p (after RoPE); v likewise.
struct KvCacheLayer {
  void* k = nullptr;
  void* v = nullptr;
  int S = 0;
};

// The storage types an Ops instance works in. `compute`: activations, activation gradients and the model's
// weights (F32, BF16 or F16). `grad`: parameter gradients (F32, or the compute type when 16-bit gradients
// are chosen to save memory). Math is fp32 whatever the storage: 16-bit values are widened on load and
// rounded to nearest even on store; GEMMs accumulate in fp32.
struct OpsPrecision {
  DType compute = DType::F32;
  DType grad = DType::F32;
};

// How a weight gradient is written: added to what the buffer holds (gradient accumulation over
// micro-batches), or written over it (its one write of the step, when the buffer was not zeroed).
enum class GradWrite { Accumulate, Overwrite };

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device& device() = 0;
  virtual OpsPrecision precision() const = 0;

  // Bytes of the `scratch` buffer the attention functions need for these shapes (`dropout`: with
  // attention-probability dropout, AttentionMask::dropout > 0).
  virtual size_t attention_scratch_bytes(const AttentionShape& s, bool dropout = false) const = 0;
  size_t attention_scratch_bytes(int B, int T, int C, int NH, bool dropout = false) const {
    return attention_scratch_bytes(AttentionShape::mha(B, T, C, NH), dropout);
  }

  // Pointer types: `void*` arguments are in the compute type unless marked [grad] (the gradient type);
  // `float*` arguments are always fp32.

  // --- embedding -------------------------------------------------------------------------------
  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].   out [B,T,C], tokens [B,T], wte [V,C], wpe [maxT,C]
  // wpe may be null: no learned positions (Llama, Qwen2, Mistral use RoPE), out[b,t,:] = wte[tokens[b,t],:].
  virtual void embedding_fwd(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                             int C) = 0;
  // [grad] dwte[tokens[b,t],:] += dout[b,t,:]; [grad] dwpe[t,:] += dout[b,t,:]   (both accumulate)
  // dwpe may be null (no learned positions): only dwte is written.
  virtual void embedding_bwd(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                             int C) = 0;
  // The token-embedding gradient of a model without learned positions whose embedding has a padding_idx
  // (Llama, Qwen2, Mistral: HF's nn.Embedding(padding_idx = pad_token_id)): [grad] dwte[tokens[i],:] +=
  // dout[i,:] for the B*T rows except those whose token is skip_token (that row never receives a gradient
  // from the lookup). Accumulates, as embedding_bwd.
  virtual void embedding_bwd_skip(void* dwte, const void* dout, const int32_t* tokens, int B, int T, int C,
                                  int32_t skip_token) = 0;
  // BERT's embedding sum (before its LayerNorm): out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] +
  // wtt[types[b,t],:]. `types` [B,T] may be null (every token of type 0). wtt [TV,C].
  virtual void bert_embedding_fwd(void* out, const int32_t* tokens, const int32_t* types, const void* wte,
                                  const void* wpe, const void* wtt, int B, int T, int C) = 0;
  // [grad] dwte[tokens[b,t],:] += dout[b,t,:] except where tokens[b,t] == skip_token (-1: none; HF's
  // nn.Embedding padding_idx, whose row never receives a gradient); [grad] dwpe[t,:] += dout[b,t,:];
  // [grad] dwtt[types[b,t],:] += dout[b,t,:] (types null: row 0). All three accumulate.
  virtual void bert_embedding_bwd(void* dwte, void* dwpe, void* dwtt, const void* dout, const int32_t* tokens,
                                  const int32_t* types, int B, int T, int C, int32_t skip_token) = 0;

  // --- layernorm (biased variance) ---------------------------------------------------------------
  // out[N,C] = (inp - mean) * rstd * w + b with rstd = 1 / sqrt(var + eps); writes mean[N], rstd[N] (fp32).
  virtual void layernorm_fwd(void* out, float* mean, float* rstd, const void* inp, const void* w,
                             const void* b, int N, int C, float eps) = 0;
  // GPT-2's epsilon (kLayerNormEps). Implementations bring it into scope with `using Ops::layernorm_fwd;`.
  void layernorm_fwd(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b,
                     int N, int C) {
    layernorm_fwd(out, mean, rstd, inp, w, b, N, C, kLayerNormEps);
  }
  // dinp ACCUMULATES (it is the residual stream's gradient); [grad] dw, db accumulate.
  virtual void layernorm_bwd(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                             const float* mean, const float* rstd, int N, int C) = 0;
  // The same backward of an output gradient held as two tensors, g = dout + dout2 (dout2 null: g = dout),
  // each element rounded to the compute type as residual_fwd stores it: exactly residual_fwd into a buffer,
  // then layernorm_bwd of it. dinp is OVERWRITTEN (not accumulated); [grad] dw, db accumulate. dinp may
  // alias dout2 (not dout, inp or w). A residual stream's gradient can stay a pair until its LayerNorm.
  //
  // With `branch`, also the gradient of the residual branch the LayerNorm's input received, res = x +
  // dropout(y + bias) (post-LayerNorm blocks): branch.dbranch = dropout_rows of dinp under branch.drop (when
  // drop.p > 0; it must not alias any other operand; with no dropout it must be null: the branch's gradient
  // is dinp itself), and [grad] branch.dbias (may be null) += the column sums of that gradient. Exactly
  // layernorm_bwd_sum, dropout_rows and the bias part of matmul_bwd in sequence; on CUDA one pass.
  virtual void layernorm_bwd_sum(void* dinp, void* dw, void* db, const void* dout, const void* dout2,
                                 const void* inp, const void* w, const float* mean, const float* rstd, int N,
                                 int C, const BranchGrad& branch) = 0;
  void layernorm_bwd_sum(void* dinp, void* dw, void* db, const void* dout, const void* dout2, const void* inp,
                         const void* w, const float* mean, const float* rstd, int N, int C) {
    layernorm_bwd_sum(dinp, dw, db, dout, dout2, inp, w, mean, rstd, N, C, BranchGrad{});
  }

  // --- rmsnorm (Llama, Qwen2, Mistral: no mean, no bias) -------------------------------------------
  // out[N,C] = inp * rstd * w with rstd = 1 / sqrt(mean(inp^2) + eps) (fp32 math; inp * rstd rounded to the
  // compute type before the multiplication by w, as Hugging Face's LlamaRMSNorm does); writes rstd[N] (fp32).
  virtual void rmsnorm_fwd(void* out, float* rstd, const void* inp, const void* w, int N, int C,
                           float eps) = 0;
  // dinp ACCUMULATES (it is the residual stream's gradient); [grad] dw accumulates.
  virtual void rmsnorm_bwd(void* dinp, void* dw, const void* dout, const void* inp, const void* w,
                           const float* rstd, int N, int C) = 0;
  // The residual stream's next value and its RMSNorm in one pass: out[N,C] = a + b (rounded to the compute
  // type), then ln = rmsnorm(out) with rstd as rmsnorm_fwd writes it. Exactly residual_fwd followed by
  // rmsnorm_fwd; on CUDA one kernel. out may alias a or b; ln must not alias any input.
  virtual void residual_rmsnorm_fwd(void* out, void* ln, float* rstd, const void* a, const void* b,
                                    const void* w, int N, int C, float eps) = 0;

  // --- matmul: out[N,OC] = inp[N,K] @ w[OC,K]^T (+ bias[OC]); bias may be null --------------------
  virtual void matmul_fwd(void* out, const void* inp, const void* w, const void* bias, int N, int K,
                          int OC) = 0;
  // dinp[N,K] = dout @ w (overwritten; skipped if dinp is null); [grad] dw[OC,K] += dout^T @ inp (skipped
  // if null; with GradWrite::Overwrite, dw = dout^T @ inp, so dw need not be zeroed first); [grad]
  // dbias[OC] += column sums of dout (skipped if null; always accumulated).
  virtual void matmul_bwd(void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w,
                          int N, int K, int OC, GradWrite dw_write = GradWrite::Accumulate) = 0;
  // The MLP's fused GELU. Forward: pre[N,OC] = inp @ w^T + bias (GELU's input, kept for the backward) and
  // out[N,OC] = gelu(pre), in one GEMM on CUDA (cuBLASLt epilogue).
  virtual void matmul_gelu_fwd(void* out, void* pre, const void* inp, const void* w, const void* bias, int N,
                               int K, int OC) = 0;
  // matmul_bwd of a GEMM whose input was gelu(gelu_pre) [N,K], with GELU's backward applied to dinp:
  // dinp = (dout @ w) * gelu'(gelu_pre) (dinp required; dw, dbias as in matmul_bwd).
  virtual void matmul_bwd_dgelu(void* dinp, void* dw, void* dbias, const void* dout, const void* inp,
                                const void* w, const void* gelu_pre, int N, int K, int OC,
                                GradWrite dw_write = GradWrite::Accumulate) = 0;

  // --- self-attention (flash-style: probabilities are never stored) -------------------------------
  // qkv [B, T, (NH + 2 NKV) HS] (AttentionShape); query head h uses the columns h*HS..(h+1)*HS of the q
  // part and key/value head h / (NH / NKV) of the k and v parts. out [B, T, NH HS] (heads side by side) =
  // softmax(q k^T / sqrt(HS)) v over the keys `mask` allows; lse [B, NH, T] (fp32) receives each query row's
  // natural log-sum-exp of its scaled, masked scores, which is all the backward needs to recompute the
  // probabilities.
  virtual void attention_fwd(void* out, float* lse, const void* qkv, void* scratch, const AttentionShape& s,
                             const AttentionMask& mask) = 0;
  // dqkv [B, T, (NH + 2 NKV) HS] overwritten (a key/value head's gradient sums over the query heads of its
  // group), from dout [B, T, NH HS], the forward's qkv, out and lse, and the same mask.
  virtual void attention_bwd(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                             void* scratch, const AttentionShape& s, const AttentionMask& mask) = 0;
  // Multi-head forms (NKV = NH, HS = C / NH). Implementations bring them into scope with `using`.
  void attention_fwd(void* out, float* lse, const void* qkv, void* scratch, int B, int T, int C, int NH,
                     const AttentionMask& mask) {
    attention_fwd(out, lse, qkv, scratch, AttentionShape::mha(B, T, C, NH), mask);
  }
  void attention_bwd(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                     void* scratch, int B, int T, int C, int NH, const AttentionMask& mask) {
    attention_bwd(dqkv, dout, qkv, out, lse, scratch, AttentionShape::mha(B, T, C, NH), mask);
  }

  // --- rotary position embedding (RoPE; Hugging Face Llama's rotate-half form) ----------------------
  // In place on the q and k heads of qkv [B, T, (NH + 2 NKV) HS] (AttentionShape; v untouched): in every q
  // and k head vector x, the pair (x[i], x[i + HS/2]), i < HS/2, of the token at position p = pos_offset + t
  // rotates by the angle a = fp32(p) * inv_freq[i] (fp32 product; cos and sin of it in fp32):
  //   x[i] <- x[i] cos a - x[i + HS/2] sin a;   x[i + HS/2] <- x[i + HS/2] cos a + x[i] sin a.
  // inv_freq [HS/2] fp32 in the backend's memory (model/rope.hpp makes it from rope_theta and rope_scaling).
  // HS must be even. pos_offset: the position of row t = 0 (0 in training; the cache length when decoding).
  virtual void rope_fwd(void* qkv, const float* inv_freq, const AttentionShape& s, int pos_offset) = 0;
  // Its backward, in place on dqkv: the inverse rotation (angle -a) of the q and k gradients; v untouched.
  virtual void rope_bwd(void* dqkv, const float* inv_freq, const AttentionShape& s, int pos_offset) = 0;

  // --- generation (KV cache) ----------------------------------------------------------------------
  // Decoding runs Tn >= 1 new tokens of each of B sequences whose first pos[b] positions are cached: `pos`
  // is int32 [B] in the backend's memory, and token t of sequence b is at position pos[b] + t. Each op
  // requires 0 <= pos[b] and pos[b] + Tn <= the bound it names: the CPU throws otherwise; CUDA, which cannot
  // check device values, skips what lies outside the buffers (the results are then meaningless).
  //
  // out[b,t,:] = wte[tokens[b,t],:] + wpe[pos[b] + t,:] (wpe null: the token row alone); tokens [B,Tn];
  // pos[b] + Tn <= wpe's rows is the caller's to ensure. With every pos[b] = 0 it is exactly embedding_fwd.
  virtual void embedding_fwd_at(void* out, const int32_t* tokens, const void* wte, const void* wpe,
                                const int32_t* pos, int B, int Tn, int C) = 0;
  // rope_fwd at per-sequence positions: row (b, t) of qkv [B, Tn, (NH + 2 NKV) HS] (s.T = Tn) rotates as
  // rope_fwd rotates position pos[b] + t. With every pos[b] = p0 it is exactly rope_fwd(..., pos_offset p0).
  virtual void rope_fwd_at(void* qkv, const float* inv_freq, const AttentionShape& s, const int32_t* pos) = 0;
  // Copies the k and v heads of qkv [B, Tn, (NH + 2 NKV) HS] (s.T = Tn; after RoPE) into the cache:
  // cache.k[b, pos[b] + t, g, :] = key head g of row (b, t), cache.v likewise. Requires pos[b] + Tn <= S.
  virtual void kv_cache_write(const KvCacheLayer& cache, const void* qkv, const int32_t* pos,
                              const AttentionShape& s) = 0;
  // Attention of the new queries over the cache. Query head h of row (b, t) of qkv (its q part; s.T = Tn),
  // at position p = pos[b] + t, attends to the cached keys and values of head h / (NH / NKV) at positions
  // [window > 0 ? max(0, p - window + 1) : 0, p] (causal; `window` as AttentionMask::window):
  // out [B, Tn, NH HS] = softmax(q k^T / sqrt(HS)) v, fp32 math over the stored values, out rounded once
  // (unlike attention_fwd, the probabilities are not rounded to the storage type). The new tokens' keys and
  // values must be in the cache already (kv_cache_write first). `max_keys`: a host-side bound with
  // pos[b] + Tn <= max_keys <= cache.S for every b (CUDA splits each sequence's keys across thread blocks,
  // flash-decoding style, by it). `scratch` of `scratch_bytes` (cached_attention_scratch_bytes below; fewer
  // bytes, even 0, only allow fewer splits) holds the splits' partial results.
  virtual void cached_attention_fwd(void* out, const void* qkv, const KvCacheLayer& cache, const int32_t* pos,
                                    int max_keys, int window, void* scratch, size_t scratch_bytes,
                                    const AttentionShape& s) = 0;

  // --- attention of each sequence's first query only --------------------------------------------
  // BERT's last block feeds only its [CLS] rows to the pooler, so only query 0 of each sequence matters
  // there; its keys and values are still every token's. q [B,C]: row b is the query of token (b, 0), heads
  // side by side; kv [B,T,2C]: k = kv[..., 0:C], v = kv[..., C:2C]. out [B,C] is exactly row (b, 0) of
  // attention_fwd's output for those q, k, v under `mask` (query index 0: causal sees key 0 only, and the
  // dropout draws element ((b * NH + h) * T) * T + key); lse [B,NH] is that row's log-sum-exp. A sequence
  // of length 0 gives out 0 and lse 0. No scratch.
  virtual void attention_first_query_fwd(void* out, float* lse, const void* q, const void* kv, int B, int T,
                                         int C, int NH, const AttentionMask& mask) = 0;
  // dq [B,C] and dkv [B,T,2C], both overwritten (rows of keys no query sees are 0), from dout [B,C] and the
  // forward's q, kv, out and lse.
  virtual void attention_first_query_bwd(void* dq, void* dkv, const void* dout, const void* q, const void* kv,
                                         const void* out, const float* lse, int B, int T, int C, int NH,
                                         const AttentionMask& mask) = 0;

  // --- activation --------------------------------------------------------------------------------
  // GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  virtual void gelu_fwd(void* out, const void* inp, size_t n) = 0;
  // dinp = dout * gelu'(inp); dinp may alias dout.
  virtual void gelu_bwd(void* dinp, const void* inp, const void* dout, size_t n) = 0;
  // out = a + b (out may alias a or b).
  virtual void residual_fwd(void* out, const void* a, const void* b, size_t n) = 0;
  // SwiGLU (Llama's MLP activation) of the fused gate/up GEMM's output inp [N, 2I] (gate = columns 0..I-1,
  // up = columns I..2I-1): out[N, I] = silu(gate) * up, silu(x) = x / (1 + exp(-x)), fp32 math, out rounded
  // once. out must not alias inp.
  virtual void swiglu_fwd(void* out, const void* inp, int N, int I) = 0;
  // dinp [N, 2I] overwritten: d gate = dout * up * silu'(gate), d up = dout * silu(gate) (silu'(x) =
  // s (1 + x (1 - s)), s = sigmoid(x)), from the forward's inp and dout [N, I]. dinp must not alias inp or
  // dout.
  virtual void swiglu_bwd(void* dinp, const void* inp, const void* dout, int N, int I) = 0;

  // --- dropout (training) ---------------------------------------------------------------------------
  // y[i] = keep(i) ? x[i] / (1 - p) : 0, keep(i) from the seed and micro-batch counter in `state` (read when
  // the kernel runs), `site` and i (kernels/dropout.hpp): every backend drops the same elements. Backward
  // is the same call on the gradient. y may alias x; 0 <= p < 1.
  virtual void dropout(void* y, const void* x, size_t n, float p, const DropoutState* state,
                       uint32_t site) = 0;
  // Dropout of `rows` rows of `cols` elements that are rows of a bigger tensor: y[r * cols + c] draws the
  // mask of element index r * index_pitch + c (as dropout() of that tensor would), y may alias x. BERT's last
  // block computes only the [CLS] rows (row b is position (b, 0) of [B, T, C]: index_pitch T * C) and drops
  // exactly what the whole block would.
  virtual void dropout_rows(void* y, const void* x, int rows, int cols, size_t index_pitch, float p,
                            const DropoutState* state, uint32_t site) = 0;
  // state->micro += 1, in stream order: a training forward starts (each micro-batch draws its own masks).
  virtual void dropout_next_micro(DropoutState* state) = 0;
  // The residual stream's next value and its LayerNorm in one pass: out[N,C] = a + b, then ln =
  // LayerNorm(out) with mean / rstd as layernorm_fwd writes them. Exactly residual_fwd followed by
  // layernorm_fwd (out is rounded to the compute type before it is normalised); on CUDA one kernel that reads
  // out back from cache instead of memory. out may alias a or b; ln must not alias any input.
  // With `drop` (drop.p > 0), `a` first goes through dropout (its row r column c drawing the mask of index
  // r * drop.index_pitch + c): exactly dropout_rows, then residual_fwd, then layernorm_fwd.
  virtual void residual_layernorm_fwd(void* out, void* ln, float* mean, float* rstd, const void* a,
                                      const void* b, const void* w, const void* bias, int N, int C, float eps,
                                      const RowDropout& drop) = 0;
  void residual_layernorm_fwd(void* out, void* ln, float* mean, float* rstd, const void* a, const void* b,
                              const void* w, const void* bias, int N, int C, float eps) {
    residual_layernorm_fwd(out, ln, mean, rstd, a, b, w, bias, N, C, eps, RowDropout{});
  }
  // Exact GELU (PyTorch's default nn.GELU, BERT's "gelu"): 0.5 x (1 + erf(x / sqrt(2))). The cuBLASLt GELU
  // epilogue of matmul_gelu_fwd is the tanh approximation, so models with exact GELU run matmul_fwd + this.
  virtual void gelu_erf_fwd(void* out, const void* inp, size_t n) = 0;
  // dinp = dout * gelu_erf'(inp); dinp may alias dout.
  virtual void gelu_erf_bwd(void* dinp, const void* inp, const void* dout, size_t n) = 0;
  // Both at once, as a backward that recomputes the GELU output needs them: out = gelu_erf(inp) and dinp =
  // dout * gelu_erf'(inp) (one pass over inp on CUDA); dinp may alias dout, out must not alias anything.
  virtual void gelu_erf_fwd_bwd(void* out, void* dinp, const void* inp, const void* dout, size_t n) = 0;
  // gelu_erf_fwd_bwd of an [N, cols] tensor that also adds dinp's column sums to [grad] dbias[cols] (the bias
  // gradient of the Linear whose output GELU read): exactly gelu_erf_fwd_bwd, then the bias part of
  // matmul_bwd; on CUDA one pass.
  virtual void gelu_erf_fwd_bwd_bias(void* out, void* dinp, void* dbias, const void* inp, const void* dout,
                                     int N, int cols) = 0;
  // out = tanh(inp) (BERT's pooler); out may alias inp.
  virtual void tanh_fwd(void* out, const void* inp, size_t n) = 0;
  // dinp = dout * (1 - out^2), from the forward's OUTPUT; dinp may alias dout.
  virtual void tanh_bwd(void* dinp, const void* out, const void* dout, size_t n) = 0;
  // The first position of every sequence (BERT's [CLS] rows): out[b,:] = inp[b,0,:], inp [B,T,C], out [B,C].
  virtual void first_token_fwd(void* out, const void* inp, int B, int T, int C) = 0;
  // Its backward: dinp [B,T,C] is overwritten with dout[b,:] at t = 0 and zero elsewhere.
  virtual void first_token_bwd(void* dinp, const void* dout, int B, int T, int C) = 0;

  // --- loss: fused softmax + cross-entropy over the vocabulary --------------------------------------
  // logits [N,Vp] with only the first V columns real (Vp >= V is the padded vocabulary). For each row
  // with targets[i] != kIgnoreIndex: losses[i] = logsumexp(logits[i,:V]) - logits[i,targets[i]] (fp32);
  // ignored rows get losses[i] = 0. If write_grad, logits is overwritten by its gradient:
  // grad_scale * (softmax - onehot) on real columns of valid rows, 0 on padded columns and ignored rows.
  virtual void softmax_xent_fwd_bwd(float* losses, void* logits, const int32_t* targets, int N, int V, int Vp,
                                    float grad_scale, bool write_grad) = 0;
  // Sequence classification (Hugging Face BertForSequenceClassification's losses, per row), logits [N, NL] in
  // the compute type, losses [N] fp32:
  //   NL >= 2 (`labels` int32 [N]): cross-entropy, losses[i] = logsumexp(logits[i,:]) - logits[i,labels[i]];
  //     a row with labels[i] == kIgnoreIndex gets loss 0 and gradient 0. A label outside [0, NL) is a data
  //     error: the CPU throws naming it, CUDA writes a NaN loss (the step's non-finite check catches it).
  //   NL == 1 (`labels` fp32 [N]): regression, losses[i] = (logits[i] - labels[i])^2.
  // With `dlogits` (not null) it receives grad_scale * d(losses[i]) / d(logits[i,:]): softmax - onehot, or
  // 2 (logit - label). logits and dlogits must not alias.
  virtual void classification_loss(float* losses, void* dlogits, const void* logits, const void* labels,
                                   int N, int NL, float grad_scale) = 0;

  // --- reduction -------------------------------------------------------------------------------------
  // Sum over x[0..n) of x^2 (x of type `dtype`: F32, BF16 or F16), accumulated in at least fp32 with a
  // deterministic order on the CPU; returned to the host (synchronises). Inf or NaN anywhere in x gives a
  // non-finite result (the fp16 overflow check relies on it).
  virtual double sum_squares(const void* x, DType dtype, size_t n) = 0;
  // Sum of x[0..n) (fp32), returned to the host (synchronises).
  virtual double sum(const float* x, size_t n) = 0;

  // The same reductions with the result left in device memory (`double*`: one fp64 value in the backend's
  // memory), queued on the compute stream without synchronising: a training step keeps its loss and
  // gradient norm on the device and reads them once, at its end. Each computes exactly the value (same
  // order, same fp64 accumulation) that the host-returning form above returns, so moving a caller from one
  // to the other changes no result.
  // out[0] += sum of x[0..n) (fp32 x): the step's loss, summed over its micro-batches.
  virtual void accumulate_sum(double* out, const float* x, size_t n) = 0;
  // out[0] = sum of x[i]^2 over x[0..n) (as sum_squares: non-finite when any x[i] is).
  virtual void sum_squares_to(double* out, const void* x, DType dtype, size_t n) = 0;
  // The optimizer's gradient multiplier from the squared norm of the stored gradients, on the device (the
  // trainer's clipping by global norm, torch.nn.utils.clip_grad_norm_ semantics). In fp64, as the host
  // computation it replaces, with the clip factor rounded to fp32:
  //   norm_out[0]  = sqrt(sum_squares[0]) * unscale      (the norm of the true gradient, for logging)
  //   clip         = max_norm > 0 && norm > max_norm ? fp32(max_norm / (norm + 1e-6)) : 1
  //   scale_out[0] = fp32(clip * unscale)                (for the optimizer's grad_scale_device)
  // `unscale` turns stored gradients into true ones (1 / (loss scale x tokens) and the like). A NaN norm
  // gives clip 1 and an infinite one clip 0: the caller must check norm_out before it trusts the step.
  // With `step_values` set, unscale is step_values->unscale, read when the op runs (a graph-safe step).
  virtual void grad_clip_scale(float* scale_out, double* norm_out, const double* sum_squares, double unscale,
                               double max_norm, const StepValues* step_values) = 0;

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

// `precision.compute` must be F32, BF16 or F16 and `precision.grad` F32 or the compute type.
void validate_ops_precision(OpsPrecision p);
// layernorm_bwd_sum's `branch` contract for C columns and the LayerNorm's dinp (both backends check it).
void validate_branch_grad(const BranchGrad& branch, int C, const void* dinp);

std::unique_ptr<Ops> make_cpu_ops(Device& dev, OpsPrecision precision = {});
// What Ops::attention_scratch_bytes answers on a backend, without a device (for planning). CUDA in a
// build without CUDA throws anvil::Error. On CUDA, 16-bit attention runs cuDNN's fused flash attention
// (SDPA) when the build has it and the head size allows (HS a multiple of 8, at most 128; T > 1); otherwise,
// or with the environment variable ANVIL_ATTENTION=materialized, a path that materialises one layer's
// probabilities in scratch (B*NH*T*T elements) and recomputes them in the backward.
// With `dropout` (attention-probability dropout in training), CUDA always takes the materialised path
// (cuDNN's dropout masks are not the ones every backend draws), and the scratch is sized for it.
size_t attention_scratch_bytes(DeviceKind backend, DType compute, const AttentionShape& s, bool dropout = false);
size_t cuda_attention_scratch_bytes(DType compute, const AttentionShape& s, bool dropout = false);
// The scratch Ops::cached_attention_fwd can use at batch s.B (any Tn): on CUDA room for the partial results
// of up to kCachedAttentionSplits key splits per query head of a one-token step (fp32 output, max and sum);
// the CPU needs none.
constexpr int kCachedAttentionSplits = 64;
inline size_t cached_attention_scratch_bytes(DeviceKind backend, const AttentionShape& s) {
  if (backend != DeviceKind::CUDA) return 0;
  return size_t(s.B) * size_t(s.NH) * kCachedAttentionSplits * (size_t(s.HS) + 2) * sizeof(float);
}
// "cudnn flash attention" or "materialized attention": what CUDA attention will run (see above) for heads of
// HS elements.
const char* cuda_attention_path(DType compute, int HS, bool dropout = false);
// Multi-head forms (HS = C / NH, NKV = NH).
inline size_t attention_scratch_bytes(DeviceKind backend, DType compute, int B, int T, int C, int NH,
                                      bool dropout = false) {
  return attention_scratch_bytes(backend, compute, AttentionShape::mha(B, T, C, NH), dropout);
}
inline size_t cuda_attention_scratch_bytes(DType compute, int B, int T, int C, int NH, bool dropout = false) {
  return cuda_attention_scratch_bytes(compute, AttentionShape::mha(B, T, C, NH), dropout);
}
inline const char* cuda_attention_implementation(DType compute, int C, int NH, bool dropout = false) {
  return cuda_attention_path(compute, C / NH, dropout);
}
// `tf32`: allow TF32 tensor cores in fp32 GEMMs. `workspace` is a device buffer of `workspace_bytes` for
// cuBLASLt.
std::unique_ptr<Ops> make_cuda_ops(Device& dev, bool tf32, void* workspace, size_t workspace_bytes,
                                   OpsPrecision precision = {});
// The device buffers of CUDA GEMMs: cuBLASLt's workspace, and for Fp32Matmul::TF32x3 the split scratch
// (split_gemm_scratch_bytes; ignored otherwise).
struct CudaGemmBuffers {
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  float* split_scratch = nullptr;
  size_t split_scratch_bytes = 0;
};
// fp32 GEMMs as `fp32` says (split_gemm_plan.hpp); 16-bit GEMMs are unaffected.
// `tuning`: GEMM algorithm tuning (kernels/cuda/gemm_tuner.hpp).
std::unique_ptr<Ops> make_cuda_ops(Device& dev, Fp32Matmul fp32, const CudaGemmBuffers& buffers,
                                   OpsPrecision precision = {}, const GemmTuningOptions& tuning = {});
constexpr size_t kCudaGemmWorkspaceBytes = 32ull << 20;

}  // namespace anvil
