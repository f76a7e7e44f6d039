// Adafactor (transformers.optimization.Adafactor semantics, AdafactorArgs in kernels/ops.hpp), fused over
// every tensor of the table in five launches, whatever the number of tensors:
//   1. prepare   (a block per tensor): its first tile (prefix over the table), zeroed per-tensor sums,
//                factored row and column averages multiplied by beta2t;
//   2. moments   (tiles): sum of p^2 per tensor; factored: (1 - beta2t) * row and column means of
//                g^2 + eps1 added atomically to the averages; vectors: their running average, elementwise;
//   3. finish    (a block per tensor): mean of the row averages, the tensor's lr (parameter scale);
//   4. rms       (tiles): sum of u^2 per tensor, u = approx(rsqrt(E[g^2])) * g;
//   5. apply     (tiles): u recomputed, clipped by its RMS, times lr; first moment; weight decay; p -= u.
// Every tensor is cut into tiles of kTileRows x kTileCols elements (a vector is viewed as
// [ceil(n / kTileCols), kTileCols]); a block walks the tiles of all tensors with a grid-stride loop and
// finds a tile's tensor by binary search over the first tiles. Row and column partial sums are reduced
// in the block and added with one atomic per row / column per tile; per-tensor sums are fp64 atomics.
// The atomics make the sums' order (and so the last bits) vary from run to run; the CPU backend is the
// deterministic reference.
#include <cstdint>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kTileRows = 32;   // kWarps warps x kRowsPerWarp rows
constexpr int kTileCols = 128;  // kWarpSize lanes x kColsPerLane columns
constexpr int kRowsPerWarp = kTileRows / kWarps;
constexpr int kColsPerLane = kTileCols / kWarpSize;

// Per-tensor values shared by the launches, in the caller's scratch (kAdafactorScratchBytesPerTensor = 64
// bytes per tensor in kernels/ops.hpp).
struct TensorScratch {
  double sum_p2;
  double sum_u2;
  unsigned long long tile_begin;
  float lr;
  float row_mean;
};
static_assert(sizeof(TensorScratch) <= 64, "kAdafactorScratchBytesPerTensor");

// The group's entry of a per-group array, without dynamic indexing (which would copy the kernel
// parameters to local memory).
__device__ __forceinline__ float group_value(const float (&v)[4], uint32_t group) {
  float x = v[0];
#pragma unroll
  for (uint32_t q = 1; q < 4; ++q)
    if (group == q) x = v[q];
  return x;
}

// The tensor as tiles see it: [rows, cols] with n valid elements (index r * cols + c).
struct View {
  uint64_t rows, cols, n;
};

__device__ __forceinline__ View view_of(const AdafactorTensorDesc& t) {
  const uint64_t n = t.rows * t.cols;
  if (t.factored) return {t.rows, t.cols, n};
  return {(n + kTileCols - 1) / kTileCols, uint64_t(kTileCols), n};
}

__device__ __forceinline__ uint64_t col_tiles(const View& v) {
  return (v.cols + kTileCols - 1) / kTileCols;
}

__device__ __forceinline__ uint64_t tiles_of(const AdafactorTensorDesc& t) {
  const View v = view_of(t);
  return (v.rows + kTileRows - 1) / kTileRows * col_tiles(v);
}

__device__ __forceinline__ uint64_t total_tiles(const AdafactorTensorDesc* tensors, const TensorScratch* s,
                                                int num_tensors) {
  return s[num_tensors - 1].tile_begin + tiles_of(tensors[num_tensors - 1]);
}

