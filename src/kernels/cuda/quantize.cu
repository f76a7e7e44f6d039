// Ops::dequantize on the GPU: each thread turns one code byte into its element(s) (two for NF4, one for
// int8), with the format's formula (kernels/quantization.cpp: dequantized_value), so the result is the CPU
// reference's bit for bit. Memory-bound: codes and scales are read once, the compute-type matrix written
// once.
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;

// The table travels by value with each launch (kernel parameters live in constant memory on every device).
struct Nf4Table {
  float v[16];
};

template <class T>
__global__ void dequantize_nf4_kernel(T* out, const uint8_t* codes, const float* scales, size_t n,
                                      Nf4Table code) {
  const size_t bytes = (n + 1) / 2;
  for (size_t b = blockIdx.x * size_t{blockDim.x} + threadIdx.x; b < bytes;
       b += size_t{gridDim.x} * blockDim.x) {
    const uint8_t c = codes[b];
    const size_t i = 2 * b;
    // Both elements of a byte are in one block (blocks hold an even number of elements).
    const float s = scales[i / anvil::kNf4BlockSize];
    out[i] = from_float<T>(code.v[c >> 4] * s);
    if (i + 1 < n) out[i + 1] = from_float<T>(code.v[c & 0xF] * s);
  }
}

template <class T>
__global__ void dequantize_int8_kernel(T* out, const int8_t* codes, const float* scales, size_t n,
                                       size_t cols) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    out[i] = from_float<T>(static_cast<float>(codes[i]) * __fmul_rn(scales[i / cols], anvil::kInt8Step));
}

}  // namespace

void dequantize(cudaStream_t stream, anvil::DType act, void* out, const anvil::QuantizedMatrix& m) {
  const size_t n = m.numel();
  if (n == 0) return;
  Nf4Table table;
  for (int i = 0; i < 16; ++i) table.v[i] = anvil::kNf4Code[i];
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    if (m.storage == anvil::WeightStorage::NF4) {
      dequantize_nf4_kernel<T><<<grid_for((n + 1) / 2, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(out), m.codes, m.scales, n, table);
    } else {
      // (CudaOps::dequantize checked the storage.)
      dequantize_int8_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(out), reinterpret_cast<const int8_t*>(m.codes), m.scales, n, size_t(m.cols));
    }
  });
  ANVIL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace anvil::cuda
