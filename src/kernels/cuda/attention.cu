// Multi-head self-attention with materialised probabilities, the CUDA path for fp32 and the fallback for
// 16-bit when cuDNN's flash attention is not used (see cudnn_attention.cpp). The fp32 forward runs as one
// fused kernel where attention_fwd_fused.cu supports the head size. Otherwise each step is one GEMM over
// every head of every sequence (run_head_batched) that reads q, k, v (and dout) in place inside their rows
// and writes out (and dq, dk, dv) in place through row strides: no permutes, no per-head copies. Only one
// layer's probabilities exist at a time (in scratch): the forward keeps each row's log-sum-exp and the
// backward recomputes the probabilities from q, k and it (the flash-attention contract of ops.hpp).
// Storage type T (fp32, bf16 or fp16) for q/k/v, probabilities and outputs; scores and dprobs are fp32 so
// the softmax and its gradient see full-precision inputs.
//
// Scratch layout (P = B*NH*T*T, [B, NH, T, T] per region; each region 256-byte aligned):
//   D: P fp32     scores; bwd with 16-bit T: dprobs (fp32 T: the probabilities, in place over the scores)
//   E: P of T     16-bit T: the probabilities; fp32 T (bwd): dprobs
//   F: P of T     bwd, 16-bit T only: dscores (fp32 computes them in place over dprobs)
//   G: 3 * B*NH matrix addresses for the pointer-array GEMMs (each 256-byte aligned region padded)
//
// Attention-probability dropout (AttentionDropout with p > 0; p == 0 runs exactly the kernels without it):
// element (row, key) of the [B*NH*T, T] probabilities (row = (b*NH + h)*T + query) is kept as
// attention_dropout_keep (kernels/dropout.hpp) decides, from the key dropout_key(seed, micro, site) read from
// device memory. The forward's softmax writes the dropped probabilities P * keep / (1 - p) for the PV GEMM
// (lse stays the undropped softmax's). The backward's dprobs are then the gradient of the dropped
// probabilities: its softmax backward masks them (dP = keep / (1 - p) * dprobs), computes dscores from the
// undropped P, and rewrites P in place as the dropped P for the dv GEMM, which therefore runs after it.
#include <cmath>
#include <type_traits>

#include "kernels/cuda/attention_common.cuh"
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
  float* d;
  void* e;
  T* f;
  void** heads;  // G: per head-batched GEMM three arrays of B*NH matrix addresses, for up to kHeadGemms
};

// The backward's three head-batched GEMMs (dv, dq, dk) get their address arrays from one kernel launch.
constexpr int kHeadGemms = 3;

size_t head_arrays_bytes(int B, int NH) {
  return padded_bytes(kHeadGemms * 3 * static_cast<size_t>(B) * NH * sizeof(void*));
}

