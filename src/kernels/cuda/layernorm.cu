// LayerNorm over the last dimension: one warp per row for the row-wise work, and a tiled column
// reduction for the parameter gradients.
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kThreads = kRowsPerBlock * kWarpSize;

// Two passes over the row (mean, then the centred variance) for accuracy; the row stays in L1/L2.
__global__ void layernorm_fwd_kernel(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                     const float* b, int N, int C, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // whole warps exit together
  const float* x = inp + static_cast<size_t>(row) * C;
  float sum = 0.f;
  for (int c = lane; c < C; c += kWarpSize) sum += x[c];
  const float mu = warp_sum(sum) / C;
  float sq = 0.f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float d = x[c] - mu;
    sq += d * d;
  }
  const float rs = rsqrtf(warp_sum(sq) / C + eps);
  float* y = out + static_cast<size_t>(row) * C;
  for (int c = lane; c < C; c += kWarpSize) y[c] = (x[c] - mu) * rs * w[c] + b[c];
  if (lane == 0) {
    if (mean) mean[row] = mu;
    if (rstd) rstd[row] = rs;
  }
}

// dinp += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * w.
__global__ void layernorm_bwd_input_kernel(float* dinp, const float* dout, const float* inp, const float* w,
                                           const float* mean, const float* rstd, int N, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const size_t offset = static_cast<size_t>(row) * C;
  const float* x = inp + offset;
  const float* dy = dout + offset;
  const float mu = mean[row], rs = rstd[row];
  float sum_dnorm = 0.f, sum_dnorm_xhat = 0.f;
  for (int c = lane; c < C; c += kWarpSize) {
    const float dnorm = dy[c] * w[c];
    sum_dnorm += dnorm;
    sum_dnorm_xhat += dnorm * (x[c] - mu) * rs;
  }
  const float mean_dnorm = warp_sum(sum_dnorm) / C;
  const float mean_dnorm_xhat = warp_sum(sum_dnorm_xhat) / C;
  float* dx = dinp + offset;
  for (int c = lane; c < C; c += kWarpSize) {
    const float xhat = (x[c] - mu) * rs;
    dx[c] += rs * (dy[c] * w[c] - mean_dnorm - xhat * mean_dnorm_xhat);
  }
}

constexpr int kColumnTile = 32;
constexpr int kRowThreads = 8;
constexpr int kMinRowsPerChunk = 256;

// dw[c] += sum_r dout[r,c] * xhat[r,c]; db[c] += sum_r dout[r,c]. Block (32, 8) covers 32 columns of one
// chunk of rows, coalesced along the row, then adds its partial with one atomic per column.
__global__ void layernorm_bwd_params_kernel(float* dw, float* db, const float* dout, const float* inp,
                                            const float* mean, const float* rstd, int N, int C,
                                            int rows_per_chunk) {
  __shared__ float partial_dw[kRowThreads][kColumnTile + 1];
  __shared__ float partial_db[kRowThreads][kColumnTile + 1];
  const int col = blockIdx.x * kColumnTile + threadIdx.x;
  const int row_begin = blockIdx.y * rows_per_chunk;
  const int row_end = min(N, row_begin + rows_per_chunk);
  float acc_dw = 0.f, acc_db = 0.f;
  if (col < C) {
    for (int r = row_begin + threadIdx.y; r < row_end; r += kRowThreads) {
      const size_t i = static_cast<size_t>(r) * C + col;
      const float dy = dout[i];
      acc_dw += dy * (inp[i] - mean[r]) * rstd[r];
      acc_db += dy;
    }
  }
  partial_dw[threadIdx.y][threadIdx.x] = acc_dw;
  partial_db[threadIdx.y][threadIdx.x] = acc_db;
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    float sum_dw = 0.f, sum_db = 0.f;
    for (int i = 0; i < kRowThreads; ++i) {
      sum_dw += partial_dw[i][threadIdx.x];
      sum_db += partial_db[i][threadIdx.x];
    }
    atomicAdd(&dw[col], sum_dw);
    atomicAdd(&db[col], sum_db);
  }
}

}  // namespace

void layernorm_fwd(cudaStream_t stream, float* out, float* mean, float* rstd, const float* inp,
                   const float* w, const float* b, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  const unsigned blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  layernorm_fwd_kernel<<<blocks, kThreads, 0, stream>>>(out, mean, rstd, inp, w, b, N, C, eps);
  ANVIL_CUDA_CHECK_LAST();
}

void layernorm_bwd(cudaStream_t stream, float* dinp, float* dw, float* db, const float* dout,
                   const float* inp, const float* w, const float* mean, const float* rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  const unsigned blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  layernorm_bwd_input_kernel<<<blocks, kThreads, 0, stream>>>(dinp, dout, inp, w, mean, rstd, N, C);
  ANVIL_CUDA_CHECK_LAST();
  const int rows_per_chunk = std::max(kMinRowsPerChunk, (N + 65534) / 65535);  // gridDim.y <= 65535
  const dim3 grid((C + kColumnTile - 1) / kColumnTile, (N + rows_per_chunk - 1) / rows_per_chunk);
  layernorm_bwd_params_kernel<<<grid, dim3(kColumnTile, kRowThreads), 0, stream>>>(
      dw, db, dout, inp, mean, rstd, N, C, rows_per_chunk);
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
