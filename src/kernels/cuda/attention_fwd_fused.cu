// The fp32 attention forward in one kernel (flash-attention style): each thread owns one query row of one
// head and its output accumulator (in registers), and streams the head's keys and values through shared
// memory with an online softmax, so neither the scores nor the probabilities are ever written. The
// materialised path (attention.cu) writes the [B, NH, T, T] scores, rereads them for the softmax, writes the
// probabilities and rereads them for the PV GEMM. The backward is unchanged: it recomputes the
// probabilities from q, k and the log-sum-exp written here.
//
// One thread per query keeps the softmax statistics in registers (no cross-thread reductions), and every
// key and value read from shared memory is a 16-byte read that all threads of the block make at the same
// time (a broadcast). Scores are formed in the log2 domain (q pre-multiplied by scale * log2(e)) so each
// probability is one exp2. (Splitting each row's dimensions over two threads, for twice the warps, measured
// slower on the H100: 194 against 183 us a BERT-large layer.)
//
// Dropout: the kept/dropped decision of element (row, key) is exactly the materialised path's
// (attention_dropout_keep, kernels/dropout.hpp); the sum l of the softmax runs over the undropped
// probabilities, so lse is the undropped softmax's, and the output is (sum over kept keys of p v) * scale /
// l.
#include <cmath>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kQueries = 64;  // queries per block, one per thread
constexpr int kKeys = 32;     // keys (and values) staged in shared memory at a time
constexpr int kChunk = 16;    // keys per online-softmax update: the scores held in registers at once
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// The last key any query of the block sees (-1: every query of the block is padding). Uniform over the
// block, so the key loop needs no vote.
__device__ __forceinline__ int block_last_key(int q0, int b, int seq, bool causal, const int32_t* lengths) {
  const int len = lengths ? min(max(lengths[b], 0), seq) : seq;
  if (q0 >= len) return -1;
  return causal ? min(q0 + kQueries - 1, len - 1) : len - 1;
}

// Rows k0 .. k0 + kKeys - 1 of a [T, ld] operand (a head, in place) into dst[kKeys][HS] by asynchronous
// copies (no registers held while the q and output rows occupy them); rows past `seq` are zero-filled.
// Consecutive threads copy consecutive 16-byte pieces of a row. The caller waits (wait_staged).
template <int HS>
__device__ __forceinline__ void stage_rows(float* dst, const float* src, int64_t ld, int k0, int seq) {
  constexpr int kQuads = HS / 4, kPerThread = kKeys * kQuads / kQueries;
  static_assert((kKeys * kQuads) % kQueries == 0, "tile not covered evenly");
#pragma unroll
  for (int n = 0; n < kPerThread; ++n) {
    const int i = threadIdx.x + n * kQueries, r = i / kQuads, d = 4 * (i % kQuads);
    const bool inside = k0 + r < seq;
    const float* from = src + int64_t(inside ? k0 + r : 0) * ld + d;
    const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst + 4 * i));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from),
                 "r"(inside ? 16 : 0));
  }
}

__device__ __forceinline__ void wait_staged() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

