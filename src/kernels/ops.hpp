// The operator contract shared by the CPU reference backend and the CUDA backend. All pointers are in
// the owning Device's memory; all tensors are row-major and contiguous; all math is fp32 over fp32, bf16 or
// fp16 storage (see OpsPrecision; on CUDA, fp32 GEMMs may use TF32 tensor cores when enabled). Work is
// queued in order on the device's compute stream.
//
// Gradient convention: parameter gradients (dw, db, dwte, dwpe) ACCUMULATE (+=), so micro-batches sum
// into one buffer; activation gradients are OVERWRITTEN unless the comment says "accumulates".
//
// Op families (one implementation file per family under cpu/ and cuda/):
//   embedding, layernorm, matmul, attention, activation (gelu, residual), loss (softmax cross-entropy),
//   reduction (sum of squares), precision (weight casts), optimizer (AdamW).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "runtime/device.hpp"

namespace anvil {

struct AdamWArgs {
  float lr = 0;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0;
  int64_t step = 1;  // 1-based step number, for bias correction
  float grad_scale =
      1.f;  // multiplies the gradient first (token-count normalisation, clipping, 1/loss scale)
};

constexpr float kLayerNormEps = 1e-5f;
constexpr int32_t kIgnoreIndex = -100;

// The storage types an Ops instance works in. `compute`: activations, activation gradients and the model's
// weights (F32, BF16 or F16). `grad`: parameter gradients (F32, or the compute type when 16-bit gradients
// are chosen to save memory). Math is fp32 whatever the storage: 16-bit values are widened on load and
// rounded to nearest even on store; GEMMs accumulate in fp32.
struct OpsPrecision {
  DType compute = DType::F32;
  DType grad = DType::F32;
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device& device() = 0;
  virtual OpsPrecision precision() const = 0;

  // Bytes of the `scratch` buffer the attention functions need for these shapes.
  virtual size_t attention_scratch_bytes(int B, int T, int C, int NH) const = 0;

  // Pointer types: `void*` arguments are in the compute type unless marked [grad] (the gradient type);
  // `float*` arguments are always fp32.

  // --- embedding -------------------------------------------------------------------------------
  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].   out [B,T,C], tokens [B,T], wte [V,C], wpe [maxT,C]
  virtual void embedding_fwd(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                             int C) = 0;
  // [grad] dwte[tokens[b,t],:] += dout[b,t,:]; [grad] dwpe[t,:] += dout[b,t,:]   (both accumulate)
  virtual void embedding_bwd(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                             int C) = 0;

  // --- layernorm (eps = kLayerNormEps, biased variance) ----------------------------------------
  // out[N,C] = (inp - mean) * rstd * w + b; writes mean[N], rstd[N] (fp32).
  virtual void layernorm_fwd(void* out, float* mean, float* rstd, const void* inp, const void* w,
                             const void* b, int N, int C) = 0;
  // dinp ACCUMULATES (it is the residual stream's gradient); [grad] dw, db accumulate.
  virtual void layernorm_bwd(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                             const float* mean, const float* rstd, int N, int C) = 0;

  // --- matmul: out[N,OC] = inp[N,K] @ w[OC,K]^T (+ bias[OC]); bias may be null --------------------
  virtual void matmul_fwd(void* out, const void* inp, const void* w, const void* bias, int N, int K,
                          int OC) = 0;
  // dinp[N,K] = dout @ w (overwritten; skipped if dinp is null); [grad] dw[OC,K] += dout^T @ inp;
  // [grad] dbias[OC] += column sums of dout (skipped if null).
  virtual void matmul_bwd(void* dinp, void* dw, void* dbias, const void* dout, const void* inp, const void* w,
                          int N, int K, int OC) = 0;

