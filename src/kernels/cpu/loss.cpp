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

// Sequence classification (Ops::classification_loss): the same numerics as softmax_xent_t per row.
template <DType A>
void classification_loss_t(float* losses, void* dlogits_, const void* logits_, const void* labels, int N,
                           int NL, float grad_scale) {
  using S = Storage<A>;
  const auto* logits = static_cast<const storage_t<A>*>(logits_);
  auto* dlogits = static_cast<storage_t<A>*>(dlogits_);
  if (NL == 1) {
    const auto* y = static_cast<const float*>(labels);
    for (int i = 0; i < N; ++i) {
      const float d = S::load(logits[i]) - y[i];
      losses[i] = d * d;
      if (dlogits) dlogits[i] = S::store(grad_scale * 2.0f * d);
    }
    return;
  }
  const auto* y = static_cast<const int32_t*>(labels);
  for (int r = 0; r < N; ++r) {
    const auto* x = logits + int64_t(r) * NL;
    auto* dx = dlogits ? dlogits + int64_t(r) * NL : nullptr;
    const int32_t label = y[r];
    if (label == kIgnoreIndex) {
      losses[r] = 0;
      if (dx) std::fill_n(dx, NL, S::store(0.0f));
      continue;
    }
    ANVIL_REQUIRE(label >= 0 && label < NL, "label {} of sequence {} is outside [0, num_labels = {})", label,
                  r, NL);
    float maxv = -INFINITY;
    for (int j = 0; j < NL; ++j) maxv = std::max(maxv, S::load(x[j]));
    double sum = 0;
    for (int j = 0; j < NL; ++j) sum += std::exp(double(S::load(x[j]) - maxv));
    losses[r] = float(std::log(sum) + maxv - S::load(x[label]));
    if (!dx) continue;
    const float inv = float(1.0 / sum);
    for (int j = 0; j < NL; ++j)
      dx[j] = S::store(grad_scale * (std::exp(S::load(x[j]) - maxv) * inv - (j == label ? 1.0f : 0.0f)));
  }
}

}  // namespace

void classification_loss(DType act, float* losses, void* dlogits, const void* logits, const void* labels,
                         int N, int NL, float grad_scale) {
  dispatch_float(act, [&](auto a) {
    classification_loss_t<decltype(a)::value>(losses, dlogits, logits, labels, N, NL, grad_scale);
  });
}

void softmax_xent_fwd_bwd(DType act, float* losses, void* logits, const int32_t* targets, int N, int V,
                          int Vp, float grad_scale, bool write_grad) {
  dispatch_float(act, [&](auto a) {
    softmax_xent_t<decltype(a)::value>(losses, logits, targets, N, V, Vp, grad_scale, write_grad);
  });
}

}  // namespace anvil::cpu
