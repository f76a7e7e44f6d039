// Dropout (Ops::dropout, Ops::dropout_rows) and the micro-batch counter of its masks
// (Ops::dropout_next_micro). The mask is the counter hash of kernels/dropout.hpp, keyed by the seed and
// counter the kernel reads from device memory when it runs (a CUDA graph replays the step with the host's
// latest seed and the device's counter), so the CPU backend drops exactly the same elements. The threshold
// and the 1 / (1 - p) factor are computed on the host (the build's --use_fast_math would make a device
// division approximate): the product x * scale is one correctly rounded fp32 multiply on both backends.
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "kernels/dropout.hpp"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;

// threshold 0 (p == 0) keeps everything: the state is not read (and may be null).
__device__ __forceinline__ uint64_t state_key(const anvil::DropoutState* state, uint32_t site,
                                              uint32_t threshold) {
  return threshold ? anvil::dropout_key(state->seed, state->micro, site) : 0;
}

template <class T>
__device__ __forceinline__ T drop_one(T x, uint64_t key, uint64_t i, uint32_t threshold, float scale) {
  return anvil::dropout_keep(key, i, threshold) ? from_float<T>(__fmul_rn(to_float(x), scale))
                                                : from_float<T>(0.f);
}

// y may alias x: each element is read before the same thread writes it.
template <class T>
__global__ void dropout_kernel(T* y, const T* x, size_t n, uint32_t threshold, float scale,
                               const anvil::DropoutState* state, uint32_t site) {
  const uint64_t key = state_key(state, site, threshold);
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    y[i] = drop_one(x[i], key, i, threshold, scale);
}

// The same over 16-byte vectors (x and y 16-byte aligned): vectors [0, n / kN), then the last n % kN elements
// one per thread of the first threads.
template <class T>
__global__ void dropout_vec_kernel(T* y, const T* x, size_t n, uint32_t threshold, float scale,
                                   const anvil::DropoutState* state, uint32_t site) {
  using V = Vec16<T>;
  const uint64_t key = state_key(state, site, threshold);
  const size_t num_vecs = n / V::kN;
  const size_t first = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  for (size_t v = first; v < num_vecs; v += size_t{gridDim.x} * blockDim.x) {
    V in = reinterpret_cast<const V*>(x)[v];
    V out;
#pragma unroll
    for (int k = 0; k < V::kN; ++k) out.v[k] = drop_one(in.v[k], key, v * V::kN + k, threshold, scale);
    reinterpret_cast<V*>(y)[v] = out;
  }
  const size_t tail = num_vecs * V::kN + first;
  if (tail < n) y[tail] = drop_one(x[tail], key, tail, threshold, scale);
}

template <class T>
__global__ void dropout_rows_kernel(T* y, const T* x, int rows, int cols, size_t index_pitch,
                                    uint32_t threshold, float scale, const anvil::DropoutState* state,
                                    uint32_t site) {
  const uint64_t key = state_key(state, site, threshold);
  const size_t n = size_t(rows) * cols;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const size_t r = i / cols, c = i % cols;
    y[i] = drop_one(x[i], key, r * index_pitch + c, threshold, scale);
  }
}

__global__ void dropout_next_micro_kernel(anvil::DropoutState* state) {
  state->micro += 1;
}

}  // namespace

void dropout(cudaStream_t stream, anvil::DType act, void* y, const void* x, size_t n, float p,
             const anvil::DropoutState* state, uint32_t site) {
  if (n == 0) return;
  const uint32_t threshold = anvil::dropout_threshold(p);
  const float scale = anvil::dropout_scale(p);
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    T* out = static_cast<T*>(y);
    const T* in = static_cast<const T*>(x);
    constexpr int kN = Vec16<T>::kN;
    if (n >= size_t{kN} && rows_vectorizable<T>(kN, {y, x}))
      dropout_vec_kernel<<<grid_for(n / kN, kThreads), kThreads, 0, stream>>>(out, in, n, threshold, scale,
                                                                              state, site);
    else
      dropout_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(out, in, n, threshold, scale, state,
                                                                     site);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void dropout_rows(cudaStream_t stream, anvil::DType act, void* y, const void* x, int rows, int cols,
                  size_t index_pitch, float p, const anvil::DropoutState* state, uint32_t site) {
  const size_t n = size_t(rows) * cols;
  if (n == 0) return;
  const uint32_t threshold = anvil::dropout_threshold(p);
  const float scale = anvil::dropout_scale(p);
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    dropout_rows_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(x), rows, cols, index_pitch, threshold, scale, state, site);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void dropout_next_micro(cudaStream_t stream, anvil::DropoutState* state) {
  dropout_next_micro_kernel<<<1, 1, 0, stream>>>(state);
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
