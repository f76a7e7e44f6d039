// Linear ops: the GEMM of a Linear layer (out = inp @ w^T + bias) and its backward, and the MLP's fused
// GELU forms (matmul_gelu_fwd, matmul_bwd_dgelu: on CUDA the GELU runs in the GEMM's epilogue; the CPU
// reference composes matmul and gelu).
//
// Part of the Ops contract (kernels/ops.hpp: memory, storage types, the `[grad]` pointer marks, and the
// gradient convention: parameter gradients accumulate, activation gradients are overwritten unless a
// comment says otherwise). Ops inherits this interface; CpuOps and CudaOps implement it.
#pragma once

namespace anvil {

// How a weight gradient is written: added to what the buffer holds (gradient accumulation over
// micro-batches), or written over it (its one write of the step, when the buffer was not zeroed).
enum class GradWrite { Accumulate, Overwrite };

class LinearOps {
 public:
  virtual ~LinearOps() = default;

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
};

}  // namespace anvil
