#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {

void adamw_step(float* param, const float* grad, float* m, float* v, size_t n, const AdamWArgs& a) {
  const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  const float step_size = float(a.lr / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float decay = 1.0f - a.lr * a.weight_decay;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    const float g = grad[i] * a.grad_scale;
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + a.eps);
  }
}

}  // namespace anvil::cpu
