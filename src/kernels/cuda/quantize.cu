// Quantized weights on the GPU (kernels/quantization.hpp).
// Ops::dequantize: each thread turns one code byte into its element(s) (two for NF4, one for int8), with the
// format's formula (kernels/quantization.cpp: dequantized_value), so the result is the CPU reference's bit
// for bit. Memory-bound: codes and scales are read once, the compute-type matrix written once.
// Ops::quantized_matmul_fwd (decoding a few tokens): a GEMV that reads each code once and never writes a
// dequantized copy: 0.56 bytes per NF4 weight (1.06 for int8) instead of dequantize + GEMM's 4.5 (0.56 read,
// 2 written, 2 read again). One warp per output feature; each lane takes 8 consecutive weights a step (one
// 4-byte NF4 word, or 8 int8 codes), dequantizes them as Ops::dequantize does (rounded to the compute type,
// so the products are the dequantized matrix's) and accumulates them against up to 8 input rows in fp32;
// the warp sums its lanes at the end.
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;

// The tables travel by value with each launch (kernel parameters live in constant memory on every device).
struct Nf4Table {
  float v[16];
};
struct DynamicMap {  // the signed dynamic map of double-quantized scales
  float v[256];
};

// The scale of NF4 block `b`: stored, or (kDQ) decoded as kernels/quantization.cpp's nf4_double_quant_scale
// (product and sum each rounded: no FMA).
template <bool kDQ>
__device__ __forceinline__ float nf4_scale(const float* scales, const uint8_t* scale_codes, const float* map,
                                           size_t b) {
  if constexpr (kDQ)
    return __fadd_rn(__fmul_rn(map[scale_codes[b]], scales[1 + b / anvil::kNf4ScaleBlock]), scales[0]);
  else
    return scales[b];
}

// Stages the dynamic map in shared memory (kDQ; the block has at least 256 threads).
template <bool kDQ>
__device__ __forceinline__ void stage_map(float* shared, const DynamicMap& map) {
  if constexpr (kDQ) {
    if (threadIdx.x < 256) shared[threadIdx.x] = map.v[threadIdx.x];
    __syncthreads();
  }
}

template <class T, bool kDQ>
__global__ void dequantize_nf4_kernel(T* out, const uint8_t* codes, const float* scales, size_t n,
                                      Nf4Table code, DynamicMap dmap) {
  __shared__ float map[kDQ ? 256 : 1];
  stage_map<kDQ>(map, dmap);
  const uint8_t* scale_codes = codes + (n + 1) / 2;
  const size_t bytes = (n + 1) / 2;
  for (size_t b = blockIdx.x * size_t{blockDim.x} + threadIdx.x; b < bytes;
       b += size_t{gridDim.x} * blockDim.x) {
    const uint8_t c = codes[b];
    const size_t i = 2 * b;
    // Both elements of a byte are in one block (blocks hold an even number of elements).
    const float s = nf4_scale<kDQ>(scales, scale_codes, map, i / anvil::kNf4BlockSize);
    out[i] = from_float<T>(code.v[c >> 4] * s);
    if (i + 1 < n) out[i + 1] = from_float<T>(code.v[c & 0xF] * s);
  }
}

template <class T>
__global__ void dequantize_int8_kernel(T* out, const int8_t* codes, const float* scales, size_t n,
                                       size_t cols) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    out[i] = from_float<T>(static_cast<float>(codes[i]) * __fmul_rn(scales[i / cols], anvil::kInt8Step));
}

// 8 values of x (compute type T) from a 16-byte-aligned address, widened.
template <class T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    const Vec16<T> a = *reinterpret_cast<const Vec16<T>*>(p);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = to_float(a.v[i]);
  }
}

constexpr int kGemvWarps = 8;             // output features per block of 256 threads
constexpr int kGemvStep = 8 * kWarpSize;  // weights of a row a warp takes per step

