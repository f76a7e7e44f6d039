// RMSNorm over the last dimension (Ops::rmsnorm_fwd, residual_rmsnorm_fwd, rmsnorm_bwd): one thread block per
// row, the row held in registers between its reduction and its output (one read of each input, one write).
// Llama-sized rows (C = 2048..8192) are too wide for the warp-per-row scheme of layernorm.cu to keep them in
// registers, and re-reading them from L2 costs a second pass over memory.
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

// Elements of a row each thread keeps in registers (per tensor held): 2 16-byte vectors of bf16, 4 of fp32.
// A row of up to 1024 * kRowElems elements is held whole; wider ones take the two-pass kernels, which re-read
// it from cache.
constexpr int kRowElems = 16;
constexpr int kMaxThreads = 1024;

// Element group i of a row (kN consecutive elements) as fp32: a 16-byte vector with kVec, else one element.
template <class T, bool kVec>
struct Group {
  static constexpr int kN = kVec ? Vec16<T>::kN : 1;
  static constexpr int kPerThread = kRowElems / kN;  // groups a thread holds in registers
  __device__ static void load(const T* row, int i, float (&f)[kN]) {
    if constexpr (kVec) {
      const Vec16<T> v = reinterpret_cast<const Vec16<T>*>(row)[i];
#pragma unroll
      for (int k = 0; k < kN; ++k) f[k] = to_float(v.v[k]);
    } else {
      f[0] = to_float(row[i]);
    }
  }
  __device__ static void store(T* row, int i, const float (&f)[kN]) {
    if constexpr (kVec) {
      Vec16<T> v;
#pragma unroll
      for (int k = 0; k < kN; ++k) v.v[k] = from_float<T>(f[k]);
      reinterpret_cast<Vec16<T>*>(row)[i] = v;
    } else {
      row[i] = from_float<T>(f[0]);
    }
  }
};

// Rounds v to T and back (the value a store of v in T holds).
template <class T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

// The threads of a row's block: whole warps, enough for `groups` groups at `per_thread` each.
int row_threads(int groups, int per_thread) {
  const int needed = (groups + per_thread - 1) / per_thread;
  return std::min(kMaxThreads, std::max(kWarpSize, (needed + kWarpSize - 1) / kWarpSize * kWarpSize));
}

// y = round(round(x * rs) * w) for one group (Hugging Face's LlamaRMSNorm rounds the normalised row to the
// input dtype before the weight).
template <class T, int kN>
__device__ __forceinline__ void normalize(float (&f)[kN], const float (&fw)[kN], float rs) {
#pragma unroll
  for (int k = 0; k < kN; ++k) f[k] = round_to<T>(f[k] * rs) * fw[k];
}

