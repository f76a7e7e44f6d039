// The front half of the materialised attention backward in one kernel: from q, k, v, dout, out and the
// forward's log-sum-exp it computes, tile by tile, the probabilities P = exp(scale q.k - lse), the gradient
// of the (dropped) probabilities dout.v, and from them
//   dscores = scale * P * (dP - D),  dP = keep * drop.scale * dout.v,  D = rowsum(dout * out),
// writing only the two [B, NH, T, T] results the remaining GEMMs read: the dropped probabilities (P * keep *
// drop.scale; P without dropout) for dv, and dscores for dq and dk. The unfused path (attention.cu) writes
// the scores, rereads them to form P, writes dprobs and rereads both for dscores; this kernel keeps the
// scores and dprobs in registers. D = rowsum(P * dP) = rowsum(dout * out) since out = P_dropped v, so no
// reduction over the keys is needed and each tile is independent.
//
// Two tilings. Head size 128: kRows queries x kCols keys per block of 256 threads, each thread an 8 x 4 patch
// of both products (below). Head sizes up to 64: 128 queries a block with the keys streamed in tiles of 64
// (namespace tiled).
// q, dout (kRows x HS) and k, v (kCols x HS) are staged in shared memory transposed ([HS][rows]) so each
// step of the inner products is one broadcast 32-byte read of q (dout) and one 16-byte read of k (v).
#include <cmath>
#include <string>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kRows = 128, kCols = 64, kThreads = 256;
constexpr int kColGroups = kCols / 4;                            // 16 threads across a tile row, 4 keys each
constexpr int kRowsPerThread = kRows / (kThreads / kColGroups);  // 8
constexpr int kPad = 4;  // floats after each staged row: 16-byte aligned, fewer bank conflicts when staging
static_assert(kRows == 2 * kThreads / 4, "D takes two threads per query row");

size_t smem_bytes(int HS) {
  return size_t(2) * (kRows + kCols + 2 * kPad) * HS * sizeof(float);
}

__device__ __forceinline__ void load4(float (&v)[4], const float* p) {
  const float4 f = *reinterpret_cast<const float4*>(p);
  v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
}
__device__ __forceinline__ void store4(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}

// acc[i][j] = sum_d a[d][row0 + i] * b[d][col0 + j] over d < HS (a: [HS][kRows + kPad], b: [HS][kCols +
// kPad]).
template <int HS>
__device__ __forceinline__ void tile_product(float (&acc)[kRowsPerThread][4], const float* a, const float* b,
                                             int row0, int col0) {
  constexpr int kLdA = kRows + kPad, kLdB = kCols + kPad;
  for (int i = 0; i < kRowsPerThread; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.f;
#pragma unroll 8
  for (int d = 0; d < HS; ++d) {
    const float4 a0 = *reinterpret_cast<const float4*>(a + d * kLdA + row0);
    const float4 a1 = *reinterpret_cast<const float4*>(a + d * kLdA + row0 + 4);
    const float4 bv = *reinterpret_cast<const float4*>(b + d * kLdB + col0);
    const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w}, bw[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bw[j], acc[i][j]);
  }
}

