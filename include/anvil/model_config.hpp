// The shape of a transformer: TransformerConfig, presets (GPT-2, BERT, Llama and Qwen2 sizes), and the
// vocabulary padding rule.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

// RoPE frequency scaling (Hugging Face rope_scaling / transformers 5 rope_parameters): type "" (none: HF
// "default"; the other fields keep their defaults), "linear" (positions divided by factor; factor only) or
// "llama3" (Llama 3.1's smooth band scaling with factor, low_freq_factor, high_freq_factor and
// original_max_position_embeddings). model/rope.hpp gives the formulas; the attention scaling is 1 for all.
struct RopeScaling {
  std::string type;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 0;
  bool operator==(const RopeScaling&) const = default;
};

// Families: the decoders "gpt2" (GPT-2: LayerNorm, learned positions, GELU MLP, tied head), "llama",
// "qwen2" and "mistral" (RMSNorm, RoPE, grouped-query attention, SwiGLU MLP; model/arch_spec.hpp derives
// each family's parts), all causal LMs built by one Decoder; and "bert" (post-LayerNorm bidirectional
// encoder with a sequence-classification head, BertModel). Fields a family does not use keep their
// defaults: validate() insists on it, so a config never says something the model does not do.
struct TransformerConfig {
  std::string family = "gpt2";
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int vocab_size = 256;  // real vocabulary
  // Maximum sequence length (HF n_positions / max_position_embeddings). GPT-2 and BERT learn one position
  // embedding per position; the RoPE families have no position table, so it only bounds the sequence length
  // (e.g. 131072 for llama-1b: training runs at its own seq_len).
  int block_size = 128;
  int eos_token_id = -1;  // -1: none. GPT-2 and BERT: inside the vocabulary; the llama family: any id

  // --- decoder fields (llama, qwen2, mistral; GPT-2 keeps the defaults) ---
  int n_kv_head = 0;            // key/value heads (num_key_value_heads; grouped-query attention); 0 = n_head
  int head_dim = 0;             // per head (even: RoPE rotates pairs); 0 = n_embd / n_head (Qwen2: always)
  double rope_theta = 10000.0;  // RoPE base
  RopeScaling rope_scaling;
  // The LM head is the token embedding (GPT-2 always; HF's default for llama, qwen2, mistral is untied).
  bool tie_word_embeddings = true;
  bool attention_bias = false;  // llama only: q, k, v and o biases (Qwen2 always has q, k, v biases, no o)
  bool mlp_bias = false;        // llama only: gate, up and down biases
  // mistral only (Qwen2's per-layer windows are refused): query t sees keys t - sliding_window < s <= t, i.e.
  // itself and the sliding_window - 1 before it (HF's mask); 0 = no window.
  int sliding_window = 0;
  int bos_token_id = -1;  // -1: none; any id (it does not enter the math)

  // --- encoder (BERT) fields; the llama family uses intermediate_size, layer_norm_eps, hidden_act,
  // pad_token_id and initializer_range too ---
  // MLP width (SwiGLU: of gate and of up); 0 = 4 * n_embd (the only width GPT-2 supports).
  int intermediate_size = 0;
  double layer_norm_eps = 1e-5;         // GPT-2: 1e-5 (fixed); BERT: 1e-12; llama family: rms_norm_eps
  std::string hidden_act = "gelu_new";  // "gelu" = exact erf GELU (BERT); "gelu_new" / "gelu_pytorch_tanh" =
                                        // the tanh approximation (GPT-2; BERT may use it too); "silu" (the
                                        // llama family's SwiGLU, the only one it accepts)
  int type_vocab_size = 2;              // token-type (segment) embeddings
  // The word embedding's padding_idx (HF nn.Embedding semantics: its row starts at 0 and never receives a
  // gradient from the lookup; a tied head still trains it); -1: none. BERT, and the llama family
  // (LlamaModel, Qwen2Model and MistralModel pass pad_token_id as padding_idx; usually null = -1). GPT-2
  // ignores it.
  int pad_token_id = 0;
  int num_labels = 2;  // classifier outputs; 1 = regression (MSE)
  // "" (HF's automatic choice: regression when num_labels == 1, else single-label classification),
  // "regression" or "single_label_classification".
  std::string problem_type;
  std::vector<std::string> label_names;  // HF id2label; empty = LABEL_0, LABEL_1, ...
  double initializer_range = 0.02;       // std of the normal initialisation (BERT, llama family)
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
  // One of the decoder families (everything but BERT).
  bool is_decoder() const { return !is_bert(); }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // Vocabulary rounded up to a multiple of 128, so the GPT-2 head GEMM has Tensor-Core friendly shapes.
  // The extra rows are zero and never receive gradient. (BERT has no LM head and does not pad.)
  int padded_vocab_size() const { return (vocab_size + 127) / 128 * 128; }
  int head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  int ffn_size() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  bool exact_gelu() const { return hidden_act == "gelu"; }
  // The classification head's loss: MSE on one output, or cross-entropy over num_labels classes.
  bool is_regression() const {
    return problem_type == "regression" || (problem_type.empty() && num_labels == 1);
  }
  std::string label_name(int i) const;
  // Parameter count as Hugging Face counts it (GPT-2: real vocabulary, tied head counted once; llama family:
  // *ForCausalLM, real vocabulary, an untied head counted, a tied one once; BERT:
  // BertForSequenceClassification with pooler and classifier).
  int64_t num_parameters() const;
  // Throws anvil::Error naming the field and value when the shape is invalid; `where` prefixes messages.
  void validate(std::string_view where = "model") const;

  // Presets. GPT-2: "tiny" (CPU default), "d12" (124M), "d24" (350M), "d36" (774M), "d48" (1.5B). BERT
  // (sequence classification, 2 labels): "bert-tiny" (tests), "bert-base" (110M), "bert-large" (335M).
  // Llama family: "llama-tiny" (CPU-trainable: 4 layers, 4 heads, 2 kv heads, 128 dims, SwiGLU 384, byte
  // vocabulary, untied), "llama-1b" (Llama-3.2-1B, 1.24B), "qwen2.5-0.5b" (Qwen2.5-0.5B, 494M).
  static TransformerConfig preset(std::string_view name);
  static std::vector<std::string> preset_names();

  // Hugging Face config.json import (model_type "gpt2": GPT2Config; "bert": BertConfig of BertModel or
  // BertForSequenceClassification; "llama", "qwen2", "mistral": the *ForCausalLM configs of transformers 4
  // and 5, rope_scaling or rope_parameters) and export (GPT2LMHeadModel / BertForSequenceClassification /
  // LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, with the classic rope_theta + rope_scaling that
  // transformers 4 and 5 both read). Fields that change the math and are not supported are errors naming
  // the file, the field and the value; the others (dtype, use_cache, ...) are ignored.
  static TransformerConfig from_hf_json(const nlohmann::json& j, std::string_view source);
  nlohmann::json to_hf_json() const;
};

}  // namespace anvil
