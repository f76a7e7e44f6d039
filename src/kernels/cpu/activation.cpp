#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoef = 0.044715f;
}  // namespace

void gelu_fwd(float* out, const float* inp, size_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kGeluCoef * x * x * x)));
  }
}

void gelu_bwd(float* dinp, const float* inp, const float* dout, size_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    const float x = inp[i];
    const float th = std::tanh(kSqrt2OverPi * (x + kGeluCoef * x * x * x));
    const float dth = (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoef * x * x);
    dinp[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * x * dth);
  }
}

void residual_fwd(float* out, const float* a, const float* b, size_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) out[i] = a[i] + b[i];
}

}  // namespace anvil::cpu