// y[r, o] = sum_k x[r, k] W[o, k] (+ bias[o]) for r < rows (<= R), W from codes; K % 64 == 0.
template <class T, int R, bool kNf4, bool kDQ>
__global__ void quantized_gemv_kernel(T* y, const T* x, const uint8_t* codes, const float* scales,
                                      const T* bias, int rows, int K, int O, Nf4Table code, DynamicMap dmap) {
  __shared__ float table[16];
  __shared__ float map[kDQ ? 256 : 1];
  if (kNf4 && threadIdx.x < 16) table[threadIdx.x] = code.v[threadIdx.x];
  stage_map<kDQ>(map, dmap);
  if (kNf4) __syncthreads();
  const uint8_t* scale_codes = codes + (static_cast<size_t>(O) * K + 1) / 2;
  const int lane = threadIdx.x % kWarpSize;
  const int o = blockIdx.x * kGemvWarps + threadIdx.x / kWarpSize;
  if (o >= O) return;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  const size_t row0 = static_cast<size_t>(o) * K;
  const float row_scale = kNf4 ? 0.f : __fmul_rn(scales[o], anvil::kInt8Step);
#pragma unroll 4
  for (int k = lane * 8; k < K; k += kGemvStep) {
    float w[8];
    if constexpr (kNf4) {
      const uint32_t word = *reinterpret_cast<const uint32_t*>(codes + (row0 + k) / 2);
      const float s = nf4_scale<kDQ>(scales, scale_codes, map, (row0 + k) / anvil::kNf4BlockSize);
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // byte j holds elements 2j (high nibble) and 2j + 1
        const uint32_t b = (word >> (8 * j)) & 0xFF;
        w[2 * j] = to_float(from_float<T>(table[b >> 4] * s));
        w[2 * j + 1] = to_float(from_float<T>(table[b & 0xF] * s));
      }
    } else {
      const uint2 c = *reinterpret_cast<const uint2*>(codes + row0 + k);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int8_t q = static_cast<int8_t>(((j < 4 ? c.x : c.y) >> (8 * (j % 4))) & 0xFF);
        w[j] = to_float(from_float<T>(static_cast<float>(q) * row_scale));
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < rows) {
        float v[8];
        load8(x + static_cast<size_t>(r) * K + k, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r] = fmaf(v[j], w[j], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float a = acc[r];
    for (int off = kWarpSize / 2; off > 0; off /= 2) a += __shfl_xor_sync(0xffffffffu, a, off);
    if (lane == 0 && r < rows)
      y[static_cast<size_t>(r) * O + o] = from_float<T>(bias ? a + to_float(bias[o]) : a);
  }
}

template <class T, bool kNf4, bool kDQ>
void launch_gemv(cudaStream_t stream, T* y, const T* x, const anvil::QuantizedMatrix& m, const T* bias,
                 int rows, const Nf4Table& table, const DynamicMap& map) {
  const int K = static_cast<int>(m.cols), O = static_cast<int>(m.rows);
  const dim3 grid((O + kGemvWarps - 1) / kGemvWarps), block(kGemvWarps * kWarpSize);
  auto go = [&](auto r) {
    quantized_gemv_kernel<T, decltype(r)::value, kNf4, kDQ>
        <<<grid, block, 0, stream>>>(y, x, m.codes, m.scales, bias, rows, K, O, table, map);
  };
  if (rows <= 1)
    go(std::integral_constant<int, 1>{});
  else if (rows <= 2)
    go(std::integral_constant<int, 2>{});
  else if (rows <= 4)
    go(std::integral_constant<int, 4>{});
  else
    go(std::integral_constant<int, 8>{});
}

Nf4Table nf4_table() {
  Nf4Table t;
  for (int i = 0; i < 16; ++i) t.v[i] = anvil::kNf4Code[i];
  return t;
}

const DynamicMap& dynamic_map() {
  static const DynamicMap m = [] {
    DynamicMap d;
    const std::array<float, 256> v = anvil::dynamic_quant_map(true);
    for (int i = 0; i < 256; ++i) d.v[i] = v[size_t(i)];
    return d;
  }();
  return m;
}

}  // namespace

bool quantized_gemv_supported(const anvil::QuantizedMatrix& m, const void* x) {
  return m.cols % kQuantizedGemvColumns == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(m.codes) % 16 == 0;
}

void quantized_gemv(cudaStream_t stream, anvil::DType act, void* y, const void* x,
                    const anvil::QuantizedMatrix& m, const void* bias, int N) {
  if (N <= 0 || m.rows == 0) return;
  const Nf4Table table = nf4_table();
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    // The codes are read again for each 8 rows.
    for (int r0 = 0; r0 < N; r0 += 8) {
      T* yr = static_cast<T*>(y) + static_cast<size_t>(r0) * m.rows;
      const T* xr = static_cast<const T*>(x) + static_cast<size_t>(r0) * m.cols;
      const int rows = N - r0 < 8 ? N - r0 : 8;
      const T* b = static_cast<const T*>(bias);
      if (m.storage == anvil::WeightStorage::NF4)
        launch_gemv<T, true, false>(stream, yr, xr, m, b, rows, table, dynamic_map());
      else if (m.storage == anvil::WeightStorage::NF4DoubleQuant)
        launch_gemv<T, true, true>(stream, yr, xr, m, b, rows, table, dynamic_map());
      else
        launch_gemv<T, false, false>(stream, yr, xr, m, b, rows, table, dynamic_map());
    }
  });
  ANVIL_CUDA_CHECK(cudaGetLastError());
}

void dequantize(cudaStream_t stream, anvil::DType act, void* out, const anvil::QuantizedMatrix& m) {
  const size_t n = m.numel();
  if (n == 0) return;
  const Nf4Table table = nf4_table();
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    if (m.storage == anvil::WeightStorage::NF4) {
      dequantize_nf4_kernel<T, false><<<grid_for((n + 1) / 2, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(out), m.codes, m.scales, n, table, dynamic_map());
    } else if (m.storage == anvil::WeightStorage::NF4DoubleQuant) {
      dequantize_nf4_kernel<T, true><<<grid_for((n + 1) / 2, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(out), m.codes, m.scales, n, table, dynamic_map());
    } else {
      // (CudaOps::dequantize checked the storage.)
      dequantize_int8_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(out), reinterpret_cast<const int8_t*>(m.codes), m.scales, n, size_t(m.cols));
    }
  });
  ANVIL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace anvil::cuda