// The tensor of a tile: the last one whose first tile is <= tile.
__device__ __forceinline__ int tensor_of(const TensorScratch* s, int num_tensors, uint64_t tile) {
  int lo = 0, hi = num_tensors - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (s[mid].tile_begin <= tile)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// A tile's place: tensor, first row and column of the tile in the tensor's view.
struct Tile {
  int tensor;
  View v;
  uint64_t r0, c0;
};

__device__ __forceinline__ Tile locate(const AdafactorTensorDesc* tensors, const TensorScratch* s,
                                       int num_tensors, uint64_t tile) {
  Tile t;
  t.tensor = tensor_of(s, num_tensors, tile);
  t.v = view_of(tensors[t.tensor]);
  const uint64_t local = tile - s[t.tensor].tile_begin, ct = col_tiles(t.v);
  t.r0 = local / ct * kTileRows;
  t.c0 = local % ct * kTileCols;
  return t;
}

// The step's beta2t: from device memory when the op was given the step's values there.
__device__ __forceinline__ float beta2t_of(const AdafactorParams& a) {
  return a.sv_device ? a.sv_device->beta2t : a.beta2t;
}

__global__ void prepare_kernel(const AdafactorTensorDesc* tensors, int num_tensors, TensorScratch* s,
                               float* sq, AdafactorParams a) {
  const float beta2t = beta2t_of(a);
  const int b = blockIdx.x;
  unsigned long long before = 0;
  for (int j = threadIdx.x; j < b; j += blockDim.x) before += tiles_of(tensors[j]);
  before = block_sum(before);
  if (threadIdx.x == 0) s[b] = {0.0, 0.0, before, 0.f, 0.f};
  const AdafactorTensorDesc t = tensors[b];
  if (!t.factored) return;
  for (uint64_t i = threadIdx.x; i < t.rows; i += blockDim.x) sq[t.row_state + i] *= beta2t;
  for (uint64_t i = threadIdx.x; i < t.cols; i += blockDim.x) sq[t.col_state + i] *= beta2t;
}

template <class G>
__global__ void moments_kernel(const float* param, const G* grad, float* sq,
                               const AdafactorTensorDesc* tensors, int num_tensors, TensorScratch* s,
                               AdafactorParams a) {
  __shared__ float col_part[kWarps][kTileCols];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const float beta2t = beta2t_of(a), one_minus = 1.f - beta2t;
  const float grad_scale = effective_grad_scale(a.grad_scale, a.grad_scale_device);
  const uint64_t total = total_tiles(tensors, s, num_tensors);
  for (uint64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const Tile T = locate(tensors, s, num_tensors, tile);
    const AdafactorTensorDesc t = tensors[T.tensor];
    float p2 = 0.f;
    float col_acc[kColsPerLane] = {};
    for (int k = 0; k < kRowsPerWarp; ++k) {
      const uint64_t r = T.r0 + warp + uint64_t(k) * kWarps;
      float row_acc = 0.f;
      for (int j = 0; j < kColsPerLane; ++j) {
        const uint64_t c = T.c0 + lane + uint64_t(j) * kWarpSize;
        const uint64_t i = r * T.v.cols + c;
        if (r >= T.v.rows || c >= T.v.cols || i >= T.v.n) continue;
        const float g = to_float(grad[t.offset + i]) * grad_scale;
        const float u = g * g + a.eps1;
        const float p = param[t.offset + i];
        p2 += p * p;
        if (t.factored) {
          row_acc += u;
          col_acc[j] += u;
        } else {
          float* v = sq + t.row_state + i;
          *v = *v * beta2t + one_minus * u;
        }
      }
      if (t.factored) {
        row_acc = warp_sum(row_acc);
        if (lane == 0 && r < T.v.rows)
          atomicAdd(sq + t.row_state + r, one_minus * (row_acc / float(T.v.cols)));
      }
    }
    if (t.factored) {
      for (int j = 0; j < kColsPerLane; ++j) col_part[warp][lane + j * kWarpSize] = col_acc[j];
      __syncthreads();
      if (threadIdx.x < kTileCols) {
        float sum = 0.f;
        for (int w = 0; w < kWarps; ++w) sum += col_part[w][threadIdx.x];
        const uint64_t c = T.c0 + threadIdx.x;
        if (c < T.v.cols) atomicAdd(sq + t.col_state + c, one_minus * (sum / float(T.v.rows)));
      }
      // (block_sum below synchronises before col_part is written again)
    }
    p2 = block_sum(p2);
    if (threadIdx.x == 0) atomicAdd(&s[T.tensor].sum_p2, double(p2));
  }
}

__global__ void finish_kernel(const AdafactorTensorDesc* tensors, const float* sq, TensorScratch* s,
                              AdafactorParams a) {
  const int b = blockIdx.x;
  const AdafactorTensorDesc t = tensors[b];
  double row_sum = 0;
  if (t.factored)
    for (uint64_t i = threadIdx.x; i < t.rows; i += blockDim.x) row_sum += sq[t.row_state + i];
  row_sum = block_sum(row_sum);
  if (threadIdx.x != 0) return;
  const uint64_t n = t.rows * t.cols;
  float lr = a.sv_device ? a.sv_device->lr[t.group & 3u] : group_value(a.step_size, t.group);
  if (a.scale_parameter) lr = fmaxf(a.eps2, float(sqrt(s[b].sum_p2 / double(n > 0 ? n : 1)))) * lr;
  s[b].lr = lr;
  s[b].row_mean = t.factored ? float(row_sum / double(t.rows > 0 ? t.rows : 1)) : 0.f;
}

// Walks the elements of a tile with their unclipped update u = approx(rsqrt(E[g^2])) * g:
// f(element index in the tensor, u) for row r0 + warp + k * kWarps, column c0 + lane + j * kWarpSize.
template <class G, class F>
__device__ __forceinline__ void for_each_update(const G* grad, const float* sq, const AdafactorTensorDesc& t,
                                                const Tile& T, float row_mean, float grad_scale, F&& f) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  float cf[kColsPerLane];
#pragma unroll
  for (int j = 0; j < kColsPerLane; ++j) {
    const uint64_t c = T.c0 + lane + uint64_t(j) * kWarpSize;
    cf[j] = t.factored && c < T.v.cols ? rsqrtf(sq[t.col_state + c]) : 0.f;
  }
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const uint64_t r = T.r0 + warp + uint64_t(k) * kWarps;
    if (r >= T.v.rows) break;
    const float rf = t.factored ? rsqrtf(sq[t.row_state + r] / row_mean) : 0.f;
#pragma unroll
    for (int j = 0; j < kColsPerLane; ++j) {
      const uint64_t c = T.c0 + lane + uint64_t(j) * kWarpSize;
      const uint64_t i = r * T.v.cols + c;
      if (c >= T.v.cols || i >= T.v.n) continue;
      const float g = to_float(grad[t.offset + i]) * grad_scale;
      const float approx = t.factored ? rf * cf[j] : rsqrtf(sq[t.row_state + i]);
      f(i, approx * g);
    }
  }
}

