// Sums over up to billions of fp32/bf16/fp16 values: a fixed grid of blocks accumulates fp64 partials (so the
// order, and the result, is deterministic for a given n), then one block adds the partials. No atomics:
// the device-result form (reduce_sum_to) gives the same value as the host-returning one, run after run.
// Also the gradient-clipping factor (grad_clip_scale), so a training step never reads its norm on the host.
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

// *result = the sum of the partials, or *result += it with kAccumulate (one thread writes: ordered).
template <bool kAccumulate>
__global__ void reduce_final_kernel(double* result, const double* partials, int count) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = block_sum(acc);
  if (threadIdx.x == 0) *result = kAccumulate ? *result + acc : acc;
}

// Both passes, queued on `stream`: partials into scratch[0, kReducePartials), the total into `result`.
void queue_reduce(cudaStream_t stream, anvil::DType dtype, const void* x, size_t n, bool square,
                  double* scratch, double* result, bool accumulate) {
  const int blocks = static_cast<int>(std::min<size_t>(kReducePartials, (n + kThreads - 1) / kThreads));
  if (blocks > 0) {
    dispatch_float(dtype, [&](auto t) {
      using T = decltype(t);
      const T* xt = static_cast<const T*>(x);
      if (square)
        reduce_partials_kernel<true><<<blocks, kThreads, 0, stream>>>(scratch, xt, n);
      else
        reduce_partials_kernel<false><<<blocks, kThreads, 0, stream>>>(scratch, xt, n);
    });
    ANVIL_CUDA_CHECK_LAST();
  }
  // With n == 0 the final pass still runs (over no partials): *result = 0, or unchanged when accumulating.
  if (accumulate)
    reduce_final_kernel<true><<<1, kThreads, 0, stream>>>(result, scratch, blocks);
  else
    reduce_final_kernel<false><<<1, kThreads, 0, stream>>>(result, scratch, blocks);
  ANVIL_CUDA_CHECK_LAST();
}

// The trainer's host arithmetic (cpu::grad_clip_scale) in fp64, each operation explicitly rounded so that
// nvcc cannot contract a multiply and an add into an FMA (which would round once instead of twice and
// could change the clip factor's last bit). fp64 math is IEEE-exact under --use_fast_math.
__global__ void grad_clip_scale_kernel(float* scale_out, double* norm_out, const double* sum_squares,
                                       double unscale, const double* unscale_device, double max_norm) {
  if (unscale_device) unscale = *unscale_device;
  const double norm = __dmul_rn(__dsqrt_rn(*sum_squares), unscale);
  float clip = 1.0f;
  if (max_norm > 0 && norm > max_norm) clip = __double2float_rn(__ddiv_rn(max_norm, __dadd_rn(norm, 1e-6)));
  *norm_out = norm;
  *scale_out = __double2float_rn(__dmul_rn(static_cast<double>(clip), unscale));
}

}  // namespace

double reduce_sum(cudaStream_t stream, anvil::DType dtype, const void* x, size_t n, bool square,
                  double* scratch) {
  if (n == 0) return 0.0;
  double* result = scratch + kReducePartials;
  queue_reduce(stream, dtype, x, n, square, scratch, result, /*accumulate=*/false);
  double host_result = 0.0;
  ANVIL_CUDA_CHECK(cudaMemcpyAsync(&host_result, result, sizeof(double), cudaMemcpyDeviceToHost, stream));
  ANVIL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host_result;
}

void reduce_sum_to(cudaStream_t stream, anvil::DType dtype, const void* x, size_t n, bool square,
                   double* scratch, double* out, bool accumulate) {
  queue_reduce(stream, dtype, x, n, square, scratch, out, accumulate);
}

void grad_clip_scale(cudaStream_t stream, float* scale_out, double* norm_out, const double* sum_squares,
                     double unscale, const double* unscale_device, double max_norm) {
  grad_clip_scale_kernel<<<1, 1, 0, stream>>>(scale_out, norm_out, sum_squares, unscale, unscale_device,
                                              max_norm);
  ANVIL_CUDA_CHECK_LAST();
}

namespace {
template <class D, class S, bool kAccumulate>
__global__ void convert_kernel(D* dst, const S* src, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<D>(kAccumulate ? to_float(dst[i]) + to_float(src[i]) : to_float(src[i]));
}

// convert_kernel, each block's squares of the written values into partials[block].
template <class D, class S, bool kAccumulate>
__global__ void convert_sum_squares_kernel(double* partials, D* dst, const S* src, size_t n) {
  double acc = 0.0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const D y = from_float<D>(kAccumulate ? to_float(dst[i]) + to_float(src[i]) : to_float(src[i]));
    dst[i] = y;
    const double v = to_float(y);
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Calls launch(dst as D*, src as const S*, accumulate as std::bool_constant) for the runtime types.
template <class Launch>
void dispatch_convert(anvil::DType dst_type, void* dst, anvil::DType src_type, const void* src,
                      bool accumulate, Launch launch) {
  dispatch_float(dst_type, [&](auto d) {
    dispatch_float(src_type, [&](auto s) {
      auto* y = static_cast<decltype(d)*>(dst);
      const auto* x = static_cast<const decltype(s)*>(src);
      if (accumulate)
        launch(y, x, std::true_type{});
      else
        launch(y, x, std::false_type{});
    });
  });
}
}  // namespace

void convert_sum_squares(cudaStream_t stream, anvil::DType dst_type, void* dst, anvil::DType src_type,
                         const void* src, size_t n, bool accumulate, double* scratch, double* sum_squares) {
  if (n == 0) return;
  const int blocks = static_cast<int>(std::min<size_t>(kReducePartials, (n + kThreads - 1) / kThreads));
  dispatch_convert(dst_type, dst, src_type, src, accumulate, [&](auto* y, const auto* x, auto acc) {
    using D = std::remove_pointer_t<decltype(y)>;
    using S = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
    convert_sum_squares_kernel<D, S, decltype(acc)::value><<<blocks, kThreads, 0, stream>>>(scratch, y, x, n);
  });
  ANVIL_CUDA_CHECK_LAST();
  reduce_final_kernel<true><<<1, kThreads, 0, stream>>>(sum_squares, scratch, blocks);
  ANVIL_CUDA_CHECK_LAST();
}

void convert(cudaStream_t stream, anvil::DType dst_type, void* dst, anvil::DType src_type, const void* src,
             size_t n, bool accumulate) {
  if (n == 0) return;
  dispatch_convert(dst_type, dst, src_type, src, accumulate, [&](auto* y, const auto* x, auto acc) {
    using D = std::remove_pointer_t<decltype(y)>;
    using S = std::remove_const_t<std::remove_pointer_t<decltype(x)>>;
    convert_kernel<D, S, decltype(acc)::value><<<grid_for(n, kThreads), kThreads, 0, stream>>>(y, x, n);
  });
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
