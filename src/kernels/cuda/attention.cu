// Multi-head self-attention with materialised probabilities, the CUDA path for fp32 and the fallback for
// 16-bit when cuDNN's flash attention is not used (see cudnn_attention.cpp). Heads are permuted into
// contiguous [B,NH,T,HS] tensors so each step is one strided-batched GEMM over the B*NH heads. Only one
// layer's probabilities exist at a time (in scratch): the forward keeps each row's log-sum-exp and the
// backward recomputes the probabilities from q, k and it (the flash-attention contract of ops.hpp).
// Storage type T (fp32, bf16 or fp16) for q/k/v, probabilities and outputs; scores and dprobs are fp32 so
// the softmax and its gradient see full-precision inputs.
//
// Scratch layout (S = B*T*C = B*NH*T*HS elements, P = B*NH*T*T; each region 256-byte aligned):
//   [0,  S)  q          [1S, 2S)  k          [2S, 3S)  v                                 (type T)
//   [3S, 4S) fwd: y (attention output per head); bwd: dout per head, then dq            (type T)
//   [4S, 5S) bwd: dk    [5S, 6S)  bwd: dv                                                (type T)
//   D: P fp32     scores; bwd with 16-bit T: dprobs (fp32 T: the probabilities, in place over the scores)
//   E: P of T     16-bit T: the probabilities; fp32 T (bwd): dprobs
//   F: P of T     bwd, 16-bit T only: dscores (fp32 computes them in place over dprobs)
//
// Attention-probability dropout (AttentionDropout with p > 0; p == 0 runs exactly the kernels without it):
// element ((b*NH + h)*T + query)*T + key of the probabilities, i.e. row * T + key in the [B*NH*T, T] layout
// here, is kept as kernels/dropout.hpp decides with the key dropout_key(seed, micro, site) read from device
// memory. The forward's softmax writes the dropped probabilities P * keep / (1 - p) for the PV GEMM (lse
// stays the undropped softmax's). The backward's dprobs are then the gradient of the dropped probabilities:
// its softmax backward masks them (dP = keep / (1 - p) * dprobs), computes dscores from the undropped P, and
// rewrites P in place as the dropped P for the dv GEMM, which therefore runs after it.
#include <cmath>
#include <type_traits>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "kernels/dropout.hpp"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarpSize;  // softmax kernels: one warp per row

size_t padded_bytes(size_t bytes) {
  return (bytes + 255) / 256 * 256;
}

template <class T>
struct Regions {
  T *q, *k, *v, *r3, *dk, *dv;
  float* d;
  void* e;
  T* f;
};

template <class T>
Regions<T> regions(void* scratch, int B, int T_, int C, int NH) {
  const size_t s = padded_bytes(static_cast<size_t>(B) * T_ * C * sizeof(T));
  const size_t p = static_cast<size_t>(B) * NH * T_ * T_;
  const size_t p32 = padded_bytes(p * sizeof(float)), pt = padded_bytes(p * sizeof(T));
  char* base = static_cast<char*>(scratch);
  auto at = [&](size_t offset) { return reinterpret_cast<T*>(base + offset); };
  return {at(0),
          at(s),
          at(2 * s),
          at(3 * s),
          at(4 * s),
          at(5 * s),
          reinterpret_cast<float*>(base + 6 * s),
          base + 6 * s + p32,
          at(6 * s + p32 + pt)};
}

// dst[b,h,t,d] = src[(b*T + t) * src_row_stride + h*HS + d], dst contiguous [B,NH,T,HS].
template <class T>
__global__ void rows_to_heads_kernel(T* dst, const T* src, int src_row_stride, int seq, int NH, int HS,
                                     size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const int d = static_cast<int>(i % HS);
    const size_t bht = i / HS;
    const int t = static_cast<int>(bht % seq);
    const size_t bh = bht / seq;
    const int h = static_cast<int>(bh % NH);
    const size_t b = bh / NH;
    dst[i] = src[(b * seq + t) * src_row_stride + static_cast<size_t>(h) * HS + d];
  }
}

// dst[(b*T + t) * dst_row_stride + h*HS + d] = src[b,h,t,d]; iterates in dst order so writes coalesce.
template <class T>
__global__ void heads_to_rows_kernel(T* dst, int dst_row_stride, const T* src, int seq, int NH, int HS,
                                     size_t total) {
  const int C = NH * HS;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const int c = static_cast<int>(i % C);
    const size_t bt = i / C;
    const int h = c / HS, d = c % HS;
    const int t = static_cast<int>(bt % seq);
    const size_t b = bt / seq;
    dst[bt * dst_row_stride + c] = src[((b * NH + h) * seq + t) * HS + d];
  }
}

