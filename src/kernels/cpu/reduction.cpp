#include <algorithm>
#include <array>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

// A fixed number of chunks, each summed in order and then combined in order: the result does not
// depend on the number of threads.
template <class F>
double chunked_sum(size_t n, F&& term) {
  constexpr int kChunks = 256;
  std::array<double, kChunks> partial{};
  const size_t chunk = (n + kChunks - 1) / kChunks;
#pragma omp parallel for schedule(static)
  for (int c = 0; c < kChunks; ++c) {
    const size_t begin = c * chunk, end = std::min(n, begin + chunk);
    double s = 0;
    for (size_t i = begin; i < end; ++i) s += term(i);
    partial[c] = s;
  }
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

// Squares are non-negative and summed in fp64, so finite inputs never overflow and an inf or NaN element
// always leaves the sum non-finite (the fp16 overflow check).
double sum_squares(DType dtype, const void* x, size_t n) {
  return dispatch_float(dtype, [&](auto d) {
    using S = Storage<decltype(d)::value>;
    const auto* p = static_cast<const typename S::type*>(x);
    return chunked_sum(n, [p](size_t i) {
      const double v = S::load(p[i]);
      return v * v;
    });
  });
}

double sum(const float* x, size_t n) {
  return chunked_sum(n, [x](size_t i) { return double(x[i]); });
}

}  // namespace anvil::cpu
