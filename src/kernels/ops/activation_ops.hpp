// Activation and elementwise ops: GELU (tanh approximation and exact erf, with fused forward+backward and
// bias-gradient forms), tanh, SwiGLU, the residual add, dropout (masks every backend draws identically:
// kernels/dropout.hpp), and the first-token rows (BERT's [CLS]).
//
// Part of the Ops contract (kernels/ops.hpp: memory, storage types, the `[grad]` pointer marks, and the
// gradient convention: parameter gradients accumulate, activation gradients are overwritten unless a
// comment says otherwise). Ops inherits this interface; CpuOps and CudaOps implement it.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/dropout.hpp"

namespace anvil {

class ActivationOps {
 public:
  virtual ~ActivationOps() = default;

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
};

}  // namespace anvil
