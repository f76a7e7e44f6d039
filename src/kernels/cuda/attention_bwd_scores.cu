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
// Tiles: kRows queries x kCols keys per block of 256 threads, each thread an 8 x 4 patch of both products.
// q, dout (kRows x HS) and k, v (kCols x HS) are staged in shared memory transposed ([HS][rows]) so each
// step of the inner products is one broadcast 32-byte read of q (dout) and one 16-byte read of k (v).
#include <array>
#include <atomic>
#include <cmath>
#include <mutex>
#include <set>
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

// rows x HS of a [T, ld] operand (heads in place), starting at token t0, into dst[HS][kTileRows + kPad]
// (fp32); tokens past `seq` read as 0. A warp reads 8 rows x 4 groups of 4 dimensions: 64 contiguous bytes
// per fp32 row, and shared-memory writes at most 2-way conflicted thanks to the padding.
template <int HS, int kTileRows>
__device__ __forceinline__ void stage_transposed(float* dst, const float* src, int64_t ld, int t0, int seq) {
  constexpr int kQuads = HS / 4, kLd = kTileRows + kPad;
  static_assert((kTileRows * kQuads) % kThreads == 0 && kQuads % 4 == 0, "tile not covered evenly");
  float v[kTileRows * kQuads / kThreads][4];
#pragma unroll
  for (int n = 0; n < kTileRows * kQuads / kThreads; ++n) {
    const int i = threadIdx.x + n * kThreads;
    const int r = i % 8 + 8 * (i / (8 * kQuads)), d = 4 * ((i / 8) % kQuads);
    v[n][0] = v[n][1] = v[n][2] = v[n][3] = 0.f;
    if (t0 + r < seq) load4(v[n], src + int64_t(t0 + r) * ld + d);
  }
#pragma unroll
  for (int n = 0; n < kTileRows * kQuads / kThreads; ++n) {
    const int i = threadIdx.x + n * kThreads;
    const int r = i % 8 + 8 * (i / (8 * kQuads)), d = 4 * ((i / 8) % kQuads);
    for (int c = 0; c < 4; ++c) dst[(d + c) * kLd + r] = v[n][c];
  }
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
    stage_transposed<HS, kRows>(q_s, q, row3, q0, seq);
    stage_transposed<HS, kRows>(do_s, dO, C, q0, seq);
    stage_transposed<HS, kCols>(k_s, q + C, row3, k0, seq);
    stage_transposed<HS, kCols>(v_s, q + 2 * C, row3, k0, seq);
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

// The opt-in shared memory per block of the current device, queried once per device: supported() asks on
// every backward call.
int max_optin_smem() {
  constexpr int kDevices = 64;
  static std::array<std::atomic<int>, kDevices> cached{};  // 0: not queried yet
  int dev = 0, bytes = 0;
  ANVIL_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < kDevices && (bytes = cached[dev].load(std::memory_order_relaxed)) > 0) return bytes;
  ANVIL_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (dev < kDevices) cached[dev].store(bytes, std::memory_order_relaxed);
  return bytes;
}

// Opts the kernel into its dynamic shared memory once per device, before its first launch there (an eager
// step, outside any graph capture).
template <bool kDropout, int HS>
void configure_for_current_device() {
  static std::mutex mutex;
  static std::set<int> configured;
  int dev = 0;
  ANVIL_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mutex);
  if (configured.insert(dev).second)
    ANVIL_CUDA_CHECK(cudaFuncSetAttribute(attention_bwd_scores_kernel<kDropout, HS>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes(HS))));
}

template <bool kDropout, int HS>
void launch(cudaStream_t stream, float* probs, float* dscores, const float* qkv, const float* dout,
            const float* out, const float* lse, int B, int seq, int C, int NH, float scale, bool causal,
            const int32_t* lengths, const DropoutArgs& drop) {
  configure_for_current_device<kDropout, HS>();
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
