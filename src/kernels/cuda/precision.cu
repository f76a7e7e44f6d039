// Master weights (fp32) to the model's storage type, optionally with stochastic rounding for bf16. The
// rounding bits come from core/half.hpp's counter hash, so the CPU backend writes the same bits.
#include "core/half.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void cast_kernel(T* out, const float* master, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    out[i] = from_float<T>(master[i]);
}

__global__ void cast_bf16_stochastic_kernel(uint16_t* out, const float* master, size_t n, uint64_t seed,
                                            const uint64_t* seed_device) {
  if (seed_device) seed = *seed_device;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    out[i] = float_to_bf16_stochastic(master[i], rounding_bits(seed, i));
}

}  // namespace

void cast_weights(cudaStream_t stream, anvil::DType out_type, void* out, const float* master, size_t n,
                  uint64_t rounding_seed, const uint64_t* seed_device) {
  if (n == 0) return;
  if (out_type == anvil::DType::BF16 && rounding_seed != 0) {
    cast_bf16_stochastic_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<uint16_t*>(out), master, n, rounding_seed, seed_device);
  } else {
    dispatch_float(out_type, [&](auto t) {
      using T = decltype(t);
      cast_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<T*>(out), master, n);
    });
  }
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
