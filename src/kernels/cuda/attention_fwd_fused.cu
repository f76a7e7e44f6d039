// The fp32 attention forward in one kernel (flash-attention style): a pair of threads owns two query rows
// of one head and their output accumulators (in registers, half the dimensions each), and streams the
// head's keys and values through shared memory with an online softmax, so neither the scores nor the
// probabilities are ever written. The materialised path (attention.cu) writes the [B, NH, T, T] scores,
// rereads them for the softmax, writes the probabilities and rereads them for the PV GEMM. The backward is
// unchanged: it recomputes the probabilities from q, k and the log-sum-exp written here. Scores are formed
// in the log2 domain (q pre-multiplied by scale * log2(e)) so each probability is one exp2.
//
// Measured on the H100, BERT-large layer (B 4, T 512, 16 heads of 64, dropout 0.1): the GEMMs and softmax
// 256 us, one thread per query 183 us (shared-memory bandwidth bound: L1 81% busy, FMA 38%), a thread per
// query with the dimensions split over a pair 194 us (more warps, same bandwidth), this layout 156 us. Head
// size 64 now runs the 8 x 8 patch kernel below (namespace tiled): 127 us; 122 us after its softmax reduced
// the eight rows' maxima together, rescaled lazily, hashed dropout per key pair and unrolled the products by
// 8 (bench/probes/attention_kernels.cu; bench/probes/results/attention_kernels_h100_2026-11-26.txt).
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

constexpr int kQueries = 64;  // queries (and threads) per block
constexpr int kKeys = 32;     // keys (and values) staged in shared memory at a time
constexpr int kChunk = 16;    // keys per online-softmax update: the scores held in registers at once
constexpr float kLn2 = 0.6931471805599453f;

// The last key any query of the block sees (-1: every query of the block is padding). Uniform over the
// block, so the key loop needs no vote.
__device__ __forceinline__ int block_last_key(int q0, int b, int seq, bool causal, const int32_t* lengths) {
  const int len = lengths ? min(max(lengths[b], 0), seq) : seq;
  if (q0 >= len) return -1;
  return causal ? min(q0 + kQueries - 1, len - 1) : len - 1;
}

// Rows k0 .. k0 + kRows - 1 of a [T, ld] operand (a head, in place) into dst[kRows][kPitch] by asynchronous
// copies (no registers held while the q and output rows occupy them), by a block of kThreads; rows past
// `seq` are zero-filled. Consecutive threads copy consecutive 16-byte pieces of a row. The caller commits
// and waits (wait_staged).
template <int HS, int kRows = kKeys, int kThreads = kQueries, int kPitch = HS>
__device__ __forceinline__ void stage_rows(float* dst, const float* src, int64_t ld, int k0, int seq) {
  constexpr int kQuads = HS / 4, kPerThread = kRows * kQuads / kThreads;
  static_assert((kRows * kQuads) % kThreads == 0, "tile not covered evenly");
#pragma unroll
  for (int n = 0; n < kPerThread; ++n) {
    const int i = threadIdx.x + n * kThreads, r = i / kQuads, d = 4 * (i % kQuads);
    const bool inside = k0 + r < seq;
    cp_async16(dst + r * kPitch + d, src + int64_t(inside ? k0 + r : 0) * ld + d, inside);
  }
}

__device__ __forceinline__ void wait_staged() {
  cp_async_commit();
  cp_async_wait<0>();
}