// The keys row `row` (query t of sequence b, head any) sees: 0..last (last = -1: a padding query).
__device__ inline int last_key(size_t row, int seq, int NH, bool causal, const int32_t* lengths) {
  const int t = static_cast<int>(row % seq);
  int len = seq;
  if (lengths) len = min(max(lengths[row / seq / NH], 0), seq);
  if (t >= len) return -1;
  return causal ? min(t, len - 1) : len - 1;
}

// The device side of AttentionDropout: the threshold and the factor 1 / (1 - p), computed on the host.
struct DropoutArgs {
  const anvil::DropoutState* state;
  uint32_t site;
  uint32_t threshold;
  float scale;
};

DropoutArgs dropout_args(const AttentionDropout& d) {
  return {d.state, d.site, anvil::dropout_threshold(d.p), anvil::dropout_scale(d.p)};
}

__device__ inline uint64_t dropout_row_key(const DropoutArgs& d) {
  return anvil::dropout_key(d.state->seed, d.state->micro, d.site);
}

// Rows of [B*NH*T, T] fp32 scores (scale * q.k). Writes the softmax over the visible keys, 0 elsewhere,
// into probs (which may alias scores when T is float: each element is read before the same thread writes
// it), and the row's log-sum-exp (0 for a padding query). kDropout: probs receives the dropped
// probabilities instead (lse is unchanged).
template <class T, bool kDropout>
__global__ void softmax_fwd_kernel(T* probs, float* lse, const float* scores, size_t rows, int seq, int NH,
                                   bool causal, const int32_t* lengths, DropoutArgs drop) {
  const size_t row = blockIdx.x * size_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int last = last_key(row, seq, NH, causal, lengths);
  const float* s = scores + row * seq;
  T* p = probs + row * seq;
  MaxSum stats{-INFINITY, 0.f};
  for (int j = lane; j <= last; j += kWarpSize) stats = max_sum_add(stats, s[j]);
  stats = warp_max_sum(stats);
  const float inv_sum = last >= 0 ? 1.f / stats.sum : 0.f;
  if constexpr (kDropout) {
    const uint64_t key = dropout_row_key(drop);
    for (int j = lane; j < seq; j += kWarpSize) {
      const bool keep = j <= last && anvil::dropout_keep(key, row * seq + j, drop.threshold);
      p[j] = from_float<T>(keep ? __fmul_rn(__expf(s[j] - stats.max) * inv_sum, drop.scale) : 0.f);
    }
  } else {
    for (int j = lane; j < seq; j += kWarpSize)
      p[j] = from_float<T>(j <= last ? __expf(s[j] - stats.max) * inv_sum : 0.f);
  }
  if (lane == 0) lse[row] = last >= 0 ? stats.max + __logf(stats.sum) : 0.f;
}

// The probabilities again from the scores and the forward's log-sum-exp (probs may alias scores for float).
template <class T>
__global__ void probs_from_lse_kernel(T* probs, const float* scores, const float* lse, size_t rows, int seq,
                                      int NH, bool causal, const int32_t* lengths) {
  const size_t row = blockIdx.x * size_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int last = last_key(row, seq, NH, causal, lengths);
  const float* s = scores + row * seq;
  const float l = lse[row];
  T* p = probs + row * seq;
  for (int j = lane; j < seq; j += kWarpSize) p[j] = from_float<T>(j <= last ? __expf(s[j] - l) : 0.f);
}

// dscores = scale * P * (dP - rowsum(P * dP)) (0 wherever P is). dscores may alias dp (T = float).
template <class T>
__global__ void softmax_bwd_kernel(T* dscores, const float* dp, const T* probs, size_t rows, int seq,
                                   float scale) {
  const size_t row = blockIdx.x * size_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const T* p = probs + row * seq;
  const float* g = dp + row * seq;
  T* out = dscores + row * seq;
  float dot = 0.f;
  for (int j = lane; j < seq; j += kWarpSize) dot += to_float(p[j]) * g[j];
  dot = warp_sum(dot);
  for (int j = lane; j < seq; j += kWarpSize) out[j] = from_float<T>(scale * to_float(p[j]) * (g[j] - dot));
}