template <class G>
__global__ void rms_kernel(const G* grad, const float* sq, const AdafactorTensorDesc* tensors,
                           int num_tensors, TensorScratch* s, AdafactorParams a) {
  const float grad_scale = effective_grad_scale(a.grad_scale, a.grad_scale_device);
  const uint64_t total = total_tiles(tensors, s, num_tensors);
  for (uint64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const Tile T = locate(tensors, s, num_tensors, tile);
    float u2 = 0.f;
    for_each_update(grad, sq, tensors[T.tensor], T, s[T.tensor].row_mean, grad_scale,
                    [&](uint64_t, float u) { u2 += u * u; });
    u2 = block_sum(u2);
    if (threadIdx.x == 0) atomicAdd(&s[T.tensor].sum_u2, double(u2));
  }
}

template <class G>
__global__ void apply_kernel(float* param, const G* grad, const float* sq, float* exp_avg,
                             const AdafactorTensorDesc* tensors, int num_tensors, const TensorScratch* s,
                             AdafactorParams a) {
  const float grad_scale = effective_grad_scale(a.grad_scale, a.grad_scale_device);
  const uint64_t total = total_tiles(tensors, s, num_tensors);
  for (uint64_t tile = blockIdx.x; tile < total; tile += gridDim.x) {
    const Tile T = locate(tensors, s, num_tensors, tile);
    const AdafactorTensorDesc t = tensors[T.tensor];
    const TensorScratch ts = s[T.tensor];
    const float clip = fmaxf(1.f, float(sqrt(ts.sum_u2 / double(T.v.n))) / a.clip_threshold);
    const float lr = ts.lr;
    const float decay = -group_value(a.weight_decay, t.group) * lr;
    float* p = param + t.offset;
    float* m = a.first_moment ? exp_avg + t.offset : nullptr;
    for_each_update(grad, sq, t, T, ts.row_mean, grad_scale, [&](uint64_t i, float u) {
      u = u / clip;
      u = u * lr;
      if (m) {
        u = m[i] * a.beta1 + (1.f - a.beta1) * u;
        m[i] = u;
      }
      float pv = p[i];
      if (decay != 0.f) pv = pv + pv * decay;
      p[i] = pv - u;
    });
  }
}

// Blocks for the tile kernels: enough to fill the GPU, walking the tiles with a grid-stride loop.
unsigned tile_grid() {
  return unsigned(sm_count()) * 8u;
}

}  // namespace

void adafactor_step(cudaStream_t stream, anvil::DType grad_type, float* param, const void* grad, float* sq,
                    float* exp_avg, const AdafactorTensorDesc* tensors, int num_tensors, void* scratch,
                    const AdafactorParams& p) {
  if (num_tensors <= 0) return;
  auto* s = static_cast<TensorScratch*>(scratch);
  const unsigned grid = tile_grid();
  prepare_kernel<<<num_tensors, kThreads, 0, stream>>>(tensors, num_tensors, s, sq, p);
  ANVIL_CUDA_CHECK_LAST();
  dispatch_float(grad_type, [&](auto tag) {
    using G = decltype(tag);
    const G* g = static_cast<const G*>(grad);
    moments_kernel<<<grid, kThreads, 0, stream>>>(param, g, sq, tensors, num_tensors, s, p);
    ANVIL_CUDA_CHECK_LAST();
    finish_kernel<<<num_tensors, kThreads, 0, stream>>>(tensors, sq, s, p);
    ANVIL_CUDA_CHECK_LAST();
    rms_kernel<<<grid, kThreads, 0, stream>>>(g, sq, tensors, num_tensors, s, p);
    ANVIL_CUDA_CHECK_LAST();
    apply_kernel<<<grid, kThreads, 0, stream>>>(param, g, sq, exp_avg, tensors, num_tensors, s, p);
    ANVIL_CUDA_CHECK_LAST();
  });
}

}  // namespace anvil::cuda
