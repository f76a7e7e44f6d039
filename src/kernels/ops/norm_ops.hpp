// Normalisation ops: LayerNorm (biased variance; GPT-2, BERT) and RMSNorm (Llama, Qwen2, Mistral), their
// backwards, and the fused forms that also add the residual stream (residual_layernorm_fwd, optionally
// with dropout of the branch; residual_rmsnorm_fwd) or take its gradient as two tensors and return the
// branch's (layernorm_bwd_sum). Each fused form is exactly the plain ops in sequence; the CPU reference
// composes them.
//
// Part of the Ops contract (kernels/ops.hpp: memory, storage types, the `[grad]` pointer marks, and the
// gradient convention: parameter gradients accumulate, activation gradients are overwritten unless a
// comment says otherwise). Ops inherits this interface; CpuOps and CudaOps implement it.
#pragma once

#include "kernels/dropout.hpp"

namespace anvil {

constexpr float kLayerNormEps = 1e-5f;

class NormOps {
 public:
  virtual ~NormOps() = default;

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
};

// layernorm_bwd_sum's `branch` contract for C columns and the LayerNorm's dinp (both backends check it).
void validate_branch_grad(const BranchGrad& branch, int C, const void* dinp);

}  // namespace anvil
