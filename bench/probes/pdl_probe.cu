// bench/probes/pdl_probe.cu: what programmatic dependent launch (PDL) would save at the kernel boundaries of
// a replayed training step. A profiled bert-large step (strict fp32, H100) has 807 kernels and 1.5 ms of idle
// time between them (about 1.9 us a boundary) although it is one CUDA graph. With PDL a kernel is launched
// with cudaLaunchAttributeProgrammaticStreamSerialization and starts with `griddepcontrol.wait` (it waits
// there until its predecessor has finished and its writes are visible), so its launch and block
// scheduling can overlap the predecessor's tail instead of following its completion.
//
// Chains recorded as CUDA graphs, each "layer" an fp32 GEMM (cuBLASLt, bert-large's attention-output shape:
// 2048 x 1024 x 1024) followed by two memory-bound elementwise kernels over its 8 MB output (the shape of the
// step's LayerNorm and GELU kernels), and a chain of the elementwise kernels alone. Each is timed with plain
// launches and with the elementwise kernels launched with PDL (and, in the primaries, `launch_dependents`
// at entry). Standalone, built on the GPU machine with nvcc alone:
//   nvcc -O3 -std=c++17 -arch=sm_90 bench/probes/pdl_probe.cu -lcublasLt -lcublas -o /tmp/pdl_probe &&
//   /tmp/pdl_probe
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "cuda_bench_util.cuh"

namespace {

// y = x * a + b elementwise (float4), optionally waiting for the predecessor (PDL) and letting the next
// kernel launch early. Both griddepcontrol instructions are no-ops for a kernel launched without PDL.
template <bool kPdl>
__global__ void elementwise(float4* y, const float4* x, size_t n4, float a, float b) {
  if constexpr (kPdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;");
  }
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4;
       i += size_t(gridDim.x) * blockDim.x) {
    float4 v = x[i];
    v.x = v.x * a + b, v.y = v.y * a + b, v.z = v.z * a + b, v.w = v.w * a + b;
    y[i] = v;
  }
}

template <bool kPdl>
void launch_elementwise(cudaStream_t s, float* y, const float* x, size_t n, float a, float b) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(132 * 4);
  cfg.blockDim = dim3(256);
  cfg.stream = s;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  if (kPdl) cfg.attrs = &attr, cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, elementwise<kPdl>, reinterpret_cast<float4*>(y),
                        reinterpret_cast<const float4*>(x), n / 4, a, b));
}

}  // namespace

int main() {
  const int M = 2048, N = 1024, K = 1024, kLayers = 100;
  const size_t n = size_t(M) * N;
  float *x, *w, *c, *y;
  CK(cudaMalloc(&x, n * sizeof(float)));
  CK(cudaMalloc(&w, size_t(N) * K * sizeof(float)));
  CK(cudaMalloc(&c, n * sizeof(float)));
  CK(cudaMalloc(&y, n * sizeof(float)));
  CK(cudaMemset(x, 0, n * sizeof(float)));
  // W = 1/K everywhere: each layer maps a constant x to (x + 1) / 2, exactly, so a kernel that read its
  // input before the predecessor had written it would leave a different value.
  const std::vector<float> host_w(size_t(N) * K, 1.f / K);
  CK(cudaMemcpy(w, host_w.data(), host_w.size() * sizeof(float), cudaMemcpyHostToDevice));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  LtLinearGemm gemm(M, N, K);

  const auto layers = [&](auto pdl, int count) {
    constexpr bool kPdl = decltype(pdl)::value;
    for (int l = 0; l < count; ++l) {
      gemm.run(s, c, x, w);                             // c = x W^T
      launch_elementwise<kPdl>(s, y, c, n, 1.f, 1.f);   // y = c + 1
      launch_elementwise<kPdl>(s, x, y, n, 0.5f, 0.f);  // x = y / 2 (the next layer's input)
    }
  };
  const auto chain = [&](auto pdl) {
    constexpr bool kPdl = decltype(pdl)::value;
    for (int l = 0; l < kLayers; ++l) {
      launch_elementwise<kPdl>(s, y, c, n, 1.f, 1.f);
      launch_elementwise<kPdl>(s, c, y, n, 1.f, -1.f);
    }
  };
  const auto gemms = [&] {
    for (int l = 0; l < kLayers; ++l) gemm.run(s, c, x, w);
  };
  for (int rep = 0; rep < 2; ++rep) {
    const double g = time_graph(s, gemms);
    const double lp = time_graph(s, [&] { layers(std::false_type{}, kLayers); });
    const double lq = time_graph(s, [&] { layers(std::true_type{}, kLayers); });
    const double cp = time_graph(s, [&] { chain(std::false_type{}); });
    const double cq = time_graph(s, [&] { chain(std::true_type{}); });
    std::printf(
        "%d layers of GEMM + 2 elementwise: plain %.1f us, PDL %.1f us (%.2f us less a PDL boundary); "
        "GEMMs alone %.1f us\n",
        kLayers, lp, lq, (lp - lq) / (2 * kLayers), g);
    std::printf(
        "%d elementwise kernels chained: plain %.1f us (%.2f us each), PDL %.1f us (%.2f us less a "
        "boundary)\n",
        2 * kLayers, cp, cp / (2 * kLayers), cq, (cp - cq) / (2 * kLayers));
  }
  // The results must not depend on the launch mode: 20 layers from x = 0 leave about 1 - 2^-20 everywhere
  // (the GEMM's sums may round), the same value both ways.
  float a = 0, b = 0;
  CK(cudaMemsetAsync(x, 0, n * sizeof(float), s));
  layers(std::false_type{}, 20);
  CK(cudaMemcpyAsync(&a, x + n - 1, sizeof(float), cudaMemcpyDeviceToHost, s));
  CK(cudaMemsetAsync(x, 0, n * sizeof(float), s));
  layers(std::true_type{}, 20);
  CK(cudaMemcpyAsync(&b, x + n - 1, sizeof(float), cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  const float want = 1.f - 1.f / (1 << 20);
  std::printf("check: the last element after 20 layers, plain %.9g, PDL %.9g, expected about %.9g: %s\n", a,
              b, want, a == b && std::fabs(a - want) < 1e-6f ? "PASS" : "FAIL");
  return 0;
}
