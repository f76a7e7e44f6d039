// Self-attention with materialised probabilities, the CUDA path for fp32 and the fallback for 16-bit when
// cuDNN's flash attention is not used (see cudnn_attention.cpp). The fp32 multi-head forward without a
// sliding window runs as one fused kernel where attention_fwd_fused.cu supports the head size. Otherwise each
// step is one GEMM over every head of every sequence (run_head_batched) that reads q, k, v (and dout) in
// place inside their rows and writes out (and dq, dk, dv) in place through row strides: no permutes, no
// per-head copies. Grouped-query attention (NKV < NH) reads key/value head h / (NH / NKV) for query head h
// through the same per-head addresses. Only one layer's probabilities exist at a time (in scratch): the
// forward keeps each row's log-sum-exp and the backward recomputes the probabilities from q, k and it (the
// flash-attention contract of ops.hpp). Storage type T (fp32, bf16 or fp16) for q/k/v, probabilities and
// outputs; scores and dprobs are fp32 so the softmax and its gradient see full-precision inputs. A sliding
// window only narrows the keys the softmax kernels let through (the GEMMs still form the whole square).
//
// Scratch layout (P = B*NH*T*T, [B, NH, T, T] per region; each region 256-byte aligned):
//   D: P fp32     scores; bwd with 16-bit T: dprobs (fp32 T: the probabilities, in place over the scores)
//   E: P of T     16-bit T: the probabilities; fp32 T (bwd): dprobs
//   F: P of T     bwd, 16-bit T only: dscores (fp32 computes them in place over dprobs)
//   G: 3 * B*NH matrix addresses for the pointer-array GEMMs (each 256-byte aligned region padded)
//   H: grouped-query only, bwd: each query head's dk and dv, fp32 [B, T, NH, HS] each, which group_sum_kernel
//      then sums over the group into dqkv (one rounding, a fixed order, no atomics)
//
// Attention-probability dropout (AttentionDropout with p > 0; p == 0 runs exactly the kernels without it):
// element (row, key) of the [B*NH*T, T] probabilities (row = (b*NH + h)*T + query) is kept as
// attention_dropout_keep (kernels/dropout.hpp) decides, from the key dropout_key(seed, micro, site) read from
// device memory. The forward's softmax writes the dropped probabilities P * keep / (1 - p) for the PV GEMM
// (lse stays the undropped softmax's). The backward's dprobs are then the gradient of the dropped
// probabilities: its softmax backward masks them (dP = keep / (1 - p) * dprobs), computes dscores from the
// undropped P, and rewrites P in place as the dropped P for the dv GEMM, which therefore runs after it.
#include <algorithm>
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
  void** heads;     // G: per head-batched GEMM three arrays of B*NH matrix addresses, for up to kHeadGemms
  float* dk_heads;  // H (grouped-query only): per query head dk, then dv
  float* dv_heads;
};

// The backward's three head-batched GEMMs (dv, dq, dk) get their address arrays from one kernel launch.
constexpr int kHeadGemms = 3;

size_t head_arrays_bytes(int B, int NH) {
  return padded_bytes(kHeadGemms * 3 * static_cast<size_t>(B) * NH * sizeof(void*));
}

// Elements of one of region H's two per-query-head gradients.
size_t head_grad_elems(const AttentionDims& s) {
  return static_cast<size_t>(s.B) * s.T * s.NH * s.HS;
}

// D, E (and F for 16-bit) as in the file comment, then G (and H for grouped-query attention).
template <class T>
Regions<T> regions(void* scratch, const AttentionDims& s) {
  const size_t p = static_cast<size_t>(s.B) * s.NH * s.T * s.T;
  const size_t p32 = padded_bytes(p * sizeof(float)), pt = padded_bytes(p * sizeof(T));
  char* base = static_cast<char*>(scratch);
  const size_t g = p32 + pt + (std::is_same_v<T, float> ? 0 : pt);
  const size_t h = g + head_arrays_bytes(s.B, s.NH), hg = padded_bytes(head_grad_elems(s) * sizeof(float));
  const bool grouped = s.grouped();
  return {reinterpret_cast<float*>(base),
          base + p32,
          reinterpret_cast<T*>(base + p32 + pt),
          reinterpret_cast<void**>(base + g),
          grouped ? reinterpret_cast<float*>(base + h) : nullptr,
          grouped ? reinterpret_cast<float*>(base + h + hg) : nullptr};
}

