// Token + position embedding, forward and backward.
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embedding_fwd_kernel(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                     int T, int C, size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i - bt * C);
    const int t = static_cast<int>(bt % T);
    out[i] = wte[static_cast<size_t>(tokens[bt]) * C + c] + wpe[static_cast<size_t>(t) * C + c];
  }
}

// Several positions may hold the same token, so dwte needs atomics.
__global__ void embedding_bwd_wte_kernel(float* dwte, const float* dout, const int32_t* tokens, int C,
                                         size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i - bt * C);
    atomicAdd(&dwte[static_cast<size_t>(tokens[bt]) * C + c], dout[i]);
  }
}

// dwpe[t,c] sums over the batch: one thread per (t,c), no atomics, deterministic.
__global__ void embedding_bwd_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const size_t per_batch = static_cast<size_t>(T) * C;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < per_batch;
       i += size_t{gridDim.x} * blockDim.x) {
    float acc = 0.f;
    for (int b = 0; b < B; ++b) acc += dout[b * per_batch + i];
    dwpe[i] += acc;
  }
}

}  // namespace

void embedding_fwd(cudaStream_t stream, float* out, const int32_t* tokens, const float* wte, const float* wpe,
                   int B, int T, int C) {
  const size_t total = static_cast<size_t>(B) * T * C;
  if (total == 0) return;
  embedding_fwd_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(out, tokens, wte, wpe, T, C,
                                                                           total);
  ANVIL_CUDA_CHECK_LAST();
}

void embedding_bwd(cudaStream_t stream, float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                   int B, int T, int C) {
  const size_t total = static_cast<size_t>(B) * T * C;
  if (total == 0) return;
  embedding_bwd_wte_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(dwte, dout, tokens, C, total);
  ANVIL_CUDA_CHECK_LAST();
  const size_t per_batch = static_cast<size_t>(T) * C;
  embedding_bwd_wpe_kernel<<<grid_for(per_batch, kThreads), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
