// Attention of each sequence's first query only (Ops::attention_first_query_fwd / _bwd): BERT's last block,
// whose only reader is the pooler's [CLS] row. One block per (sequence, head) walks that query's keys in
// chunks whose scores (forward) or probability gradients (backward) sit in shared memory; a thread computes
// one key's dot products over the head, then the block's threads, laid out as groups x head dimensions,
// combine the chunk's keys (the output or dq as per-group partial sums reduced at the end, the rows of dk
// and dv written coalesced). The arithmetic follows the CPU reference (kernels/cpu/attention.cpp): the
// forward's normalised, dropped probabilities are rounded to the storage type before they multiply v, as is
// the dropped probability that multiplies dout in dv.
//
// Against the whole attention of that block this skips T - 1 of the T queries: for bert-large (T 512, H200)
// the last block's forward 1230 -> 335 us and backward 2470 -> 557 us together with the QKV projection's
// split (bench/probes/results/seed_vanilla_fp32_first_query_h200_2026-11-26.txt).
#include <cmath>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kChunk = 1024;  // keys whose per-key values are in shared memory at once

// The groups x dimensions layout of the combining phase: `lanes` consecutive threads cover a head's
// dimensions (looping when the head is wider than the block), `groups` of them split the chunk's keys.
struct DimLayout {
  int lanes, groups;
  __host__ __device__ explicit DimLayout(int HS)
      : lanes(HS < kThreads ? HS : kThreads), groups(kThreads / (HS < kThreads ? HS : kThreads)) {}
};

size_t smem_floats(int HS) {
  const DimLayout L(HS);
  return size_t(2) * HS + 2 * size_t(kChunk) + size_t(L.groups) * HS;
}

// a_s . b over HS elements, a_s in shared memory. fp32 rows are read as float4 when they allow it (one
// thread walks one key's row: scalar reads made the kernels four times slower); the order of the sum is the
// same either way.
template <class E>
__device__ float dot(const float* a_s, const E* b, int HS) {
  float s = 0.f;
  if constexpr (std::is_same_v<E, float>) {
    if (HS % 4 == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0) {
      for (int i = 0; i < HS; i += 4) {
        const float4 v = *reinterpret_cast<const float4*>(b + i);
        s += a_s[i] * v.x;
        s += a_s[i + 1] * v.y;
        s += a_s[i + 2] * v.z;
        s += a_s[i + 3] * v.w;
      }
      return s;
    }
  }
  for (int i = 0; i < HS; ++i) s += a_s[i] * to_float(b[i]);
  return s;
}