// Block (key tile x, query tile y, head z = b * NH + h).
template <bool kDropout, int HS>
__global__ void __launch_bounds__(kThreads)
    attention_bwd_scores_kernel(float* probs, float* dscores, const float* qkv, const float* dout,
                                const float* out, const float* lse, int seq, int C, int NH, float scale,
                                bool causal, const int32_t* lengths, DropoutArgs drop) {
  constexpr int kLdR = kRows + kPad, kLdC = kCols + kPad;
  extern __shared__ float smem[];
  float* q_s = smem;              // [HS][kLdR]
  float* do_s = q_s + HS * kLdR;  // [HS][kLdR]
  float* k_s = do_s + HS * kLdR;  // [HS][kLdC]
  float* v_s = k_s + HS * kLdC;   // [HS][kLdC]
  __shared__ float lse_s[kRows], d_s[kRows];
  __shared__ int last_s[kRows];

  const int z = blockIdx.z, b = z / NH, h = z % NH;
  const int k0 = blockIdx.x * kCols, q0 = blockIdx.y * kRows;
  const int64_t row3 = 3 * int64_t(C);
  const float* q = qkv + int64_t(b) * seq * row3 + int64_t(h) * HS;
  const float* dO = dout + int64_t(b) * seq * C + int64_t(h) * HS;
  const float* o = out + int64_t(b) * seq * C + int64_t(h) * HS;
  const size_t row_base = size_t(z) * seq;  // [B*NH*T] row of query 0 of this head

  int live = 0;  // does any query of the tile see any key of it?
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const int t = q0 + r;
    const int last = t < seq ? last_key(row_base + t, seq, NH, causal, lengths) : -1;
    last_s[r] = last, lse_s[r] = t < seq ? lse[row_base + t] : 0.f;
    live |= last >= k0;
  }
  live = __syncthreads_or(live);
  if (live) {
    stage_transposed<HS, kRows, kThreads>(q_s, q, row3, q0, seq);
    stage_transposed<HS, kRows, kThreads>(do_s, dO, C, q0, seq);
    stage_transposed<HS, kCols, kThreads>(k_s, q + C, row3, k0, seq);
    stage_transposed<HS, kCols, kThreads>(v_s, q + 2 * C, row3, k0, seq);
    __syncthreads();
    // D for the tile's queries: two threads per row, each over every other group of four dimensions.
    const int r = threadIdx.x / 2, part = threadIdx.x % 2, t = q0 + r;
    float dsum = 0.f;
    if (t < seq)
      for (int d = 4 * part; d < HS; d += 8) {
        float ov[4];
        load4(ov, o + int64_t(t) * C + d);
        for (int c = 0; c < 4; ++c) dsum = fmaf(ov[c], do_s[(d + c) * kLdR + r], dsum);
      }
    dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
    if (part == 0) d_s[r] = dsum;
    __syncthreads();
  }

  const int row0 = (threadIdx.x / kColGroups) * kRowsPerThread, col0 = (threadIdx.x % kColGroups) * 4;
  float p[kRowsPerThread][4], dp[kRowsPerThread][4];
  if (live) {
    tile_product<HS>(p, q_s, k_s, row0, col0);
    for (int i = 0; i < kRowsPerThread; ++i)
      for (int j = 0; j < 4; ++j)
        p[i][j] = k0 + col0 + j <= last_s[row0 + i] ? __expf(scale * p[i][j] - lse_s[row0 + i]) : 0.f;
    tile_product<HS>(dp, do_s, v_s, row0, col0);
  } else {
    for (int i = 0; i < kRowsPerThread; ++i)
      for (int j = 0; j < 4; ++j) p[i][j] = dp[i][j] = 0.f;
  }
  const uint64_t key = kDropout ? probabilities_dropout_key(drop) : 0;  // rows' keys derive from it
  const bool vector_rows = seq % 4 == 0;                                // every row starts 4-element aligned
  for (int i = 0; i < kRowsPerThread; ++i) {
    const int t = q0 + row0 + i;
    if (t >= seq) break;
    const size_t row = row_base + t;
    const float D = live ? d_s[row0 + i] : 0.f;
    float pd[4], ds[4];
    const uint32_t row_key = kDropout ? anvil::attention_dropout_row_key(key, row) : 0;
    for (int j = 0; j < 4; ++j) {
      float dpu = dp[i][j];
      pd[j] = p[i][j];
      if constexpr (kDropout) {
        const bool keep = anvil::attention_dropout_keep(row_key, k0 + col0 + j, drop.threshold);
        dpu = keep ? dpu * drop.scale : 0.f;
        pd[j] = keep ? __fmul_rn(p[i][j], drop.scale) : 0.f;
      }
      ds[j] = scale * p[i][j] * (dpu - D);
    }
    const int c = k0 + col0;
    float* prow = probs + row * seq;
    float* srow = dscores + row * seq;
    if (vector_rows && c + 3 < seq) {
      store4(prow + c, pd);
      store4(srow + c, ds);
    } else {
      for (int j = 0; j < 4 && c + j < seq; ++j) prow[c + j] = pd[j], srow[c + j] = ds[j];
    }
  }
}

