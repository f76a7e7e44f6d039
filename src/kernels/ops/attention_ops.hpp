// Attention ops: flash-style self-attention over packed qkv (any head counts: AttentionShape; causal,
// padding lengths, sliding window and probability dropout: AttentionMask), rotary position embedding, and
// the attention of each sequence's first query only (BERT's last block); the scratch each needs, also
// without a device (for planning), and which CUDA path runs. Attention over a KV cache is in
// kv_cache_ops.hpp.
//
// Part of the Ops contract (kernels/ops.hpp: memory, storage types, the `[grad]` pointer marks, and the
// gradient convention: parameter gradients accumulate, activation gradients are overwritten unless a
// comment says otherwise). Ops inherits this interface; CpuOps and CudaOps implement it.
#pragma once
#include <cstddef>
#include <cstdint>

#include "anvil/tensor.hpp"
#include "kernels/dropout.hpp"

namespace anvil {

// Which keys each query of an attention call sees. `causal`: query t sees keys t2 <= t. `lengths` (null, or
// [B] int32 in the backend's memory): sequence b has lengths[b] real tokens followed by padding; no query
// sees a padding key, and the rows of padding queries (t >= lengths[b]) are 0 in out, lse and dqkv.
// `dropout` > 0 (training): out = dropout(softmax(q k^T / sqrt(HS))) v, the probabilities dropped as
// Ops::dropout drops (the state and site as there; element index ((b * NH + h) * T + query) * T + key); lse
// is the undropped softmax's. The backward regenerates the same mask.
struct AttentionMask {
  bool causal = true;
  const int32_t* lengths = nullptr;
  float dropout = 0;
  const DropoutState* dropout_state = nullptr;
  uint32_t dropout_site = 0;
  // Sliding window (Mistral's sliding_window): > 0 lets query t see only keys t2 with t - t2 < window (on
  // top of `causal`, which it requires); 0: no window.
  int window = 0;
};

// The shape of one self-attention call. qkv rows hold NH query heads, then NKV key heads, then NKV value
// heads, each of HS elements: [B, T, (NH + 2 NKV) HS]; the output rows hold the NH heads side by side
// [B, T, NH HS]. Grouped-query attention (NKV < NH, NH a multiple of NKV): query head h reads key/value head
// h / (NH / NKV). Multi-head attention: NKV == NH. HS need not be C / NH of the model (Llama's head_dim).
struct AttentionShape {
  int B = 0, T = 0, NH = 0, NKV = 0, HS = 0;
  int q_width() const { return NH * HS; }
  int qkv_width() const { return (NH + 2 * NKV) * HS; }
  // The multi-head shape of the older int-argument forms: C = NH * HS, NKV = NH.
  static AttentionShape mha(int B, int T, int C, int NH) { return {B, T, NH, NH, C / NH}; }
};

class AttentionOps {
 public:
  virtual ~AttentionOps() = default;

  // Bytes of the `scratch` buffer the attention functions need for these shapes (`dropout`: with
  // attention-probability dropout, AttentionMask::dropout > 0).
  virtual size_t attention_scratch_bytes(const AttentionShape& s, bool dropout = false) const = 0;
  size_t attention_scratch_bytes(int B, int T, int C, int NH, bool dropout = false) const {
    return attention_scratch_bytes(AttentionShape::mha(B, T, C, NH), dropout);
  }

  // --- self-attention (flash-style: probabilities are never stored) -------------------------------
  // qkv [B, T, (NH + 2 NKV) HS] (AttentionShape); query head h uses the columns h*HS..(h+1)*HS of the q
  // part and key/value head h / (NH / NKV) of the k and v parts. out [B, T, NH HS] (heads side by side) =
  // softmax(q k^T / sqrt(HS)) v over the keys `mask` allows; lse [B, NH, T] (fp32) receives each query row's
  // natural log-sum-exp of its scaled, masked scores, which is all the backward needs to recompute the
  // probabilities.
  virtual void attention_fwd(void* out, float* lse, const void* qkv, void* scratch, const AttentionShape& s,
                             const AttentionMask& mask) = 0;
  // dqkv [B, T, (NH + 2 NKV) HS] overwritten (a key/value head's gradient sums over the query heads of its
  // group), from dout [B, T, NH HS], the forward's qkv, out and lse, and the same mask.
  virtual void attention_bwd(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                             void* scratch, const AttentionShape& s, const AttentionMask& mask) = 0;
  // Multi-head forms (NKV = NH, HS = C / NH). Implementations bring them into scope with `using`.
  void attention_fwd(void* out, float* lse, const void* qkv, void* scratch, int B, int T, int C, int NH,
                     const AttentionMask& mask) {
    attention_fwd(out, lse, qkv, scratch, AttentionShape::mha(B, T, C, NH), mask);
  }
  void attention_bwd(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                     void* scratch, int B, int T, int C, int NH, const AttentionMask& mask) {
    attention_bwd(dqkv, dout, qkv, out, lse, scratch, AttentionShape::mha(B, T, C, NH), mask);
  }

