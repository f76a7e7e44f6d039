#include "model/arch_spec.hpp"

#include "anvil/error.hpp"

namespace anvil {

ArchSpec ArchSpec::of(const TransformerConfig& cfg) {
  ANVIL_REQUIRE(cfg.is_decoder(), "model family '{}' is not a decoder (gpt2, llama, qwen2, mistral)",
                cfg.family);
  ArchSpec s;
  s.n_layer = cfg.n_layer, s.C = cfg.n_embd;
  s.NH = cfg.n_head, s.NKV = cfg.kv_heads(), s.HS = cfg.head_size();
  s.ffn = cfg.ffn_size();
  s.vocab = cfg.vocab_size, s.padded_vocab = cfg.padded_vocab_size();
  s.max_positions = cfg.block_size;
  s.norm_eps = float(cfg.layer_norm_eps);
  s.tied_head = cfg.tie_word_embeddings;
  if (cfg.family == "gpt2") return s;  // LayerNorm, learned positions, GELU, biases everywhere, tied
  s.norm = NormKind::RMSNorm;
  s.positions = PositionKind::Rope;
  s.mlp = MlpKind::SwiGLU;
  s.qkv_bias = cfg.family == "qwen2" || cfg.attention_bias;
  s.out_bias = cfg.family != "qwen2" && cfg.attention_bias;
  s.mlp_bias = cfg.mlp_bias;
  s.window = cfg.sliding_window;
  s.padding_idx = cfg.pad_token_id >= 0 && cfg.pad_token_id < cfg.vocab_size ? cfg.pad_token_id : -1;
  return s;
}

const DecoderNames& DecoderNames::of(const std::string& family) {
  static const DecoderNames gpt2{
      .token_embedding = "transformer.wte.weight",
      .position_embedding = "transformer.wpe.weight",
      .block = "transformer.h.{L}.",
      .norm1 = "ln_1",
      .norm2 = "ln_2",
      .final_norm = "transformer.ln_f",
      .qkv = {"attn.c_attn"},
      .out = "attn.c_proj",
      .mlp_in = {"mlp.c_fc"},
      .mlp_out = "mlp.c_proj",
      .head = "lm_head",
      .matrices_transposed = true,
      .alias_strip = "transformer.",
      .ignored_suffixes = {".attn.bias", ".attn.masked_bias", "lm_head.weight"},
  };
  static const DecoderNames llama{
      .token_embedding = "model.embed_tokens.weight",
      .position_embedding = "",
      .block = "model.layers.{L}.",
      .norm1 = "input_layernorm",
      .norm2 = "post_attention_layernorm",
      .final_norm = "model.norm",
      .qkv = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"},
      .out = "self_attn.o_proj",
      .mlp_in = {"mlp.gate_proj", "mlp.up_proj"},
      .mlp_out = "mlp.down_proj",
      .head = "lm_head",
      .matrices_transposed = false,
      .alias_strip = "",
      .ignored_suffixes = {".rotary_emb.inv_freq"},
  };
  if (family == "gpt2") return gpt2;
  if (family == "llama" || family == "qwen2" || family == "mistral") return llama;
  ANVIL_THROW("model family '{}' is not a decoder (gpt2, llama, qwen2, mistral)", family);
}

}  // namespace anvil
