// Fused softmax + cross-entropy over the (padded) vocabulary: one block per row, 16-byte loads and stores.
// Sequence classification losses over [N, num_labels] logits: one warp per row.
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

// The loss kernel streams the [N, Vp] logits, so its speed is its load/store width: 16-byte vectors.
template <class T>
__global__ void softmax_xent_kernel(float* losses, T* logits, const int32_t* targets, int V, int Vp,
                                    float grad_scale, bool write_grad, int32_t ignore_index,
                                    bool vectorized) {
  constexpr int kN = Vec16<T>::kN;
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
  int scalar_from = 0;
  if (vectorized) {
    // Whole vectors inside [0, V): one max per vector, then one rescale of the running sum.
    const int full = V / kN;
    const auto* xv = reinterpret_cast<const Vec16<T>*>(x);
    for (int i = threadIdx.x; i < full; i += blockDim.x) {
      const Vec16<T> in = xv[i];
      float f[kN], m = stats.max;
#pragma unroll
      for (int k = 0; k < kN; ++k) f[k] = to_float(in.v[k]), m = fmaxf(m, f[k]);
      float sum = stats.max == -INFINITY ? 0.f : stats.sum * __expf(stats.max - m);
#pragma unroll
      for (int k = 0; k < kN; ++k) sum += __expf(f[k] - m);
      stats = {m, sum};
    }
    scalar_from = full * kN;
  }
  for (int j = scalar_from + threadIdx.x; j < V; j += blockDim.x) stats = max_sum_add(stats, to_float(x[j]));
  stats = block_max_sum(stats);
  if (threadIdx.x == 0) losses[row] = target_valid ? stats.max + __logf(stats.sum) - target_logit : NAN;
  if (!write_grad) return;
  const float inv_sum = 1.f / stats.sum;
  auto grad_of = [&](int j, float logit) {
    if (j >= V) return 0.f;
    return grad_scale * (__expf(logit - stats.max) * inv_sum - (j == target ? 1.f : 0.f));
  };
  if (vectorized) {
    auto* xv = reinterpret_cast<Vec16<T>*>(x);
    for (int i = threadIdx.x; i < Vp / kN; i += blockDim.x) {
      Vec16<T> io = xv[i];
#pragma unroll
      for (int k = 0; k < kN; ++k) io.v[k] = from_float<T>(grad_of(i * kN + k, to_float(io.v[k])));
      xv[i] = io;
    }
  } else {
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) x[j] = from_float<T>(grad_of(j, to_float(x[j])));
  }
}

constexpr int kClassRowsPerBlock = 8;  // warps per block, one row each

// Cross-entropy over NL classes per row (the rows are short: a warp's online max/sum is enough).
template <class T>
__global__ void classification_xent_kernel(float* losses, T* dlogits, const T* logits, const int32_t* labels,
                                           int N, int NL, float grad_scale, int32_t ignore_index) {
  const int row = blockIdx.x * kClassRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // whole warps exit together
  const T* x = logits + static_cast<size_t>(row) * NL;
  T* dx = dlogits ? dlogits + static_cast<size_t>(row) * NL : nullptr;
  const int32_t label = labels[row];
  if (label == ignore_index) {
    if (lane == 0) losses[row] = 0.f;
    if (dx)
      for (int j = lane; j < NL; j += kWarpSize) dx[j] = from_float<T>(0.f);
    return;
  }
  // An out-of-range label is a data bug: a NaN loss (and gradient) rather than an out-of-bounds read.
  const bool valid = label >= 0 && label < NL;
  MaxSum s{-INFINITY, 0.f};
  for (int j = lane; j < NL; j += kWarpSize) s = max_sum_add(s, to_float(x[j]));
  s = warp_max_sum(s);
  if (lane == 0) losses[row] = valid ? s.max + __logf(s.sum) - to_float(x[label]) : NAN;
  if (!dx) return;
  const float inv_sum = 1.f / s.sum;
  for (int j = lane; j < NL; j += kWarpSize)
    dx[j] = from_float<T>(
        valid ? grad_scale * (__expf(to_float(x[j]) - s.max) * inv_sum - (j == label ? 1.f : 0.f)) : NAN);
}

// Regression (one output): squared error against fp32 labels.
template <class T>
__global__ void classification_mse_kernel(float* losses, T* dlogits, const T* logits, const float* labels,
                                          int N, float grad_scale) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < N; i += gridDim.x * blockDim.x) {
    const float d = to_float(logits[i]) - labels[i];
    losses[i] = d * d;
    if (dlogits) dlogits[i] = from_float<T>(grad_scale * 2.f * d);
  }
}

}  // namespace

void classification_loss(cudaStream_t stream, anvil::DType act, float* losses, void* dlogits,
                         const void* logits, const void* labels, int N, int NL, float grad_scale,
                         int32_t ignore_index) {
  if (N <= 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    if (NL == 1) {
      constexpr int kThreads1 = 256;
      classification_mse_kernel<<<grid_for(static_cast<size_t>(N), kThreads1), kThreads1, 0, stream>>>(
          losses, static_cast<T*>(dlogits), static_cast<const T*>(logits), static_cast<const float*>(labels),
          N, grad_scale);
    } else {
      const unsigned blocks = (N + kClassRowsPerBlock - 1) / kClassRowsPerBlock;
      classification_xent_kernel<<<blocks, kClassRowsPerBlock * kWarpSize, 0, stream>>>(
          losses, static_cast<T*>(dlogits), static_cast<const T*>(logits),
          static_cast<const int32_t*>(labels), N, NL, grad_scale, ignore_index);
    }
  });
  ANVIL_CUDA_CHECK_LAST();
}

void softmax_xent_fwd_bwd(cudaStream_t stream, anvil::DType act, float* losses, void* logits,
                          const int32_t* targets, int N, int V, int Vp, float grad_scale, bool write_grad,
                          int32_t ignore_index) {
  if (N <= 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    const bool vectorized = rows_vectorizable<T>(Vp, {logits});
    softmax_xent_kernel<<<N, kThreads, 0, stream>>>(losses, static_cast<T*>(logits), targets, V, Vp,
                                                    grad_scale, write_grad, ignore_index, vectorized);
  });
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
