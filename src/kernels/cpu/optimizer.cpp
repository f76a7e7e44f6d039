#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

// Parameters and moments are fp32; the gradient is widened from its storage type.
template <DType G>
void adamw_t(float* param, const void* grad_, float* m, float* v, size_t n, const AdamWArgs& a) {
  const auto* grad = static_cast<const storage_t<G>*>(grad_);
  const double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  const double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  const float step_size = float(a.lr / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float decay = 1.0f - a.lr * a.weight_decay;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    const float g = Storage<G>::load(grad[i]) * a.grad_scale;
    const float mi = a.beta1 * m[i] + (1.0f - a.beta1) * g;
    const float vi = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] = param[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + a.eps);
  }
}

}  // namespace

void adamw_step(DType grad_type, float* param, const void* grad, float* m, float* v, size_t n,
                const AdamWArgs& a) {
  dispatch_float(grad_type, [&](auto g) { adamw_t<decltype(g)::value>(param, grad, m, v, n, a); });
}

}  // namespace anvil::cpu