// Block (query tile x, head y = b * NH + h). Lanes 2p and 2p + 1 (a pair) share queries 2p and 2p + 1 of
// the tile: thread g of the pair owns the groups of four dimensions 2i + g of both rows (interleaved, so the
// pair's 16-byte reads of a key row fall in different banks) and query 2p + g's softmax statistics. Every
// key or value element read from shared memory thus feeds two rows' multiply-adds: shared-memory bandwidth
// (every 16-byte read delivers 512 bytes to a warp, broadcast or not), not the FMA units, bounded the
// one-thread-per-query version. After the partial scores, the pair swaps halves (one shuffle a key) so each
// thread holds its own query's whole scores, and swaps the probabilities back for the PV products. The
// pre-scaled q rows live in shared memory (row pitch HS + 4: conflict-free 16-byte reads).
template <int HS, bool kDropout>
__global__ void __launch_bounds__(kQueries)
    attention_fwd_fused_kernel(float* out, float* lse, const float* qkv, int seq, int C, int NH,
                               float scale_log2, bool causal, const int32_t* lengths, DropoutArgs drop) {
  constexpr int kQPitch = HS + 4, kQuads = HS / 4, kMine = kQuads / 2;  // kMine: dimension groups a thread
  __shared__ __align__(16) float k_s[kKeys * HS];
  __shared__ __align__(16) float v_s[kKeys * HS];
  __shared__ __align__(16) float q_s[kQueries * kQPitch];
  const int z = blockIdx.y, b = z / NH, h = z % NH;
  const int g = threadIdx.x % 2, ra = threadIdx.x - g;         // the pair's rows: ra (g == 0's) and ra + 1
  const int q0 = blockIdx.x * kQueries, t = q0 + threadIdx.x;  // this thread's query: ra + g
  const int64_t row3 = 3 * int64_t(C);
  const float* head = qkv + int64_t(b) * seq * row3 + int64_t(h) * HS;  // q of token 0; k at +C, v at +2C
  const size_t row = size_t(z) * seq + t;                               // [B*NH*T] row of this query
  const int last = t < seq ? last_key(row, seq, NH, causal, lengths) : -1;
  const int block_last = block_last_key(q0, b, seq, causal, lengths);

  for (int i = threadIdx.x; i < kQueries * kQuads; i += kQueries) {
    const int r = i / kQuads, d = 4 * (i % kQuads);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (q0 + r < seq) v = *reinterpret_cast<const float4*>(head + int64_t(q0 + r) * row3 + d);
    *reinterpret_cast<float4*>(q_s + r * kQPitch + d) =
        make_float4(v.x * scale_log2, v.y * scale_log2, v.z * scale_log2, v.w * scale_log2);
  }
  const float* qa = q_s + ra * kQPitch + 4 * g;  // read after the first tile's barrier
  const float* qb = qa + kQPitch;
  float oa[4 * kMine], ob[4 * kMine];  // rows ra and ra + 1; element 4i + c: dimension 4 * (2i + g) + c
#pragma unroll
  for (int d = 0; d < 4 * kMine; ++d) oa[d] = ob[d] = 0.f;
  float m = -INFINITY, l = 0.f;  // own query: running max (log2 domain), sum of 2^(s - m) over visible keys
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
      const float* kc = k_s + c0 * HS + 4 * g;
      const float* vc = v_s + c0 * HS + 4 * g;
      uint32_t keep = 0;  // bit j: key c0 + j of the tile is kept by dropout in the own query's row
      if constexpr (kDropout) {
#pragma unroll
        for (int j = 0; j < kChunk; ++j)
          keep |= uint32_t(anvil::attention_dropout_keep(row_key, k0 + c0 + j, drop.threshold)) << j;
      }
      float sa[kChunk], sb[kChunk];  // partial scores of rows ra and ra + 1 over the own dimensions
#pragma unroll
      for (int j = 0; j < kChunk; ++j) sa[j] = sb[j] = 0.f;
#pragma unroll
      for (int i = 0; i < kMine; ++i) {
        const float4 xa = *reinterpret_cast<const float4*>(qa + 8 * i);
        const float4 xb = *reinterpret_cast<const float4*>(qb + 8 * i);
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          const float4 kv = *reinterpret_cast<const float4*>(kc + j * HS + 8 * i);
          sa[j] = fmaf(xa.x, kv.x, sa[j]);
          sa[j] = fmaf(xa.y, kv.y, sa[j]);
          sa[j] = fmaf(xa.z, kv.z, sa[j]);
          sa[j] = fmaf(xa.w, kv.w, sa[j]);
          sb[j] = fmaf(xb.x, kv.x, sb[j]);
          sb[j] = fmaf(xb.y, kv.y, sb[j]);
          sb[j] = fmaf(xb.z, kv.z, sb[j]);
          sb[j] = fmaf(xb.w, kv.w, sb[j]);
        }
      }
      // Own query's whole scores: keep its partial, send the other row's to the partner.
      float s[kChunk];
      float chunk_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const float send = g ? sa[j] : sb[j];
        s[j] = (g ? sb[j] : sa[j]) + __shfl_xor_sync(0xffffffffu, send, 1);
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
        const float alpha_other = __shfl_xor_sync(0xffffffffu, alpha, 1);
        const float alpha_a = g ? alpha_other : alpha, alpha_b = g ? alpha : alpha_other;
#pragma unroll
        for (int d = 0; d < 4 * kMine; ++d) oa[d] *= alpha_a, ob[d] *= alpha_b;
      }
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        const float other = __shfl_xor_sync(0xffffffffu, s[j], 1);
        sa[j] = g ? other : s[j];
        sb[j] = g ? s[j] : other;
      }