  // --- rotary position embedding (RoPE; Hugging Face Llama's rotate-half form) ----------------------
  // In place on the q and k heads of qkv [B, T, (NH + 2 NKV) HS] (AttentionShape; v untouched): in every q
  // and k head vector x, the pair (x[i], x[i + HS/2]), i < HS/2, of the token at position p = pos_offset + t
  // rotates by the angle a = fp32(p) * inv_freq[i] (fp32 product; cos and sin of it in fp32):
  //   x[i] <- x[i] cos a - x[i + HS/2] sin a;   x[i + HS/2] <- x[i + HS/2] cos a + x[i] sin a.
  // inv_freq [HS/2] fp32 in the backend's memory (model/rope.hpp makes it from rope_theta and rope_scaling).
  // HS must be even. pos_offset: the position of row t = 0 (0 in training; the cache length when decoding).
  virtual void rope_fwd(void* qkv, const float* inv_freq, const AttentionShape& s, int pos_offset) = 0;
  // Its backward, in place on dqkv: the inverse rotation (angle -a) of the q and k gradients; v untouched.
  virtual void rope_bwd(void* dqkv, const float* inv_freq, const AttentionShape& s, int pos_offset) = 0;

  // --- attention of each sequence's first query only --------------------------------------------
  // BERT's last block feeds only its [CLS] rows to the pooler, so only query 0 of each sequence matters
  // there; its keys and values are still every token's. q [B,C]: row b is the query of token (b, 0), heads
  // side by side; kv [B,T,2C]: k = kv[..., 0:C], v = kv[..., C:2C]. out [B,C] is exactly row (b, 0) of
  // attention_fwd's output for those q, k, v under `mask` (query index 0: causal sees key 0 only, and the
  // dropout draws element ((b * NH + h) * T) * T + key); lse [B,NH] is that row's log-sum-exp. A sequence
  // of length 0 gives out 0 and lse 0. No scratch.
  virtual void attention_first_query_fwd(void* out, float* lse, const void* q, const void* kv, int B, int T,
                                         int C, int NH, const AttentionMask& mask) = 0;
  // dq [B,C] and dkv [B,T,2C], both overwritten (rows of keys no query sees are 0), from dout [B,C] and the
  // forward's q, kv, out and lse.
  virtual void attention_first_query_bwd(void* dq, void* dkv, const void* dout, const void* q, const void* kv,
                                         const void* out, const float* lse, int B, int T, int C, int NH,
                                         const AttentionMask& mask) = 0;
};

// What Ops::attention_scratch_bytes answers on a backend, without a device (for planning). CUDA in a
// build without CUDA throws anvil::Error. On CUDA, 16-bit attention runs cuDNN's fused flash attention
// (SDPA) when the build has it and the head size allows (HS a multiple of 8, at most 128; T > 1); otherwise,
// or with the environment variable ANVIL_ATTENTION=materialized, a path that materialises one layer's
// probabilities in scratch (B*NH*T*T elements) and recomputes them in the backward.
// With `dropout` (attention-probability dropout in training), CUDA always takes the materialised path
// (cuDNN's dropout masks are not the ones every backend draws), and the scratch is sized for it.
size_t attention_scratch_bytes(DeviceKind backend, DType compute, const AttentionShape& s,
                               bool dropout = false);
size_t cuda_attention_scratch_bytes(DType compute, const AttentionShape& s, bool dropout = false);
// "cudnn flash attention" or "materialized attention": what CUDA attention will run (see above) for heads of
// HS elements.
const char* cuda_attention_path(DType compute, int HS, bool dropout = false);
// Multi-head forms (HS = C / NH, NKV = NH).
inline size_t attention_scratch_bytes(DeviceKind backend, DType compute, int B, int T, int C, int NH,
                                      bool dropout = false) {
  return attention_scratch_bytes(backend, compute, AttentionShape::mha(B, T, C, NH), dropout);
}
inline size_t cuda_attention_scratch_bytes(DType compute, int B, int T, int C, int NH, bool dropout = false) {
  return cuda_attention_scratch_bytes(compute, AttentionShape::mha(B, T, C, NH), dropout);
}
inline const char* cuda_attention_implementation(DType compute, int C, int NH, bool dropout = false) {
  return cuda_attention_path(compute, C / NH, dropout);
}

}  // namespace anvil
