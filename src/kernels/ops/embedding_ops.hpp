// Embedding ops: GPT-2's token + learned-position lookup and its backward, the lookup without learned
// positions whose padding row gets no gradient (Llama, Qwen2, Mistral), and BERT's sum with token types.
// (The lookup at per-sequence positions of generation is in kv_cache_ops.hpp.)
//
// Part of the Ops contract (kernels/ops.hpp: memory, storage types, the `[grad]` pointer marks, and the
// gradient convention: parameter gradients accumulate, activation gradients are overwritten unless a
// comment says otherwise). Ops inherits this interface; CpuOps and CudaOps implement it.
#pragma once
#include <cstdint>

namespace anvil {

class EmbeddingOps {
 public:
  virtual ~EmbeddingOps() = default;

  // --- embedding -------------------------------------------------------------------------------
  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].   out [B,T,C], tokens [B,T], wte [V,C], wpe [maxT,C]
  // wpe may be null: no learned positions (Llama, Qwen2, Mistral use RoPE), out[b,t,:] = wte[tokens[b,t],:].
  virtual void embedding_fwd(void* out, const int32_t* tokens, const void* wte, const void* wpe, int B, int T,
                             int C) = 0;
  // [grad] dwte[tokens[b,t],:] += dout[b,t,:]; [grad] dwpe[t,:] += dout[b,t,:]   (both accumulate)
  // dwpe may be null (no learned positions): only dwte is written.
  virtual void embedding_bwd(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int B, int T,
                             int C) = 0;
  // The token-embedding gradient of a model without learned positions whose embedding has a padding_idx
  // (Llama, Qwen2, Mistral: HF's nn.Embedding(padding_idx = pad_token_id)): [grad] dwte[tokens[i],:] +=
  // dout[i,:] for the B*T rows except those whose token is skip_token (that row never receives a gradient
  // from the lookup). Accumulates, as embedding_bwd.
  virtual void embedding_bwd_skip(void* dwte, const void* dout, const int32_t* tokens, int B, int T, int C,
                                  int32_t skip_token) = 0;
  // BERT's embedding sum (before its LayerNorm): out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:] +
  // wtt[types[b,t],:]. `types` [B,T] may be null (every token of type 0). wtt [TV,C].
  virtual void bert_embedding_fwd(void* out, const int32_t* tokens, const int32_t* types, const void* wte,
                                  const void* wpe, const void* wtt, int B, int T, int C) = 0;
  // [grad] dwte[tokens[b,t],:] += dout[b,t,:] except where tokens[b,t] == skip_token (-1: none; HF's
  // nn.Embedding padding_idx, whose row never receives a gradient); [grad] dwpe[t,:] += dout[b,t,:];
  // [grad] dwtt[types[b,t],:] += dout[b,t,:] (types null: row 0). All three accumulate.
  virtual void bert_embedding_bwd(void* dwte, void* dwpe, void* dwtt, const void* dout, const int32_t* tokens,
                                  const int32_t* types, int B, int T, int C, int32_t skip_token) = 0;
};

}  // namespace anvil