// Rows of [B*NH*T, T] fp32 scores (scale * q.k). Writes the softmax over the visible keys (first..last),
// 0 elsewhere, into probs (which may alias scores when T is float: each element is read before the same
// thread writes it), and the row's log-sum-exp (0 for a padding query). kDropout: probs receives the
// dropped probabilities instead (lse is unchanged).
template <class T, bool kDropout>
__global__ void softmax_fwd_kernel(T* probs, float* lse, const float* scores, size_t rows, int seq, int NH,
                                   bool causal, int window, const int32_t* lengths, DropoutArgs drop) {
  const size_t row = blockIdx.x * size_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int first = first_key(row, seq, window), last = last_key(row, seq, NH, causal, lengths);
  const float* s = scores + row * seq;
  T* p = probs + row * seq;
  MaxSum stats{-INFINITY, 0.f};
  for (int j = first + lane; j <= last; j += kWarpSize) stats = max_sum_add(stats, s[j]);
  stats = warp_max_sum(stats);
  const float inv_sum = last >= 0 ? 1.f / stats.sum : 0.f;
  if constexpr (kDropout) {
    const uint32_t row_key = attention_dropout_row_key(drop, row);
    for (int j = lane; j < seq; j += kWarpSize) {
      const bool keep = j >= first && j <= last && anvil::attention_dropout_keep(row_key, j, drop.threshold);
      p[j] = from_float<T>(keep ? __fmul_rn(__expf(s[j] - stats.max) * inv_sum, drop.scale) : 0.f);
    }
  } else {
    for (int j = lane; j < seq; j += kWarpSize)
      p[j] = from_float<T>(j >= first && j <= last ? __expf(s[j] - stats.max) * inv_sum : 0.f);
  }
  if (lane == 0) lse[row] = last >= 0 ? stats.max + __logf(stats.sum) : 0.f;
}

// The probabilities again from the scores and the forward's log-sum-exp (probs may alias scores for float).
template <class T>
__global__ void probs_from_lse_kernel(T* probs, const float* scores, const float* lse, size_t rows, int seq,
                                      int NH, bool causal, int window, const int32_t* lengths) {
  const size_t row = blockIdx.x * size_t{kRowsPerBlock} + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= rows) return;
  const int first = first_key(row, seq, window), last = last_key(row, seq, NH, causal, lengths);
  const float* s = scores + row * seq;
  const float l = lse[row];
  T* p = probs + row * seq;
  for (int j = lane; j < seq; j += kWarpSize)
    p[j] = from_float<T>(j >= first && j <= last ? __expf(s[j] - l) : 0.f);
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
// [T, width] buffers (q, k, v in qkv, width (NH + 2 NKV) HS; out and dout, width NH HS), read and written in
// place through a row stride, with no permute. Probability-shaped operands ([NH, T, T] per sequence) are
// contiguous. `a`/`b`/`c` are the sequence-0 pointers; `*_seq` the elements between sequences, `*_head`
// between heads, `ld*` the row strides (0: contiguous). An operand with `group` G > 1 holds grouped-query
// key/value heads: query head h reads its head h / G. No single stride steps through every head of every
// sequence, so one pointer-array GEMM covers all B * NH heads (its addresses written by head_addresses_kernel
// into G); where cuBLASLt has no pointer-array algorithm, one strided GEMM per sequence (per sequence and
// member of a group when grouped).
struct HeadOperand {
  const void* p;
  int64_t seq, head, ld;
  int group = 1;
};