#pragma unroll
      for (int i = 0; i < kMine; ++i) {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) {
          const float4 vv = *reinterpret_cast<const float4*>(vc + j * HS + 8 * i);
          oa[4 * i] = fmaf(sa[j], vv.x, oa[4 * i]);
          oa[4 * i + 1] = fmaf(sa[j], vv.y, oa[4 * i + 1]);
          oa[4 * i + 2] = fmaf(sa[j], vv.z, oa[4 * i + 2]);
          oa[4 * i + 3] = fmaf(sa[j], vv.w, oa[4 * i + 3]);
          ob[4 * i] = fmaf(sb[j], vv.x, ob[4 * i]);
          ob[4 * i + 1] = fmaf(sb[j], vv.y, ob[4 * i + 1]);
          ob[4 * i + 2] = fmaf(sb[j], vv.z, ob[4 * i + 2]);
          ob[4 * i + 3] = fmaf(sb[j], vv.w, ob[4 * i + 3]);
        }
      }
    }
  }
  // A padding query: output 0 and lse 0, the contract's values there.
  const float inv = last >= 0 ? (kDropout ? drop.scale : 1.f) / l : 0.f;
  const float inv_other = __shfl_xor_sync(0xffffffffu, inv, 1);
  const float inv_a = g ? inv_other : inv, inv_b = g ? inv : inv_other;
  const int ta = q0 + ra;
  float* dst = out + (int64_t(b) * seq + ta) * C + int64_t(h) * HS + 4 * g;
#pragma unroll
  for (int i = 0; i < kMine; ++i) {
    if (ta < seq)
      *reinterpret_cast<float4*>(dst + 8 * i) =
          make_float4(oa[4 * i] * inv_a, oa[4 * i + 1] * inv_a, oa[4 * i + 2] * inv_a, oa[4 * i + 3] * inv_a);
    if (ta + 1 < seq)
      *reinterpret_cast<float4*>(dst + C + 8 * i) =
          make_float4(ob[4 * i] * inv_b, ob[4 * i + 1] * inv_b, ob[4 * i + 2] * inv_b, ob[4 * i + 3] * inv_b);
  }
  if (t < seq) lse[row] = last >= 0 ? (m + __log2f(l)) * kLn2 : 0.f;
}

