// The operator contract shared by the CPU reference backend and the CUDA backend. All pointers are in
// the owning Device's memory; all tensors are row-major and contiguous; all math is fp32 (on CUDA,
// GEMMs may use TF32 tensor cores when enabled). Work is queued in order on the device's compute stream.
//
// Gradient convention: parameter gradients (dw, db, dwte, dwpe) ACCUMULATE (+=), so micro-batches sum
// into one buffer; activation gradients are OVERWRITTEN unless the comment says "accumulates".
//
// Op families (one implementation file per family under cpu/ and cuda/):
//   embedding, layernorm, matmul, attention, activation (gelu, residual), loss (softmax cross-entropy),
//   reduction (sum of squares), optimizer (AdamW).
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
  int64_t step = 1;        // 1-based step number, for bias correction
  float grad_scale = 1.f;  // multiplies the gradient first (clipping coefficient, 1/loss scale)
};

constexpr float kLayerNormEps = 1e-5f;
constexpr int32_t kIgnoreIndex = -100;

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device& device() = 0;

  // Size, in floats, of the `scratch` buffer the attention functions need for these shapes.
  virtual size_t attention_scratch_floats(int B, int T, int C, int NH) const = 0;

  // --- embedding -------------------------------------------------------------------------------
  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].   out [B,T,C], tokens [B,T], wte [V,C], wpe [maxT,C]
  virtual void embedding_fwd(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B,
                             int T, int C) = 0;
  // dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]   (both accumulate)
  virtual void embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                             int C) = 0;

  // --- layernorm (eps = kLayerNormEps, biased variance) ----------------------------------------
  // out[N,C] = (inp - mean) * rstd * w + b; writes mean[N], rstd[N].
  virtual void layernorm_fwd(float* out, float* mean, float* rstd, const float* inp, const float* w,
                             const float* b, int N, int C) = 0;
  // dinp ACCUMULATES (it is the residual stream's gradient); dw, db accumulate.
  virtual void layernorm_bwd(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                             const float* w, const float* mean, const float* rstd, int N, int C) = 0;

  // --- matmul: out[N,OC] = inp[N,K] @ w[OC,K]^T (+ bias[OC]); bias may be null --------------------
  virtual void matmul_fwd(float* out, const float* inp, const float* w, const float* bias, int N, int K,
                          int OC) = 0;
  // dinp[N,K] = dout @ w (overwritten; skipped if dinp is null); dw[OC,K] += dout^T @ inp;
  // dbias[OC] += column sums of dout (skipped if null).
  virtual void matmul_bwd(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                          const float* w, int N, int K, int OC) = 0;

  // --- causal multi-head self-attention ---------------------------------------------------------
  // qkv [B,T,3C]: q = qkv[..., 0:C], k = qkv[..., C:2C], v = qkv[..., 2C:3C]; head h uses columns
  // h*HS..(h+1)*HS of each, HS = C/NH. probs [B,NH,T,T] receives the softmax(q k^T / sqrt(HS)) with the
  // causal mask (entries above the diagonal are 0). out [B,T,C] has heads side by side.
  virtual void attention_fwd(float* out, float* probs, const float* qkv, float* scratch, int B, int T, int C,
                             int NH) = 0;
  // dqkv [B,T,3C] overwritten, from dout [B,T,C] and the saved qkv and probs.
  virtual void attention_bwd(float* dqkv, const float* dout, const float* qkv, const float* probs,
                             float* scratch, int B, int T, int C, int NH) = 0;

  // --- activation --------------------------------------------------------------------------------
  // GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  virtual void gelu_fwd(float* out, const float* inp, size_t n) = 0;
  // dinp = dout * gelu'(inp); dinp may alias dout.
  virtual void gelu_bwd(float* dinp, const float* inp, const float* dout, size_t n) = 0;
  // out = a + b (out may alias a or b).
  virtual void residual_fwd(float* out, const float* a, const float* b, size_t n) = 0;

  // --- loss: fused softmax + cross-entropy over the vocabulary --------------------------------------
  // logits [N,Vp] with only the first V columns real (Vp >= V is the padded vocabulary). For each row
  // with targets[i] != kIgnoreIndex: losses[i] = logsumexp(logits[i,:V]) - logits[i,targets[i]];
  // ignored rows get losses[i] = 0. If write_grad, logits is overwritten by its gradient:
  // grad_scale * (softmax - onehot) on real columns of valid rows, 0 on padded columns and ignored rows.
  virtual void softmax_xent_fwd_bwd(float* losses, float* logits, const int32_t* targets, int N, int V,
                                    int Vp, float grad_scale, bool write_grad) = 0;

  // --- reduction -------------------------------------------------------------------------------------
  // Sum over x[0..n) of x^2, accumulated in at least fp32 with a deterministic order on the CPU;
  // returned to the host (synchronises).
  virtual double sum_squares(const float* x, size_t n) = 0;
  // Sum of x[0..n), returned to the host (synchronises).
  virtual double sum(const float* x, size_t n) = 0;

  // --- optimizer ---------------------------------------------------------------------------------------
  // PyTorch AdamW (decoupled weight decay), per element, g = grad * a.grad_scale:
  //   p -= lr * wd * p;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
  //   p -= (lr / (1 - b1^step)) * m / (sqrt(v) / sqrt(1 - b2^step) + eps)
  virtual void adamw_step(float* param, const float* grad, float* m, float* v, size_t n,
                          const AdamWArgs& a) = 0;
};

std::unique_ptr<Ops> make_cpu_ops(Device& dev);
// What Ops::attention_scratch_floats answers on a backend, without a device (for planning). CUDA in a
// build without CUDA throws anvil::Error.
size_t attention_scratch_floats(DeviceKind backend, int B, int T, int C, int NH);
size_t cuda_attention_scratch_floats(int B, int T, int C, int NH);
// `tf32`: allow TF32 tensor cores in GEMMs. `workspace` is a device buffer of `workspace_bytes` for cuBLASLt.
std::unique_ptr<Ops> make_cuda_ops(Device& dev, bool tf32, void* workspace, size_t workspace_bytes);
constexpr size_t kCudaGemmWorkspaceBytes = 32ull << 20;

}  // namespace anvil
