#include <algorithm>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {

void embedding_fwd(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                   int C) {
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < int64_t(B) * T; ++bt) {
    const float* te = wte + int64_t(tokens[bt]) * C;
    const float* pe = wpe + (bt % T) * C;
    float* o = out + bt * C;
    for (int c = 0; c < C; ++c) o[c] = te[c] + pe[c];
  }
}

void embedding_bwd(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C) {
  // Rows with the same token add into the same dwte row, so threads split the channels, not the rows:
  // each thread walks every row in order, which keeps the sums deterministic.
  constexpr int kBlock = 32;
  const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    for (int64_t bt = 0; bt < int64_t(B) * T; ++bt) {
      const float* d = dout + bt * C;
      float* te = dwte + int64_t(tokens[bt]) * C;
      float* pe = dwpe + (bt % T) * C;
      for (int c = c0; c < c1; ++c) {
        te[c] += d[c];
        pe[c] += d[c];
      }
    }
  }
}

}  // namespace anvil::cpu
