#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {

void softmax_xent_fwd_bwd(float* losses, float* logits, const int32_t* targets, int N, int V, int Vp,
                          float grad_scale, bool write_grad) {
  std::atomic<int64_t> bad_row{-1};
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    float* x = logits + r * Vp;
    const int32_t target = targets[r];
    if (target == kIgnoreIndex) {
      losses[r] = 0;
      if (write_grad)
        for (int j = 0; j < Vp; ++j) x[j] = 0;
      continue;
    }
    if (target < 0 || target >= V) {
      bad_row = r;
      continue;
    }
    float maxv = -INFINITY;
    for (int j = 0; j < V; ++j) maxv = std::max(maxv, x[j]);
    double sum = 0;
    for (int j = 0; j < V; ++j) sum += std::exp(double(x[j] - maxv));
    losses[r] = float(std::log(sum) + maxv - x[target]);
    if (!write_grad) continue;
    const float inv = float(1.0 / sum);
    for (int j = 0; j < V; ++j)
      x[j] = grad_scale * (std::exp(x[j] - maxv) * inv - (j == target ? 1.0f : 0.0f));
    for (int j = V; j < Vp; ++j) x[j] = 0;
  }
  if (bad_row >= 0)
    ANVIL_THROW("target id {} at position {} is outside the vocabulary [0, {})", targets[bad_row.load()],
                bad_row.load(), V);
}

}  // namespace anvil::cpu
