#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

// Logits (and their gradient, written in place) in the compute type; losses are fp32.
template <DType A>
void softmax_xent_t(float* losses, void* logits, const int32_t* targets, int N, int V, int Vp,
                    float grad_scale, bool write_grad) {
  using S = Storage<A>;
  std::atomic<int64_t> bad_row{-1};
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    auto* x = static_cast<storage_t<A>*>(logits) + r * Vp;
    const int32_t target = targets[r];
    if (target == kIgnoreIndex) {
      losses[r] = 0;
      if (write_grad)
        for (int j = 0; j < Vp; ++j) x[j] = S::store(0.0f);
      continue;
    }
    if (target < 0 || target >= V) {
      bad_row = r;
      continue;
    }
    float maxv = -INFINITY;
    for (int j = 0; j < V; ++j) maxv = std::max(maxv, S::load(x[j]));
    double sum = 0;
    for (int j = 0; j < V; ++j) sum += std::exp(double(S::load(x[j]) - maxv));
    losses[r] = float(std::log(sum) + maxv - S::load(x[target]));
    if (!write_grad) continue;
    const float inv = float(1.0 / sum);
    for (int j = 0; j < V; ++j)
      x[j] = S::store(grad_scale * (std::exp(S::load(x[j]) - maxv) * inv - (j == target ? 1.0f : 0.0f)));
    for (int j = V; j < Vp; ++j) x[j] = S::store(0.0f);
  }
  if (bad_row >= 0)
    ANVIL_THROW("target id {} at position {} is outside the vocabulary [0, {})", targets[bad_row.load()],
                bad_row.load(), V);
}

}  // namespace

void softmax_xent_fwd_bwd(DType act, float* losses, void* logits, const int32_t* targets, int N, int V,
                          int Vp, float grad_scale, bool write_grad) {
  dispatch_float(act, [&](auto a) {
    softmax_xent_t<decltype(a)::value>(losses, logits, targets, N, V, Vp, grad_scale, write_grad);
  });
}

}  // namespace anvil::cpu
