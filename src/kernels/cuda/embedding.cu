// Token + position embedding (GPT-2) and word + position + token-type embedding (BERT), forward and
// backward.
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
    float v = to_float(wte[static_cast<size_t>(tokens[bt]) * C + c]);
    if (wpe) v += to_float(wpe[static_cast<size_t>(t) * C + c]);  // null: no learned positions (RoPE models)
    out[i] = from_float<T>(v);
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

// BERT: (word + token type) + position, in Hugging Face's order.
template <class T>
__global__ void bert_embedding_fwd_kernel(T* out, const int32_t* tokens, const int32_t* types, const T* wte,
                                          const T* wpe, const T* wtt, int seq, int C, size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i - bt * C);
    const int t = static_cast<int>(bt % seq);
    const size_t type = types ? static_cast<size_t>(types[bt]) : 0;
    out[i] = from_float<T>(to_float(wte[static_cast<size_t>(tokens[bt]) * C + c]) +
                           to_float(wtt[type * C + c]) + to_float(wpe[static_cast<size_t>(t) * C + c]));
  }
}

// The word-embedding gradient with HF's padding_idx rule: rows of `skip` tokens get nothing.
template <class T, class G>
__global__ void bert_embedding_bwd_wte_kernel(G* dwte, const T* dout, const int32_t* tokens, int32_t skip,
                                              int C, size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t bt = i / C;
    const int32_t token = tokens[bt];
    if (token == skip) continue;
    atomic_add(&dwte[static_cast<size_t>(token) * C + (i - bt * C)], to_float(dout[i]));
  }
}

// The token-type gradient: a handful of rows (usually 2) receive every position, so per-element atomics would
// all collide on them. Each thread walks a contiguous run of positions for one column (coalesced across the
// warp), sums while the type stays the same (segments are runs), and adds each sum with one atomic.
constexpr int kTypeColumns = 32, kTypeRowThreads = 8, kTypeRowsPerThread = 64;
template <class T, class G>
__global__ void bert_embedding_bwd_types_kernel(G* dwtt, const T* dout, const int32_t* types, int C,
                                                size_t rows) {
  const int col = blockIdx.x * kTypeColumns + threadIdx.x;
  if (col >= C) return;
  const size_t begin = (static_cast<size_t>(blockIdx.y) * kTypeRowThreads + threadIdx.y) * kTypeRowsPerThread;
  const size_t end = begin + kTypeRowsPerThread < rows ? begin + kTypeRowsPerThread : rows;
  int current = -1;
  float acc = 0.f;
  for (size_t r = begin; r < end; ++r) {
    const int type = types ? types[r] : 0;
    if (type != current) {
      if (current >= 0) atomic_add(&dwtt[static_cast<size_t>(current) * C + col], acc);
      current = type, acc = 0.f;
    }
    acc += to_float(dout[r * C + col]);
  }
  if (current >= 0) atomic_add(&dwtt[static_cast<size_t>(current) * C + col], acc);
}

}  // namespace

void bert_embedding_fwd(cudaStream_t stream, anvil::DType act, void* out, const int32_t* tokens,
                        const int32_t* types, const void* wte, const void* wpe, const void* wtt, int B, int T,
                        int C) {
  const size_t total = static_cast<size_t>(B) * T * C;
  if (total == 0) return;
  dispatch_float(act, [&](auto t) {
    using A = decltype(t);
    bert_embedding_fwd_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<A*>(out), tokens, types, static_cast<const A*>(wte), static_cast<const A*>(wpe),
        static_cast<const A*>(wtt), T, C, total);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void embedding_bwd_skip(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dwte, const void* dout,
                        const int32_t* tokens, int B, int T, int C, int32_t skip_token) {
  const size_t total = static_cast<size_t>(B) * T * C;
  if (total == 0) return;
  dispatch_float(act, [&](auto t) {
    using A = decltype(t);
    dispatch_float(grad, [&](auto g) {
      using G = decltype(g);
      bert_embedding_bwd_wte_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(
          static_cast<G*>(dwte), static_cast<const A*>(dout), tokens, skip_token, C, total);
      ANVIL_CUDA_CHECK_LAST();
    });
  });
}

void bert_embedding_bwd(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dwte, void* dwpe,
                        void* dwtt, const void* dout, const int32_t* tokens, const int32_t* types, int B,
                        int T, int C, int32_t skip_token) {
  const size_t total = static_cast<size_t>(B) * T * C;
  if (total == 0) return;
  const size_t rows = static_cast<size_t>(B) * T, per_batch = static_cast<size_t>(T) * C;
  const size_t rows_per_block = size_t{kTypeRowThreads} * kTypeRowsPerThread;
  const dim3 type_grid((C + kTypeColumns - 1) / kTypeColumns,
                       static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block));
  dispatch_float(act, [&](auto t) {
    using A = decltype(t);
    dispatch_float(grad, [&](auto g) {
      using G = decltype(g);
      bert_embedding_bwd_wte_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(
          static_cast<G*>(dwte), static_cast<const A*>(dout), tokens, skip_token, C, total);
      ANVIL_CUDA_CHECK_LAST();
      embedding_bwd_wpe_kernel<<<grid_for(per_batch, kThreads), kThreads, 0, stream>>>(
          static_cast<G*>(dwpe), static_cast<const A*>(dout), B, T, C);
      ANVIL_CUDA_CHECK_LAST();
      bert_embedding_bwd_types_kernel<<<type_grid, dim3(kTypeColumns, kTypeRowThreads), 0, stream>>>(
          static_cast<G*>(dwtt), static_cast<const A*>(dout), types, C, rows);
      ANVIL_CUDA_CHECK_LAST();
    });
  });
}

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
      if (!dwpe) return;  // no learned positions
      embedding_bwd_wpe_kernel<<<grid_for(per_batch, kThreads), kThreads, 0, stream>>>(
          static_cast<G*>(dwpe), static_cast<const A*>(dout), B, T, C);
      ANVIL_CUDA_CHECK_LAST();
    });
  });
}

}  // namespace anvil::cuda
