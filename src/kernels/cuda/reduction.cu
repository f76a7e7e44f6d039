// Sums over up to billions of fp32/bf16/fp16 values: a fixed grid of blocks accumulates fp64 partials (so the
// order, and the result, is deterministic for a given n), then one block adds the partials.
#include <type_traits>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;

template <bool kSquare>
__device__ inline double term(float x) {
  return kSquare ? static_cast<double>(x) * x : static_cast<double>(x);
}

template <bool kSquare, class T>
__global__ void reduce_partials_kernel(double* partials, const T* x, size_t n) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  const size_t first = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  double acc = 0.0;
  // 16-byte vector loads when the pointer allows; the scalar loop covers the tail (or everything).
  size_t scalar_begin = 0;
  if constexpr (std::is_same_v<T, float>) {
    if (reinterpret_cast<uintptr_t>(x) % sizeof(float4) == 0) {
      const size_t n4 = n / 4;
      const float4* x4 = reinterpret_cast<const float4*>(x);
      for (size_t i = first; i < n4; i += stride) {
        const float4 v = x4[i];
        acc += term<kSquare>(v.x) + term<kSquare>(v.y) + term<kSquare>(v.z) + term<kSquare>(v.w);
      }
      scalar_begin = n4 * 4;
    }
  }
  for (size_t i = scalar_begin + first; i < n; i += stride) acc += term<kSquare>(to_float(x[i]));
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

__global__ void reduce_final_kernel(double* result, const double* partials, int count) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *result = acc;
}

}  // namespace

double reduce_sum(cudaStream_t stream, anvil::DType dtype, const void* x, size_t n, bool square,
                  double* scratch) {
  if (n == 0) return 0.0;
  const int blocks = static_cast<int>(std::min<size_t>(kReducePartials, (n + kThreads - 1) / kThreads));
  dispatch_float(dtype, [&](auto t) {
    using T = decltype(t);
    const T* xt = static_cast<const T*>(x);
    if (square)
      reduce_partials_kernel<true><<<blocks, kThreads, 0, stream>>>(scratch, xt, n);
    else
      reduce_partials_kernel<false><<<blocks, kThreads, 0, stream>>>(scratch, xt, n);
  });
  ANVIL_CUDA_CHECK_LAST();
  double* result = scratch + kReducePartials;
  reduce_final_kernel<<<1, kThreads, 0, stream>>>(result, scratch, blocks);
  ANVIL_CUDA_CHECK_LAST();
  double host_result = 0.0;
  ANVIL_CUDA_CHECK(cudaMemcpyAsync(&host_result, result, sizeof(double), cudaMemcpyDeviceToHost, stream));
  ANVIL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host_result;
}

}  // namespace anvil::cuda
