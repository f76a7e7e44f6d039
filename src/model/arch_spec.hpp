// The parts a decoder family is built from (DESIGN: "ArchSpec"), derived once from a TransformerConfig:
// GPT-2, Llama, Qwen2 and Mistral are specs of one Decoder, not separate models. Family knowledge lives
// here and in the Hugging Face name table (DecoderNames), nowhere else.
#pragma once
#include <string>
#include <vector>

#include "anvil/model_config.hpp"

namespace anvil {

enum class NormKind { LayerNorm, RMSNorm };
enum class PositionKind { Learned, Rope };
enum class MlpKind { Gelu, SwiGLU };  // GELU (tanh approximation) MLP, or SwiGLU gate/up/down

struct ArchSpec {
  NormKind norm = NormKind::LayerNorm;
  float norm_eps = 1e-5f;
  PositionKind positions = PositionKind::Learned;
  MlpKind mlp = MlpKind::Gelu;
  int n_layer = 0, C = 0;
  int NH = 0, NKV = 0, HS = 0;  // query heads, key/value heads, head size
  int ffn = 0;                  // MLP width (SwiGLU: of gate and of up)
  int vocab = 0, padded_vocab = 0;
  int max_positions = 0;  // block_size
  bool qkv_bias = true, out_bias = true, mlp_bias = true;
  bool tied_head = true;
  int window = 0;  // sliding window (0: none)
  // The token embedding's padding_idx (Llama-family HF models: pad_token_id; its row starts at 0 and never
  // receives a gradient from the lookup), or -1.
  int padding_idx = -1;

  static ArchSpec of(const TransformerConfig& cfg);

  bool norm_has_bias() const { return norm == NormKind::LayerNorm; }
  int q_width() const { return NH * HS; }
  int kv_width() const { return NKV * HS; }
  int qkv_width() const { return (NH + 2 * NKV) * HS; }
  // Columns of the MLP's first GEMM: F (GELU) or 2F (SwiGLU's gate and up).
  int mlp_in_width() const { return mlp == MlpKind::SwiGLU ? 2 * ffn : ffn; }
};

// A family's Hugging Face tensor names ("{L}" stands for the layer index) and transforms: the declarative
// table ParamLayout::decoder builds the layout from.
struct DecoderNames {
  std::string token_embedding, position_embedding;  // position: "" without learned positions
  std::string block;                                // prefix of a block's names, with {L}
  std::string norm1, norm2, final_norm;             // module names (".weight" / ".bias" appended)
  std::vector<std::string> qkv;                     // one fused module, or q, k, v
  std::string out;
  std::vector<std::string> mlp_in;  // one module (GELU), or gate, up (SwiGLU)
  std::string mlp_out;
  std::string head;                 // the untied LM head's module
  bool matrices_transposed = false;  // stored [in, out] (Conv1D)
  std::string alias_strip;           // a prefix some checkpoints leave out ("transformer.")
  // Tensors a file may hold that the model does not use (name suffixes).
  std::vector<std::string> ignored_suffixes;

  static const DecoderNames& of(const std::string& family);
};

}  // namespace anvil