// One block per row. kResidual: the row is x = a + b, rounded to T and stored to `sum` (as residual_fwd
// stores it) on the way in, so the normalisation reads it from registers (or, for rows too wide to hold, back
// from L1/L2, which this block has just written); otherwise x = a. sum may alias a or b: every thread reads
// its elements before it writes them. kRegs: the row fits the block's registers.
template <class T, bool kVec, bool kResidual, bool kRegs>
__global__ void rmsnorm_fwd_kernel(T* sum, T* ln, float* rstd, const T* a, const T* b, const T* w, int C,
                                   float eps) {
  using G = Group<T, kVec>;
  constexpr int kN = G::kN;
  const int groups = C / kN;
  const size_t offset = static_cast<size_t>(blockIdx.x) * C;
  const auto load_x = [&](int i, float(&f)[kN]) {
    G::load(a + offset, i, f);
    if constexpr (kResidual) {
      float fb[kN];
      G::load(b + offset, i, fb);
#pragma unroll
      for (int k = 0; k < kN; ++k) f[k] = round_to<T>(f[k] + fb[k]);
      G::store(sum + offset, i, f);
    }
  };
  float fw[kN];
  float ss = 0.f;
  if constexpr (kRegs) {
    float x[G::kPerThread][kN];
#pragma unroll
    for (int j = 0; j < G::kPerThread; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i < groups) {
        load_x(i, x[j]);
#pragma unroll
        for (int k = 0; k < kN; ++k) ss += x[j][k] * x[j][k];
      }
    }
    const float rs = rsqrtf(block_sum(ss) / C + eps);
#pragma unroll
    for (int j = 0; j < G::kPerThread; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i < groups) {
        G::load(w, i, fw);
        normalize<T, kN>(x[j], fw, rs);
        G::store(ln + offset, i, x[j]);
      }
    }
    if (threadIdx.x == 0 && rstd) rstd[blockIdx.x] = rs;
  } else {
    float f[kN];
    for (int i = threadIdx.x; i < groups; i += blockDim.x) {
      load_x(i, f);
#pragma unroll
      for (int k = 0; k < kN; ++k) ss += f[k] * f[k];
    }
    const float rs = rsqrtf(block_sum(ss) / C + eps);
    const T* x = kResidual ? sum + offset : a + offset;  // each thread re-reads its own groups
    for (int i = threadIdx.x; i < groups; i += blockDim.x) {
      G::load(x, i, f);
      G::load(w, i, fw);
      normalize<T, kN>(f, fw, rs);
      G::store(ln + offset, i, f);
    }
    if (threadIdx.x == 0 && rstd) rstd[blockIdx.x] = rs;
  }
}

// The input gradient of one row, dinp += rs * (dn - xhat * mean(dn * xhat)) with dn = dout * w and xhat =
// x * rs, for rows held in registers. Blocks loop over rows. kDw: each thread also sums its columns of dw,
// dout * round(xhat) (the normalised input as the forward stored it), over its rows in registers and adds
// them with one atomic per column at the end: one pass over dout and the input for both gradients. fp32
// gradients only: a 16-bit dw would be rounded once per block.
template <class T, class GT, bool kVec, bool kDw>
__global__ void rmsnorm_bwd_regs_kernel(T* dinp, GT* dw, const T* dout, const T* inp, const T* w,
                                        const float* rstd, int N, int C) {
  using G = Group<T, kVec>;
  constexpr int kN = G::kN, kPer = G::kPerThread;
  const int groups = C / kN;
  float acc[kPer][kN];
  if constexpr (kDw) {
#pragma unroll
    for (int j = 0; j < kPer; ++j)
#pragma unroll
      for (int k = 0; k < kN; ++k) acc[j][k] = 0.f;
  }
  for (int row = blockIdx.x; row < N; row += gridDim.x) {  // the same trip count for the whole block
    const size_t offset = static_cast<size_t>(row) * C;
    const float rs = rstd[row];
    float x[kPer][kN], dy[kPer][kN], fw[kN];
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i < groups) {
        G::load(inp + offset, i, x[j]);
        G::load(dout + offset, i, dy[j]);
        G::load(w, i, fw);
#pragma unroll
        for (int k = 0; k < kN; ++k) dot += dy[j][k] * fw[k] * (x[j][k] * rs);
      }
    }
    const float m = block_sum(dot) / C;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i < groups) {
        float fd[kN];
        G::load(w, i, fw);  // from L1: the same for every row
        G::load(dinp + offset, i, fd);
#pragma unroll
        for (int k = 0; k < kN; ++k) {
          const float xhat = x[j][k] * rs;
          fd[k] += rs * (dy[j][k] * fw[k] - xhat * m);
          if constexpr (kDw) acc[j][k] += dy[j][k] * round_to<T>(xhat);
        }
        G::store(dinp + offset, i, fd);
      }
    }
  }
  if constexpr (kDw) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = threadIdx.x + j * blockDim.x;
      if (i < groups) {
        if constexpr (kN % 4 == 0) {
#pragma unroll
          for (int k = 0; k < kN; k += 4)
            atomic_add4(dw + size_t(i) * kN + k,
                        make_float4(acc[j][k], acc[j][k + 1], acc[j][k + 2], acc[j][k + 3]));
        } else {
          atomic_add(&dw[i], acc[j][0]);
        }
      }
    }
  }
}

