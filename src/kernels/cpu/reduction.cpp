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

double sum_squares(const float* x, size_t n) {
  return chunked_sum(n, [x](size_t i) { return double(x[i]) * x[i]; });
}

double sum(const float* x, size_t n) {
  return chunked_sum(n, [x](size_t i) { return double(x[i]); });
}

}  // namespace anvil::cpu
