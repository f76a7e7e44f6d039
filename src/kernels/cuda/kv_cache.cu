// Generation with a KV cache (the "generation (KV cache)" ops of kernels/ops.hpp): the embedding and RoPE at
// per-sequence positions, the cache write, and attention of the new queries over the cache.
//
// The attention is built for one-token steps, where it reads every cached key and value once per step and
// is bound by memory bandwidth. A thread block takes one (sequence, key/value head, new token) and up to
// kMaxGroup query heads of that key/value head's group, so grouped-query attention reads each cached head
// once for its whole group. Its keys go through in tiles of kTile: each thread scores one key against the
// group's queries (held in shared memory), the warps update the running max / sum (online softmax), then
// each warp accumulates the weighted values of its share of the tile (lanes over the head's elements). When
// the work items alone cannot fill the GPU (small batch, one token), each sequence's visible keys are split
// across `splits` blocks whose partial results (unnormalised output, max, sum) a second kernel combines
// (flash-decoding). Scores are kept in base 2 (q pre-scaled by log2(e) / sqrt(HS), exp2).
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;

// --- embedding and RoPE at positions ----------------------------------------------------------------------

// embedding_fwd_kernel's arithmetic, with row (b, t) taking position pos[b] + t.
template <class T>
__global__ void embedding_at_kernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                    const int32_t* pos, int Tn, int C, size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t bt = i / C;
    const int c = static_cast<int>(i - bt * C);
    float v = to_float(wte[static_cast<size_t>(tokens[bt]) * C + c]);
    if (wpe) {
      const int p = pos[bt / Tn] + static_cast<int>(bt % Tn);
      if (p >= 0) v += to_float(wpe[static_cast<size_t>(p) * C + c]);
    }
    out[i] = from_float<T>(v);
  }
}

// rope.cu's rotation (cos and sin in fp64 rounded to fp32, explicitly rounded fp32 products), one block per
// row (b, t) at a time, at the row's own position.
template <class T, bool kVec>
__global__ void rope_at_kernel(T* qkv, const float* inv_freq, const int32_t* pos, int rows, int Tn, int heads,
                               int width, int HS) {
  extern __shared__ float2 table[];  // [HS / 2]: (cos a, sin a)
  constexpr int kN = kVec ? Vec16<T>::kN : 1;
  const int half = HS / 2, groups = half / kN, items = heads * groups;
  for (int r = blockIdx.x; r < rows; r += gridDim.x) {
    __syncthreads();  // the previous row's table is no longer read
    const float p = static_cast<float>(pos[r / Tn] + r % Tn);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      double s, c;
      sincos(static_cast<double>(__fmul_rn(p, inv_freq[i])), &s, &c);
      table[i] = make_float2(static_cast<float>(c), static_cast<float>(s));
    }
    __syncthreads();
    for (int j = threadIdx.x; j < items; j += blockDim.x) {
      const int g = j % groups, h = j / groups;
      T* x0 = qkv + static_cast<size_t>(r) * width + static_cast<size_t>(h) * HS + g * kN;
      T* x1 = x0 + half;
      float f0[kN], f1[kN];
      if constexpr (kVec) {
        const Vec16<T> v0 = *reinterpret_cast<const Vec16<T>*>(x0),
                       v1 = *reinterpret_cast<const Vec16<T>*>(x1);
#pragma unroll
        for (int k = 0; k < kN; ++k) f0[k] = to_float(v0.v[k]), f1[k] = to_float(v1.v[k]);
      } else {
        f0[0] = to_float(*x0), f1[0] = to_float(*x1);
      }
      float y0[kN], y1[kN];
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        const float2 cs = table[g * kN + k];
        y0[k] = __fsub_rn(__fmul_rn(f0[k], cs.x), __fmul_rn(f1[k], cs.y));
        y1[k] = __fadd_rn(__fmul_rn(f1[k], cs.x), __fmul_rn(f0[k], cs.y));
      }
      if constexpr (kVec) {
        Vec16<T> v0, v1;
#pragma unroll
        for (int k = 0; k < kN; ++k) v0.v[k] = from_float<T>(y0[k]), v1.v[k] = from_float<T>(y1[k]);
        *reinterpret_cast<Vec16<T>*>(x0) = v0;
        *reinterpret_cast<Vec16<T>*>(x1) = v1;
      } else {
        *x0 = from_float<T>(y0[0]), *x1 = from_float<T>(y1[0]);
      }
    }
  }
}

// --- cache write ------------------------------------------------------------------------------------------