// --- 128-query tiles with 8 x 8 patches, head size 64 ----------------------------------------------------
// The kernel above feeds two multiply-adds per float it reads from shared memory, so shared-memory bandwidth
// holds its products to about half the FMA rate. Here a block of 128 threads keeps 128 queries and walks the
// keys in tiles of 64, and every product is an outer product of 8 x 8 patches (four multiply-adds per float
// read): S = q k^T into registers (thread: rows ty*4 and 64 + ty*4, four each; keys tx*4 and 32 + tx*4),
// the online softmax on them (a row's 64 keys lie in the 8 consecutive lanes of one ty: three shuffles per
// row maximum; the sums stay per thread until the end), P through shared memory (transposed, [key][row]),
// then o += P v (the same rows; dimensions tx*4 and 32 + tx*4). k is copied for the next tile while P v
// runs, v while the next S runs, each into its single buffer (cp.async), so two blocks fit on an SM.
namespace tiled {

constexpr int kQ = 128, kK = 64, kThreads = 128, kLdQ = kQ + 4, kLdK = kK + 4;
constexpr float kSlack = 8.f;  // log2 domain: the running maximum may lag the true one by a factor 256

template <int HS>
constexpr size_t smem_bytes() {
  // q^T [HS][kLdQ], k^T [HS][kLdK], v [kK][HS + 4], P^T [kK][kLdQ]; per query: last key, dropout row key
  return (size_t(HS) * kLdQ + size_t(HS) * kLdK + size_t(kK) * (HS + 4) + size_t(kK) * kLdQ + 2 * kQ) *
         sizeof(float);
}

// Block (query tile x, head y = b * NH + h).
template <int HS, bool kDropout>
__global__ void __launch_bounds__(kThreads, 2)
    attention_fwd_tiled_kernel(float* out, float* lse, const float* qkv, int seq, int C, int NH,
                               float scale_log2, bool causal, const int32_t* lengths, DropoutArgs drop) {
  static_assert(HS == 64, "the patch layout covers 64 dimensions");
  constexpr int kLdV = HS + 4;
  extern __shared__ __align__(16) float smem[];
  float* q_s = smem;             // [HS][kLdQ], pre-scaled by scale * log2(e)
  float* k_s = q_s + HS * kLdQ;  // [HS][kLdK]
  float* v_s = k_s + HS * kLdK;  // [kK][kLdV]
  float* p_s = v_s + kK * kLdV;  // [kK][kLdQ]
  int* last_s = reinterpret_cast<int*>(p_s + kK * kLdQ);
  uint32_t* row_key_s = reinterpret_cast<uint32_t*>(last_s + kQ);
  __shared__ BlockKeys keys_s;

  const int z = blockIdx.y, b = z / NH, h = z % NH, q0 = blockIdx.x * kQ;
  const int64_t row3 = 3 * int64_t(C);
  const float* head = qkv + int64_t(b) * seq * row3 + int64_t(h) * HS;  // q of token 0; k at +C, v at +2C
  const size_t row_base = size_t(z) * seq;

  const BlockKeys keys = stage_query_rows<kQ, kThreads, kDropout>(last_s, row_key_s, &keys_s, q0, row_base,
                                                                  seq, NH, causal, lengths, drop);
  const int tiles = keys.any_sees < 0 ? 0 : keys.any_sees / kK + 1;  // key tiles any query of the block sees

  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  float o[8][8], m[8], l[8];  // rows patch_index(ty, i, 64); o's columns: dimensions patch_index(tx, j, 32)
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    m[i] = -INFINITY, l[i] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) o[i][j] = 0.f;
  }
  if (tiles > 0) {
    stage_transposed_async<HS, kK, kThreads>(k_s, head + C, row3, 0, seq);
    cp_async_commit();
    stage_rows<HS, kK, kThreads, kLdV>(v_s, head + 2 * C, row3, 0, seq);
    cp_async_commit();
    stage_transposed<HS, kQ, kThreads>(q_s, head, row3, q0, seq, scale_log2);
  }
  for (int j = 0; j < tiles; ++j) {
    const int k0 = j * kK;
    cp_async_wait<1>();  // k of tile j (v may still be in flight)
    __syncthreads();
    float s[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int c = 0; c < 8; ++c) s[i][c] = 0.f;
    patch_product<HS, kLdQ, 64, kLdK, 32, 8>(s, q_s + ty * 4, k_s + tx * 4);
    __syncthreads();  // every thread is done with k_s: the next tile's k goes there
    if (j + 1 < tiles) stage_transposed_async<HS, kK, kThreads>(k_s, head + C, row3, k0 + kK, seq);
    cp_async_commit();                 // possibly empty: the group count stays uniform
    if (k0 + kK - 1 > keys.all_see) {  // some query of the block does not see every key of the tile
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int last = last_s[patch_index(ty, i, 64)];
#pragma unroll
        for (int c = 0; c < 8; ++c)
          if (k0 + patch_index(tx, c, 32) > last) s[i][c] = -INFINITY;  // masked, padding or past the keys
      }
    }
    // The rows' tile maxima, all eight rows at once (independent chains: the shuffles' latencies overlap).
    float tile_max[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      tile_max[i] = s[i][0];
#pragma unroll
      for (int c = 1; c < 8; ++c) tile_max[i] = fmaxf(tile_max[i], s[i][c]);
    }
#pragma unroll
    for (int lanes = 1; lanes < 8; lanes *= 2)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], lanes));
    // The running maximum m moves only when a score exceeds it by more than kSlack (so probabilities up to
    // 2^kSlack accumulate, harmless in fp32): after the first tiles o is almost never rescaled. Nothing
    // visible yet (m and the tile's maximum -inf) moves nothing; the first visible tile rescales zeros
    // (alpha = 2^-inf = 0).
    bool moved = false;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const bool move = tile_max[i] > m[i] + kSlack;
      const float alpha = move ? exp2f(m[i] - tile_max[i]) : 1.f;
      m[i] = move ? tile_max[i] : m[i];
      l[i] *= alpha;
      tile_max[i] = alpha;  // kept for the rescale below
      moved |= move;
    }
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int c = 0; c < 8; ++c) o[i][c] *= tile_max[i];
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float m_use = m[i] == -INFINITY ? 0.f : m[i];  // no -inf - -inf: masked terms are 2^-inf = 0
      float sum = 0.f;
      const uint32_t row_key = kDropout ? row_key_s[patch_index(ty, i, 64)] : 0;
