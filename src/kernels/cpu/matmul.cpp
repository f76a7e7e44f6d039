#include <cblas.h>

#include <algorithm>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {

void matmul_fwd(float* out, const float* inp, const float* w, const float* bias, int N, int K, int OC) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, K, 1.0f, inp, K, w, K, 0.0f, out, OC);
  if (!bias) return;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r)
    for (int o = 0; o < OC; ++o) out[r * OC + o] += bias[o];
}

void matmul_bwd(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                int N, int K, int OC) {
  if (dinp)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, K, OC, 1.0f, dout, OC, w, K, 0.0f, dinp, K);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, K, N, 1.0f, dout, OC, inp, K, 1.0f, dw, K);
  if (!dbias) return;
  constexpr int kBlock = 32;
  const int nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int o0 = blk * kBlock, o1 = std::min(OC, o0 + kBlock);
    float acc[kBlock] = {};
    for (int64_t r = 0; r < N; ++r)
      for (int o = o0; o < o1; ++o) acc[o - o0] += dout[r * OC + o];
    for (int o = o0; o < o1; ++o) dbias[o] += acc[o - o0];
  }
}

}  // namespace anvil::cpu