// Copies the k and v parts (kv_row units each, starting at unit k0 of a row of `width` units) of every qkv
// row into the cache; U is one element or a 16-byte vector of them. Rows past the cache are skipped.
template <class U>
__global__ void kv_write_kernel(U* k, U* v, int S, const U* qkv, const int32_t* pos, int Tn, int width,
                                int k0, int kv_row, size_t total) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < total;
       i += size_t{gridDim.x} * blockDim.x) {
    const size_t r = i / kv_row;
    const int c = static_cast<int>(i - r * kv_row);
    const size_t b = r / Tn;
    const int p = pos[b] + static_cast<int>(r % Tn);
    if (p < 0 || p >= S) continue;
    const size_t dst = (b * S + p) * kv_row + c;
    const U* src = qkv + r * width + k0 + c;
    k[dst] = src[0];
    v[dst] = src[kv_row];
  }
}

// --- attention over the cache
// -------------------------------------------------------------------------------

constexpr int kAttnThreads = 128;
constexpr int kAttnWarps = kAttnThreads / kWarpSize;
constexpr int kTile = kAttnThreads;  // keys per tile: one per thread when scoring
constexpr int kMaxSplits = 64;       // ops.hpp's kCachedAttentionSplits (the planned scratch)
constexpr int kMinKeysPerSplit = 64;

struct CachedAttentionArgs {
  const void* qkv;
  const void* k;
  const void* v;
  void* out;
  float* partial;  // [B, Tn, NH, splits, HS + 2] when splits > 1
  const int32_t* pos;
  int Tn, NH, NKV, HS, S, window, group, head_chunks, splits;
  float q_scale;  // log2(e) / sqrt(HS)
};

