// GELU (tanh approximation and exact erf), tanh, the residual add, SwiGLU and the first-token rows:
// elementwise, grid-stride over size_t counts.
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// The build uses --use_fast_math, which turns tanhf into tanh.approx.f32 (relative error ~2^-11): too coarse
// for parity with the CPU. exp-based tanh keeps the absolute error near 1e-7, and saturates correctly
// (exp -> inf gives 1, exp -> 0 gives -1).
__device__ inline float accurate_tanh(float u) {
  return 1.f - 2.f / (1.f + __expf(2.f * u));
}

template <class T>
__global__ void gelu_fwd_kernel(T* out, const T* inp, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float x = to_float(inp[i]);
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    out[i] = from_float<T>(0.5f * x * (1.f + accurate_tanh(u)));
  }
}

// dinp may alias dout: each element is read before it is written, by the same thread.
template <class T>
__global__ void gelu_bwd_kernel(T* dinp, const T* inp, const T* dout, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float x = to_float(inp[i]);
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    const float th = accurate_tanh(u);
    const float du_dx = kSqrt2OverPi * (1.f + 3.f * kGeluCubic * x * x);
    const float grad = 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * du_dx;
    dinp[i] = from_float<T>(to_float(dout[i]) * grad);
  }
}

// out may alias a or b.
template <class T>
__global__ void residual_fwd_kernel(T* out, const T* a, const T* b, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    out[i] = from_float<T>(to_float(a[i]) + to_float(b[i]));
}

constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// erff has no fast-math intrinsic: it stays the accurate (2 ulp) library function under --use_fast_math.
__device__ __forceinline__ float gelu_erf(float x) {
  return 0.5f * x * (1.f + erff(x * kInvSqrt2));
}
// d/dx [x Phi(x)] = Phi(x) + x phi(x).
__device__ __forceinline__ float gelu_erf_grad(float x) {
  const float cdf = 0.5f * (1.f + erff(x * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * __expf(-0.5f * x * x);
  return cdf + x * pdf;
}

// Calls f(i0, count) for runs of elements: with kVec, one 16-byte vector of T per thread and step (i0 a
// multiple of Vec16<T>::kN, count kN), then the tail one element per thread; else one element at a time.
template <class T, bool kVec, class F>
__device__ __forceinline__ void for_each_run(size_t n, F&& f) {
  constexpr int kN = kVec ? Vec16<T>::kN : 1;
  const size_t first = blockIdx.x * size_t{blockDim.x} + threadIdx.x, stride = size_t{gridDim.x} * blockDim.x;
  const size_t runs = n / kN;
  for (size_t r = first; r < runs; r += stride) f(r * kN, std::integral_constant<int, kN>{});
  if constexpr (kVec) {
    const size_t tail = runs * kN + first;
    if (tail < n) f(tail, std::integral_constant<int, 1>{});
  }
}

template <class T, int kCount>
__device__ __forceinline__ void load_run(const T* p, size_t i, float (&f)[kCount]) {
  if constexpr (kCount > 1) {
    const Vec16<T> v = *reinterpret_cast<const Vec16<T>*>(p + i);
#pragma unroll
    for (int k = 0; k < kCount; ++k) f[k] = to_float(v.v[k]);
  } else {
    f[0] = to_float(p[i]);
  }
}
template <class T, int kCount>
__device__ __forceinline__ void store_run(T* p, size_t i, const float (&f)[kCount]) {
  if constexpr (kCount > 1) {
    Vec16<T> v;
#pragma unroll
    for (int k = 0; k < kCount; ++k) v.v[k] = from_float<T>(f[k]);
    *reinterpret_cast<Vec16<T>*>(p + i) = v;
  } else {
    p[i] = from_float<T>(f[0]);
  }
}

template <class T, bool kVec>
__global__ void gelu_erf_fwd_kernel(T* out, const T* inp, size_t n) {
  for_each_run<T, kVec>(n, [&](size_t i, auto count) {
    constexpr int kCount = decltype(count)::value;
    float f[kCount];
    load_run<T, kCount>(inp, i, f);
#pragma unroll
    for (int k = 0; k < kCount; ++k) f[k] = gelu_erf(f[k]);
    store_run<T, kCount>(out, i, f);
  });
}

// dinp may alias dout (read before written, by the same thread).
template <class T>
__global__ void gelu_erf_bwd_kernel(T* dinp, const T* inp, const T* dout, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    dinp[i] = from_float<T>(to_float(dout[i]) * gelu_erf_grad(to_float(inp[i])));
}

// out = gelu_erf(inp) and dinp = dout * gelu_erf'(inp) in one pass over inp (dinp may alias dout).
template <class T, bool kVec>
__global__ void gelu_erf_fwd_bwd_kernel(T* out, T* dinp, const T* inp, const T* dout, size_t n) {
  for_each_run<T, kVec>(n, [&](size_t i, auto count) {
    constexpr int kCount = decltype(count)::value;
    float x[kCount], d[kCount];
    load_run<T, kCount>(inp, i, x);
    load_run<T, kCount>(dout, i, d);
#pragma unroll
    for (int k = 0; k < kCount; ++k) d[k] *= gelu_erf_grad(x[k]), x[k] = gelu_erf(x[k]);
    store_run<T, kCount>(out, i, x);
    store_run<T, kCount>(dinp, i, d);
  });
}

// gelu_erf_fwd_bwd of fp32 [rows, cols] (cols % 4 == 0, 16-byte aligned rows) with dinp's column sums added
// to dbias, in column_sums_vec4_kernel's layout (matmul.cu): a block (32, 8) covers 128 columns and
// rows_per_block rows, each thread four columns of kGeluRowsInFlight rows per pass with all their loads in
// flight; the block's partial sums meet in shared memory, then one atomic add per column.
constexpr int kGeluColumnThreads = 32, kGeluRowThreads = 8, kGeluRowsInFlight = 4;
template <class G>
__global__ void gelu_erf_fwd_bwd_bias_kernel(float* out, float* dinp, G* dbias, const float* inp,
                                             const float* dout, int rows, int cols, int rows_per_block) {
  __shared__ float4 partial[kGeluRowThreads][kGeluColumnThreads];
  const int col = 4 * (blockIdx.x * kGeluColumnThreads + threadIdx.x);
  const int row_begin = blockIdx.y * rows_per_block, row_end = min(rows, row_begin + rows_per_block);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  if (col < cols)
    for (int r0 = row_begin + threadIdx.y; r0 < row_end; r0 += kGeluRowThreads * kGeluRowsInFlight) {
      float4 x[kGeluRowsInFlight], d[kGeluRowsInFlight];
#pragma unroll
      for (int k = 0; k < kGeluRowsInFlight; ++k) {
        const int r = r0 + k * kGeluRowThreads;
        const size_t at = static_cast<size_t>(r) * cols + col;
        x[k] = d[k] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < row_end) {
          x[k] = *reinterpret_cast<const float4*>(inp + at);
          d[k] = *reinterpret_cast<const float4*>(dout + at);
        }
      }
#pragma unroll
      for (int k = 0; k < kGeluRowsInFlight; ++k) {
        const int r = r0 + k * kGeluRowThreads;
        if (r >= row_end) break;
        const size_t at = static_cast<size_t>(r) * cols + col;
        const float4 g = make_float4(d[k].x * gelu_erf_grad(x[k].x), d[k].y * gelu_erf_grad(x[k].y),
                                     d[k].z * gelu_erf_grad(x[k].z), d[k].w * gelu_erf_grad(x[k].w));
        *reinterpret_cast<float4*>(out + at) =
            make_float4(gelu_erf(x[k].x), gelu_erf(x[k].y), gelu_erf(x[k].z), gelu_erf(x[k].w));
        *reinterpret_cast<float4*>(dinp + at) = g;
        acc.x += g.x, acc.y += g.y, acc.z += g.z, acc.w += g.w;
      }
    }
  add_block_column_sums(partial, acc, dbias, col, cols);
}

template <class T>
__global__ void tanh_fwd_kernel(T* out, const T* inp, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    out[i] = from_float<T>(accurate_tanh(to_float(inp[i])));
}

template <class T>
__global__ void tanh_bwd_kernel(T* dinp, const T* out, const T* dout, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float y = to_float(out[i]);
    dinp[i] = from_float<T>(to_float(dout[i]) * (1.f - y * y));
  }
}

// out [B,C] = inp[:, 0, :] of [B,T,C]: a plain copy of stored values.
template <class T>
__global__ void first_token_fwd_kernel(T* out, const T* inp, int T_, int C, size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t b = i / C;
    out[i] = inp[b * T_ * C + (i - b * C)];
  }
}

template <class T>
__global__ void first_token_bwd_kernel(T* dinp, const T* dout, int T_, int C, size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t bt = i / C;
    dinp[i] = bt % T_ == 0 ? dout[(bt / T_) * C + (i - bt * C)] : from_float<T>(0.f);
  }
}

