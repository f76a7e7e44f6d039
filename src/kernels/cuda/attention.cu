// Causal multi-head self-attention with materialised probabilities (not flash): heads are permuted into
// contiguous [B,NH,T,HS] tensors so each step is one strided-batched GEMM over the B*NH heads.
//
// Scratch layout (floats; S = B*T*C = B*NH*T*HS, P = B*NH*T*T, each region padded to 64 floats):
//   [0,  S)  q          [1S, 2S)  k          [2S, 3S)  v
//   [3S, 4S) fwd: y (attention output per head); bwd: dout per head, then dq
//   [4S, 5S) bwd: dk    [5S, 6S)  bwd: dv    [6S, 6S + P) bwd: dprobs, then dscores (in place)
#include <cmath>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarpSize;  // softmax kernels: one warp per row

size_t padded(size_t floats) {
  return (floats + 63) / 64 * 64;
}  // 256-byte aligned regions

struct Regions {
  float *q, *k, *v, *r3, *dk, *dv, *dp;
};

Regions regions(float* scratch, int B, int T, int C) {
  const size_t s = padded(static_cast<size_t>(B) * T * C);
  return {scratch,         scratch + s,     scratch + 2 * s, scratch + 3 * s,
          scratch + 4 * s, scratch + 5 * s, scratch + 6 * s};
}

// dst[b,h,t,d] = src[(b*T + t) * src_row_stride + h*HS + d], dst contiguous [B,NH,T,HS].
__global__ void rows_to_heads_kernel(float* dst, const float* src, int src_row_stride, int T, int NH, int HS,
                                     size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const int d = static_cast<int>(i % HS);
    const size_t bht = i / HS;
    const int t = static_cast<int>(bht % T);
    const size_t bh = bht / T;
    const int h = static_cast<int>(bh % NH);
    const size_t b = bh / NH;
    dst[i] = src[(b * T + t) * src_row_stride + static_cast<size_t>(h) * HS + d];
  }
}

// dst[(b*T + t) * dst_row_stride + h*HS + d] = src[b,h,t,d]; iterates in dst order so writes coalesce.
__global__ void heads_to_rows_kernel(float* dst, int dst_row_stride, const float* src, int T, int NH, int HS,
                                     size_t total) {
  const int C = NH * HS;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const int c = static_cast<int>(i % C);
    const size_t bt = i / C;
    const int h = c / HS, d = c % HS;
    const int t = static_cast<int>(bt % T);
    const size_t b = bt / T;
    dst[bt * dst_row_stride + c] = src[((b * NH + h) * T + t) * HS + d];
  }
}

// In place on rows of [B*NH*T, T] holding scale * q.k: row r is query t = r % T, which sees keys 0..t.
// Writes softmax over those and 0 above the diagonal.
__global__ void causal_softmax_fwd_kernel(float* probs, size_t rows, int T) {
  const size_t row = blockIdx.x * size_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  float* p = probs + row * T;
  MaxSum stats{-INFINITY, 0.f};
  for (int j = lane; j <= t; j += kWarpSize) stats = max_sum_add(stats, p[j]);
  stats = warp_max_sum(stats);
  const float inv_sum = 1.f / stats.sum;
  for (int j = lane; j < T; j += kWarpSize) p[j] = j <= t ? __expf(p[j] - stats.max) * inv_sum : 0.f;
}

// dscores = scale * P * (dP - rowsum(P * dP)), in place over dP; 0 above the diagonal.
__global__ void causal_softmax_bwd_kernel(float* dp, const float* probs, size_t rows, int T, float scale) {
  const size_t row = blockIdx.x * size_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int t = static_cast<int>(row % T);
  const float* p = probs + row * T;
  float* g = dp + row * T;
  float dot = 0.f;
  for (int j = lane; j <= t; j += kWarpSize) dot += p[j] * g[j];
  dot = warp_sum(dot);
  for (int j = lane; j < T; j += kWarpSize) g[j] = j <= t ? scale * p[j] * (g[j] - dot) : 0.f;
}

void rows_to_heads(cudaStream_t stream, float* dst, const float* src, int src_row_stride, int B, int T,
                   int NH, int HS) {
  const size_t total = static_cast<size_t>(B) * T * NH * HS;
  rows_to_heads_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(dst, src, src_row_stride, T, NH,
                                                                           HS, total);
  ANVIL_CUDA_CHECK_LAST();
}

void heads_to_rows(cudaStream_t stream, float* dst, int dst_row_stride, const float* src, int B, int T,
                   int NH, int HS) {
  const size_t total = static_cast<size_t>(B) * T * NH * HS;
  heads_to_rows_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(dst, dst_row_stride, src, T, NH,
                                                                           HS, total);
  ANVIL_CUDA_CHECK_LAST();
}

