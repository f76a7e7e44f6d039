// Token + position embedding, forward and backward.
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;

template <class T>
__global__ void embedding_fwd_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe, int seq,
                                     int C, size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i - bt * C);
    const int t = static_cast<int>(bt % seq);
    out[i] = from_float<T>(to_float(wte[static_cast<size_t>(tokens[bt]) * C + c]) +
                           to_float(wpe[static_cast<size_t>(t) * C + c]));
  }
}

// Several positions may hold the same token, so dwte needs atomics.
template <class T, class G>
__global__ void embedding_bwd_wte_kernel(G* dwte, const T* dout, const int32_t* tokens, int C, size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i - bt * C);
    atomic_add(&dwte[static_cast<size_t>(tokens[bt]) * C + c], to_float(dout[i]));
  }
}

// dwpe[t,c] sums over the batch: one thread per (t,c), no atomics, deterministic.
template <class T, class G>
__global__ void embedding_bwd_wpe_kernel(G* dwpe, const T* dout, int B, int seq, int C) {
  const size_t per_batch = static_cast<size_t>(seq) * C;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < per_batch;
       i += size_t{gridDim.x} * blockDim.x) {
    float acc = 0.f;
    for (int b = 0; b < B; ++b) acc += to_float(dout[b * per_batch + i]);
    dwpe[i] = from_float<G>(to_float(dwpe[i]) + acc);
  }
}

}  // namespace

void embedding_fwd(cudaStream_t stream, anvil::DType act, void* out, const int32_t* tokens, const void* wte,
                   const void* wpe, int B, int T, int C) {
  const size_t total = static_cast<size_t>(B) * T * C;
  if (total == 0) return;
  dispatch_float(act, [&](auto t) {
    using A = decltype(t);
    embedding_fwd_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<A*>(out), tokens, static_cast<const A*>(wte), static_cast<const A*>(wpe), T, C, total);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void embedding_bwd(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dwte, void* dwpe,
                   const void* dout, const int32_t* tokens, int B, int T, int C) {
  const size_t total = static_cast<size_t>(B) * T * C;
  if (total == 0) return;
  const size_t per_batch = static_cast<size_t>(T) * C;
  dispatch_float(act, [&](auto t) {
    using A = decltype(t);
    dispatch_float(grad, [&](auto g) {
      using G = decltype(g);
      embedding_bwd_wte_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(
          static_cast<G*>(dwte), static_cast<const A*>(dout), tokens, C, total);
      ANVIL_CUDA_CHECK_LAST();
      embedding_bwd_wpe_kernel<<<grid_for(per_batch, kThreads), kThreads, 0, stream>>>(
          static_cast<G*>(dwpe), static_cast<const A*>(dout), B, T, C);
      ANVIL_CUDA_CHECK_LAST();
    });
  });
}

}  // namespace anvil::cuda