// The input gradient of rows too wide for registers: one block per row, dout, the input and w read twice
// (the second time from L1/L2).
template <class T, bool kVec>
__global__ void rmsnorm_bwd_input_kernel(T* dinp, const T* dout, const T* inp, const T* w, const float* rstd,
                                         int C) {
  using G = Group<T, kVec>;
  constexpr int kN = G::kN;
  const int groups = C / kN;
  const size_t offset = static_cast<size_t>(blockIdx.x) * C;
  const float rs = rstd[blockIdx.x];
  float x[kN], dy[kN], fw[kN], fd[kN];
  float dot = 0.f;
  for (int i = threadIdx.x; i < groups; i += blockDim.x) {
    G::load(inp + offset, i, x);
    G::load(dout + offset, i, dy);
    G::load(w, i, fw);
#pragma unroll
    for (int k = 0; k < kN; ++k) dot += dy[k] * fw[k] * (x[k] * rs);
  }
  const float m = block_sum(dot) / C;
  for (int i = threadIdx.x; i < groups; i += blockDim.x) {
    G::load(inp + offset, i, x);
    G::load(dout + offset, i, dy);
    G::load(w, i, fw);
    G::load(dinp + offset, i, fd);
#pragma unroll
    for (int k = 0; k < kN; ++k) fd[k] += rs * (dy[k] * fw[k] - x[k] * rs * m);
    G::store(dinp + offset, i, fd);
  }
}

// dw[c] += sum_r dout[r,c] * round(x[r,c] * rstd[r]), as layernorm_bwd_params_kernel: a block (32, 8) covers
// 32 columns of one chunk of rows, coalesced along the row, and adds its partial with one atomic per column
// (16-bit gradients are rounded once per chunk of kMinRowsPerChunk rows or more).
constexpr int kColumnTile = 32;
constexpr int kRowThreads = 8;
constexpr int kMinRowsPerChunk = 256;
template <class T, class GT>
__global__ void rmsnorm_bwd_dw_kernel(GT* dw, const T* dout, const T* inp, const float* rstd, int N, int C,
                                      int rows_per_chunk) {
  __shared__ float partial[kRowThreads][kColumnTile + 1];
  const int col = blockIdx.x * kColumnTile + threadIdx.x;
  const int row_begin = blockIdx.y * rows_per_chunk;
  const int row_end = min(N, row_begin + rows_per_chunk);
  float acc = 0.f;
  if (col < C) {
    for (int r = row_begin + threadIdx.y; r < row_end; r += kRowThreads) {
      const size_t i = static_cast<size_t>(r) * C + col;
      acc += to_float(dout[i]) * round_to<T>(to_float(inp[i]) * rstd[r]);
    }
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    float sum = 0.f;
    for (int i = 0; i < kRowThreads; ++i) sum += partial[i][threadIdx.x];
    atomic_add(&dw[col], sum);
  }
}

// Launches the forward for rows of T (sum and b unused without kResidual).
template <class T, bool kResidual>
void launch_fwd(cudaStream_t stream, T* sum, T* ln, float* rstd, const T* a, const T* b, const T* w, int N,
                int C, float eps) {
  auto launch = [&](auto kernel, int threads) {
    kernel<<<N, threads, 0, stream>>>(sum, ln, rstd, a, b, w, C, eps);
  };
  const auto pick = [&](auto vec) {
    constexpr bool kVec = decltype(vec)::value;
    using G = Group<T, kVec>;
    const int groups = C / G::kN;
    if (groups <= kMaxThreads * G::kPerThread)
      launch(rmsnorm_fwd_kernel<T, kVec, kResidual, true>, row_threads(groups, G::kPerThread));
    else
      launch(rmsnorm_fwd_kernel<T, kVec, kResidual, false>, kMaxThreads);
  };
  if (rows_vectorizable<T>(C, {sum, ln, a, b, w}))  // null pointers are aligned
    pick(std::true_type{});
  else
    pick(std::false_type{});
}

}  // namespace

