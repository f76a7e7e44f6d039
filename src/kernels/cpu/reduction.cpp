#include <algorithm>
#include <array>
#include <cmath>

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

// The CPU computes synchronously on the calling thread, so the device-result forms are the host ones
// writing into (host) memory: the values are those of sum / sum_squares by construction.
void accumulate_sum(double* out, const float* x, size_t n) {
  *out += sum(x, n);
}

void sum_squares_to(DType dtype, double* out, const void* x, size_t n) {
  *out = sum_squares(dtype, x, n);
}

void grad_clip_scale(float* scale_out, double* norm_out, const double* sum_squares, double unscale,
                     double max_norm) {
  // The trainer's former host arithmetic, operation for operation (the CUDA kernel repeats it in fp64 with
  // explicitly rounded operations), so the clipped update is unchanged.
  const double norm = std::sqrt(*sum_squares) * unscale;
  const float clip = max_norm > 0 && norm > max_norm ? float(max_norm / (norm + 1e-6)) : 1.0f;
  *norm_out = norm;
  *scale_out = float(double(clip) * unscale);
}

void convert(DType dst_type, void* dst, DType src_type, const void* src, size_t n, bool accumulate) {
  dispatch_float(dst_type, [&](auto d) {
    dispatch_float(src_type, [&](auto s) {
      using D = Storage<decltype(d)::value>;
      using S = Storage<decltype(s)::value>;
      auto* y = static_cast<typename D::type*>(dst);
      const auto* x = static_cast<const typename S::type*>(src);
      if (accumulate)
        for (size_t i = 0; i < n; ++i) y[i] = D::store(D::load(y[i]) + S::load(x[i]));
      else
        for (size_t i = 0; i < n; ++i) y[i] = D::store(S::load(x[i]));
    });
  });
}

}  // namespace anvil::cpu