// Block = (b, g, head chunk, t, split), the split fastest. kD: head elements per lane (ceil(HS / 32), a power
// of two); kG: query heads per block. Dynamic shared memory: q [kG][HS], scores [kG][kTile], the warps'
// outputs [kAttnWarps][kG][HS].
template <class T, bool kVec, int kD, int kG>
__global__ void __launch_bounds__(kAttnThreads) cached_attention_kernel(CachedAttentionArgs a) {
  extern __shared__ float smem[];
  float* q_s = smem;
  float* s_s = q_s + kG * a.HS;
  float* red = s_s + kG * kTile;
  __shared__ float m_s[kG], l_s[kG], alpha_s[kG];

  int item = blockIdx.x;
  const int split = item % a.splits;
  item /= a.splits;
  const int t = item % a.Tn;
  item /= a.Tn;
  const int hc = item % a.head_chunks;
  item /= a.head_chunks;
  const int g = item % a.NKV, b = item / a.NKV;
  const int h0 = g * a.group + hc * kG, heads = min(kG, a.group - hc * kG);
  const int HS = a.HS, lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;

  // This split's share of the keys the query sees (clamped to the cache: an invalid position reads nothing).
  const int p = a.pos[b] + t;
  const int first = a.window > 0 ? max(0, p - a.window + 1) : 0, last = min(p, a.S - 1);
  const int n_keys = max(0, last - first + 1);
  const int per_split = (n_keys + a.splits - 1) / a.splits;
  const int k_begin = first + split * per_split, k_end = min(first + n_keys, k_begin + per_split);

  const size_t row = static_cast<size_t>(b) * a.Tn + t;
  const T* q = static_cast<const T*>(a.qkv) + row * (a.NH + 2 * a.NKV) * HS + static_cast<size_t>(h0) * HS;
  for (int i = threadIdx.x; i < heads * HS; i += kAttnThreads) q_s[i] = to_float(q[i]) * a.q_scale;
  if (threadIdx.x < kG) m_s[threadIdx.x] = -INFINITY, l_s[threadIdx.x] = 0.f;
  __syncthreads();

  const size_t kv_stride = static_cast<size_t>(a.NKV) * HS;  // between positions
  const size_t head_base = static_cast<size_t>(b) * a.S * kv_stride + static_cast<size_t>(g) * HS;
  const T* kbase = static_cast<const T*>(a.k) + head_base;
  const T* vbase = static_cast<const T*>(a.v) + head_base;

  float acc[kG][kD];
#pragma unroll
  for (int h = 0; h < kG; ++h)
#pragma unroll
    for (int i = 0; i < kD; ++i) acc[h][i] = 0.f;

  for (int tile0 = k_begin; tile0 < k_end; tile0 += kTile) {
    const int tile_len = min(kTile, k_end - tile0);
    // Scores: thread i takes key tile0 + i against every query head of the block.
    if (threadIdx.x < tile_len) {
      const T* kr = kbase + static_cast<size_t>(tile0 + threadIdx.x) * kv_stride;
      float dot[kG];
#pragma unroll
      for (int h = 0; h < kG; ++h) dot[h] = 0.f;
      constexpr int kN = kVec ? Vec16<T>::kN : 1;
      for (int d0 = 0; d0 < HS; d0 += kN) {
        float kf[kN];
        if constexpr (kVec) {
          const Vec16<T> kv = *reinterpret_cast<const Vec16<T>*>(kr + d0);
#pragma unroll
          for (int j = 0; j < kN; ++j) kf[j] = to_float(kv.v[j]);
        } else {
          kf[0] = to_float(kr[d0]);
        }
#pragma unroll
        for (int h = 0; h < kG; ++h)
          if (h < heads)
#pragma unroll
            for (int j = 0; j < kN; ++j) dot[h] += q_s[h * HS + d0 + j] * kf[j];
      }
#pragma unroll
      for (int h = 0; h < kG; ++h)
        if (h < heads) s_s[h * kTile + threadIdx.x] = dot[h];
    }
    __syncthreads();
    // Online softmax: a warp per head turns the tile's scores into exp2(s - max) and rescales the sums.
    for (int h = warp; h < heads; h += kAttnWarps) {
      float mx = -INFINITY;
      for (int i = lane; i < tile_len; i += kWarpSize) mx = fmaxf(mx, s_s[h * kTile + i]);
      mx = warp_max(mx);
      const float m_old = m_s[h], m_new = fmaxf(m_old, mx);
      float sum = 0.f;
      for (int i = lane; i < tile_len; i += kWarpSize) {
        const float e = exp2f(s_s[h * kTile + i] - m_new);
        s_s[h * kTile + i] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float alpha = exp2f(m_old - m_new);  // 0 on the first tile (m_old = -inf)
        alpha_s[h] = alpha;
        l_s[h] = l_s[h] * alpha + sum;
        m_s[h] = m_new;
      }
    }
    __syncthreads();
    // Values: warp w takes keys w, w + kAttnWarps, ... of the tile; lane holds elements lane + 32 i.
#pragma unroll
    for (int h = 0; h < kG; ++h) {
      const float alpha = h < heads ? alpha_s[h] : 0.f;
#pragma unroll
      for (int i = 0; i < kD; ++i) acc[h][i] *= alpha;
    }
    for (int j = warp; j < tile_len; j += kAttnWarps) {
      const T* vr = vbase + static_cast<size_t>(tile0 + j) * kv_stride;
      float vf[kD];
#pragma unroll
      for (int i = 0; i < kD; ++i) {
        const int d = lane + i * kWarpSize;
        vf[i] = d < HS ? to_float(vr[d]) : 0.f;
      }
#pragma unroll
      for (int h = 0; h < kG; ++h) {
        if (h >= heads) continue;
        const float pr = s_s[h * kTile + j];
#pragma unroll
        for (int i = 0; i < kD; ++i) acc[h][i] += pr * vf[i];
      }
    }
    __syncthreads();  // the next tile overwrites the scores
  }

  // The warps' sums, then the output (one split) or this split's partial result.
#pragma unroll
  for (int h = 0; h < kG; ++h)
#pragma unroll
    for (int i = 0; i < kD; ++i) {
      const int d = lane + i * kWarpSize;
      if (h < heads && d < HS) red[(warp * kG + h) * HS + d] = acc[h][i];
    }
  __syncthreads();
  for (int i = threadIdx.x; i < heads * HS; i += kAttnThreads) {
    const int h = i / HS, d = i - h * HS;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) o += red[(w * kG + h) * HS + d];
    const size_t qrow = row * a.NH + h0 + h;  // (b, t, query head)
    if (a.splits == 1) {
      const float l = l_s[h];
      static_cast<T*>(a.out)[qrow * HS + d] = from_float<T>(l > 0.f ? o / l : 0.f);
    } else {
      float* part = a.partial + (qrow * a.splits + split) * (HS + 2);
      part[d] = o;
      if (d == 0) part[HS] = m_s[h], part[HS + 1] = l_s[h];
    }
  }
}