// Block (b * NH + h).
template <class E>
__global__ void __launch_bounds__(kThreads)
    first_query_fwd_kernel(E* out, float* lse, const E* q, const E* kv, int T, int C, int NH, float scale,
                           bool causal, const int32_t* lengths, DropoutArgs drop, bool dropout) {
  extern __shared__ float smem[];
  const int HS = C / NH, z = blockIdx.x, b = z / NH, h = z % NH;
  const DimLayout L(HS);
  float* q_s = smem;                // [HS]
  float* p_s = q_s + 2 * HS;        // [kChunk]: the chunk's probabilities as they multiply v
  float* acc_s = p_s + 2 * kChunk;  // [groups][HS]: partial outputs
  const int64_t C2 = 2 * int64_t(C);
  const E* k = kv + int64_t(b) * T * C2 + int64_t(h) * HS;  // key 0 of this head; v at + C
  E* o = out + int64_t(b) * C + int64_t(h) * HS;
  const int last = last_key(size_t(z) * T, T, NH, causal, lengths);  // query 0's
  if (last < 0) {
    for (int d = threadIdx.x; d < HS; d += kThreads) o[d] = from_float<E>(0.f);
    if (threadIdx.x == 0) lse[z] = 0.f;
    return;
  }
  for (int d = threadIdx.x; d < HS; d += kThreads) q_s[d] = to_float(q[int64_t(b) * C + int64_t(h) * HS + d]);
  for (int i = threadIdx.x; i < L.groups * HS; i += kThreads) acc_s[i] = 0.f;
  __syncthreads();
  // Pass 1: the maximum and the sum of the softmax over every visible key (per thread, then the block).
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= last; j += kThreads) m = fmaxf(m, dot(q_s, k + j * C2, HS) * scale);
  m = block_max(m);
  float l = 0.f;
  for (int j = threadIdx.x; j <= last; j += kThreads) l += expf(dot(q_s, k + j * C2, HS) * scale - m);
  l = block_sum(l);
  const float inv = 1.f / l;
  const uint32_t row_key = dropout ? attention_dropout_row_key(drop, uint64_t(z) * T) : 0;
  // Pass 2: o = sum of the normalised (dropped, rounded) probabilities times v, chunk by chunk.
  const int g = threadIdx.x / L.lanes, lane = threadIdx.x % L.lanes;
  for (int c0 = 0; c0 <= last; c0 += kChunk) {
    const int n = min(kChunk, last + 1 - c0);
    __syncthreads();  // the previous chunk's probabilities are no longer read
    for (int j = threadIdx.x; j < n; j += kThreads) {
      float p = expf(dot(q_s, k + (c0 + j) * C2, HS) * scale - m) * inv;
      if (dropout)
        p = anvil::attention_dropout_keep(row_key, uint32_t(c0 + j), drop.threshold) ? p * drop.scale : 0.f;
      p_s[j] = to_float(from_float<E>(p));
    }
    __syncthreads();
    if (g < L.groups)
      for (int d = lane; d < HS; d += L.lanes) {
        float a = acc_s[g * HS + d];
        for (int j = g; j < n; j += L.groups) a += p_s[j] * to_float(k[(c0 + j) * C2 + C + d]);
        acc_s[g * HS + d] = a;
      }
  }
  __syncthreads();
  for (int d = threadIdx.x; d < HS; d += kThreads) {
    float a = 0.f;
    for (int gg = 0; gg < L.groups; ++gg) a += acc_s[gg * HS + d];
    o[d] = from_float<E>(a);
  }
  if (threadIdx.x == 0) lse[z] = m + logf(l);
}

// Block (b * NH + h).
template <class E>
__global__ void __launch_bounds__(kThreads)
    first_query_bwd_kernel(E* dq, E* dkv, const E* dout, const E* q, const E* kv, const E* out,
                           const float* lse, int T, int C, int NH, float scale, bool causal,
                           const int32_t* lengths, DropoutArgs drop, bool dropout) {
  extern __shared__ float smem[];
  const int HS = C / NH, z = blockIdx.x, b = z / NH, h = z % NH;
  const DimLayout L(HS);
  float* q_s = smem;             // [HS]
  float* d_s = q_s + HS;         // [HS]: dout
  float* pd_s = d_s + HS;        // [kChunk]: the dropped probabilities as they multiply dout (dv)
  float* ds_s = pd_s + kChunk;   // [kChunk]: the score gradients
  float* acc_s = ds_s + kChunk;  // [groups][HS]: partial dq
  const int64_t C2 = 2 * int64_t(C), row = int64_t(b) * C + int64_t(h) * HS;
  const E* k = kv + int64_t(b) * T * C2 + int64_t(h) * HS;           // v at + C
  E* dk = dkv + int64_t(b) * T * C2 + int64_t(h) * HS;               // dv at + C
  const int last = last_key(size_t(z) * T, T, NH, causal, lengths);  // query 0's
  for (int d = threadIdx.x; d < HS; d += kThreads) {
    q_s[d] = to_float(q[row + d]);
    d_s[d] = to_float(dout[row + d]);
  }
  for (int i = threadIdx.x; i < L.groups * HS; i += kThreads) acc_s[i] = 0.f;
  // D = dout . out = rowsum(P * dP): the softmax backward's correction.
  float part = 0.f;
  for (int d = threadIdx.x; d < HS; d += kThreads) part += to_float(dout[row + d]) * to_float(out[row + d]);
  const float D = block_sum(part);  // (its barriers also publish q_s, d_s and acc_s)
  const float row_lse = lse[z];
  const uint32_t row_key = dropout ? attention_dropout_row_key(drop, uint64_t(z) * T) : 0;
  const int g = threadIdx.x / L.lanes, lane = threadIdx.x % L.lanes;
  for (int c0 = 0; c0 < T; c0 += kChunk) {
    const int n = min(kChunk, T - c0);
    __syncthreads();  // the previous chunk's values are no longer read
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const int key = c0 + j;
      float pd = 0.f, ds = 0.f;
      if (key <= last) {
        const float p = expf(dot(q_s, k + key * C2, HS) * scale - row_lse);
        float dz = dot(d_s, k + key * C2 + C, HS);  // the gradient of the (dropped) probability
        pd = p;
        if (dropout) {
          const bool keep = anvil::attention_dropout_keep(row_key, uint32_t(key), drop.threshold);
          pd = keep ? p * drop.scale : 0.f;
          dz = keep ? dz * drop.scale : 0.f;
        }
        pd = to_float(from_float<E>(pd));
        ds = p * (dz - D) * scale;
      }
      pd_s[j] = pd, ds_s[j] = ds;
    }
    __syncthreads();
    if (g < L.groups)
      for (int d = lane; d < HS; d += L.lanes) {
        float a = acc_s[g * HS + d];
        const float qd = q_s[d], dd = d_s[d];
        for (int j = g; j < n; j += L.groups) {
          const int64_t r = (c0 + j) * C2;
          a += ds_s[j] * to_float(k[r + d]);
          dk[r + d] = from_float<E>(ds_s[j] * qd);
          dk[r + C + d] = from_float<E>(pd_s[j] * dd);
        }
        acc_s[g * HS + d] = a;
      }
  }
  __syncthreads();
  for (int d = threadIdx.x; d < HS; d += kThreads) {
    float a = 0.f;
    for (int gg = 0; gg < L.groups; ++gg) a += acc_s[gg * HS + d];
    dq[row + d] = from_float<E>(a);
  }
}