template <class Kernel>
void launch_elementwise(cudaStream_t stream, anvil::DType act, size_t n, Kernel&& kernel) {
  if (n == 0) return;
  dispatch_float(act, [&](auto t) { kernel(t, grid_for(n, kThreads)); });
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace

void gelu_erf_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* inp, size_t n) {
  if (n == 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    constexpr int kN = Vec16<T>::kN;
    T* o = static_cast<T*>(out);
    const T* in = static_cast<const T*>(inp);
    if (rows_vectorizable<T>(kN, {out, inp}))
      gelu_erf_fwd_kernel<T, true><<<grid_for(n / kN + 1, kThreads), kThreads, 0, stream>>>(o, in, n);
    else
      gelu_erf_fwd_kernel<T, false><<<grid_for(n, kThreads), kThreads, 0, stream>>>(o, in, n);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void gelu_erf_bwd(cudaStream_t stream, anvil::DType act, void* dinp, const void* inp, const void* dout,
                  size_t n) {
  launch_elementwise(stream, act, n, [&](auto t, unsigned grid) {
    using T = decltype(t);
    gelu_erf_bwd_kernel<<<grid, kThreads, 0, stream>>>(static_cast<T*>(dinp), static_cast<const T*>(inp),
                                                       static_cast<const T*>(dout), n);
  });
}

void gelu_erf_fwd_bwd(cudaStream_t stream, anvil::DType act, void* out, void* dinp, const void* inp,
                      const void* dout, size_t n) {
  if (n == 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    constexpr int kN = Vec16<T>::kN;
    T *o = static_cast<T*>(out), *di = static_cast<T*>(dinp);
    const T *in = static_cast<const T*>(inp), *d = static_cast<const T*>(dout);
    if (rows_vectorizable<T>(kN, {out, dinp, inp, dout}))
      gelu_erf_fwd_bwd_kernel<T, true>
          <<<grid_for(n / kN + 1, kThreads), kThreads, 0, stream>>>(o, di, in, d, n);
    else
      gelu_erf_fwd_bwd_kernel<T, false><<<grid_for(n, kThreads), kThreads, 0, stream>>>(o, di, in, d, n);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void gelu_erf_fwd_bwd_bias(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* out, void* dinp,
                           void* dbias, const void* inp, const void* dout, int N, int cols) {
  if (N <= 0 || cols <= 0) return;
  if (act != anvil::DType::F32 || !rows_vectorizable<float>(cols, {out, dinp, inp, dout})) {
    gelu_erf_fwd_bwd(stream, act, out, dinp, inp, dout, size_t(N) * cols);
    column_sums_accumulate(stream, grad, dbias, act, dinp, N, cols);
    return;
  }
  // 64 rows a block: 1024 blocks at the BERT-large MLP's [2048, 4096], 128 atomic adds each.
  const int rows_per_block = std::max(64, (N + 65534) / 65535);
  const dim3 grid((cols / 4 + kGeluColumnThreads - 1) / kGeluColumnThreads,
                  (N + rows_per_block - 1) / rows_per_block);
  dispatch_float(grad, [&](auto g) {
    using G = decltype(g);
    gelu_erf_fwd_bwd_bias_kernel<G><<<grid, dim3(kGeluColumnThreads, kGeluRowThreads), 0, stream>>>(
        static_cast<float*>(out), static_cast<float*>(dinp), static_cast<G*>(dbias),
        static_cast<const float*>(inp), static_cast<const float*>(dout), N, cols, rows_per_block);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void tanh_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* inp, size_t n) {
  launch_elementwise(stream, act, n, [&](auto t, unsigned grid) {
    using T = decltype(t);
    tanh_fwd_kernel<<<grid, kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(inp), n);
  });
}

void tanh_bwd(cudaStream_t stream, anvil::DType act, void* dinp, const void* out, const void* dout,
              size_t n) {
  launch_elementwise(stream, act, n, [&](auto t, unsigned grid) {
    using T = decltype(t);
    tanh_bwd_kernel<<<grid, kThreads, 0, stream>>>(static_cast<T*>(dinp), static_cast<const T*>(out),
                                                   static_cast<const T*>(dout), n);
  });
}

void first_token_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* inp, int B, int T, int C) {
  const size_t total = static_cast<size_t>(B) * C;
  launch_elementwise(stream, act, total, [&](auto t, unsigned grid) {
    using E = decltype(t);
    first_token_fwd_kernel<<<grid, kThreads, 0, stream>>>(static_cast<E*>(out), static_cast<const E*>(inp), T,
                                                          C, total);
  });
}

void first_token_bwd(cudaStream_t stream, anvil::DType act, void* dinp, const void* dout, int B, int T,
                     int C) {
  const size_t total = static_cast<size_t>(B) * T * C;
  launch_elementwise(stream, act, total, [&](auto t, unsigned grid) {
    using E = decltype(t);
    first_token_bwd_kernel<<<grid, kThreads, 0, stream>>>(static_cast<E*>(dinp), static_cast<const E*>(dout),
                                                          T, C, total);
  });
}

void gelu_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* inp, size_t n) {
  if (n == 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    gelu_fwd_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<T*>(out),
                                                                    static_cast<const T*>(inp), n);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void gelu_bwd(cudaStream_t stream, anvil::DType act, void* dinp, const void* inp, const void* dout,
              size_t n) {
  if (n == 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    gelu_bwd_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(dinp), static_cast<const T*>(inp), static_cast<const T*>(dout), n);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void residual_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* a, const void* b, size_t n) {
  if (n == 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    residual_fwd_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), n);
  });
  ANVIL_CUDA_CHECK_LAST();
}

// --- SwiGLU ----------------------------------------------------------------------------------------------

namespace {

// Grid-stride over the N * I outputs in runs of kN columns of one row (16-byte vectors with kVec: I % kN ==
// 0 and aligned buffers, so a run never straddles gate and up). The divisions are IEEE (__fdiv_rn), not
// fast-math's approximate ones; 1 + exp(-g) overflowing to inf gives silu = -0 and sigmoid = 0, no NaN.
template <class T, bool kVec, class F>
__device__ __forceinline__ void for_each_swiglu_run(int I, size_t runs, F&& f) {
  constexpr int kN = kVec ? Vec16<T>::kN : 1;
  const size_t per_row = static_cast<size_t>(I / kN);
  for (size_t j = blockIdx.x * size_t{blockDim.x} + threadIdx.x; j < runs;
       j += size_t{gridDim.x} * blockDim.x) {
    const size_t r = j / per_row, c = (j - r * per_row) * kN;
    f(r * 2 * I + c, r * I + c);  // gate's index in inp, the output's in [N, I]
  }
}

template <class T, bool kVec>
__global__ void swiglu_fwd_kernel(T* out, const T* inp, int I, size_t runs) {
  constexpr int kN = kVec ? Vec16<T>::kN : 1;
  for_each_swiglu_run<T, kVec>(I, runs, [&](size_t gi, size_t oi) {
    float g[kN], u[kN];
    load_run<T, kN>(inp, gi, g);
    load_run<T, kN>(inp, gi + I, u);
#pragma unroll
    for (int k = 0; k < kN; ++k) g[k] = __fdiv_rn(g[k], 1.f + __expf(-g[k])) * u[k];
    store_run<T, kN>(out, oi, g);
  });
}

template <class T, bool kVec>
__global__ void swiglu_bwd_kernel(T* dinp, const T* inp, const T* dout, int I, size_t runs) {
  constexpr int kN = kVec ? Vec16<T>::kN : 1;
  for_each_swiglu_run<T, kVec>(I, runs, [&](size_t gi, size_t oi) {
    float g[kN], u[kN], d[kN];
    load_run<T, kN>(inp, gi, g);
    load_run<T, kN>(inp, gi + I, u);
    load_run<T, kN>(dout, oi, d);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const float den = 1.f + __expf(-g[k]);
      const float sig = __fdiv_rn(1.f, den), silu = __fdiv_rn(g[k], den);
      const float dg = d[k] * u[k] * (sig * (1.f + g[k] * (1.f - sig)));
      u[k] = d[k] * silu;
      g[k] = dg;
    }
    store_run<T, kN>(dinp, gi, g);
    store_run<T, kN>(dinp, gi + I, u);
  });
}

}  // namespace

