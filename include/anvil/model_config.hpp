// The shape of a transformer: TransformerConfig, presets (GPT-2 and BERT sizes), and the vocabulary padding
// rule.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

// Families: "gpt2" (decoder-only causal LM, GptModel) and "bert" (post-LayerNorm bidirectional encoder with
// a sequence-classification head, BertModel). The fields below the family-independent shape are used by the
// encoder; GPT-2 ignores them, and validate() insists they keep GPT-2's values for family "gpt2" so a config
// never says something the model does not do.
struct TransformerConfig {
  std::string family = "gpt2";
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int vocab_size = 256;   // real vocabulary
  int block_size = 128;   // maximum sequence length (HF n_positions / max_position_embeddings)
  int eos_token_id = -1;  // -1: none

  // --- encoder (BERT) fields ---
  int intermediate_size = 0;            // MLP width; 0 = 4 * n_embd (the only width GPT-2 supports)
  double layer_norm_eps = 1e-5;         // GPT-2: 1e-5 (fixed); BERT: 1e-12
  std::string hidden_act = "gelu_new";  // "gelu" = exact erf GELU (BERT); "gelu_new" / "gelu_pytorch_tanh" =
                                        // the tanh approximation (GPT-2; BERT may use it too)
  int type_vocab_size = 2;              // token-type (segment) embeddings
  // The word embedding's padding_idx (HF nn.Embedding semantics: its row starts at 0 and never receives a
  // gradient); -1: none.
  int pad_token_id = 0;
  int num_labels = 2;  // classifier outputs; 1 = regression (MSE)
  // "" (HF's automatic choice: regression when num_labels == 1, else single-label classification),
  // "regression" or "single_label_classification".
  std::string problem_type;
  std::vector<std::string> label_names;  // HF id2label; empty = LABEL_0, LABEL_1, ...
  double initializer_range = 0.02;       // std of the normal initialisation (BERT)
  // Dropout in training, as HF's BERT applies it (docs/bert.md, "Dropout"): on the embedding output, the
  // attention probabilities, each block's attention and MLP output projections, and the classifier's input
  // (classifier_dropout; negative = null in config.json: hidden_dropout_prob). Each in [0, 1).
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
  double classifier_dropout = -1;
  double classifier_dropout_prob() const {
    return classifier_dropout < 0 ? hidden_dropout_prob : classifier_dropout;
  }

  bool is_bert() const { return family == "bert"; }
  // Vocabulary rounded up to a multiple of 128, so the GPT-2 head GEMM has Tensor-Core friendly shapes.
  // The extra rows are zero and never receive gradient. (BERT has no LM head and does not pad.)
  int padded_vocab_size() const { return (vocab_size + 127) / 128 * 128; }
  int head_size() const { return n_embd / n_head; }
  int ffn_size() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  bool exact_gelu() const { return hidden_act == "gelu"; }
  // The classification head's loss: MSE on one output, or cross-entropy over num_labels classes.
  bool is_regression() const {
    return problem_type == "regression" || (problem_type.empty() && num_labels == 1);
  }
  std::string label_name(int i) const;
  // Parameter count as Hugging Face counts it (GPT-2: real vocabulary, tied head counted once; BERT:
  // BertForSequenceClassification with pooler and classifier).
  int64_t num_parameters() const;
  // Throws anvil::Error naming the field and value when the shape is invalid; `where` prefixes messages.
  void validate(std::string_view where = "model") const;

  // Presets. GPT-2: "tiny" (CPU default), "d12" (124M), "d24" (350M), "d36" (774M), "d48" (1.5B). BERT
  // (sequence classification, 2 labels): "bert-tiny" (tests), "bert-base" (110M), "bert-large" (335M).
  static TransformerConfig preset(std::string_view name);
  static std::vector<std::string> preset_names();

  // Hugging Face config.json import (model_type "gpt2": GPT2Config; "bert": BertConfig of BertModel or
  // BertForSequenceClassification) and export (GPT2LMHeadModel / BertForSequenceClassification).
  static TransformerConfig from_hf_json(const nlohmann::json& j, std::string_view source);
  nlohmann::json to_hf_json() const;
};

}  // namespace anvil