// One block per (b, t, query head): the splits' partial outputs weighted by exp2(m_s - max) over the total
// weighted sum.
template <class T>
__global__ void combine_splits_kernel(T* out, const float* partial, int splits, int HS) {
  __shared__ float weight[kMaxSplits];
  __shared__ float inv_total;
  const size_t qrow = blockIdx.x;
  const float* part = partial + qrow * splits * (HS + 2);
  if (threadIdx.x < kWarpSize) {
    const int lane = threadIdx.x;
    float m = -INFINITY;
    for (int s = lane; s < splits; s += kWarpSize) m = fmaxf(m, part[s * (HS + 2) + HS]);
    m = warp_max(m);
    float total = 0.f;
    for (int s = lane; s < splits; s += kWarpSize) {
      const float ms = part[s * (HS + 2) + HS];
      const float w = ms == -INFINITY ? 0.f : exp2f(ms - m);
      weight[s] = w;
      total += w * part[s * (HS + 2) + HS + 1];
    }
    total = warp_sum(total);
    if (lane == 0) inv_total = total > 0.f ? 1.f / total : 0.f;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float o = 0.f;
    for (int s = 0; s < splits; ++s) o += part[s * (HS + 2) + d] * weight[s];
    out[qrow * HS + d] = from_float<T>(o * inv_total);
  }
}

template <class T, bool kVec, int kD, int kG>
void launch_cached_attention(cudaStream_t stream, CachedAttentionArgs a, const AttentionDims& d, int max_keys,
                             size_t scratch_bytes) {
  a.head_chunks = (a.group + kG - 1) / kG;
  const int items = d.B * d.NKV * a.head_chunks * d.T;
  // Splits only while the work items leave SMs idle, each split keeping kMinKeysPerSplit keys or more, and as
  // many as the scratch holds.
  a.splits = 1;
  const int target = 2 * sm_count();
  if (items < target && a.partial) {
    const size_t per_split = static_cast<size_t>(d.B) * d.T * d.NH * (d.HS + 2) * sizeof(float);
    const int by_keys = (max_keys + kMinKeysPerSplit - 1) / kMinKeysPerSplit;
    const size_t by_scratch = scratch_bytes / per_split;
    a.splits = static_cast<int>(
        std::min<size_t>({static_cast<size_t>((target + items - 1) / items), static_cast<size_t>(by_keys),
                          by_scratch, static_cast<size_t>(kMaxSplits)}));
    a.splits = std::max(a.splits, 1);
  }
  const size_t smem = (static_cast<size_t>(kG) * d.HS * (1 + kAttnWarps) + kG * kTile) * sizeof(float);
  const unsigned blocks = static_cast<unsigned>(items) * a.splits;
  cached_attention_kernel<T, kVec, kD, kG><<<blocks, kAttnThreads, smem, stream>>>(a);
  ANVIL_CUDA_CHECK_LAST();
  if (a.splits > 1) {
    const unsigned rows = static_cast<unsigned>(d.B) * d.T * d.NH;
    combine_splits_kernel<T><<<rows, std::min(128, std::max(32, (d.HS + 31) / 32 * 32)), 0, stream>>>(
        static_cast<T*>(a.out), a.partial, a.splits, d.HS);
    ANVIL_CUDA_CHECK_LAST();
  }
}

template <class T, bool kVec>
void cached_attention_by_head_size(cudaStream_t stream, const CachedAttentionArgs& a, const AttentionDims& d,
                                   int max_keys, size_t scratch_bytes) {
  // kG * kD accumulators per lane: at most 64 registers. Multi-head attention (GPT-2) has one query head per
  // key/value head: its own instantiation keeps the shared memory (and registers) of one head.
  const bool mha = a.group == 1;
  if (d.HS <= 64)
    mha ? launch_cached_attention<T, kVec, 2, 1>(stream, a, d, max_keys, scratch_bytes)
        : launch_cached_attention<T, kVec, 2, 8>(stream, a, d, max_keys, scratch_bytes);
  else if (d.HS <= 128)
    mha ? launch_cached_attention<T, kVec, 4, 1>(stream, a, d, max_keys, scratch_bytes)
        : launch_cached_attention<T, kVec, 4, 8>(stream, a, d, max_keys, scratch_bytes);
  else if (d.HS <= 256)
    launch_cached_attention<T, kVec, 8, 8>(stream, a, d, max_keys, scratch_bytes);
  else
    launch_cached_attention<T, kVec, 16, 4>(stream, a, d, max_keys, scratch_bytes);
}

}  // namespace

