// Small device helpers shared by the CUDA kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

#include "anvil/dtype.hpp"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {

constexpr int kWarpSize = 32;

// Blocks for a grid-stride loop over n elements; capped so huge n loops instead of launching millions of
// blocks. n must be > 0.
inline unsigned grid_for(size_t n, int threads_per_block) {
  const size_t blocks = (n + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(std::min<size_t>(blocks, size_t{1} << 16));
}

// --- storage types: kernels are templated on the storage type and compute in fp32 ---------------------

using bf16 = __nv_bfloat16;
using fp16 = __half;

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(bf16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float to_float(fp16 x) {
  return __half2float(x);
}

// Round-to-nearest-even conversion from fp32 to the storage type.
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ fp16 from_float<fp16>(float x) {
  return __float2half_rn(x);
}

// *p += v in the storage type of p (atomic; 16-bit atomics need sm_70 for fp16, sm_80 for bf16).
__device__ __forceinline__ void atomic_add(float* p, float v) {
  atomicAdd(p, v);
}
__device__ __forceinline__ void atomic_add(bf16* p, float v) {
  atomicAdd(p, __float2bfloat16_rn(v));
}
__device__ __forceinline__ void atomic_add(fp16* p, float v) {
  atomicAdd(p, __float2half_rn(v));
}
// p[0..3] += v: one vector atomic for 16-byte aligned fp32 on sm_90 (a quarter of the L2 atomic operations
// of four scalar ones), else four.
template <class G>
__device__ __forceinline__ void atomic_add4(G* p, float4 v) {
#if __CUDA_ARCH__ >= 900
  if constexpr (std::is_same_v<G, float>) {
    if (reinterpret_cast<uintptr_t>(p) % 16 == 0) {
      atomicAdd(reinterpret_cast<float4*>(p), v);
      return;
    }
  }
#endif
  atomic_add(p, v.x), atomic_add(p + 1, v.y), atomic_add(p + 2, v.z), atomic_add(p + 3, v.w);
}

// The column sums of a block of (kColumns, kRows) threads, each holding `acc`, the sums of its four columns
// col..col + 3 over its rows: summed down threadIdx.y in `partial` (shared), then added to dst[col..col + 3]
// by the first row of threads (columns from `cols` on are skipped).
template <int kColumns, int kRows, class G>
__device__ __forceinline__ void add_block_column_sums(float4 (&partial)[kRows][kColumns], float4 acc, G* dst,
                                                      int col, int cols) {
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || col >= cols) return;
  float4 total = partial[0][threadIdx.x];
  for (int i = 1; i < kRows; ++i) {
    const float4 p = partial[i][threadIdx.x];
    total.x += p.x, total.y += p.y, total.z += p.z, total.w += p.w;
  }
  atomic_add4(dst + col, total);
}

// An attribute of the current device, queried once per device (launchers ask on every call).
template <cudaDeviceAttr kAttr>
inline int cached_device_attribute() {
  constexpr int kDevices = 64;
  static std::array<std::atomic<int>, kDevices> cached{};  // 0: not queried yet
  int dev = 0, value = 0;
  ANVIL_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < kDevices && (value = cached[dev].load(std::memory_order_relaxed)) > 0) return value;
  ANVIL_CUDA_CHECK(cudaDeviceGetAttribute(&value, kAttr, dev));
  if (dev < kDevices) cached[dev].store(value, std::memory_order_relaxed);
  return value;
}

// The opt-in shared memory per block of the current device.
inline int max_optin_smem() {
  return cached_device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>();
}

// The streaming multiprocessors of the current device (at least 1).
inline int sm_count() {
  return std::max(cached_device_attribute<cudaDevAttrMultiProcessorCount>(), 1);
}

// Opts `kernel` into `bytes` of dynamic shared memory once per device, before its first launch there (an
// eager step, outside any graph capture). Only the first call per kernel and device counts: pass the most any
// launch of the kernel will request.
inline void configure_for_current_device(const void* kernel, size_t bytes) {
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> configured;
  int dev = 0;
  ANVIL_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mutex);
  if (configured.insert({kernel, dev}).second)
    ANVIL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Calls f(T{}) with T the storage type of `dtype` (F32, BF16 or F16); the launchers use it to pick the
// kernel instantiation.
template <class F>
void dispatch_float(anvil::DType dtype, F&& f) {
  switch (dtype) {
    case anvil::DType::F32:
      f(float{});
      return;
    case anvil::DType::BF16:
      f(bf16{});
      return;
    case anvil::DType::F16:
      f(fp16{});
      return;
    default:
      anvil::detail::raise_at(
          __FILE__, __LINE__,
          "CUDA kernels support F32, BF16 and F16 storage, not " + std::string(anvil::dtype_name(dtype)));
  }
}

// The gradient multiplier of an optimizer kernel: grad_scale, times *grad_scale_device when that is set
// (the optimizer args of kernels/ops.hpp: a factor the device computed, e.g. the clip factor). Every thread
// reads the same word (one cached load); the product is rounded once, as the CPU kernels' is.
__device__ __forceinline__ float effective_grad_scale(float grad_scale, const float* grad_scale_device) {
  return grad_scale_device ? __fmul_rn(grad_scale, __ldg(grad_scale_device)) : grad_scale;
}

template <class T>
__device__ inline T warp_sum(T v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ inline float warp_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// Contains __syncthreads, so all threads of the block must call it.
template <class T>
__device__ inline T block_sum(T v) {
  __shared__ T warp_sums[32];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  T total = lane < num_warps ? warp_sums[lane] : T(0);
  return warp_sum(total);
}

// Maximum over the whole block, as block_sum (every thread gets it; all threads must call it).
__device__ inline float block_max(float v) {
  __shared__ float warp_maxes[32];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();  // warp_maxes may still be read by a previous call
  if (lane == 0) warp_maxes[warp] = v;
  __syncthreads();
  return warp_max(lane < num_warps ? warp_maxes[lane] : -INFINITY);
}

// Online softmax statistics: running max `m` and sum of exp(x - m). Combining handles empty (-inf) sides.
struct MaxSum {
  float max;
  float sum;
};

__device__ inline MaxSum max_sum_combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) return a;  // both empty
  return {m, a.sum * __expf(a.max - m) + b.sum * __expf(b.max - m)};
}

__device__ inline MaxSum max_sum_add(MaxSum s, float x) {
  if (x > s.max) return {x, s.sum * __expf(s.max - x) + 1.f};
  return {s.max, s.sum + __expf(x - s.max)};
}

__device__ inline MaxSum warp_max_sum(MaxSum s) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, s.max, offset), __shfl_xor_sync(0xffffffffu, s.sum, offset)};
    s = max_sum_combine(s, other);
  }
  return s;
}

// 16 bytes of T (8 bf16/fp16 or 4 fp32): one vector load or store. Memory-bound kernels use it where rows
// are whole vectors and 16-byte aligned.
template <class T>
struct alignas(16) Vec16 {
  static constexpr int kN = 16 / sizeof(T);
  T v[kN];
};

// Whether every row of these [rows, width] buffers of T is a whole number of aligned 16-byte vectors.
template <class T>
bool rows_vectorizable(int width, std::initializer_list<const void*> ptrs) {
  if (width % Vec16<T>::kN != 0) return false;
  for (const void* p : ptrs)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

}  // namespace anvil::cuda
