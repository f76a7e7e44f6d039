// The Decoder's generation path (decoder.hpp, "generation with a KV cache"): forward()'s blocks over the new
// tokens only, attending to the KV cache. Buffers are forward()'s own (a step of B x Tn rows uses the first
// rows of each), so a generation model plans nothing beyond its decoder and the cache.
#include <algorithm>

#include "model/decoder.hpp"
#include "model/kv_cache.hpp"

namespace anvil {

void Decoder::block_forward_cached(Ops& ops, const KvCache& cache, int l, const int32_t* pos, int B, int Tn,
                                   int max_end) {
  const int C = spec_.C, N = B * Tn;
  const size_t sBTC = size_t(B_) * T_ * C;
  const AttentionShape shape = attention_shape(B, Tn);
  const KvCacheLayer kv = cache.layer(l);
  store_.acquire(1 + l);
  store_.prefetch(l + 1 < spec_.n_layer ? 2 + l : unit_final_);
  const LayerParams p = layer_weights(l);
  const BlockLinears lin = block_linears(l, false);
  const void* x = l == 0 ? encoded_ : at(res3_, (l - 1) * sBTC);
  void *ln1 = act(kLn1, l), *qkv = act(kQkv, l), *atty = act(kAtty, l);
  void *res2 = act(kRes2, l), *ln2 = act(kLn2, l), *fch = act(kFch, l), *fch_gelu = act(kFchGelu, l);
  // As in block_forward: the previous block's fused residual + norm already wrote norm 1 (but for block 0).
  if (l == 0) norm_fwd(ops, ln1, stats(kLn1Stats, l), x, p.ln1w, p.ln1b, N);
  lin.qkv.forward(ops, qkv, ln1, N);
  if (inv_freq_) ops.rope_fwd_at(qkv, inv_freq_, shape, pos);
  ops.kv_cache_write(kv, qkv, pos, shape);
  ops.cached_attention_fwd(atty, qkv, kv, pos, max_end, spec_.window, cache.attention_scratch(),
                           cache.attention_scratch_bytes(), shape);
  lin.out.forward(ops, tmp_c_, atty, N);
  residual_norm_fwd(ops, res2, ln2, stats(kLn2Stats, l), x, tmp_c_, p.ln2w, p.ln2b, N);
  mlp_forward(ops, lin, fch_gelu, fch, ln2, N, true);
  lin.mlp_out.forward(ops, tmp_c_, fch_gelu, N);
  block_output_fwd(ops, l, res2, N);
  store_.release(1 + l);
}

void Decoder::forward_cached(Ops& ops, const KvCache& cache, const int32_t* tokens, const int32_t* pos, int B,
                             int Tn, int max_end, const std::vector<int>& last_rows) {
  ANVIL_ASSERT(B >= 1 && B <= B_ && B <= cache.max_batch() && Tn >= 1 && Tn <= T_,
               "forward_cached: {} x {} new tokens exceed the planned {} x {} (cache batch {})", B, Tn, B_,
               T_, cache.max_batch());
  ANVIL_ASSERT(max_end >= Tn && max_end <= cache.max_len() && cache.layers() == spec_.n_layer,
               "forward_cached: max_end {} outside [{}, the cache's {} positions] (cache of {} layers)",
               max_end, Tn, cache.max_len(), cache.layers());
  ANVIL_ASSERT(last_rows.empty() || last_rows.size() == size_t(B),
               "forward_cached: {} last rows for {} sequences", last_rows.size(), B);
  ANVIL_ASSERT(ops.precision().compute == precision().compute,
               "the ops' precision does not match the model's");
  const int C = spec_.C;
  lora_dropping_ = false;  // generation: no dropout
  store_.acquire(0);
  if (spec_.n_layer > 0) store_.prefetch(1);
  ops.embedding_fwd_at(encoded_, tokens, store_.weight_at(wte_off_), weight_or_null(wpe_off_), pos, B, Tn, C);
  for (int l = 0; l < spec_.n_layer; ++l) block_forward_cached(ops, cache, l, pos, B, Tn, max_end);
  // The LM head on one row per sequence: the final norm rows are [B, Tn, C]; Tn = 1 (a decode step) takes
  // them as they are, otherwise the chosen rows are gathered into the projection scratch first.
  const void* rows = lnf_;
  if (Tn > 1) {
    const size_t row_bytes = size_t(C) * ae_;
    for (int b = 0; b < B; ++b) {
      const int r = last_rows.empty() ? Tn - 1 : last_rows[b];
      ANVIL_ASSERT(r >= 0 && r < Tn, "forward_cached: last row {} of sequence {} outside [0, {})", r, b, Tn);
      ops.device().copy_on_device(at(tmp_c_, size_t(b) * C), at(lnf_, (size_t(b) * Tn + r) * C), row_bytes);
    }
    rows = tmp_c_;
  }
  head_linear(false).forward(ops, logits_, rows, B);
}

}  // namespace anvil
