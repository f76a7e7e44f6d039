// Linear ops: the GEMM of a Linear layer (out = inp @ w^T + bias) and its backward, and the MLP's fused
// GELU forms (matmul_gelu_fwd, matmul_bwd_dgelu: on CUDA the GELU runs in the GEMM's epilogue; the CPU
// reference composes matmul and gelu), and a general strided GEMM (gemm) for adapters.
//
// Part of the Ops contract (kernels/ops.hpp: memory, storage types, the `[grad]` pointer marks, and the
// gradient convention: parameter gradients accumulate, activation gradients are overwritten unless a
// comment says otherwise). Ops inherits this interface; CpuOps and CudaOps implement it.
#pragma once
#include <cstdint>

namespace anvil {

// How a weight gradient is written: added to what the buffer holds (gradient accumulation over
// micro-batches), or written over it (its one write of the step, when the buffer was not zeroed).
enum class GradWrite { Accumulate, Overwrite };

// A plain GEMM over row-major matrices: C[m,n] = alpha op(A)[m,k] op(B)[k,n] + beta C, where op(A) is A
// [m,k] or, with trans_a, the transpose of A stored [k,m] (B likewise: [k,n] or, with trans_b, [n,k]).
// lda, ldb, ldc are the row strides as stored, in elements (0: the rows are contiguous), so an operand may be
// a column block of a wider matrix. A and B are in the compute type; C in the compute type, or [grad] in the
// gradient type with c_grad. With beta == 0, C is not read (it may hold anything, NaN included). C must not
// overlap A or B.
struct GemmSpec {
  const void* a = nullptr;
  bool trans_a = false;
  const void* b = nullptr;
  bool trans_b = false;
  void* c = nullptr;
  bool c_grad = false;
  int m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.f, beta = 0.f;
};

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
  // The GEMM of `g` (GemmSpec), for the products the fixed-shape ops above do not cover: a LoRA adapter's
  // low-rank factors (peft/lora_adapter.hpp), which write into column blocks of a fused output and add into
  // outputs and gradients that hold values already.
  virtual void gemm(const GemmSpec& g) = 0;
};

}  // namespace anvil