// --- 128 queries x 64-key tiles, two blocks an SM, for head sizes up to 64 ------------------------------
// The kernel above gives each thread an 8 x 4 patch: 12 floats from shared memory per 32 multiply-adds, so
// shared-memory bandwidth caps its products at 2/3 of the FMA rate. Here each thread takes an 8 x 8 patch
// (rows ty*4 and 64 + ty*4, four each; keys tx*4 and 32 + tx*4), 16 floats per 64 multiply-adds. A block of
// 128 threads keeps 128 queries (q, dout, lse, D) and walks the keys in tiles of 64 with single-buffered k
// and v (102 KB of shared memory), so two blocks share an SM and one's stores overlap the other's products:
// an earlier version with 128-key tiles, double-buffered, and one block of 256 threads an SM (203 KB) left
// the FMA units idle while its threads wrote a tile's results (178 -> 154 us a bert-large layer). The next
// tile's k is copied (cp.async) during dP = dout v^T, the next v during the stores and the next S. 155 ->
// 146 us a bert-large layer on the H100 (bench/probes/results/attention_kernels_h100_2026-11-26.txt) from: exp2 of
// one multiply-add (lse in the log2 domain), dropout hashed per key pair, the products unrolled by 8, and a
// branch-free epilogue for tiles whose rows and keys all exist (a per-row branch kept the rows' arithmetic
// from interleaving).
namespace tiled {

constexpr int kQ = 128, kK = 64, kThreads = 128, kLdQ = kQ + 4, kLdK = kK + 4;
static_assert(kQ == kThreads, "one thread a query row: its lse and D");

constexpr size_t smem_bytes(int HS) {
  // q^T, dout^T [HS][kLdQ]; k^T, v^T [HS][kLdK]; per query: lse, D, last key, dropout row key
  return (size_t(2) * HS * kLdQ + size_t(2) * HS * kLdK + 4 * kQ) * sizeof(float);
}

// Block (query tile x, head y = b * NH + h).
template <bool kDropout, int HS>
__global__ void __launch_bounds__(kThreads, 2)
    attention_bwd_scores_tiled_kernel(float* probs, float* dscores, const float* qkv, const float* dout,
                                      const float* out, const float* lse, int seq, int C, int NH, float scale,
                                      bool causal, const int32_t* lengths, DropoutArgs drop) {
  static_assert(HS % 16 == 0 && HS <= 64, "head size");
  extern __shared__ __align__(16) float smem[];
  float* q_s = smem;              // [HS][kLdQ]
  float* do_s = q_s + HS * kLdQ;  // [HS][kLdQ]
  float* k_s = do_s + HS * kLdQ;  // [HS][kLdK]
  float* v_s = k_s + HS * kLdK;   // [HS][kLdK]
  float* lse_s = v_s + HS * kLdK;
  float* d_s = lse_s + kQ;
  int* last_s = reinterpret_cast<int*>(d_s + kQ);
  uint32_t* row_key_s = reinterpret_cast<uint32_t*>(last_s + kQ);
  __shared__ BlockKeys keys_s;

  const int z = blockIdx.y, b = z / NH, h = z % NH, q0 = blockIdx.x * kQ;
  const int64_t row3 = 3 * int64_t(C);
  const float* q = qkv + int64_t(b) * seq * row3 + int64_t(h) * HS;
  const float* dO = dout + int64_t(b) * seq * C + int64_t(h) * HS;
  const float* o = out + int64_t(b) * seq * C + int64_t(h) * HS;
  const size_t row_base = size_t(z) * seq;

  const BlockKeys keys = stage_query_rows<kQ, kThreads, kDropout>(last_s, row_key_s, &keys_s, q0, row_base,
                                                                  seq, NH, causal, lengths, drop);
  // lse in the log2 domain: each probability is then one multiply-add and one exp2.
  lse_s[threadIdx.x] = q0 + int(threadIdx.x) < seq ? lse[row_base + q0 + threadIdx.x] * kLog2e : 0.f;
  const float scale_log2 = scale * kLog2e;
  // Key tiles from live_tiles on are past every row's last key: only zeros to write there.
  const int live_tiles = keys.any_sees < 0 ? 0 : keys.any_sees / kK + 1, n_tiles = (seq + kK - 1) / kK;
  if (live_tiles > 0) {
    stage_transposed_async<HS, kK, kThreads>(k_s, q + C, row3, 0, seq);
    cp_async_commit();
    stage_transposed_async<HS, kK, kThreads>(v_s, q + 2 * C, row3, 0, seq);
    cp_async_commit();
    // D = rowsum(dout * out), one thread a query. The reads of `out` are issued first, so their latency
    // overlaps the staging's; two interleaved partial sums.
    const int r = threadIdx.x, t = q0 + r;
    float ov[HS / 4][4];
#pragma unroll
    for (int n = 0; n < HS / 4; ++n) {
      ov[n][0] = ov[n][1] = ov[n][2] = ov[n][3] = 0.f;
      if (t < seq) load4(ov[n], o + int64_t(t) * C + 4 * n);
    }
    stage_transposed<HS, kQ, kThreads>(q_s, q, row3, q0, seq);
    stage_transposed<HS, kQ, kThreads>(do_s, dO, C, q0, seq);
    __syncthreads();
    float dsum[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < HS / 4; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) dsum[n % 2] = fmaf(ov[n][c], do_s[(4 * n + c) * kLdQ + r], dsum[n % 2]);
    d_s[r] = dsum[0] + dsum[1];
  }

  const int ty = threadIdx.x / 8, tx = threadIdx.x % 8;
  const bool vector_rows = seq % 4 == 0;
  for (int j = 0; j < n_tiles; ++j) {
    const int k0 = j * kK;
    float p[8][8], dp[8][8];
    const bool live = j < live_tiles;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int c = 0; c < 8; ++c) p[i][c] = dp[i][c] = 0.f;
    if (live) {
      cp_async_wait<1>();  // k of tile j (its v may still be in flight)
      __syncthreads();
      patch_product<HS, kLdQ, 64, kLdK, 32, 8>(p, q_s + ty * 4, k_s + tx * 4);
      __syncthreads();  // every thread is done with k_s: the next tile's k goes there
      if (j + 1 < live_tiles) stage_transposed_async<HS, kK, kThreads>(k_s, q + C, row3, k0 + kK, seq);
      cp_async_commit();                 // possibly empty: the group count stays uniform
      if (k0 + kK - 1 > keys.all_see) {  // some query of the block does not see every key of the tile
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int r = patch_index(ty, i, 64), last = last_s[r];
          const float l = lse_s[r];
#pragma unroll
          for (int c = 0; c < 8; ++c)
            p[i][c] = k0 + patch_index(tx, c, 32) <= last ? exp2f(fmaf(scale_log2, p[i][c], -l)) : 0.f;
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const float l = lse_s[patch_index(ty, i, 64)];
#pragma unroll
          for (int c = 0; c < 8; ++c) p[i][c] = exp2f(fmaf(scale_log2, p[i][c], -l));
        }
      }
      cp_async_wait<1>();  // v of tile j (the next k may still be in flight)
      __syncthreads();
      patch_product<HS, kLdQ, 64, kLdK, 32, 8>(dp, do_s + ty * 4, v_s + tx * 4);
      __syncthreads();  // every thread is done with v_s
      if (j + 1 < live_tiles) stage_transposed_async<HS, kK, kThreads>(v_s, q + 2 * C, row3, k0 + kK, seq);
      cp_async_commit();
    }
    // Row i's results at keys c .. c + 3 (c = k0 + g * 32 + tx * 4): the dropped probabilities and dscores.
    const auto results = [&](int i, int g, float(&pd)[4], float(&ds)[4]) {
      const int r = patch_index(ty, i, 64), c = k0 + g * 32 + tx * 4;
      const float D = live ? d_s[r] : 0.f;
      uint32_t bits[2] = {0, 0};  // the dropout bits of keys c, c + 1 and c + 2, c + 3
      if constexpr (kDropout) {
        bits[0] = anvil::attention_dropout_pair_bits(row_key_s[r], uint32_t(c) >> 1);
        bits[1] = anvil::attention_dropout_pair_bits(row_key_s[r], (uint32_t(c) >> 1) + 1);
      }
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const float pv = p[i][g * 4 + jj];
        float dpu = dp[i][g * 4 + jj];
        pd[jj] = pv;
        if constexpr (kDropout) {
          const bool keep = live && anvil::attention_dropout_keep_bits(bits[jj / 2], jj, drop.threshold);
          dpu = keep ? dpu * drop.scale : 0.f;
          pd[jj] = keep ? __fmul_rn(pv, drop.scale) : 0.f;
        }
        ds[jj] = scale * pv * (dpu - D);
      }
    };
    if (vector_rows && q0 + kQ <= seq && k0 + kK <= seq) {
      // Every row and key of the tile exists: no per-row branch, so the rows' arithmetic interleaves.
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const size_t row = row_base + q0 + patch_index(ty, i, 64);
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          float pd[4], ds[4];
          results(i, g, pd, ds);
          const int c = k0 + g * 32 + tx * 4;
          store4(probs + row * seq + c, pd);
          store4(dscores + row * seq + c, ds);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int t = q0 + patch_index(ty, i, 64);
        if (t >= seq) continue;
        float* prow = probs + (row_base + t) * seq;
        float* srow = dscores + (row_base + t) * seq;
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          float pd[4], ds[4];
          results(i, g, pd, ds);
          const int c = k0 + g * 32 + tx * 4;
          if (vector_rows && c + 3 < seq) {
            store4(prow + c, pd);
            store4(srow + c, ds);
          } else {
            for (int jj = 0; jj < 4 && c + jj < seq; ++jj) prow[c + jj] = pd[jj], srow[c + jj] = ds[jj];
          }
        }
      }
    }
  }
  cp_async_wait<0>();  // nothing may land in shared memory after the block exits
}

}  // namespace tiled

