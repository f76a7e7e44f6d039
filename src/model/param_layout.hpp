// Flat parameter storage (DESIGN principle 2): the layout table. Each family's tensors are declared once
// here, with their Hugging Face names, aliases and transforms, their role in the model, initialisation and
// weight decay; checkpoints, optimizer groups, HF import/export and the models derive everything from it. The
// model's parameters live in ONE contiguous fp32 buffer made of units: the embedding, each transformer block,
// and the final unit (GPT-2: the final norm, the head being tied to the token embedding; BERT: the pooler and
// the classifier). Gradients and optimizer states mirror this layout exactly.
//
// Within a unit, tensors that take weight decay come first and those that do not (biases, norm
// weights) come after, so the optimizer updates each unit with two contiguous range calls.
//
// Decoder order (ParamLayout::decoder; GPT-2 names shown, offsets in floats; C = n_embd, Vp = padded vocab,
// P = block_size):
//   embedding: transformer.wte.weight [Vp, C], transformer.wpe.weight [P, C]
//   block i:   attn.c_attn.weight [3C, C], attn.c_proj.weight [C, C], mlp.c_fc.weight [4C, C],
//              mlp.c_proj.weight [C, 4C] | ln_1.weight [C], ln_1.bias [C], attn.c_attn.bias [3C],
//              attn.c_proj.bias [C], ln_2.weight [C], ln_2.bias [C], mlp.c_fc.bias [4C], mlp.c_proj.bias [C]
//   final:     transformer.ln_f.weight [C], transformer.ln_f.bias [C]
// Matrix weights are stored [out, in] (PyTorch Linear); Hugging Face GPT-2 stores its Conv1D weights
// [in, out], so those are transposed on import/export (`hf_transposed`).
// Llama, Qwen2 and Mistral ("model.layers.L." prefix) follow the same order by role: q_proj, k_proj, v_proj
// (adjacent: the fused QKV matrix), o_proj, gate_proj, up_proj (adjacent: the fused gate/up matrix),
// down_proj | input_layernorm, [q, k, v biases], [o bias], post_attention_layernorm, [mlp biases]; the
// embedding unit has model.embed_tokens only; the final unit is [lm_head when untied] | model.norm.
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
#include "kernels/quantization.hpp"
#include "peft/lora_config.hpp"

