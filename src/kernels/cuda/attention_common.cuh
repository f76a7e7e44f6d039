// Device helpers shared by the materialised attention kernels (attention.cu) and the fused fp32 kernels
// (attention_fwd_fused.cu, attention_bwd_scores.cu): which keys a query row sees, the device side of
// attention dropout, and the staging of head tiles in shared memory.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "kernels/dropout.hpp"

namespace anvil::cuda {

// log2(e): the fused fp32 kernels form probabilities as exp2 of log2-domain scores.
constexpr float kLog2e = 1.4426950408889634f;

// The keys row `row` (query t of sequence b, head any) sees: 0..last (last = -1: a padding query), from
// first_key on with a sliding window.
__device__ inline int last_key(size_t row, int seq, int NH, bool causal, const int32_t* lengths) {
  const int t = static_cast<int>(row % seq);
  int len = seq;
  if (lengths) len = min(max(lengths[row / seq / NH], 0), seq);
  if (t >= len) return -1;
  return causal ? min(t, len - 1) : len - 1;
}

// The first key row `row` sees: 0, or with a sliding window (window > 0) the oldest key inside it.
__device__ inline int first_key(size_t row, int seq, int window) {
  return window > 0 ? max(0, static_cast<int>(row % seq) - window + 1) : 0;
}

// The device side of AttentionDropout: the threshold and the factor 1 / (1 - p), computed on the host.
struct DropoutArgs {
  const anvil::DropoutState* state;
  uint32_t site;
  uint32_t threshold;
  float scale;
};

inline DropoutArgs dropout_args(const AttentionDropout& d) {
  return {d.state, d.site, anvil::dropout_threshold(d.p), anvil::dropout_scale(d.p)};
}

// The key of the probabilities' whole mask in the current micro-batch (read from device memory); each row's
// 32-bit key derives from it.
__device__ inline uint64_t probabilities_dropout_key(const DropoutArgs& d) {
  return anvil::dropout_key(d.state->seed, d.state->micro, d.site);
}

// The 32-bit key of probability row `row` (anvil::attention_dropout_keep's first argument).
__device__ inline uint32_t attention_dropout_row_key(const DropoutArgs& d, uint64_t row) {
  return anvil::attention_dropout_row_key(probabilities_dropout_key(d), row);
}

// --- staging operands in shared memory ---------------------------------------------------------------------
// Asynchronous global -> shared copies (cp.async): 4 or 16 bytes, zero-filled when !valid. Each thread's
// copies form groups (commit); wait<N> blocks until at most N of its newest groups are still in flight.
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool valid) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(to), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool valid) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// kRows rows x HS of a [T, ld] operand (heads in place), from token t0, times `scale`, into
// dst[HS][kRows + 4] (transposed, so a thread's consecutive rows at one dimension are one vector read), by a
// block of kThreads. Tokens past `seq` read as 0. A warp reads 8 rows x 4 groups of 4 dimensions: 64
// contiguous bytes per row, and its shared-memory writes are at most 2-way conflicted thanks to the padding.
template <int HS, int kRows, int kThreads>
__device__ __forceinline__ void stage_transposed(float* dst, const float* src, int64_t ld, int t0, int seq,
                                                 float scale = 1.f) {
  constexpr int kQuads = HS / 4, kLd = kRows + 4, kPerThread = kRows * kQuads / kThreads;
  static_assert((kRows * kQuads) % kThreads == 0 && kQuads % 4 == 0, "tile not covered evenly");
  float4 v[kPerThread];
#pragma unroll
  for (int n = 0; n < kPerThread; ++n) {
    const int i = threadIdx.x + n * kThreads;
    const int r = i % 8 + 8 * (i / (8 * kQuads)), d = 4 * ((i / 8) % kQuads);
    v[n] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (t0 + r < seq) v[n] = *reinterpret_cast<const float4*>(src + int64_t(t0 + r) * ld + d);
  }
#pragma unroll
  for (int n = 0; n < kPerThread; ++n) {
    const int i = threadIdx.x + n * kThreads;
    const int r = i % 8 + 8 * (i / (8 * kQuads)), d = 4 * ((i / 8) % kQuads);
    dst[d * kLd + r] = v[n].x * scale;
    dst[(d + 1) * kLd + r] = v[n].y * scale;
    dst[(d + 2) * kLd + r] = v[n].z * scale;
    dst[(d + 3) * kLd + r] = v[n].w * scale;
  }
}