void swiglu_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* inp, int N, int I) {
  if (N <= 0 || I <= 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    T* o = static_cast<T*>(out);
    const T* in = static_cast<const T*>(inp);
    const size_t n = static_cast<size_t>(N) * I;
    if (rows_vectorizable<T>(I, {out, inp})) {
      const size_t runs = n / Vec16<T>::kN;
      swiglu_fwd_kernel<T, true><<<grid_for(runs, kThreads), kThreads, 0, stream>>>(o, in, I, runs);
    } else {
      swiglu_fwd_kernel<T, false><<<grid_for(n, kThreads), kThreads, 0, stream>>>(o, in, I, n);
    }
  });
  ANVIL_CUDA_CHECK_LAST();
}

void swiglu_bwd(cudaStream_t stream, anvil::DType act, void* dinp, const void* inp, const void* dout, int N,
                int I) {
  if (N <= 0 || I <= 0) return;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    T* di = static_cast<T*>(dinp);
    const T* in = static_cast<const T*>(inp);
    const T* dy = static_cast<const T*>(dout);
    const size_t n = static_cast<size_t>(N) * I;
    if (rows_vectorizable<T>(I, {dinp, inp, dout})) {
      const size_t runs = n / Vec16<T>::kN;
      swiglu_bwd_kernel<T, true><<<grid_for(runs, kThreads), kThreads, 0, stream>>>(di, in, dy, I, runs);
    } else {
      swiglu_bwd_kernel<T, false><<<grid_for(n, kThreads), kThreads, 0, stream>>>(di, in, dy, I, n);
    }
  });
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