struct HeadAddresses {
  const char* a;
  const char* b;
  char* c;
  int64_t a_seq, a_head, b_seq, b_head, c_seq, c_head;  // in bytes
  int a_group, b_group;
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
  out[i] = const_cast<char*>(h.a + s * h.a_seq + head / h.a_group * h.a_head);
  out[h.count + i] = const_cast<char*>(h.b + s * h.b_seq + head / h.b_group * h.b_head);
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

// Runs `gemms` (at most kHeadGemms) in order, their address arrays (B > 1, or grouped operands) written by
// one kernel first.
void run_head_batched(Gemm& gemm, cudaStream_t stream, void** arrays, int B, int NH,
                      std::initializer_list<HeadGemm> gemms, anvil::DType ab_type, anvil::DType c_type) {
  const size_t ab = anvil::dtype_bits(ab_type) / 8, cb = anvil::dtype_bits(c_type) / 8;
  const int count = B * NH;
  int G = 1;  // the group size of the grouped operands (each operand's group is 1 or G)
  for (const HeadGemm& hg : gemms) G = std::max({G, hg.a.group, hg.b.group});
  // One strided batch cannot map query head h to head h / G, so grouped operands take the pointer arrays
  // even for one sequence.
  const bool use_arrays = B > 1 || G > 1;
  if (use_arrays) {
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
                         hg.a.group,
                         hg.b.group,
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
    if (use_arrays) {
      g.a = hg.a.p, g.b = hg.b.p, g.c = hg.c, g.batch = count;
      g.stride_a = hg.a.seq | hg.a.head, g.stride_b = hg.b.seq | hg.b.head,
      g.stride_c = hg.c_seq | hg.c_head;  // alignment only
      g.a_array = mine, g.b_array = mine + count, g.c_array = mine + 2 * count;
      if (gemm.try_run(stream, g)) continue;
      g.a_array = g.b_array = nullptr, g.c_array = nullptr;
    }
    // Per sequence and group member j, the query heads j, j + G, ...: a query-head operand steps G heads
    // per batch entry from head j, a grouped one one head from head 0 (G = 1: every head, one batch).
    const auto first = [&](const HeadOperand& o, int j) { return o.group > 1 ? 0 : j * o.head; };
    const auto step = [&](const HeadOperand& o) { return o.group > 1 ? o.head : G * o.head; };
    g.batch = NH / G, g.stride_a = step(hg.a), g.stride_b = step(hg.b), g.stride_c = G * hg.c_head;
    for (int s = 0; s < B; ++s) {
      for (int j = 0; j < G; ++j) {
        g.a = static_cast<const char*>(hg.a.p) + (size_t(s) * hg.a.seq + first(hg.a, j)) * ab;
        g.b = static_cast<const char*>(hg.b.p) + (size_t(s) * hg.b.seq + first(hg.b, j)) * ab;
        g.c = static_cast<char*>(hg.c) + (size_t(s) * hg.c_seq + j * hg.c_head) * cb;
        gemm.run(stream, g);
      }
    }
  }
}

// dk and dv of each key/value head from region H: the sum over its group's query heads (in head order, fp32)
// of their own gradients, rounded once into dqkv's k and v columns (row width (NH + 2 NKV) HS).
template <class T>
__global__ void group_sum_kernel(T* dqkv, const float* dk_heads, const float* dv_heads, int NH, int NKV,
                                 int HS, size_t total) {
  const int G = NH / NKV, kv_width = NKV * HS;
  const int64_t row = int64_t(NH + 2 * NKV) * HS;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t bt = i / kv_width;
    const int c = static_cast<int>(i % kv_width);                          // kv head c / HS, dimension c % HS
    const size_t first = bt * NH * HS + size_t(c / HS) * G * HS + c % HS;  // its first query head's element
    float dk = 0.f, dv = 0.f;
    for (int j = 0; j < G; ++j) dk += dk_heads[first + j * HS], dv += dv_heads[first + j * HS];
    T* dst = dqkv + bt * row + int64_t(NH) * HS + c;
    dst[0] = from_float<T>(dk);
    dst[kv_width] = from_float<T>(dv);
  }
}

// The head operands of one call: q, k, v inside qkv rows (k and v grouped with G > 1), out / dout rows.
struct HeadOperands {
  HeadOperands(const void* qkv, size_t elem, const AttentionDims& s)
      : row(s.qkv_width()), seq(int64_t(s.T) * row), C(s.q_width()) {
    const char* base = static_cast<const char*>(qkv);
    const int G = s.NH / s.NKV;
    q = {base, seq, s.HS, row};
    k = {base + size_t(C) * elem, seq, s.HS, row, G};
    v = {base + size_t(s.NH + s.NKV) * s.HS * elem, seq, s.HS, row, G};
  }
  int64_t row, seq, C;
  HeadOperand q, k, v;
};

