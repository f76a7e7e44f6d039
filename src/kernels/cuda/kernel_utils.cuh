// Small device helpers shared by the CUDA kernels.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

namespace anvil::cuda {

constexpr int kWarpSize = 32;

// Blocks for a grid-stride loop over n elements; capped so huge n loops instead of launching millions of
// blocks. n must be > 0.
inline unsigned grid_for(size_t n, int threads_per_block) {
  const size_t blocks = (n + threads_per_block - 1) / threads_per_block;
  return static_cast<unsigned>(std::min<size_t>(blocks, size_t{1} << 16));
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

}  // namespace anvil::cuda