// What both launches derive from the shapes: the score scale, the device side of the dropout, and the
// dynamic shared memory (under the 48 KB any kernel may use: head sizes up to about 4000).
struct FirstQueryLaunch {
  float scale;
  DropoutArgs drop;
  size_t smem;
  FirstQueryLaunch(int C, int NH, const AttentionDropout& dropout)
      : scale(1.f / std::sqrt(float(C / NH))),
        drop(dropout.p > 0 ? dropout_args(dropout) : DropoutArgs{}),
        smem(smem_floats(C / NH) * sizeof(float)) {
    if (smem > 48 * 1024)
      detail::raise_at(__FILE__, __LINE__,
                       "first-query attention: head size " + std::to_string(C / NH) + " is too large");
  }
};

}  // namespace

void attention_first_query_fwd(cudaStream_t stream, anvil::DType act, void* out, float* lse, const void* q,
                               const void* kv, int B, int T, int C, int NH, bool causal,
                               const int32_t* lengths, const AttentionDropout& dropout) {
  if (B <= 0) return;
  const FirstQueryLaunch l(C, NH, dropout);
  dispatch_float(act, [&](auto tag) {
    using E = decltype(tag);
    first_query_fwd_kernel<E><<<B * NH, kThreads, l.smem, stream>>>(
        static_cast<E*>(out), lse, static_cast<const E*>(q), static_cast<const E*>(kv), T, C, NH, l.scale,
        causal, lengths, l.drop, dropout.p > 0);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void attention_first_query_bwd(cudaStream_t stream, anvil::DType act, void* dq, void* dkv, const void* dout,
                               const void* q, const void* kv, const void* out, const float* lse, int B, int T,
                               int C, int NH, bool causal, const int32_t* lengths,
                               const AttentionDropout& dropout) {
  if (B <= 0) return;
  const FirstQueryLaunch l(C, NH, dropout);
  dispatch_float(act, [&](auto tag) {
    using E = decltype(tag);
    first_query_bwd_kernel<E><<<B * NH, kThreads, l.smem, stream>>>(
        static_cast<E*>(dq), static_cast<E*>(dkv), static_cast<const E*>(dout), static_cast<const E*>(q),
        static_cast<const E*>(kv), static_cast<const E*>(out), lse, T, C, NH, l.scale, causal, lengths,
        l.drop, dropout.p > 0);
  });
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