// Block (query tile x, head y = b * NH + h); thread = one query. The pre-scaled q rows live in shared memory
// (row pitch HS + 4: a warp's 16-byte reads of 8 consecutive rows hit 32 distinct banks), which leaves the
// registers to the output row and the scores.
template <int HS, bool kDropout>
__global__ void __launch_bounds__(kQueries)
    attention_fwd_fused_kernel(float* out, float* lse, const float* qkv, int seq, int C, int NH,
                               float scale_log2, bool causal, const int32_t* lengths, DropoutArgs drop) {
  constexpr int kQPitch = HS + 4;
  __shared__ __align__(16) float k_s[kKeys * HS];
  __shared__ __align__(16) float v_s[kKeys * HS];
  __shared__ __align__(16) float q_s[kQueries * kQPitch];
  const int z = blockIdx.y, b = z / NH, h = z % NH;
  const int q0 = blockIdx.x * kQueries, t = q0 + threadIdx.x;
  const int64_t row3 = 3 * int64_t(C);
  const float* head = qkv + int64_t(b) * seq * row3 + int64_t(h) * HS;  // q of token 0; k at +C, v at +2C
  const size_t row = size_t(z) * seq + t;                               // [B*NH*T] row of this query
  const int last = t < seq ? last_key(row, seq, NH, causal, lengths) : -1;
  const int block_last = block_last_key(q0, b, seq, causal, lengths);

  constexpr int kQuads = HS / 4;
  for (int i = threadIdx.x; i < kQueries * kQuads; i += kQueries) {
    const int r = i / kQuads, d = 4 * (i % kQuads);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (q0 + r < seq) v = *reinterpret_cast<const float4*>(head + int64_t(q0 + r) * row3 + d);
    *reinterpret_cast<float4*>(q_s + r * kQPitch + d) =
        make_float4(v.x * scale_log2, v.y * scale_log2, v.z * scale_log2, v.w * scale_log2);
  }
  const float* my_q = q_s + threadIdx.x * kQPitch;  // read after the first tile's barrier
  float o[HS];
#pragma unroll
  for (int d = 0; d < HS; ++d) o[d] = 0.f;
  float m = -INFINITY, l = 0.f;  // running max (log2 domain) and sum of 2^(s - m) over the visible keys
  const uint32_t row_key = kDropout && t < seq ? attention_dropout_row_key(drop, row) : 0;

#pragma unroll 1
  for (int k0 = 0; k0 <= block_last; k0 += kKeys) {
    __syncthreads();  // the previous tile is no longer read
    stage_rows<HS>(k_s, head + C, row3, k0, seq);
    stage_rows<HS>(v_s, head + 2 * C, row3, k0, seq);
    wait_staged();
    __syncthreads();
    const int keys = min(kKeys, block_last + 1 - k0);
#pragma unroll 1
    for (int c0 = 0; c0 < keys; c0 += kChunk) {
      const float* kc = k_s + c0 * HS;
      const float* vc = v_s + c0 * HS;
      uint32_t keep = 0;  // bit j: key c0 + j of the tile is kept by dropout
      if constexpr (kDropout) {
#pragma unroll
        for (int j = 0; j < kChunk; ++j)
          keep |= uint32_t(anvil::attention_dropout_keep(row_key, k0 + c0 + j, drop.threshold)) << j;
      }
      float s[kChunk];
#pragma unroll
      for (int j = 0; j < kChunk; ++j) s[j] = 0.f;
#pragma unroll
      for (int d = 0; d < HS; d += 4) {
        const float4 qv = *reinterpret_cast<const float4*>(my_q + d);
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          const float4 kv = *reinterpret_cast<const float4*>(kc + j * HS + d);
          s[j] = fmaf(qv.x, kv.x, s[j]);
          s[j] = fmaf(qv.y, kv.y, s[j]);
          s[j] = fmaf(qv.z, kv.z, s[j]);
          s[j] = fmaf(qv.w, kv.w, s[j]);
        }
      }
      float chunk_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        if (k0 + c0 + j > last) s[j] = -INFINITY;  // masked, padding or past this tile's keys
        chunk_max = fmaxf(chunk_max, s[j]);
      }
      const float m_new = fmaxf(m, chunk_max);
      // Nothing visible yet: keep every term 0 (2^(-inf - 0)) rather than form -inf - -inf.
      const float m_use = m_new == -INFINITY ? 0.f : m_new;
      // 1 while nothing was visible (o and l are still 0), so such rows do not force the rescale below.
      const float alpha = m == -INFINITY ? 1.f : exp2f(m - m_use);
      m = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        s[j] = exp2f(s[j] - m_use);
        sum += s[j];
        if constexpr (kDropout)
          if (!(keep >> j & 1u)) s[j] = 0.f;
      }
      l = fmaf(l, alpha, sum);
      if (__any_sync(0xffffffffu, alpha != 1.f)) {  // the maximum moved for some row of the warp
#pragma unroll
        for (int d = 0; d < HS; ++d) o[d] *= alpha;
      }
#pragma unroll
      for (int d = 0; d < HS; d += 4) {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          const float4 vv = *reinterpret_cast<const float4*>(vc + j * HS + d);
          o[d] = fmaf(s[j], vv.x, o[d]);
          o[d + 1] = fmaf(s[j], vv.y, o[d + 1]);
          o[d + 2] = fmaf(s[j], vv.z, o[d + 2]);
          o[d + 3] = fmaf(s[j], vv.w, o[d + 3]);
        }
      }
    }
  }
  if (t >= seq) return;
  // A padding query: output 0 and lse 0, the contract's values there.
  const float inv = last >= 0 ? (kDropout ? drop.scale : 1.f) / l : 0.f;
  float* dst = out + (int64_t(b) * seq + t) * C + int64_t(h) * HS;
#pragma unroll
  for (int d = 0; d < HS; d += 4)
    *reinterpret_cast<float4*>(dst + d) =
        make_float4(o[d] * inv, o[d + 1] * inv, o[d + 2] * inv, o[d + 3] * inv);
  lse[row] = last >= 0 ? (m + __log2f(l)) * kLn2 : 0.f;
}

template <int HS>
void launch(cudaStream_t stream, float* out, float* lse, const float* qkv, int B, int seq, int C, int NH,
            bool causal, const int32_t* lengths, const AttentionDropout& dropout) {
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(HS));
  const dim3 grid((seq + kQueries - 1) / kQueries, B * NH);
  if (dropout.p > 0)
    attention_fwd_fused_kernel<HS, true><<<grid, kQueries, 0, stream>>>(
        out, lse, qkv, seq, C, NH, scale_log2, causal, lengths, dropout_args(dropout));
  else
    attention_fwd_fused_kernel<HS, false>
        <<<grid, kQueries, 0, stream>>>(out, lse, qkv, seq, C, NH, scale_log2, causal, lengths, {});
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace

bool attention_fwd_fused_supported(anvil::DType act, int B, int T, int C, int NH, const void* qkv,
                                   const void* out) {
  if (act != anvil::DType::F32 || NH <= 0 || C % NH != 0 || B <= 0 || T <= 0) return false;
  const int HS = C / NH;
  if (HS != 32 && HS != 64) return false;  // q and the output row in registers: 2 * HS of them
  if (B * int64_t(NH) > 65535) return false;
  for (const void* p : {qkv, out})
    if (reinterpret_cast<uintptr_t>(p) % (4 * sizeof(float)) != 0) return false;
  return true;
}

void attention_fwd_fused(cudaStream_t stream, float* out, float* lse, const float* qkv, int B, int T, int C,
                         int NH, bool causal, const int32_t* lengths, const AttentionDropout& dropout) {
  if (C / NH == 32)
    launch<32>(stream, out, lse, qkv, B, T, C, NH, causal, lengths, dropout);
  else
    launch<64>(stream, out, lse, qkv, B, T, C, NH, causal, lengths, dropout);
}

}  // namespace anvil::cuda