unsigned softmax_blocks(size_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

size_t attention_scratch_floats(int B, int T, int C, int NH) {
  const size_t s = padded(static_cast<size_t>(B) * T * C);
  const size_t p = padded(static_cast<size_t>(B) * NH * T * T);
  return 6 * s + p;
}

void attention_fwd(cudaStream_t stream, Gemm& gemm, float* out, float* probs, const float* qkv,
                   float* scratch, int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0) return;
  const int HS = C / NH;
  const Regions r = regions(scratch, B, T, C);
  rows_to_heads(stream, r.q, qkv, 3 * C, B, T, NH, HS);
  rows_to_heads(stream, r.k, qkv + C, 3 * C, B, T, NH, HS);
  rows_to_heads(stream, r.v, qkv + 2 * C, 3 * C, B, T, NH, HS);

  const int heads = B * NH;
  const int64_t head_stride = static_cast<int64_t>(T) * HS;
  const int64_t probs_stride = static_cast<int64_t>(T) * T;
  const float scale = 1.f / std::sqrt(static_cast<float>(HS));
  // scores[T,T] = scale * q[T,HS] @ k[T,HS]^T, into probs; the full square (the upper half is masked next).
  gemm.run(stream, {.a = r.q,
                    .b = r.k,
                    .trans_b = true,
                    .c = probs,
                    .m = T,
                    .n = T,
                    .k = HS,
                    .alpha = scale,
                    .batch = heads,
                    .stride_a = head_stride,
                    .stride_b = head_stride,
                    .stride_c = probs_stride});
  const size_t rows = static_cast<size_t>(heads) * T;
  causal_softmax_fwd_kernel<<<softmax_blocks(rows), kThreads, 0, stream>>>(probs, rows, T);
  ANVIL_CUDA_CHECK_LAST();
  // y[T,HS] = probs[T,T] @ v[T,HS]
  gemm.run(stream, {.a = probs,
                    .b = r.v,
                    .c = r.r3,
                    .m = T,
                    .n = HS,
                    .k = T,
                    .batch = heads,
                    .stride_a = probs_stride,
                    .stride_b = head_stride,
                    .stride_c = head_stride});
  heads_to_rows(stream, out, C, r.r3, B, T, NH, HS);
}

void attention_bwd(cudaStream_t stream, Gemm& gemm, float* dqkv, const float* dout, const float* qkv,
                   const float* probs, float* scratch, int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0) return;
  const int HS = C / NH;
  const Regions r = regions(scratch, B, T, C);
  float* dout_heads = r.r3;
  float* dq = r.r3;  // reuses dout_heads once dv and dprobs no longer need it (stream order)
  rows_to_heads(stream, r.q, qkv, 3 * C, B, T, NH, HS);
  rows_to_heads(stream, r.k, qkv + C, 3 * C, B, T, NH, HS);
  rows_to_heads(stream, r.v, qkv + 2 * C, 3 * C, B, T, NH, HS);
  rows_to_heads(stream, dout_heads, dout, C, B, T, NH, HS);

  const int heads = B * NH;
  const int64_t head_stride = static_cast<int64_t>(T) * HS;
  const int64_t probs_stride = static_cast<int64_t>(T) * T;
  const float scale = 1.f / std::sqrt(static_cast<float>(HS));
  // dprobs[T,T] = dout[T,HS] @ v[T,HS]^T
  gemm.run(stream, {.a = dout_heads,
                    .b = r.v,
                    .trans_b = true,
                    .c = r.dp,
                    .m = T,
                    .n = T,
                    .k = HS,
                    .batch = heads,
                    .stride_a = head_stride,
                    .stride_b = head_stride,
                    .stride_c = probs_stride});
  // dv[T,HS] = probs[T,T]^T @ dout[T,HS]
  gemm.run(stream, {.a = probs,
                    .trans_a = true,
                    .b = dout_heads,
                    .c = r.dv,
                    .m = T,
                    .n = HS,
                    .k = T,
                    .batch = heads,
                    .stride_a = probs_stride,
                    .stride_b = head_stride,
                    .stride_c = head_stride});
  // dscores = scale * probs * (dprobs - rowsum(probs * dprobs)), in place
  const size_t rows = static_cast<size_t>(heads) * T;
  causal_softmax_bwd_kernel<<<softmax_blocks(rows), kThreads, 0, stream>>>(r.dp, probs, rows, T, scale);
  ANVIL_CUDA_CHECK_LAST();
  // dq[T,HS] = dscores[T,T] @ k[T,HS]
  gemm.run(stream, {.a = r.dp,
                    .b = r.k,
                    .c = dq,
                    .m = T,
                    .n = HS,
                    .k = T,
                    .batch = heads,
                    .stride_a = probs_stride,
                    .stride_b = head_stride,
                    .stride_c = head_stride});
  // dk[T,HS] = dscores[T,T]^T @ q[T,HS]
  gemm.run(stream, {.a = r.dp,
                    .trans_a = true,
                    .b = r.q,
                    .c = r.dk,
                    .m = T,
                    .n = HS,
                    .k = T,
                    .batch = heads,
                    .stride_a = probs_stride,
                    .stride_b = head_stride,
                    .stride_c = head_stride});
  heads_to_rows(stream, dqkv, 3 * C, dq, B, T, NH, HS);
  heads_to_rows(stream, dqkv + C, 3 * C, r.dk, B, T, NH, HS);
  heads_to_rows(stream, dqkv + 2 * C, 3 * C, r.dv, B, T, NH, HS);
}

}  // namespace anvil::cuda