template <class T>
void attention_fwd_typed(cudaStream_t stream, Gemm& gemm, anvil::DType act, T* out, float* lse, const T* qkv,
                         void* scratch, const AttentionDims& s, bool causal, int window,
                         const int32_t* lengths, const AttentionDropout& dropout) {
  constexpr bool kFloat = std::is_same_v<T, float>;
  const int B = s.B, seq = s.T, NH = s.NH, HS = s.HS, C = s.q_width();
  if constexpr (kFloat) {
    // The fused kernels know multi-head attention without a window only.
    if (!s.grouped() && window == 0 && attention_fwd_fused_supported(act, B, seq, C, NH, qkv, out)) {
      attention_fwd_fused(stream, out, lse, qkv, B, seq, C, NH, causal, lengths, dropout);
      return;
    }
  }
  const Regions<T> r = regions<T>(scratch, s);
  const int64_t probs_stride = static_cast<int64_t>(seq) * seq, probs_seq = NH * probs_stride;
  const HeadOperands ops(qkv, sizeof(T), s);
  const float scale = 1.f / std::sqrt(static_cast<float>(HS));
  // scores[T,T] = scale * q[T,HS] @ k[T,HS]^T; the full square (masked entries are zeroed next).
  run_head_batched(
      gemm, stream, r.heads, B, NH,
      {HeadGemm{ops.q, false, ops.k, true, r.d, probs_seq, probs_stride, 0, seq, seq, HS, scale}}, act,
      anvil::DType::F32);
  T* probs = kFloat ? reinterpret_cast<T*>(r.d) : static_cast<T*>(r.e);
  const size_t rows = static_cast<size_t>(B) * NH * seq;
  if (dropout.p > 0)
    softmax_fwd_kernel<T, true><<<softmax_blocks(rows), kThreads, 0, stream>>>(
        probs, lse, r.d, rows, seq, NH, causal, window, lengths, dropout_args(dropout));
  else
    softmax_fwd_kernel<T, false><<<softmax_blocks(rows), kThreads, 0, stream>>>(
        probs, lse, r.d, rows, seq, NH, causal, window, lengths, {});
  ANVIL_CUDA_CHECK_LAST();
  // out[T,HS] of each head = probs[T,T] @ v[T,HS] (the dropped probabilities with dropout), written in place
  run_head_batched(gemm, stream, r.heads, B, NH,
                   {HeadGemm{{probs, probs_seq, probs_stride, 0},
                             false,
                             ops.v,
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
                         const T* qkv, const T* out, const float* lse, void* scratch, const AttentionDims& s,
                         bool causal, int window, const int32_t* lengths, const AttentionDropout& dropout) {
  const int B = s.B, seq = s.T, NH = s.NH, HS = s.HS, C = s.q_width();
  const bool grouped = s.grouped();
  const Regions<T> r = regions<T>(scratch, s);
  const int64_t probs_stride = static_cast<int64_t>(seq) * seq, probs_seq = NH * probs_stride;
  const HeadOperands ops(qkv, sizeof(T), s);
  const HeadOperand &q = ops.q, &k = ops.k, &v = ops.v;
  const HeadOperand dO{dout, int64_t(seq) * C, HS, C};
  const float scale = 1.f / std::sqrt(static_cast<float>(HS));
  constexpr bool kFloat = std::is_same_v<T, float>;
  T* probs = kFloat ? reinterpret_cast<T*>(r.d) : static_cast<T*>(r.e);
  float* dprobs = kFloat ? static_cast<float*>(r.e) : r.d;
  const size_t rows = static_cast<size_t>(B) * NH * seq;
  T* dscores = kFloat ? reinterpret_cast<T*>(dprobs) : r.f;
  const HeadOperand P{probs, probs_seq, probs_stride, 0}, dS{dscores, probs_seq, probs_stride, 0};
  // dv[T,HS] = probs[T,T]^T @ dout[T,HS], dq[T,HS] = dscores[T,T] @ k[T,HS] and dk[T,HS] = dscores[T,T]^T @
  // q[T,HS], in place into dqkv's columns; grouped, dv and dk of each query head into region H (fp32, rows of
  // NH heads) instead.
  const int64_t seq_c = int64_t(seq) * C;
  const HeadGemm dq{dS, false, k, false, dqkv, ops.seq, HS, ops.row, seq, HS, seq, 1.f};
  const HeadGemm dv =
      grouped ? HeadGemm{P, true, dO, false, r.dv_heads, seq_c, HS, C, seq, HS, seq, 1.f}
              : HeadGemm{P, true, dO, false, dqkv + 2 * C, ops.seq, HS, ops.row, seq, HS, seq, 1.f};
  const HeadGemm dk = grouped
                          ? HeadGemm{dS, true, q, false, r.dk_heads, seq_c, HS, C, seq, HS, seq, 1.f}
                          : HeadGemm{dS, true, q, false, dqkv + C, ops.seq, HS, ops.row, seq, HS, seq, 1.f};
  if constexpr (kFloat) {
    if (!grouped && window == 0 && attention_bwd_scores_supported(act, B, seq, C, NH, qkv, dout, out)) {
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
                                                                       window, lengths);
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
    if (!grouped) run_head_batched(gemm, stream, r.heads, B, NH, {dv, dq, dk}, act, act);
  } else {
    if (!grouped) run_head_batched(gemm, stream, r.heads, B, NH, {dv}, act, act);
    // dscores = scale * probs * (dprobs - rowsum(probs * dprobs)); in place for fp32
    softmax_bwd_kernel<<<softmax_blocks(rows), kThreads, 0, stream>>>(dscores, dprobs, probs, rows, seq,
                                                                      scale);
    ANVIL_CUDA_CHECK_LAST();
    if (!grouped) run_head_batched(gemm, stream, r.heads, B, NH, {dq, dk}, act, act);
  }
  if (grouped) {
    run_head_batched(gemm, stream, r.heads, B, NH, {dq}, act, act);
    run_head_batched(gemm, stream, r.heads, B, NH, {dv, dk}, act, anvil::DType::F32);
    const size_t total = static_cast<size_t>(B) * seq * s.NKV * HS;
    group_sum_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(dqkv, r.dk_heads, r.dv_heads, NH,
                                                                            s.NKV, HS, total);
    ANVIL_CUDA_CHECK_LAST();
  }
}

}  // namespace

size_t materialized_attention_scratch_bytes(anvil::DType act, const AttentionDims& s) {
  const size_t elem = anvil::dtype_bits(act) / 8;
  const size_t p = static_cast<size_t>(s.B) * s.NH * s.T * s.T;
  const bool fp32 = act == anvil::DType::F32;
  const size_t head_grads = s.grouped() ? 2 * padded_bytes(head_grad_elems(s) * sizeof(float)) : 0;
  return padded_bytes(p * sizeof(float)) + padded_bytes(p * elem) + (fp32 ? 0 : padded_bytes(p * elem)) +
         head_arrays_bytes(s.B, s.NH) + head_grads;
}

void materialized_attention_fwd(cudaStream_t stream, Gemm& gemm, anvil::DType act, void* out, float* lse,
                                const void* qkv, void* scratch, const AttentionDims& s, bool causal,
                                int window, const int32_t* lengths, const AttentionDropout& dropout) {
  if (s.B <= 0 || s.T <= 0) return;
  dispatch_float(act, [&](auto t) {
    using E = decltype(t);
    attention_fwd_typed<E>(stream, gemm, act, static_cast<E*>(out), lse, static_cast<const E*>(qkv), scratch,
                           s, causal, window, lengths, dropout);
  });
}

void materialized_attention_bwd(cudaStream_t stream, Gemm& gemm, anvil::DType act, void* dqkv,
                                const void* dout, const void* qkv, const void* out, const float* lse,
                                void* scratch, const AttentionDims& s, bool causal, int window,
                                const int32_t* lengths, const AttentionDropout& dropout) {
  if (s.B <= 0 || s.T <= 0) return;
  dispatch_float(act, [&](auto t) {
    using E = decltype(t);
    attention_bwd_typed<E>(stream, gemm, act, static_cast<E*>(dqkv), static_cast<const E*>(dout),
                           static_cast<const E*>(qkv), static_cast<const E*>(out), lse, scratch, s, causal,
                           window, lengths, dropout);
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
