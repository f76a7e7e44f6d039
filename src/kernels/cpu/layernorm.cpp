#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {

void layernorm_fwd(float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
                   int N, int C) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* x = inp + r * C;
    double s = 0;
    for (int c = 0; c < C; ++c) s += x[c];
    const float m = float(s / C);
    double v = 0;
    for (int c = 0; c < C; ++c) v += double(x[c] - m) * (x[c] - m);
    const float rs = float(1.0 / std::sqrt(v / C + kLayerNormEps));
    float* o = out + r * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * rs * w[c] + b[c];
    mean[r] = m;
    rstd[r] = rs;
  }
}

void layernorm_bwd(float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
                   const float* mean, const float* rstd, int N, int C) {
  // Input gradient: rows are independent.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const float* x = inp + r * C;
    const float* d = dout + r * C;
    const float m = mean[r], rs = rstd[r];
    double sum_dn = 0, sum_dn_xhat = 0;
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - m) * rs;
      const float dn = d[c] * w[c];
      sum_dn += dn;
      sum_dn_xhat += double(dn) * xhat;
    }
    const float mean_dn = float(sum_dn / C), mean_dn_xhat = float(sum_dn_xhat / C);
    float* di = dinp + r * C;
    for (int c = 0; c < C; ++c) {
      const float xhat = (x[c] - m) * rs;
      di[c] += (d[c] * w[c] - mean_dn - xhat * mean_dn_xhat) * rs;
    }
  }
  // Parameter gradients: threads split channels and walk rows in order (deterministic sums).
  constexpr int kBlock = 16;
  const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    float acc_w[kBlock] = {}, acc_b[kBlock] = {};
    for (int64_t r = 0; r < N; ++r) {
      const float* x = inp + r * C;
      const float* d = dout + r * C;
      for (int c = c0; c < c1; ++c) {
        acc_w[c - c0] += d[c] * (x[c] - mean[r]) * rstd[r];
        acc_b[c - c0] += d[c];
      }
    }
    for (int c = c0; c < c1; ++c) {
      dw[c] += acc_w[c - c0];
      db[c] += acc_b[c - c0];
    }
  }
}

}  // namespace anvil::cpu
