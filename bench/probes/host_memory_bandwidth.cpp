// Is the offloaded optimizer's CPU update (docs/memory.md, optimizer offload) bound by the host's memory
// bandwidth? Measures what the host's cores move with OpenMP: a copy (read a, write b), a triad (read a
// and b, write c) and an AdamW-shaped pass over fp32 arrays (read and write p, m, v; read g: 28 bytes a
// parameter, the bytes Anvil's host AdamW moves), each over 1.24e9 floats (the Llama-3.2-1B shape's
// parameter count), best of 5.
//   g++ -O3 -march=native -fopenmp bench/probes/host_memory_bandwidth.cpp -o /tmp/hmb && /tmp/hmb
// Prints GB/s per pass and the AdamW-shaped pass's seconds, to compare with `anvil bench-optimizer --model
// llama-1b --device cpu` (0.306 s on the 32-core host of 2 H200s).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>

namespace {

using Clock = std::chrono::steady_clock;

struct Free {
  void operator()(float* p) const { std::free(p); }
};
using Array = std::unique_ptr<float[], Free>;

Array make(size_t n, float value) {
  Array a(static_cast<float*>(std::aligned_alloc(64, n * sizeof(float))));
  if (!a) {
    std::fprintf(stderr, "out of host memory for %zu floats\n", n);
    std::exit(1);
  }
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) a[i] = value;  // first touch by the thread that uses the page
  return a;
}

template <class F>
double best_seconds(F&& pass) {
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t = Clock::now();
    pass();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t n = argc > 1 ? size_t(std::atof(argv[1])) : size_t(1.24e9);
  Array p = make(n, 1.0f), g = make(n, 1e-3f), m = make(n, 0.0f), v = make(n, 0.0f);
  std::printf("%d threads, %zu floats per array\n", omp_get_max_threads(), n);
  const double copy = best_seconds([&] {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) m[i] = p[i];
  });
  std::printf("copy   %7.1f GB/s\n", 8.0 * double(n) / copy / 1e9);
  const double triad = best_seconds([&] {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) v[i] = p[i] + 0.5f * g[i];
  });
  std::printf("triad  %7.1f GB/s\n", 12.0 * double(n) / triad / 1e9);
  const float b1 = 0.9f, b2 = 0.999f, lr = 1e-5f, eps = 1e-8f, decay = 1.0f - 1e-6f;
  const double adamw = best_seconds([&] {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i];
      const float mi = b1 * m[i] + (1.0f - b1) * gi, vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi, v[i] = vi;
      p[i] = p[i] * decay - lr * mi / (std::sqrt(vi) + eps);
    }
  });
  std::printf("adamw  %7.1f GB/s (28 bytes a parameter), %.3f s for %zu parameters\n",
              28.0 * double(n) / adamw / 1e9, adamw, n);
  return 0;
}
