// Flat parameter storage (DESIGN principle 2). The model's parameters live in ONE contiguous fp32
// buffer made of units: the embedding, each transformer block, and the final unit (GPT-2: the final norm,
// the head being tied to the token embedding; BERT: the pooler and the classifier). Gradients and optimizer
// states mirror this layout exactly.
//
// Within a unit, tensors that take weight decay come first and those that do not (biases, norm
// weights) come after, so the optimizer updates each unit with two contiguous range calls.
//
// GPT-2 order (offsets in floats; C = n_embd, Vp = padded vocab, P = block_size):
//   embedding: transformer.wte.weight [Vp, C], transformer.wpe.weight [P, C]
//   block i:   attn.c_attn.weight [3C, C], attn.c_proj.weight [C, C], mlp.c_fc.weight [4C, C],
//              mlp.c_proj.weight [C, 4C] | ln_1.weight [C], ln_1.bias [C], attn.c_attn.bias [3C],
//              attn.c_proj.bias [C], ln_2.weight [C], ln_2.bias [C], mlp.c_fc.bias [4C], mlp.c_proj.bias [C]
//   final:     transformer.ln_f.weight [C], transformer.ln_f.bias [C]
// Matrix weights are stored [out, in] (PyTorch Linear); Hugging Face GPT-2 stores its Conv1D weights
// [in, out], so those are transposed on import/export (`hf_transposed`).
//
// BERT order (Hugging Face BertForSequenceClassification names; C = n_embd, I = intermediate size,
// P = max positions, TV = type vocabulary, NL = num_labels; "L." = "bert.encoder.layer.L."):
//   embedding: bert.embeddings.word_embeddings.weight [V, C], .position_embeddings.weight [P, C],
//              .token_type_embeddings.weight [TV, C] | bert.embeddings.LayerNorm.weight [C], .bias [C]
//   block L:   L.attention.self.query.weight [C, C], .key.weight [C, C], .value.weight [C, C],
//              L.attention.output.dense.weight [C, C], L.intermediate.dense.weight [I, C],
//              L.output.dense.weight [C, I] | L.attention.self.query.bias [C], .key.bias [C], .value.bias
//              [C], L.attention.output.dense.bias [C], L.attention.output.LayerNorm.weight [C], .bias [C],
//              L.intermediate.dense.bias [I], L.output.dense.bias [C], L.output.LayerNorm.weight [C], .bias
//              [C]
//   final:     bert.pooler.dense.weight [C, C], classifier.weight [NL, C] | bert.pooler.dense.bias [C],
//              classifier.bias [NL]
// Query, key and value weights are adjacent, so together they are the [3C, C] matrix of one fused QKV GEMM,
// and their biases the [3C] bias. BERT's Linear weights are [out, in] in Hugging Face too (no transpose), and
// the word embeddings are not padded (there is no LM head).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "anvil/model_config.hpp"
#include "anvil/tensor.hpp"

namespace anvil {

struct ParamTensor {
  std::string name;    // Hugging Face name, e.g. "transformer.h.3.attn.c_attn.weight"
  Shape shape;         // Anvil's shape ([out, in] for matrices, [Vp, C] for wte)
  size_t offset = 0;   // in floats, from the start of the whole flat buffer
  bool decay = false;  // takes weight decay
  bool hf_transposed = false;
  enum class Init { Normal, NormalResidual, Zeros, Ones } init = Init::Zeros;
  size_t numel() const { return size_t(shape.numel()); }
};

struct ParamUnit {
  std::string name;   // "embedding", "block.3", "final"
  size_t offset = 0;  // first float of the unit in the flat buffer
  size_t numel = 0;
  size_t decay_numel = 0;       // the first decay_numel floats take weight decay
  std::vector<size_t> tensors;  // indices into ParamLayout::tensors
};

class ParamLayout {
 public:
  static ParamLayout gpt2(const TransformerConfig& cfg);
  static ParamLayout bert(const TransformerConfig& cfg);

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  size_t total_numel() const { return total_; }
  const ParamTensor& get(const std::string& name) const;
  const ParamTensor* find(const std::string& name) const;

 private:
  void begin_unit(std::string name);
  void add(std::string name, Shape shape, bool decay, ParamTensor::Init init, bool hf_transposed = false);
  std::vector<ParamTensor> tensors_;
  std::vector<ParamUnit> units_;
  size_t total_ = 0;
};

}  // namespace anvil