void rmsnorm_fwd(cudaStream_t stream, anvil::DType act, void* out, float* rstd, const void* inp,
                 const void* w, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    launch_fwd<T, false>(stream, nullptr, static_cast<T*>(out), rstd, static_cast<const T*>(inp), nullptr,
                         static_cast<const T*>(w), N, C, eps);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void residual_rmsnorm_fwd(cudaStream_t stream, anvil::DType act, void* out, void* ln, float* rstd,
                          const void* a, const void* b, const void* w, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    launch_fwd<T, true>(stream, static_cast<T*>(out), static_cast<T*>(ln), rstd, static_cast<const T*>(a),
                        static_cast<const T*>(b), static_cast<const T*>(w), N, C, eps);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void rmsnorm_bwd(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dinp, void* dw,
                 const void* dout, const void* inp, const void* w, const float* rstd, int N, int C) {
  if (N <= 0 || C <= 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    dispatch_float(grad, [&](auto g) {
      using GT = decltype(g);
      auto* di = static_cast<T*>(dinp);
      auto* dwt = static_cast<GT*>(dw);
      const auto* dy = static_cast<const T*>(dout);
      const auto* x = static_cast<const T*>(inp);
      const auto* wt = static_cast<const T*>(w);
      const auto run = [&](auto vec) {
        constexpr bool kVec = decltype(vec)::value;
        using G = Group<T, kVec>;
        const int groups = C / G::kN;
        const bool regs = groups <= kMaxThreads * G::kPerThread;
        if constexpr (std::is_same_v<GT, float>) {
          if (regs) {
            // One pass for both gradients: as many blocks as fit on the GPU at once, each looping over rows
            // (dw gets one atomic per column and block).
            const auto kernel = rmsnorm_bwd_regs_kernel<T, GT, kVec, true>;
            const int threads = row_threads(groups, G::kPerThread);
            int per_sm = 0;
            ANVIL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
            const int blocks = std::min(N, std::max(1, per_sm) * sm_count());
            kernel<<<blocks, threads, 0, stream>>>(di, dwt, dy, x, wt, rstd, N, C);
            ANVIL_CUDA_CHECK_LAST();
            return;
          }
        }
        // 16-bit dw (or rows too wide for registers): dw by column tiles over chunks of rows, as
        // layernorm_bwd does, then the input gradient.
        const int rows_per_chunk = std::max(kMinRowsPerChunk, (N + 65534) / 65535);  // gridDim.y <= 65535
        const dim3 grid((C + kColumnTile - 1) / kColumnTile, (N + rows_per_chunk - 1) / rows_per_chunk);
        rmsnorm_bwd_dw_kernel<T, GT>
            <<<grid, dim3(kColumnTile, kRowThreads), 0, stream>>>(dwt, dy, x, rstd, N, C, rows_per_chunk);
        ANVIL_CUDA_CHECK_LAST();
        if (regs) {
          rmsnorm_bwd_regs_kernel<T, GT, kVec, false>
              <<<N, row_threads(groups, G::kPerThread), 0, stream>>>(di, dwt, dy, x, wt, rstd, N, C);
        } else {
          rmsnorm_bwd_input_kernel<T, kVec><<<N, kMaxThreads, 0, stream>>>(di, dy, x, wt, rstd, C);
        }
        ANVIL_CUDA_CHECK_LAST();
      };
      if (rows_vectorizable<T>(C, {dinp, dout, inp, w}))
        run(std::true_type{});
      else
        run(std::false_type{});
    });
  });
}

}  // namespace anvil::cuda
