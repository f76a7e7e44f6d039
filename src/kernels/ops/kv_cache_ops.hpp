// Generation (KV cache) ops: the forward of new tokens at per-sequence positions while decoding, i.e. the
// embedding and RoPE at those positions, writes of keys and values into a layer's cache, and attention of
// the new queries over the cache (flash-decoding style on CUDA).
//
// Part of the Ops contract (kernels/ops.hpp: memory, storage types, the `[grad]` pointer marks, and the
// gradient convention: parameter gradients accumulate, activation gradients are overwritten unless a
// comment says otherwise). Ops inherits this interface; CpuOps and CudaOps implement it.
#pragma once
#include <cstddef>
#include <cstdint>

#include "anvil/tensor.hpp"
#include "kernels/ops/attention_ops.hpp"

namespace anvil {

// One layer's KV cache (generation): k and v, each [B, S, NKV, HS] in the compute type, S the cache's
// capacity in positions. k[b, p, g, :] is key head g of sequence b at position p (after RoPE); v likewise.
struct KvCacheLayer {
  void* k = nullptr;
  void* v = nullptr;
  int S = 0;
};

class KvCacheOps {
 public:
  virtual ~KvCacheOps() = default;

  // --- generation (KV cache) ----------------------------------------------------------------------
  // Decoding runs Tn >= 1 new tokens of each of B sequences whose first pos[b] positions are cached: `pos`
  // is int32 [B] in the backend's memory, and token t of sequence b is at position pos[b] + t. Each op
  // requires 0 <= pos[b] and pos[b] + Tn <= the bound it names: the CPU throws otherwise; CUDA, which cannot
  // check device values, skips what lies outside the buffers (the results are then meaningless).
  //
  // out[b,t,:] = wte[tokens[b,t],:] + wpe[pos[b] + t,:] (wpe null: the token row alone); tokens [B,Tn];
  // pos[b] + Tn <= wpe's rows is the caller's to ensure. With every pos[b] = 0 it is exactly embedding_fwd.
  virtual void embedding_fwd_at(void* out, const int32_t* tokens, const void* wte, const void* wpe,
                                const int32_t* pos, int B, int Tn, int C) = 0;
  // rope_fwd at per-sequence positions: row (b, t) of qkv [B, Tn, (NH + 2 NKV) HS] (s.T = Tn) rotates as
  // rope_fwd rotates position pos[b] + t. With every pos[b] = p0 it is exactly rope_fwd(..., pos_offset p0).
  virtual void rope_fwd_at(void* qkv, const float* inv_freq, const AttentionShape& s, const int32_t* pos) = 0;
  // Copies the k and v heads of qkv [B, Tn, (NH + 2 NKV) HS] (s.T = Tn; after RoPE) into the cache:
  // cache.k[b, pos[b] + t, g, :] = key head g of row (b, t), cache.v likewise. Requires pos[b] + Tn <= S.
  virtual void kv_cache_write(const KvCacheLayer& cache, const void* qkv, const int32_t* pos,
                              const AttentionShape& s) = 0;
  // Attention of the new queries over the cache. Query head h of row (b, t) of qkv (its q part; s.T = Tn),
  // at position p = pos[b] + t, attends to the cached keys and values of head h / (NH / NKV) at positions
  // [window > 0 ? max(0, p - window + 1) : 0, p] (causal; `window` as AttentionMask::window):
  // out [B, Tn, NH HS] = softmax(q k^T / sqrt(HS)) v, fp32 math over the stored values, out rounded once
  // (unlike attention_fwd, the probabilities are not rounded to the storage type). The new tokens' keys and
  // values must be in the cache already (kv_cache_write first). `max_keys`: a host-side bound with
  // pos[b] + Tn <= max_keys <= cache.S for every b (CUDA splits each sequence's keys across thread blocks,
  // flash-decoding style, by it). `scratch` of `scratch_bytes` (cached_attention_scratch_bytes below; fewer
  // bytes, even 0, only allow fewer splits) holds the splits' partial results.
  virtual void cached_attention_fwd(void* out, const void* qkv, const KvCacheLayer& cache, const int32_t* pos,
                                    int max_keys, int window, void* scratch, size_t scratch_bytes,
                                    const AttentionShape& s) = 0;
};

// The scratch Ops::cached_attention_fwd can use at batch s.B (any Tn): on CUDA room for the partial results
// of up to kCachedAttentionSplits key splits per query head of a one-token step (fp32 output, max and sum);
// the CPU needs none.
constexpr int kCachedAttentionSplits = 64;
inline size_t cached_attention_scratch_bytes(DeviceKind backend, const AttentionShape& s) {
  if (backend != DeviceKind::CUDA) return 0;
  return size_t(s.B) * size_t(s.NH) * kCachedAttentionSplits * (size_t(s.HS) + 2) * sizeof(float);
}

}  // namespace anvil