// The same with dropout: dz is the gradient of the dropped probabilities, so dP = keep * drop.scale * dz and
// dscores = scale * P * (dP - rowsum(P * dP)) with P the undropped probabilities. Then probs is rewritten in
// place as the dropped probabilities (P * keep * drop.scale) for the dv GEMM. dscores may alias dz (T =
// float); probs aliases neither. Each element is read before the same thread writes it.
template <class T>
__global__ void softmax_dropout_bwd_kernel(T* dscores, const float* dz, T* probs, size_t rows, int seq,
                                           float scale, DropoutArgs drop) {
  const size_t row = blockIdx.x * size_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const uint64_t key = dropout_row_key(drop);
  T* p = probs + row * seq;
  const float* g = dz + row * seq;
  T* out = dscores + row * seq;
  float dot = 0.f;
  for (int j = lane; j < seq; j += kWarpSize)
    if (anvil::dropout_keep(key, row * seq + j, drop.threshold)) dot += to_float(p[j]) * (g[j] * drop.scale);
  dot = warp_sum(dot);
  for (int j = lane; j < seq; j += kWarpSize) {
    const bool keep = anvil::dropout_keep(key, row * seq + j, drop.threshold);
    const float pj = to_float(p[j]);
    const float dp = keep ? g[j] * drop.scale : 0.f;
    out[j] = from_float<T>(scale * pj * (dp - dot));
    p[j] = from_float<T>(keep ? __fmul_rn(pj, drop.scale) : 0.f);
  }
}

// Zeroes the rows of padding tokens (t >= lengths[b]) of x [B,T,width] (and, when lse is given, of lse
// [B,NH,T]): the contract's value there whatever a library kernel left.
template <class T>
__global__ void zero_padding_rows_kernel(T* x, int width, float* lse, int seq, int NH, const int32_t* lengths,
                                         size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t bt = i / width;
    const int b = static_cast<int>(bt / seq), t = static_cast<int>(bt % seq);
    if (t < lengths[b]) continue;
    x[i] = from_float<T>(0.f);
    if (lse && static_cast<int>(i % width) < NH)
      lse[(static_cast<size_t>(b) * NH + i % width) * seq + t] = 0.f;
  }
}

template <class T>
void rows_to_heads(cudaStream_t stream, T* dst, const T* src, int src_row_stride, int B, int seq, int NH,
                   int HS) {
  const size_t total = static_cast<size_t>(B) * seq * NH * HS;
  rows_to_heads_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(dst, src, src_row_stride, seq, NH,
                                                                           HS, total);
  ANVIL_CUDA_CHECK_LAST();
}

template <class T>
void heads_to_rows(cudaStream_t stream, T* dst, int dst_row_stride, const T* src, int B, int seq, int NH,
                   int HS) {
  const size_t total = static_cast<size_t>(B) * seq * NH * HS;
  heads_to_rows_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(dst, dst_row_stride, src, seq, NH,
                                                                           HS, total);
  ANVIL_CUDA_CHECK_LAST();
}