// D, E (and F for 16-bit) as in the file comment, then G.
template <class T>
Regions<T> regions(void* scratch, int B, int T_, int NH) {
  const size_t p = static_cast<size_t>(B) * NH * T_ * T_;
  const size_t p32 = padded_bytes(p * sizeof(float)), pt = padded_bytes(p * sizeof(T));
  char* base = static_cast<char*>(scratch);
  const size_t g = p32 + pt + (std::is_same_v<T, float> ? 0 : pt);
  return {reinterpret_cast<float*>(base), base + p32, reinterpret_cast<T*>(base + p32 + pt),
          reinterpret_cast<void**>(base + g)};
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
    const uint32_t row_key = attention_dropout_row_key(drop, row);
    for (int j = lane; j < seq; j += kWarpSize) {
      const bool keep = j <= last && anvil::attention_dropout_keep(row_key, j, drop.threshold);
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
  const uint32_t row_key = attention_dropout_row_key(drop, row);
  T* p = probs + row * seq;
  const float* g = dz + row * seq;
  T* out = dscores + row * seq;
  float dot = 0.f;
  for (int j = lane; j < seq; j += kWarpSize)
    if (anvil::attention_dropout_keep(row_key, j, drop.threshold))
      dot += to_float(p[j]) * (g[j] * drop.scale);
  dot = warp_sum(dot);
  for (int j = lane; j < seq; j += kWarpSize) {
    const bool keep = anvil::attention_dropout_keep(row_key, j, drop.threshold);
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

unsigned softmax_blocks(size_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

template <class T>
void zero_padding_rows(cudaStream_t stream, T* x, int width, float* lse, int B, int seq, int NH,
                       const int32_t* lengths) {
  const size_t total = static_cast<size_t>(B) * seq * width;
  zero_padding_rows_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(x, width, lse, seq, NH,
                                                                               lengths, total);
  ANVIL_CUDA_CHECK_LAST();
}

// Head-batched GEMMs over the B sequences' heads: the heads are NH matrices HS apart inside rows of the
// [T, width] buffers (q, k, v in qkv, width 3C; out and dout, width C), read and written in place through a
// row stride, with no permute. Probability-shaped operands ([NH, T, T] per sequence) are contiguous.
// `a`/`b`/`c` are the sequence-0 pointers; `*_seq` the elements between sequences, `*_head` between heads,
// `ld*` the row strides (0: contiguous). No single stride steps through every head of every sequence, so
// one pointer-array GEMM covers all B * NH heads (its addresses written by head_addresses_kernel into G);
// where cuBLASLt has no pointer-array algorithm, one strided GEMM per sequence.
struct HeadOperand {
  const void* p;
  int64_t seq, head, ld;
};

struct HeadAddresses {
  const char* a;
  const char* b;
  char* c;
  int64_t a_seq, a_head, b_seq, b_head, c_seq, c_head;  // in bytes
  int NH, count;
};

// The address arrays of up to kHeadGemms head-batched GEMMs: GEMM y's three arrays at arrays + 3 * count * y.
struct HeadAddressBatch {
  HeadAddresses gemm[kHeadGemms];
};

__global__ void head_addresses_kernel(void** arrays, HeadAddressBatch batch) {
  const HeadAddresses& h = batch.gemm[blockIdx.y];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= h.count) return;
  void** out = arrays + 3 * size_t(h.count) * blockIdx.y;
  const int64_t s = i / h.NH, head = i % h.NH;
  out[i] = const_cast<char*>(h.a + s * h.a_seq + head * h.a_head);
  out[h.count + i] = const_cast<char*>(h.b + s * h.b_seq + head * h.b_head);
  out[2 * h.count + i] = h.c + s * h.c_seq + head * h.c_head;
}

// One head-batched GEMM (see run_head_batched).
struct HeadGemm {
  HeadOperand a;
  bool trans_a;
  HeadOperand b;
  bool trans_b;
  void* c;
  int64_t c_seq, c_head, ldc;
  int m, n, k;
  float alpha;
};

// Runs `gemms` (at most kHeadGemms) in order, their address arrays (B > 1) written by one kernel first.
void run_head_batched(Gemm& gemm, cudaStream_t stream, void** arrays, int B, int NH,
                      std::initializer_list<HeadGemm> gemms, anvil::DType ab_type, anvil::DType c_type) {
  const size_t ab = anvil::dtype_bits(ab_type) / 8, cb = anvil::dtype_bits(c_type) / 8;
  const int count = B * NH;
  if (B > 1) {
    HeadAddressBatch batch{};
    int y = 0;
    for (const HeadGemm& hg : gemms)
      batch.gemm[y++] = {static_cast<const char*>(hg.a.p),
                         static_cast<const char*>(hg.b.p),
                         static_cast<char*>(hg.c),
                         hg.a.seq * int64_t(ab),
                         hg.a.head * int64_t(ab),
                         hg.b.seq * int64_t(ab),
                         hg.b.head * int64_t(ab),
                         hg.c_seq * int64_t(cb),
                         hg.c_head * int64_t(cb),
                         NH,
                         count};
    constexpr int kAddressThreads = 128;
    const dim3 grid((count + kAddressThreads - 1) / kAddressThreads, y);
    head_addresses_kernel<<<grid, kAddressThreads, 0, stream>>>(arrays, batch);
    ANVIL_CUDA_CHECK_LAST();
  }
  int y = 0;
  for (const HeadGemm& hg : gemms) {
    GemmArgs g;
    g.trans_a = hg.trans_a, g.trans_b = hg.trans_b;
    g.m = hg.m, g.n = hg.n, g.k = hg.k, g.alpha = hg.alpha;
    g.lda = hg.a.ld, g.ldb = hg.b.ld, g.ldc = hg.ldc;
    g.ab_type = ab_type, g.c_type = c_type;
    g.native_fp32 = true;
    void** mine = arrays + 3 * size_t(count) * y++;
    if (B > 1) {
      g.a = hg.a.p, g.b = hg.b.p, g.c = hg.c, g.batch = count;
      g.stride_a = hg.a.seq | hg.a.head, g.stride_b = hg.b.seq | hg.b.head,
      g.stride_c = hg.c_seq | hg.c_head;  // alignment only
      g.a_array = mine, g.b_array = mine + count, g.c_array = mine + 2 * count;
      if (gemm.try_run(stream, g)) continue;
      g.a_array = g.b_array = nullptr, g.c_array = nullptr;
    }
    g.batch = NH, g.stride_a = hg.a.head, g.stride_b = hg.b.head, g.stride_c = hg.c_head;
    for (int s = 0; s < B; ++s) {
      g.a = static_cast<const char*>(hg.a.p) + size_t(s) * hg.a.seq * ab;
      g.b = static_cast<const char*>(hg.b.p) + size_t(s) * hg.b.seq * ab;
      g.c = static_cast<char*>(hg.c) + size_t(s) * hg.c_seq * cb;
      gemm.run(stream, g);
    }
  }
}

template <class T>
void attention_fwd_typed(cudaStream_t stream, Gemm& gemm, anvil::DType act, T* out, float* lse, const T* qkv,
                         void* scratch, int B, int seq, int C, int NH, bool causal, const int32_t* lengths,
                         const AttentionDropout& dropout) {
  constexpr bool kFloat = std::is_same_v<T, float>;
  if constexpr (kFloat) {
    if (attention_fwd_fused_supported(act, B, seq, C, NH, qkv, out)) {
      attention_fwd_fused(stream, out, lse, qkv, B, seq, C, NH, causal, lengths, dropout);
      return;
    }
  }
  const int HS = C / NH;
  const Regions<T> r = regions<T>(scratch, B, seq, NH);
  const int64_t row3 = 3 * int64_t(C), seq3 = int64_t(seq) * row3;  // qkv: row stride, sequence stride
  const int64_t probs_stride = static_cast<int64_t>(seq) * seq, probs_seq = NH * probs_stride;
  const HeadOperand q{qkv, seq3, HS, row3}, k{qkv + C, seq3, HS, row3}, v{qkv + 2 * C, seq3, HS, row3};
  const float scale = 1.f / std::sqrt(static_cast<float>(HS));
  // scores[T,T] = scale * q[T,HS] @ k[T,HS]^T; the full square (masked entries are zeroed next).
  run_head_batched(gemm, stream, r.heads, B, NH,
                   {HeadGemm{q, false, k, true, r.d, probs_seq, probs_stride, 0, seq, seq, HS, scale}}, act,
                   anvil::DType::F32);
  T* probs = kFloat ? reinterpret_cast<T*>(r.d) : static_cast<T*>(r.e);
  const size_t rows = static_cast<size_t>(B) * NH * seq;
  if (dropout.p > 0)
    softmax_fwd_kernel<T, true><<<softmax_blocks(rows), kThreads, 0, stream>>>(
        probs, lse, r.d, rows, seq, NH, causal, lengths, dropout_args(dropout));
  else
    softmax_fwd_kernel<T, false>
        <<<softmax_blocks(rows), kThreads, 0, stream>>>(probs, lse, r.d, rows, seq, NH, causal, lengths, {});
  ANVIL_CUDA_CHECK_LAST();
  // out[T,HS] of each head = probs[T,T] @ v[T,HS] (the dropped probabilities with dropout), written in place
  run_head_batched(gemm, stream, r.heads, B, NH,
                   {HeadGemm{{probs, probs_seq, probs_stride, 0},
                             false,
                             v,
                             false,
                             out,
                             int64_t(seq) * C,
                             HS,
                             C,
                             seq,
                             HS,
                             seq,
                             1.f}},
                   act, act);
}

template <class T>
void attention_bwd_typed(cudaStream_t stream, Gemm& gemm, anvil::DType act, T* dqkv, const T* dout,
                         const T* qkv, const T* out, const float* lse, void* scratch, int B, int seq, int C,
                         int NH, bool causal, const int32_t* lengths, const AttentionDropout& dropout) {
  const int HS = C / NH;
  const Regions<T> r = regions<T>(scratch, B, seq, NH);
  const int64_t row3 = 3 * int64_t(C), seq3 = int64_t(seq) * row3;
  const int64_t probs_stride = static_cast<int64_t>(seq) * seq, probs_seq = NH * probs_stride;
  const HeadOperand q{qkv, seq3, HS, row3}, k{qkv + C, seq3, HS, row3}, v{qkv + 2 * C, seq3, HS, row3};
  const HeadOperand dO{dout, int64_t(seq) * C, HS, C};
  const float scale = 1.f / std::sqrt(static_cast<float>(HS));
  constexpr bool kFloat = std::is_same_v<T, float>;
  T* probs = kFloat ? reinterpret_cast<T*>(r.d) : static_cast<T*>(r.e);
  float* dprobs = kFloat ? static_cast<float*>(r.e) : r.d;
  const size_t rows = static_cast<size_t>(B) * NH * seq;
  T* dscores = kFloat ? reinterpret_cast<T*>(dprobs) : r.f;
  const HeadOperand P{probs, probs_seq, probs_stride, 0}, dS{dscores, probs_seq, probs_stride, 0};
  // dv[T,HS] = probs[T,T]^T @ dout[T,HS], dq[T,HS] = dscores[T,T] @ k[T,HS] and dk[T,HS] = dscores[T,T]^T @
  // q[T,HS], in place into dqkv's columns.
  const HeadGemm dv{P, true, dO, false, dqkv + 2 * C, seq3, HS, row3, seq, HS, seq, 1.f};
  const HeadGemm dq{dS, false, k, false, dqkv, seq3, HS, row3, seq, HS, seq, 1.f};
  const HeadGemm dk{dS, true, q, false, dqkv + C, seq3, HS, row3, seq, HS, seq, 1.f};
  if constexpr (kFloat) {
    if (attention_bwd_scores_supported(act, B, seq, C, NH, qkv, dout, out)) {
      // The (dropped) probabilities and dscores in one pass (attention_bwd_scores.cu), then the three GEMMs.
      attention_bwd_scores(stream, probs, dscores, qkv, dout, out, lse, B, seq, C, NH, scale, causal, lengths,
                           dropout);
      run_head_batched(gemm, stream, r.heads, B, NH, {dv, dq, dk}, act, act);
      return;
    }
  }
  // The probabilities again: scores into D, then exp(score - lse) (in place for fp32, into E for 16-bit).
  run_head_batched(gemm, stream, r.heads, B, NH,
                   {HeadGemm{q, false, k, true, r.d, probs_seq, probs_stride, 0, seq, seq, HS, scale}}, act,
                   anvil::DType::F32);
  probs_from_lse_kernel<<<softmax_blocks(rows), kThreads, 0, stream>>>(probs, r.d, lse, rows, seq, NH, causal,
                                                                       lengths);
  ANVIL_CUDA_CHECK_LAST();
  // dprobs[T,T] = dout[T,HS] @ v[T,HS]^T, in fp32 (with dropout: the gradient of the dropped probabilities)
  run_head_batched(gemm, stream, r.heads, B, NH,
                   {HeadGemm{dO, false, v, true, dprobs, probs_seq, probs_stride, 0, seq, seq, HS, 1.f}}, act,
                   anvil::DType::F32);
  if (dropout.p > 0) {
    // dscores from the masked dprobs and the undropped probs, which it then overwrites with the dropped ones
    // for dv.
    softmax_dropout_bwd_kernel<<<softmax_blocks(rows), kThreads, 0, stream>>>(
        dscores, dprobs, probs, rows, seq, scale, dropout_args(dropout));
    ANVIL_CUDA_CHECK_LAST();
    run_head_batched(gemm, stream, r.heads, B, NH, {dv, dq, dk}, act, act);
  } else {
    run_head_batched(gemm, stream, r.heads, B, NH, {dv}, act, act);
    // dscores = scale * probs * (dprobs - rowsum(probs * dprobs)); in place for fp32
    softmax_bwd_kernel<<<softmax_blocks(rows), kThreads, 0, stream>>>(dscores, dprobs, probs, rows, seq,
                                                                      scale);
    ANVIL_CUDA_CHECK_LAST();
    run_head_batched(gemm, stream, r.heads, B, NH, {dq, dk}, act, act);
  }
}

}  // namespace

size_t materialized_attention_scratch_bytes(anvil::DType act, int B, int T,
                                            int /*C: heads are read in place*/, int NH) {
  const size_t elem = anvil::dtype_bits(act) / 8;
  const size_t p = static_cast<size_t>(B) * NH * T * T;
  const bool fp32 = act == anvil::DType::F32;
  return padded_bytes(p * sizeof(float)) + padded_bytes(p * elem) + (fp32 ? 0 : padded_bytes(p * elem)) +
         head_arrays_bytes(B, NH);
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
                                const void* dout, const void* qkv, const void* out, const float* lse,
                                void* scratch, int B, int T, int C, int NH, bool causal,
                                const int32_t* lengths, const AttentionDropout& dropout) {
  if (B <= 0 || T <= 0) return;
  dispatch_float(act, [&](auto t) {
    using E = decltype(t);
    attention_bwd_typed<E>(stream, gemm, act, static_cast<E*>(dqkv), static_cast<const E*>(dout),
                           static_cast<const E*>(qkv), static_cast<const E*>(out), lse, scratch, B, T, C, NH,
                           causal, lengths, dropout);
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