  // --- causal multi-head self-attention ---------------------------------------------------------
  // qkv [B,T,3C]: q = qkv[..., 0:C], k = qkv[..., C:2C], v = qkv[..., 2C:3C]; head h uses columns
  // h*HS..(h+1)*HS of each, HS = C/NH. probs [B,NH,T,T] receives the softmax(q k^T / sqrt(HS)) with the
  // causal mask (entries above the diagonal are 0). out [B,T,C] has heads side by side.
  virtual void attention_fwd(void* out, void* probs, const void* qkv, void* scratch, int B, int T, int C,
                             int NH) = 0;
  // dqkv [B,T,3C] overwritten, from dout [B,T,C] and the saved qkv and probs.
  virtual void attention_bwd(void* dqkv, const void* dout, const void* qkv, const void* probs, void* scratch,
                             int B, int T, int C, int NH) = 0;

  // --- activation --------------------------------------------------------------------------------
  // GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  virtual void gelu_fwd(void* out, const void* inp, size_t n) = 0;
  // dinp = dout * gelu'(inp); dinp may alias dout.
  virtual void gelu_bwd(void* dinp, const void* inp, const void* dout, size_t n) = 0;
  // out = a + b (out may alias a or b).
  virtual void residual_fwd(void* out, const void* a, const void* b, size_t n) = 0;

  // --- loss: fused softmax + cross-entropy over the vocabulary --------------------------------------
  // logits [N,Vp] with only the first V columns real (Vp >= V is the padded vocabulary). For each row
  // with targets[i] != kIgnoreIndex: losses[i] = logsumexp(logits[i,:V]) - logits[i,targets[i]] (fp32);
  // ignored rows get losses[i] = 0. If write_grad, logits is overwritten by its gradient:
  // grad_scale * (softmax - onehot) on real columns of valid rows, 0 on padded columns and ignored rows.
  virtual void softmax_xent_fwd_bwd(float* losses, void* logits, const int32_t* targets, int N, int V, int Vp,
                                    float grad_scale, bool write_grad) = 0;

  // --- reduction -------------------------------------------------------------------------------------
  // Sum over x[0..n) of x^2 (x of type `dtype`: F32, BF16 or F16), accumulated in at least fp32 with a
  // deterministic order on the CPU; returned to the host (synchronises). Inf or NaN anywhere in x gives a
  // non-finite result (the fp16 overflow check relies on it).
  virtual double sum_squares(const void* x, DType dtype, size_t n) = 0;
  // Sum of x[0..n) (fp32), returned to the host (synchronises).
  virtual double sum(const float* x, size_t n) = 0;

  // --- precision ------------------------------------------------------------------------------------
  // out[i] = master[i] in the compute type (a copy when it is F32). With a nonzero `rounding_seed` and
  // BF16, rounds stochastically with the bits of rounding_bits(rounding_seed, i) (core/half.hpp), the
  // same on every backend; otherwise to nearest even.
  virtual void cast_weights(void* out, const float* master, size_t n, uint64_t rounding_seed) = 0;

  // --- optimizer ---------------------------------------------------------------------------------------
  // PyTorch AdamW (decoupled weight decay), per element, g = grad * a.grad_scale (grad of the gradient type):
  //   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
  //   p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
  // `param` is fp32 (the master weights).
  virtual void adamw_step(float* param, const void* grad, float* m, float* v, size_t n,
                          const AdamWArgs& a) = 0;
};

// `precision.compute` must be F32, BF16 or F16 and `precision.grad` F32 or the compute type.
void validate_ops_precision(OpsPrecision p);

std::unique_ptr<Ops> make_cpu_ops(Device& dev, OpsPrecision precision = {});
// What Ops::attention_scratch_bytes answers on a backend, without a device (for planning). CUDA in a
// build without CUDA throws anvil::Error.
size_t attention_scratch_bytes(DeviceKind backend, DType compute, int B, int T, int C, int NH);
size_t cuda_attention_scratch_bytes(DType compute, int B, int T, int C, int NH);
// `tf32`: allow TF32 tensor cores in fp32 GEMMs. `workspace` is a device buffer of `workspace_bytes` for
// cuBLASLt.
std::unique_ptr<Ops> make_cuda_ops(Device& dev, bool tf32, void* workspace, size_t workspace_bytes,
                                   OpsPrecision precision = {});
constexpr size_t kCudaGemmWorkspaceBytes = 32ull << 20;

}  // namespace anvil