unsigned softmax_blocks(size_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

// One strided-batched GEMM (see GemmArgs). nvcc's host pass rejects designated initialisers inside templates,
// so the templated functions below go through this positional helper.
void run_batched(Gemm& gemm, cudaStream_t stream, const void* a, bool trans_a, const void* b, bool trans_b,
                 void* c, int m, int n, int k, float alpha, int batch, int64_t stride_a, int64_t stride_b,
                 int64_t stride_c, anvil::DType ab_type, anvil::DType c_type) {
  GemmArgs g;
  g.a = a, g.trans_a = trans_a, g.b = b, g.trans_b = trans_b, g.c = c;
  g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.batch = batch;
  g.stride_a = stride_a, g.stride_b = stride_b, g.stride_c = stride_c;
  g.ab_type = ab_type, g.c_type = c_type;
  gemm.run(stream, g);
}

template <class T>
void zero_padding_rows(cudaStream_t stream, T* x, int width, float* lse, int B, int seq, int NH,
                       const int32_t* lengths) {
  const size_t total = static_cast<size_t>(B) * seq * width;
  zero_padding_rows_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(x, width, lse, seq, NH,
                                                                               lengths, total);
  ANVIL_CUDA_CHECK_LAST();
}

template <class T>
void attention_fwd_typed(cudaStream_t stream, Gemm& gemm, anvil::DType act, T* out, float* lse, const T* qkv,
                         void* scratch, int B, int seq, int C, int NH, bool causal, const int32_t* lengths,
                         const AttentionDropout& dropout) {
  const int HS = C / NH;
  const Regions<T> r = regions<T>(scratch, B, seq, C, NH);
  rows_to_heads(stream, r.q, qkv, 3 * C, B, seq, NH, HS);
  rows_to_heads(stream, r.k, qkv + C, 3 * C, B, seq, NH, HS);
  rows_to_heads(stream, r.v, qkv + 2 * C, 3 * C, B, seq, NH, HS);

  const int heads = B * NH;
  const int64_t head_stride = static_cast<int64_t>(seq) * HS;
  const int64_t probs_stride = static_cast<int64_t>(seq) * seq;
  const float scale = 1.f / std::sqrt(static_cast<float>(HS));
  constexpr bool kFloat = std::is_same_v<T, float>;
  // scores[T,T] = scale * q[T,HS] @ k[T,HS]^T; the full square (masked entries are zeroed next).
  run_batched(gemm, stream, r.q, false, r.k, true, r.d, seq, seq, HS, scale, heads, head_stride, head_stride,
              probs_stride, act, anvil::DType::F32);
  T* probs = kFloat ? reinterpret_cast<T*>(r.d) : static_cast<T*>(r.e);
  const size_t rows = static_cast<size_t>(heads) * seq;
  if (dropout.p > 0)
    softmax_fwd_kernel<T, true><<<softmax_blocks(rows), kThreads, 0, stream>>>(
        probs, lse, r.d, rows, seq, NH, causal, lengths, dropout_args(dropout));
  else
    softmax_fwd_kernel<T, false>
        <<<softmax_blocks(rows), kThreads, 0, stream>>>(probs, lse, r.d, rows, seq, NH, causal, lengths, {});
  ANVIL_CUDA_CHECK_LAST();
  // y[T,HS] = probs[T,T] @ v[T,HS] (the dropped probabilities with dropout)
  run_batched(gemm, stream, probs, false, r.v, false, r.r3, seq, HS, seq, 1.f, heads, probs_stride,
              head_stride, head_stride, act, act);
  heads_to_rows(stream, out, C, r.r3, B, seq, NH, HS);
}

template <class T>
void attention_bwd_typed(cudaStream_t stream, Gemm& gemm, anvil::DType act, T* dqkv, const T* dout,
                         const T* qkv, const float* lse, void* scratch, int B, int seq, int C, int NH,
                         bool causal, const int32_t* lengths, const AttentionDropout& dropout) {
  const int HS = C / NH;
  const Regions<T> r = regions<T>(scratch, B, seq, C, NH);
  T* dout_heads = r.r3;
  T* dq = r.r3;  // reuses dout_heads once dv and dprobs no longer need it (stream order)
  rows_to_heads(stream, r.q, qkv, 3 * C, B, seq, NH, HS);
  rows_to_heads(stream, r.k, qkv + C, 3 * C, B, seq, NH, HS);
  rows_to_heads(stream, r.v, qkv + 2 * C, 3 * C, B, seq, NH, HS);
  rows_to_heads(stream, dout_heads, dout, C, B, seq, NH, HS);

  const int heads = B * NH;
  const int64_t head_stride = static_cast<int64_t>(seq) * HS;
  const int64_t probs_stride = static_cast<int64_t>(seq) * seq;
  const float scale = 1.f / std::sqrt(static_cast<float>(HS));
  constexpr bool kFloat = std::is_same_v<T, float>;
  T* probs = kFloat ? reinterpret_cast<T*>(r.d) : static_cast<T*>(r.e);
  float* dprobs = kFloat ? static_cast<float*>(r.e) : r.d;
  const size_t rows = static_cast<size_t>(heads) * seq;
  // The probabilities again: scores into D, then exp(score - lse) (in place for fp32, into E for 16-bit).
  run_batched(gemm, stream, r.q, false, r.k, true, r.d, seq, seq, HS, scale, heads, head_stride, head_stride,
              probs_stride, act, anvil::DType::F32);
  probs_from_lse_kernel<<<softmax_blocks(rows), kThreads, 0, stream>>>(probs, r.d, lse, rows, seq, NH, causal,
                                                                       lengths);
  ANVIL_CUDA_CHECK_LAST();
  // dprobs[T,T] = dout[T,HS] @ v[T,HS]^T, in fp32 (with dropout: the gradient of the dropped probabilities)
  run_batched(gemm, stream, dout_heads, false, r.v, true, dprobs, seq, seq, HS, 1.f, heads, head_stride,
              head_stride, probs_stride, act, anvil::DType::F32);
  T* dscores = kFloat ? reinterpret_cast<T*>(dprobs) : r.f;
  if (dropout.p > 0) {
    // dscores from the masked dprobs and the undropped probs, which it then overwrites with the dropped ones;
    // dv[T,HS] = dropped probs[T,T]^T @ dout[T,HS]
    softmax_dropout_bwd_kernel<<<softmax_blocks(rows), kThreads, 0, stream>>>(
        dscores, dprobs, probs, rows, seq, scale, dropout_args(dropout));
    ANVIL_CUDA_CHECK_LAST();
    run_batched(gemm, stream, probs, true, dout_heads, false, r.dv, seq, HS, seq, 1.f, heads, probs_stride,
                head_stride, head_stride, act, act);
  } else {
    // dv[T,HS] = probs[T,T]^T @ dout[T,HS]
    run_batched(gemm, stream, probs, true, dout_heads, false, r.dv, seq, HS, seq, 1.f, heads, probs_stride,
                head_stride, head_stride, act, act);
    // dscores = scale * probs * (dprobs - rowsum(probs * dprobs)); in place for fp32
    softmax_bwd_kernel<<<softmax_blocks(rows), kThreads, 0, stream>>>(dscores, dprobs, probs, rows, seq,
                                                                      scale);
    ANVIL_CUDA_CHECK_LAST();
  }
  // dq[T,HS] = dscores[T,T] @ k[T,HS]
  run_batched(gemm, stream, dscores, false, r.k, false, dq, seq, HS, seq, 1.f, heads, probs_stride,
              head_stride, head_stride, act, act);
  // dk[T,HS] = dscores[T,T]^T @ q[T,HS]
  run_batched(gemm, stream, dscores, true, r.q, false, r.dk, seq, HS, seq, 1.f, heads, probs_stride,
              head_stride, head_stride, act, act);
  heads_to_rows(stream, dqkv, 3 * C, dq, B, seq, NH, HS);
  heads_to_rows(stream, dqkv + C, 3 * C, r.dk, B, seq, NH, HS);
  heads_to_rows(stream, dqkv + 2 * C, 3 * C, r.dv, B, seq, NH, HS);
}

}  // namespace

