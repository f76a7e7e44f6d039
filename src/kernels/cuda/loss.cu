// Fused softmax + cross-entropy over the (padded) vocabulary: one block per row.
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 512;

// Block-wide online max/sum; every thread gets the result. All threads of the block must call it.
__device__ MaxSum block_max_sum(MaxSum s) {
  __shared__ float warp_max[32], warp_sum_exp[32];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int num_warps = blockDim.x / kWarpSize;
  s = warp_max_sum(s);
  if (lane == 0) warp_max[warp] = s.max, warp_sum_exp[warp] = s.sum;
  __syncthreads();
  MaxSum total = lane < num_warps ? MaxSum{warp_max[lane], warp_sum_exp[lane]} : MaxSum{-INFINITY, 0.f};
  return warp_max_sum(total);
}

template <class T>
__global__ void softmax_xent_kernel(float* losses, T* logits, const int32_t* targets, int V, int Vp,
                                    float grad_scale, bool write_grad, int32_t ignore_index) {
  const size_t row = blockIdx.x;
  T* x = logits + row * Vp;
  const int target = targets[row];
  if (target == ignore_index) {
    if (threadIdx.x == 0) losses[row] = 0.f;
    if (write_grad)
      for (int j = threadIdx.x; j < Vp; j += blockDim.x) x[j] = from_float<T>(0.f);
    return;  // the whole block takes this branch
  }
  // A target outside [0, V) is a data bug: report it as a NaN loss rather than read out of bounds.
  const bool target_valid = target >= 0 && target < V;
  // Read before the barrier inside block_max_sum, so before any thread overwrites the row with gradients.
  const float target_logit = target_valid ? to_float(x[target]) : 0.f;

  MaxSum stats{-INFINITY, 0.f};
  for (int j = threadIdx.x; j < V; j += blockDim.x) stats = max_sum_add(stats, to_float(x[j]));
  stats = block_max_sum(stats);
  if (threadIdx.x == 0) losses[row] = target_valid ? stats.max + __logf(stats.sum) - target_logit : NAN;
  if (!write_grad) return;
  const float inv_sum = 1.f / stats.sum;
  for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
    float grad = 0.f;
    if (j < V) grad = grad_scale * (__expf(to_float(x[j]) - stats.max) * inv_sum - (j == target ? 1.f : 0.f));
    x[j] = from_float<T>(grad);
  }
}

}  // namespace

void softmax_xent_fwd_bwd(cudaStream_t stream, anvil::DType act, float* losses, void* logits,
                          const int32_t* targets, int N, int V, int Vp, float grad_scale, bool write_grad,
                          int32_t ignore_index) {
  if (N <= 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    softmax_xent_kernel<<<N, kThreads, 0, stream>>>(losses, static_cast<T*>(logits), targets, V, Vp,
                                                    grad_scale, write_grad, ignore_index);
  });
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
