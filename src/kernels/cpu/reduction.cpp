#include <algorithm>
#include <array>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
// Squares are non-negative and summed in fp64, so finite inputs never overflow and an inf or NaN element
// always leaves the sum non-finite (the fp16 overflow check).
double sum_squares(DType dtype, const void* x, size_t n) {
  return dispatch_float(dtype, [&](auto d) {
    using S = Storage<decltype(d)::value>;
    const auto* p = static_cast<const typename S::type*>(x);
    return fixed_order_sum<256>(n, [p](size_t i) {
      const double v = S::load(p[i]);
      return v * v;
    });
  });
}

double sum(const float* x, size_t n) {
  return fixed_order_sum<256>(n, [x](size_t i) { return double(x[i]); });
}

}  // namespace anvil::cpu