void embedding_fwd_at(cudaStream_t stream, anvil::DType act, void* out, const int32_t* tokens,
                      const void* wte, const void* wpe, const int32_t* pos, int B, int Tn, int C) {
  const size_t total = static_cast<size_t>(B) * Tn * C;
  if (total == 0) return;
  dispatch_float(act, [&](auto tag) {
    using T = decltype(tag);
    embedding_at_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(out), tokens, static_cast<const T*>(wte), static_cast<const T*>(wpe), pos, Tn, C,
        total);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void rope_fwd_at(cudaStream_t stream, anvil::DType act, void* qkv, const float* inv_freq, const int32_t* pos,
                 const AttentionDims& d) {
  const int rows = d.B * d.T;
  if (rows <= 0) return;
  const int heads = d.NH + d.NKV, width = d.qkv_width(), half = d.HS / 2;
  const unsigned blocks = static_cast<unsigned>(std::min(rows, 1 << 16));
  const size_t smem = static_cast<size_t>(half) * sizeof(float2);
  dispatch_float(act, [&](auto tag) {
    using T = decltype(tag);
    auto* x = static_cast<T*>(qkv);
    if (half % Vec16<T>::kN == 0 && reinterpret_cast<uintptr_t>(qkv) % 16 == 0)
      rope_at_kernel<T, true>
          <<<blocks, kThreads, smem, stream>>>(x, inv_freq, pos, rows, d.T, heads, width, d.HS);
    else
      rope_at_kernel<T, false>
          <<<blocks, kThreads, smem, stream>>>(x, inv_freq, pos, rows, d.T, heads, width, d.HS);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void kv_cache_write(cudaStream_t stream, anvil::DType act, void* k, void* v, int S, const void* qkv,
                    const int32_t* pos, const AttentionDims& d) {
  const int rows = d.B * d.T;
  if (rows <= 0) return;
  const int width = d.qkv_width(), k0 = d.q_width(), kv_row = d.NKV * d.HS;
  dispatch_float(act, [&](auto tag) {
    using T = decltype(tag);
    using V = Vec16<T>;
    constexpr int kN = V::kN;
    // Whole 16-byte vectors when every row, head block and buffer is aligned to them.
    if (kv_row % kN == 0 && width % kN == 0 && k0 % kN == 0 && rows_vectorizable<T>(width, {k, v, qkv})) {
      const size_t total = static_cast<size_t>(rows) * (kv_row / kN);
      kv_write_kernel<V><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
          static_cast<V*>(k), static_cast<V*>(v), S, static_cast<const V*>(qkv), pos, d.T, width / kN,
          k0 / kN, kv_row / kN, total);
    } else {
      const size_t total = static_cast<size_t>(rows) * kv_row;
      kv_write_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(k), static_cast<T*>(v), S, static_cast<const T*>(qkv), pos, d.T, width, k0, kv_row,
          total);
    }
  });
  ANVIL_CUDA_CHECK_LAST();
}

void cached_attention_fwd(cudaStream_t stream, anvil::DType act, void* out, const void* qkv, const void* k,
                          const void* v, int S, const int32_t* pos, int max_keys, int window, void* scratch,
                          size_t scratch_bytes, const AttentionDims& d) {
  if (d.B <= 0 || d.T <= 0) return;
  if (d.HS > kCachedAttentionMaxHeadSize)
    detail::raise_at(__FILE__, __LINE__,
                     "cached attention: head size " + std::to_string(d.HS) + " is larger than " +
                         std::to_string(kCachedAttentionMaxHeadSize));
  CachedAttentionArgs a{};
  a.qkv = qkv, a.k = k, a.v = v, a.out = out, a.partial = static_cast<float*>(scratch), a.pos = pos;
  a.Tn = d.T, a.NH = d.NH, a.NKV = d.NKV, a.HS = d.HS, a.S = S, a.window = window, a.group = d.NH / d.NKV;
  a.q_scale = 1.4426950408889634f / sqrtf(static_cast<float>(d.HS));
  // The splits are sized by the keys there are to read (max_keys), not by the capacity.
  dispatch_float(act, [&](auto tag) {
    using T = decltype(tag);
    // Keys as 16-byte vectors: whole vectors per head (then every head and position is aligned too).
    if (d.HS % Vec16<T>::kN == 0 && reinterpret_cast<uintptr_t>(k) % 16 == 0)
      cached_attention_by_head_size<T, true>(stream, a, d, max_keys, scratch_bytes);
    else
      cached_attention_by_head_size<T, false>(stream, a, d, max_keys, scratch_bytes);
  });
}

}  // namespace anvil::cuda