namespace anvil {

// What a tensor is to the model that reads it (the decoder finds its weights by role and layer, not by
// name); Other for tensors only their own model knows by name (BERT's).
enum class TensorRole {
  Other,
  TokenEmbedding,
  PositionEmbedding,
  Norm1Weight,
  Norm1Bias,
  QkvWeight,  // q, k, v (one fused tensor or three adjacent ones: [(NH + 2 NKV) HS, C] together)
  QkvBias,
  OutWeight,  // attention output projection
  OutBias,
  Norm2Weight,
  Norm2Bias,
  MlpInWeight,  // GELU: c_fc [F, C]; SwiGLU: gate and up adjacent, [2F, C] together
  MlpInBias,
  MlpOutWeight,
  MlpOutBias,
  FinalNormWeight,
  FinalNormBias,
  HeadWeight,  // an untied LM head
  LoraA,       // a LoRA adapter's factors (peft/lora_config.hpp): A [r, in] and B [rows, r] of the tensor
  LoraB,       // ParamTensor::adapts
};

struct ParamTensor {
  std::string name;            // Hugging Face name, e.g. "transformer.h.3.attn.c_attn.weight"
  Shape shape;                 // Anvil's shape ([out, in] for matrices, [Vp, C] for a padded vocabulary)
  size_t offset = 0;           // in floats, from the start of the whole flat buffer
  bool decay = false;          // takes weight decay
  bool hf_transposed = false;  // Hugging Face stores it [in, out] (GPT-2's Conv1D)
  // LoraA: uniform in +-1/sqrt(in) (PEFT's kaiming_uniform, a = sqrt(5)), from its own random stream.
  enum class Init { Normal, NormalResidual, Zeros, Ones, LoraA } init = Init::Zeros;
  TensorRole role = TensorRole::Other;
  int layer = -1;  // the block it belongs to, or -1
  // Rows Hugging Face stores (the real vocabulary of a padded embedding or head); -1: all. The rows past it
  // are zero, are not exported and never receive a gradient.
  int64_t hf_rows = -1;
  // Other names the same tensor has in Hugging Face files (GPT2Model checkpoints drop "transformer.").
  std::vector<std::string> aliases;
  // Whether the optimizer updates it (a frozen base under LoRA will not).
  bool trainable = true;
  // How the store keeps it: the compute type, or quantized (a frozen Linear weight; model/quantized_weights).
  WeightStorage storage = WeightStorage::Compute;
  // A LoRA factor (role LoraA / LoraB): the index of the weight it adapts; -1 otherwise. Adapter tensors
  // are saved in PEFT's adapter files, not in model.safetensors (io/checkpoint.hpp).
  int adapts = -1;
  bool is_adapter() const { return adapts >= 0; }
  size_t numel() const { return size_t(shape.numel()); }
  // Its Hugging Face shape: transposed for hf_transposed, hf_rows rows.
  std::vector<int64_t> hf_shape() const;
};

struct ParamUnit {
  std::string name;   // "embedding", "block.3", "final"
  size_t offset = 0;  // first float of the unit in the flat buffer
  size_t numel = 0;
  size_t decay_numel = 0;       // the first decay_numel floats take weight decay
  std::vector<size_t> tensors;  // indices into ParamLayout::tensors
};

// A range [begin, end) of the flat buffer, in floats: a rank's shard under ZeRO, or the whole buffer.
struct ParamRange {
  size_t begin = 0, end = 0;
  size_t numel() const { return end - begin; }
  bool operator==(const ParamRange&) const = default;
};

// The piece of one tensor inside a ParamRange: elements [first, first + count) of `tensor` (in `unit`), at
// `offset` floats from the range's begin.
struct TensorPart {
  size_t tensor = 0;  // index into ParamLayout::tensors
  size_t unit = 0;    // index into ParamLayout::units
  size_t first = 0;
  size_t count = 0;
  size_t offset = 0;
  bool whole(const ParamTensor& t) const { return first == 0 && count == t.numel(); }
};

class ParamLayout {
 public:
  // The causal-LM decoders (gpt2, llama, qwen2, mistral: model/arch_spec.hpp), and BERT. With `lora`
  // enabled, each block also holds the LoRA factors of the Linear weights lora's targets name, after the
  // block's matrices (A then B per weight, in the weights' order), and every other tensor is frozen; a
  // target that names no module is an error.
  static ParamLayout decoder(const TransformerConfig& cfg, const LoraConfig& lora = {});
  static ParamLayout bert(const TransformerConfig& cfg);

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  const std::vector<ParamUnit>& units() const { return units_; }
  size_t total_numel() const { return total_; }
  const ParamTensor& get(const std::string& name) const;
  const ParamTensor* find(const std::string& name) const;
  // The tensor a Hugging Face file names `name` (its name or an alias), or nullptr.
  const ParamTensor* find_hf(const std::string& name) const;
  // Whether a Hugging Face file may hold `name` without the model using it (attention-mask and rotary
  // buffers, a tied head saved anyway).
  bool hf_ignored(const std::string& name) const;
  // The first tensor of `role` in block `layer` (-1: outside the blocks), or nullptr.
  const ParamTensor* find_role(TensorRole role, int layer = -1) const;
  // The whole buffer as a range.
  ParamRange all() const { return {0, total_}; }
  // The index of the unit holding element `offset` (< total_numel()).
  int unit_of(size_t offset) const;
  // The non-empty pieces of the tensors inside `r`, in layout order.
  std::vector<TensorPart> parts(ParamRange r) const;

  // Freezing (model/freeze.hpp): tensor `index` trainable or not. The optimizers leave a frozen tensor as
  // it is (ParamRangeTable skips it), the step zeroes its gradient before the norm, and a model skips the
  // gradient computations whose every output would be frozen (any_trainable).
  void set_trainable(size_t index, bool trainable) { tensors_.at(index).trainable = trainable; }
  // Quantized storage (model/quantized_weights.hpp): tensor `index` kept as `s`.
  void set_storage(size_t index, WeightStorage s) { tensors_.at(index).storage = s; }
  // Whether a tensor overlapping `r` is trainable.
  bool any_trainable(ParamRange r) const;
  // The frozen tensors as ranges, neighbours merged, in layout order (none: every tensor trains).
  std::vector<ParamRange> frozen_ranges() const;
  // The first unit holding a trainable tensor (the unit count when none does): a model's backward may stop
  // above it, no gradient being needed below.
  int first_trainable_unit() const;
  // The trainable tensors alone, renumbered in layout order (units without one dropped; each tensor as here
  // but its offset, and `adapts` cleared: the weight an adapter adapts is not in it): the space in which a
  // store that keeps master weights and gradients for the trainable tensors only (ParamStore::
  // keep_trainable_only) and its optimizer index them.
  ParamLayout trainable_part() const;
  // The LoRA configuration the layout was built with (r == 0: none), and the modules it adapts (Hugging
  // Face module names, in layout order).
  const LoraConfig& lora() const { return lora_; }
  std::vector<std::string> lora_modules() const;

 private:
  void begin_unit(std::string name);
  ParamTensor& add(std::string name, Shape shape, bool decay, ParamTensor::Init init,
                   bool hf_transposed = false);
  std::vector<ParamTensor> tensors_;
  std::vector<std::string> hf_ignored_suffixes_;
  std::vector<ParamUnit> units_;
  size_t total_ = 0;
  LoraConfig lora_;
};

}  // namespace anvil