template <bool kDropout, int HS>
void launch(cudaStream_t stream, float* probs, float* dscores, const float* qkv, const float* dout,
            const float* out, const float* lse, int B, int seq, int C, int NH, float scale, bool causal,
            const int32_t* lengths, const DropoutArgs& drop) {
  // Head sizes up to 64: the 8 x 8 patches (bert-large, batch 4 x 512, dropout 0.1, H100: 219 -> 154 us a
  // layer; bench/probes/results/seed_vanilla_fp32_profile_h100_2026-11-23_tiled_bwd_scores.txt and
  // ..._scores_64key.txt). A head size of 128 would need 8 x 16 patches: more registers than a thread has.
  if constexpr (HS <= 64) {
    const auto kernel = tiled::attention_bwd_scores_tiled_kernel<kDropout, HS>;
    configure_for_current_device(reinterpret_cast<const void*>(kernel), tiled::smem_bytes(HS));
    const dim3 grid((seq + tiled::kQ - 1) / tiled::kQ, B * NH);
    kernel<<<grid, tiled::kThreads, tiled::smem_bytes(HS), stream>>>(probs, dscores, qkv, dout, out, lse, seq,
                                                                     C, NH, scale, causal, lengths, drop);
    ANVIL_CUDA_CHECK_LAST();
    return;
  }
  configure_for_current_device(reinterpret_cast<const void*>(attention_bwd_scores_kernel<kDropout, HS>),
                               smem_bytes(HS));
  const dim3 grid((seq + kCols - 1) / kCols, (seq + kRows - 1) / kRows, B * NH);
  attention_bwd_scores_kernel<kDropout, HS><<<grid, kThreads, smem_bytes(HS), stream>>>(
      probs, dscores, qkv, dout, out, lse, seq, C, NH, scale, causal, lengths, drop);
  ANVIL_CUDA_CHECK_LAST();
}