#pragma unroll
      for (int c = 0; c < 8; c += 2) {  // columns c and c + 1: keys 2n and 2n + 1, one pair's dropout bits
        float p0 = exp2f(s[i][c] - m_use), p1 = exp2f(s[i][c + 1] - m_use);
        sum += p0 + p1;
        if constexpr (kDropout) {
          const uint32_t bits =
              anvil::attention_dropout_pair_bits(row_key, (k0 + patch_index(tx, c, 32)) >> 1);
          if (!anvil::attention_dropout_keep_bits(bits, 0, drop.threshold)) p0 = 0.f;
          if (!anvil::attention_dropout_keep_bits(bits, 1, drop.threshold)) p1 = 0.f;
        }
        s[i][c] = p0, s[i][c + 1] = p1;
      }
      l[i] += sum;
    }
    // P^T: key patch_index(tx, c, 32), rows ty*4 .. ty*4 + 3 and 64 + ty*4 .. (two 16-byte writes a key).
#pragma unroll
    for (int c = 0; c < 8; ++c) {
      float* dst = p_s + patch_index(tx, c, 32) * kLdQ + ty * 4;
      *reinterpret_cast<float4*>(dst) = make_float4(s[0][c], s[1][c], s[2][c], s[3][c]);
      *reinterpret_cast<float4*>(dst + 64) = make_float4(s[4][c], s[5][c], s[6][c], s[7][c]);
    }
    cp_async_wait<1>();  // v of tile j (the next k may still be in flight)
    __syncthreads();
    patch_product<kK, kLdQ, 64, kLdV, 32, 8>(o, p_s + ty * 4, v_s + tx * 4);
    __syncthreads();  // every thread is done with v_s and p_s
    if (j + 1 < tiles) stage_rows<HS, kK, kThreads, kLdV>(v_s, head + 2 * C, row3, k0 + kK, seq);
    cp_async_commit();
  }
  cp_async_wait<0>();  // nothing may land in shared memory after the block exits

  const float drop_scale = kDropout ? drop.scale : 1.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = patch_index(ty, i, 64), t = q0 + r;
    float sum = l[i];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    sum += __shfl_xor_sync(0xffffffffu, sum, 4);
    if (t >= seq) continue;
    // A padding query: output 0 and lse 0, the contract's values there.
    const bool visible = last_s[r] >= 0;
    const float inv = visible ? drop_scale / sum : 0.f;
    float* dst = out + (int64_t(b) * seq + t) * C + int64_t(h) * HS + tx * 4;
    *reinterpret_cast<float4*>(dst) = make_float4(o[i][0] * inv, o[i][1] * inv, o[i][2] * inv, o[i][3] * inv);
    *reinterpret_cast<float4*>(dst + 32) =
        make_float4(o[i][4] * inv, o[i][5] * inv, o[i][6] * inv, o[i][7] * inv);
    if (tx == 0) lse[row_base + t] = visible ? (m[i] + __log2f(sum)) * kLn2 : 0.f;
  }
}

}  // namespace tiled

template <int HS>
void launch(cudaStream_t stream, float* out, float* lse, const float* qkv, int B, int seq, int C, int NH,
            bool causal, const int32_t* lengths, const AttentionDropout& dropout) {
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(HS));
  const DropoutArgs drop = dropout.p > 0 ? dropout_args(dropout) : DropoutArgs{};
  if constexpr (HS == 64) {
    // bert-large, B 4, T 512, dropout 0.1, H100: 159 -> 127 us a layer against the pair kernel
    // (bench/probes/results/seed_vanilla_fp32_profile_h100_2026-11-23_tiled_fwd.txt).
    if (tiled::smem_bytes<HS>() + sizeof(int) <= size_t(max_optin_smem())) {
      const auto kernel = dropout.p > 0 ? tiled::attention_fwd_tiled_kernel<HS, true>
                                        : tiled::attention_fwd_tiled_kernel<HS, false>;
      configure_for_current_device(reinterpret_cast<const void*>(kernel), tiled::smem_bytes<HS>());
      const dim3 grid((seq + tiled::kQ - 1) / tiled::kQ, B * NH);
      kernel<<<grid, tiled::kThreads, tiled::smem_bytes<HS>(), stream>>>(out, lse, qkv, seq, C, NH,
                                                                         scale_log2, causal, lengths, drop);
      ANVIL_CUDA_CHECK_LAST();
      return;
    }
  }
  const dim3 grid((seq + kQueries - 1) / kQueries, B * NH);
  const auto kernel =
      dropout.p > 0 ? attention_fwd_fused_kernel<HS, true> : attention_fwd_fused_kernel<HS, false>;
  kernel<<<grid, kQueries, 0, stream>>>(out, lse, qkv, seq, C, NH, scale_log2, causal, lengths, drop);
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
