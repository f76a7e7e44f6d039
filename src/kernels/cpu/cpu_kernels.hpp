// CPU reference kernels: fp32, OpenMP, OpenBLAS for GEMMs. Semantics are those of kernels/ops.hpp.
// Every reduction runs in a fixed order independent of the thread count, so a CPU run is bit-for-bit
// reproducible (the resume test relies on it).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/ops.hpp"

namespace anvil::cpu {

void embedding_fwd(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                   int C);
void embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C);

void layernorm_fwd(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                   int N, int C);
void layernorm_bwd(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                   const float* mean, const float* rstd, int N, int C);

void matmul_fwd(float* out, const float* inp, const float* w, const float* bias, int N, int K, int OC);
void matmul_bwd(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                int N, int K, int OC);

size_t attention_scratch_floats(int B, int T, int C, int NH);
void attention_fwd(float* out, float* probs, const float* qkv, int B, int T, int C, int NH);
void attention_bwd(float* dqkv, const float* dout, const float* qkv, const float* probs, float* scratch,
                   int B, int T, int C, int NH);

void gelu_fwd(float* out, const float* inp, size_t n);
void gelu_bwd(float* dinp, const float* inp, const float* dout, size_t n);
void residual_fwd(float* out, const float* a, const float* b, size_t n);

void softmax_xent_fwd_bwd(float* losses, float* logits, const int32_t* targets, int N, int V, int Vp,
                          float grad_scale, bool write_grad);

double sum_squares(const float* x, size_t n);
double sum(const float* x, size_t n);

void adamw_step(float* param, const float* grad, float* m, float* v, size_t n, const AdamWArgs& a);

}  // namespace anvil::cpu