template <bool kDropout>
void launch_for_head_size(int HS, cudaStream_t stream, float* probs, float* dscores, const float* qkv,
                          const float* dout, const float* out, const float* lse, int B, int seq, int C,
                          int NH, float scale, bool causal, const int32_t* lengths, const DropoutArgs& drop) {
  switch (HS) {
    case 32:
      return launch<kDropout, 32>(stream, probs, dscores, qkv, dout, out, lse, B, seq, C, NH, scale, causal,
                                  lengths, drop);
    case 64:
      return launch<kDropout, 64>(stream, probs, dscores, qkv, dout, out, lse, B, seq, C, NH, scale, causal,
                                  lengths, drop);
    case 128:
      return launch<kDropout, 128>(stream, probs, dscores, qkv, dout, out, lse, B, seq, C, NH, scale, causal,
                                   lengths, drop);
    default:
      detail::raise_at(__FILE__, __LINE__,
                       "attention_bwd_scores: head size " + std::to_string(HS) + " is not supported");
  }
}

}  // namespace

bool attention_bwd_scores_supported(anvil::DType act, int B, int T, int C, int NH, const void* qkv,
                                    const void* dout, const void* out) {
  // fp32 only: in 16-bit, D = rowsum(dout * out) from the rounded `out` loses the precision that the
  // unfused path's rowsum(P * dP) in fp32 keeps when dP and D nearly cancel.
  if (act != anvil::DType::F32 || NH <= 0 || C % NH != 0 || B <= 0 || T <= 0) return false;
  const int HS = C / NH;
  if ((HS != 32 && HS != 64 && HS != 128) || C % 4 != 0) return false;
  if (B * int64_t(NH) > 65535 || (T + kRows - 1) / kRows > 65535) return false;
  if (smem_bytes(HS) + 3 * kRows * sizeof(float) > size_t(max_optin_smem())) return false;
  if (HS <= 64 && (tiled::smem_bytes(HS) + sizeof(int) > size_t(max_optin_smem()) || B * int64_t(NH) > 65535))
    return false;
  // Four-element vector reads of every row (rows are 4-element aligned given C % 4 == 0).
  for (const void* p : {qkv, dout, out})
    if (reinterpret_cast<uintptr_t>(p) % (4 * sizeof(float)) != 0) return false;
  return true;
}

void attention_bwd_scores(cudaStream_t stream, float* probs, float* dscores, const float* qkv,
                          const float* dout, const float* out, const float* lse, int B, int T_, int C, int NH,
                          float scale, bool causal, const int32_t* lengths, const AttentionDropout& dropout) {
  const int HS = C / NH;
  if (dropout.p > 0)
    launch_for_head_size<true>(HS, stream, probs, dscores, qkv, dout, out, lse, B, T_, C, NH, scale, causal,
                               lengths, dropout_args(dropout));
  else
    launch_for_head_size<false>(HS, stream, probs, dscores, qkv, dout, out, lse, B, T_, C, NH, scale, causal,
                                lengths, {});
}

}  // namespace anvil::cuda