size_t materialized_attention_scratch_bytes(anvil::DType act, int B, int T, int C, int NH) {
  const size_t elem = anvil::dtype_bits(act) / 8;
  const size_t s = padded_bytes(static_cast<size_t>(B) * T * C * elem);
  const size_t p = static_cast<size_t>(B) * NH * T * T;
  const bool fp32 = act == anvil::DType::F32;
  return 6 * s + padded_bytes(p * sizeof(float)) + padded_bytes(p * elem) +
         (fp32 ? 0 : padded_bytes(p * elem));
}

void materialized_attention_fwd(cudaStream_t stream, Gemm& gemm, anvil::DType act, void* out, float* lse,
                                const void* qkv, void* scratch, int B, int T, int C, int NH, bool causal,
                                const int32_t* lengths, const AttentionDropout& dropout) {
  if (B <= 0 || T <= 0) return;
  dispatch_float(act, [&](auto t) {
    using E = decltype(t);
    attention_fwd_typed<E>(stream, gemm, act, static_cast<E*>(out), lse, static_cast<const E*>(qkv), scratch,
                           B, T, C, NH, causal, lengths, dropout);
  });
}

void materialized_attention_bwd(cudaStream_t stream, Gemm& gemm, anvil::DType act, void* dqkv,
                                const void* dout, const void* qkv, const float* lse, void* scratch, int B,
                                int T, int C, int NH, bool causal, const int32_t* lengths,
                                const AttentionDropout& dropout) {
  if (B <= 0 || T <= 0) return;
  dispatch_float(act, [&](auto t) {
    using E = decltype(t);
    attention_bwd_typed<E>(stream, gemm, act, static_cast<E*>(dqkv), static_cast<const E*>(dout),
                           static_cast<const E*>(qkv), lse, scratch, B, T, C, NH, causal, lengths, dropout);
  });
}

void zero_attention_padding(cudaStream_t stream, anvil::DType act, void* x, int width, float* lse, int B,
                            int T, int NH, const int32_t* lengths) {
  if (B <= 0 || T <= 0 || !lengths) return;
  dispatch_float(act, [&](auto t) {
    using E = decltype(t);
    zero_padding_rows<E>(stream, static_cast<E*>(x), width, lse, B, T, NH, lengths);
  });
}

}  // namespace anvil::cuda