// Like stage_transposed (scale 1), without waiting: asynchronous 4-byte copies, each warp instruction 4 rows
// x 8 dimensions (4 whole 32-byte sectors, into 32 distinct banks). The caller commits and waits.
template <int HS, int kRows, int kThreads>
__device__ __forceinline__ void stage_transposed_async(float* dst, const float* src, int64_t ld, int t0,
                                                       int seq) {
  constexpr int kRowGroups = kRows / 4, kChunks = kRowGroups * (HS / 8), kLd = kRows + 4;
  const int lane = threadIdx.x % 32, rr = lane % 4, dd = lane / 4;
  for (int c = threadIdx.x / 32; c < kChunks; c += kThreads / 32) {
    const int r = (c % kRowGroups) * 4 + rr, d = (c / kRowGroups) * 8 + dd, t = t0 + r;
    cp_async4(dst + d * kLd + r, src + int64_t(t < seq ? t : 0) * ld + d, t < seq);
  }
}

// Row (or column) i of a thread's 8 x 8 patch (patch_product's layout): t*4 + i for i < 4, then half + t*4 +
// (i - 4).
__device__ __forceinline__ int patch_index(int t, int i, int half) {
  return i < 4 ? t * 4 + i : half + t * 4 + (i - 4);
}

// The keys a block's queries see: the last key any of them sees (-1: none), and the last key all of them see
// (-1: some query sees none), so key tiles up to `all_see` need no mask.
struct BlockKeys {
  int any_sees, all_see;
};

// The prologue of a block that keeps kRows queries of one head (rows row_base + q0 ..): each query's last
// visible key into last_s (-1: a padding query or past `seq`) and, with kDropout, its dropout row key into
// row_key_s. Returns the block's BlockKeys, the same in every thread.
template <int kRows, int kThreads, bool kDropout>
__device__ __forceinline__ BlockKeys stage_query_rows(int* last_s, uint32_t* row_key_s, BlockKeys* keys_s,
                                                      int q0, size_t row_base, int seq, int NH, bool causal,
                                                      const int32_t* lengths, const DropoutArgs& drop) {
  if (threadIdx.x == 0) *keys_s = {-1, seq};
  __syncthreads();
  int any_sees = -1, all_see = seq;
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const int t = q0 + r;
    const int last = t < seq ? last_key(row_base + t, seq, NH, causal, lengths) : -1;
    last_s[r] = last;
    if constexpr (kDropout) row_key_s[r] = attention_dropout_row_key(drop, row_base + t);
    any_sees = max(any_sees, last);
    all_see = min(all_see, last);
  }
  if (any_sees >= 0) atomicMax(&keys_s->any_sees, any_sees);
  if (all_see < seq) atomicMin(&keys_s->all_see, all_see);
  __syncthreads();
  return *keys_s;
}

// acc[i][j] += sum over s < kSteps of a[s][row i] * b[s][column j], for a thread's 8 x 8 patch of a product
// whose operands are staged step-major in shared memory (a: row pitch kLdA, b: kLdB), `a` and `b` pointing at
// the patch's first row and column. Rows i < 4 are a[s][0..3], rows 4..7 a[s][kHalfA + 0..3]; columns
// likewise with kHalfB. Two 16-byte reads of each operand per 64 multiply-adds.
template <int kSteps, int kLdA, int kHalfA, int kLdB, int kHalfB, int kUnroll = 4>
__device__ __forceinline__ void patch_product(float (&acc)[8][8], const float* a, const float* b) {
#pragma unroll kUnroll
  for (int s = 0; s < kSteps; ++s) {
    const float4 a0 = *reinterpret_cast<const float4*>(a + s * kLdA);
    const float4 a1 = *reinterpret_cast<const float4*>(a + s * kLdA + kHalfA);
    const float4 b0 = *reinterpret_cast<const float4*>(b + s * kLdB);
    const float4 b1 = *reinterpret_cast<const float4*>(b + s * kLdB + kHalfB);
    const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
  }
}

// attention_bwd_scores.cu: the fused front half of the fp32 backward (see there). Writes the dropped
// probabilities into `probs` and dscores into `dscores`, both [B, NH, T, T]. Supported for fp32 with head
// sizes 32, 64 and 128 when the operands allow 4-element vector reads; otherwise attention.cu runs the
// unfused kernels.
// attention_fwd_fused.cu: the whole fp32 forward in one kernel (out and lse; see there). Supported for fp32
// with head sizes 32 and 64 when qkv and out allow 4-element vector access; otherwise attention.cu runs the
// GEMMs and the softmax kernel.
bool attention_fwd_fused_supported(anvil::DType act, int B, int T, int C, int NH, const void* qkv,
                                   const void* out);
void attention_fwd_fused(cudaStream_t stream, float* out, float* lse, const float* qkv, int B, int T, int C,
                         int NH, bool causal, const int32_t* lengths, const AttentionDropout& dropout);

bool attention_bwd_scores_supported(anvil::DType act, int B, int T, int C, int NH, const void* qkv,
                                    const void* dout, const void* out);
void attention_bwd_scores(cudaStream_t stream, float* probs, float* dscores, const float* qkv,
                          const float* dout, const float* out, const float* lse, int B, int T, int C, int NH,
                          float scale, bool causal, const int32_t* lengths, const AttentionDropout& dropout);

}  // namespace anvil::cuda
