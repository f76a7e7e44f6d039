#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>

#include "anvil/error.hpp"
#include "anvil/model_config.hpp"

namespace anvil {

std::string TransformerConfig::label_name(int i) const {
  return i < int(label_names.size()) ? label_names[size_t(i)] : "LABEL_" + std::to_string(i);
}

int64_t TransformerConfig::num_parameters() const {
  const int64_t C = n_embd, L = n_layer;
  if (is_bert()) {
    const int64_t I = ffn_size();
    const int64_t embeddings = (int64_t(vocab_size) + block_size + type_vocab_size) * C + 2 * C;
    const int64_t per_block = (4 * C * C + 4 * C) + 2 * C + (I * C + I) + (C * I + C) + 2 * C;
    const int64_t head = (C * C + C) + (int64_t(num_labels) * C + num_labels);
    return embeddings + L * per_block + head;
  }
  if (family == "gpt2") {
    const int64_t per_block =
        2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
    return int64_t(vocab_size) * C + int64_t(block_size) * C + L * per_block + 2 * C;
  }
  // Llama family: two RMSNorm weights per block, q/k/v/o (GQA: k and v have kv_heads() heads), SwiGLU's
  // gate/up/down, the final norm, and the head unless tied.
  const int64_t Q = int64_t(n_head) * head_size(), KV = int64_t(kv_heads()) * head_size(), I = ffn_size();
  const bool qkv_bias = family == "qwen2" || attention_bias, o_bias = family != "qwen2" && attention_bias;
  const int64_t attn = C * Q + 2 * C * KV + Q * C + (qkv_bias ? Q + 2 * KV : 0) + (o_bias ? C : 0);
  const int64_t mlp = 3 * C * I + (mlp_bias ? 2 * I + C : 0);
  const int64_t embeddings = int64_t(vocab_size) * C * (tie_word_embeddings ? 1 : 2);
  return embeddings + L * (2 * C + attn + mlp) + C;
}

namespace {
bool llama_family(std::string_view family) {
  return family == "llama" || family == "qwen2" || family == "mistral";
}

// GPT-2 and BERT have none of the Llama family's options: those fields keep their defaults.
void require_no_llama_fields(const TransformerConfig& c, std::string_view where) {
  const TransformerConfig d;
  auto same = [&](const char* field, bool ok, const std::string& value) {
    ANVIL_REQUIRE(ok, "{}: {} {} is not supported by {} (a llama, qwen2 and mistral field)", where, field,
                  value, c.family);
  };
  same("n_kv_head", c.n_kv_head == d.n_kv_head, std::to_string(c.n_kv_head));
  same("head_dim", c.head_dim == d.head_dim, std::to_string(c.head_dim));
  same("rope_theta", c.rope_theta == d.rope_theta, fmt::format("{}", c.rope_theta));
  same("rope_scaling", c.rope_scaling == d.rope_scaling, "'" + c.rope_scaling.type + "'");
  same("tie_word_embeddings", c.tie_word_embeddings == d.tie_word_embeddings,
       c.tie_word_embeddings ? "true" : "false");
  same("attention_bias", c.attention_bias == d.attention_bias, c.attention_bias ? "true" : "false");
  same("mlp_bias", c.mlp_bias == d.mlp_bias, c.mlp_bias ? "true" : "false");
  same("sliding_window", c.sliding_window == d.sliding_window, std::to_string(c.sliding_window));
  same("bos_token_id", c.bos_token_id == d.bos_token_id, std::to_string(c.bos_token_id));
}

// RoPE: the base and the three supported scalings (HF's validation only warns on most of these).
void validate_rope(const TransformerConfig& c, std::string_view where) {
  const RopeScaling& r = c.rope_scaling;
  ANVIL_REQUIRE(std::isfinite(c.rope_theta) && c.rope_theta > 0, "{}: rope_theta must be > 0, got {}", where,
                c.rope_theta);
  ANVIL_REQUIRE(r.type.empty() || r.type == "linear" || r.type == "llama3",
                "{}: rope_scaling type '{}' is not supported (none, linear, llama3)", where, r.type);
  if (r.type.empty()) {
    ANVIL_REQUIRE(r == RopeScaling{}, "{}: rope_scaling without a type must keep its defaults (factor {})",
                  where, r.factor);
    return;
  }
  ANVIL_REQUIRE(std::isfinite(r.factor) && r.factor >= 1, "{}: rope_scaling factor must be >= 1, got {}",
                where, r.factor);
  if (r.type == "linear") {
    const RopeScaling d;
    ANVIL_REQUIRE(r.low_freq_factor == d.low_freq_factor && r.high_freq_factor == d.high_freq_factor &&
                      r.original_max_position_embeddings == d.original_max_position_embeddings,
                  "{}: linear rope_scaling uses only factor (low_freq_factor, high_freq_factor and "
                  "original_max_position_embeddings keep their defaults)",
                  where);
    return;
  }
  ANVIL_REQUIRE(std::isfinite(r.low_freq_factor) && r.low_freq_factor > 0,
                "{}: rope_scaling low_freq_factor must be > 0, got {}", where, r.low_freq_factor);
  ANVIL_REQUIRE(std::isfinite(r.high_freq_factor) && r.high_freq_factor > r.low_freq_factor,
                "{}: rope_scaling high_freq_factor ({}) must be greater than low_freq_factor ({})", where,
                r.high_freq_factor, r.low_freq_factor);
  ANVIL_REQUIRE(r.original_max_position_embeddings >= 1,
                "{}: rope_scaling original_max_position_embeddings must be >= 1, got {}", where,
                r.original_max_position_embeddings);
}

// llama, qwen2, mistral: what LlamaForCausalLM / Qwen2ForCausalLM / MistralForCausalLM compute, and
// nothing the Decoder would silently ignore.
void validate_llama_family(const TransformerConfig& c, std::string_view where) {
  const std::string& f = c.family;
  ANVIL_REQUIRE(c.n_embd >= 1, "{}: n_embd must be >= 1, got {}", where, c.n_embd);
  // transformers 5's LlamaConfig insists on it even with an explicit head_dim; Qwen2 derives head_dim.
  if (c.head_dim == 0 || f != "mistral")
    ANVIL_REQUIRE(c.n_embd % c.n_head == 0, "{}: n_embd ({}) must be a multiple of n_head ({})", where,
                  c.n_embd, c.n_head);
  ANVIL_REQUIRE(c.n_kv_head >= 0 && c.n_kv_head <= c.n_head && c.n_head % c.kv_heads() == 0,
                "{}: n_head ({}) must be a multiple of n_kv_head ({})", where, c.n_head, c.n_kv_head);
  ANVIL_REQUIRE(c.head_dim >= 0, "{}: head_dim must be >= 0 (0 = n_embd / n_head), got {}", where,
                c.head_dim);
  ANVIL_REQUIRE(c.head_size() >= 2 && c.head_size() % 2 == 0,
                "{}: head_dim {} must be even (RoPE rotates pairs)", where, c.head_size());
  // transformers 4's Qwen2 always uses hidden_size / num_attention_heads.
  ANVIL_REQUIRE(f != "qwen2" || c.head_dim == 0 || c.head_dim == c.n_embd / c.n_head,
                "{}: head_dim {} is not supported by qwen2 (only n_embd / n_head = {})", where, c.head_dim,
                c.n_embd / c.n_head);
  ANVIL_REQUIRE(std::isfinite(c.layer_norm_eps) && c.layer_norm_eps > 0 && c.layer_norm_eps < 1,
                "{}: layer_norm_eps (rms_norm_eps) must be in (0, 1), got {}", where, c.layer_norm_eps);
  ANVIL_REQUIRE(c.hidden_act == "silu", "{}: hidden_act '{}' is not supported by {} (silu)", where,
                c.hidden_act, f);
  validate_rope(c, where);
  // transformers 4's MistralForCausalLM ignores rope_scaling, transformers 5's applies it.
  ANVIL_REQUIRE(f != "mistral" || c.rope_scaling.type.empty(),
                "{}: rope_scaling type '{}' is not supported by mistral (transformers 4 ignores it)", where,
                c.rope_scaling.type);
  ANVIL_REQUIRE(c.sliding_window >= 0, "{}: sliding_window must be >= 0 (0 = none), got {}", where,
                c.sliding_window);
  ANVIL_REQUIRE(f == "mistral" || c.sliding_window == 0,
                "{}: sliding_window {} is not supported by {} (mistral)", where, c.sliding_window, f);
  ANVIL_REQUIRE(f == "llama" || !c.attention_bias,
                "{}: attention_bias true is not supported by {} (llama; qwen2 always has q, k, v biases)",
                where, f);
  ANVIL_REQUIRE(f == "llama" || !c.mlp_bias, "{}: mlp_bias true is not supported by {} (llama)", where, f);
  // Token ids outside the vocabulary do not matter to the math (configs in the wild have them).
  ANVIL_REQUIRE(c.eos_token_id >= -1, "{}: eos_token_id must be >= 0 (or -1: none), got {}", where,
                c.eos_token_id);
  ANVIL_REQUIRE(c.bos_token_id >= -1, "{}: bos_token_id must be >= 0 (or -1: none), got {}", where,
                c.bos_token_id);
  ANVIL_REQUIRE(c.pad_token_id >= -1 && c.pad_token_id < c.vocab_size,
                "{}: pad_token_id {} is outside the vocabulary (size {}; -1 for none)", where, c.pad_token_id,
                c.vocab_size);
  ANVIL_REQUIRE(c.initializer_range > 0 && std::isfinite(c.initializer_range),
                "{}: initializer_range must be > 0, got {}", where, c.initializer_range);
  // The sequence-classification fields are BERT's.
  const TransformerConfig d;
  ANVIL_REQUIRE(c.type_vocab_size == d.type_vocab_size && c.num_labels == d.num_labels &&
                    c.problem_type.empty() && c.label_names.empty(),
                "{}: {} is a causal LM: type_vocab_size, num_labels, problem_type and label names are BERT's "
                "(got type_vocab_size {}, num_labels {})",
                where, f, c.type_vocab_size, c.num_labels);
  ANVIL_REQUIRE(c.hidden_dropout_prob == d.hidden_dropout_prob &&
                    c.attention_probs_dropout_prob == d.attention_probs_dropout_prob &&
                    c.classifier_dropout == d.classifier_dropout,
                "{}: hidden_dropout_prob, attention_probs_dropout_prob and classifier_dropout are BERT's; {} "
                "keeps their defaults (got {}, {}, {})",
                where, f, c.hidden_dropout_prob, c.attention_probs_dropout_prob, c.classifier_dropout);
}
}  // namespace

void TransformerConfig::validate(std::string_view where) const {
  ANVIL_REQUIRE(family == "gpt2" || family == "bert" || llama_family(family),
                "{}: family '{}' is not supported (supported: gpt2, llama, qwen2, mistral, bert)", where,
                family);
  ANVIL_REQUIRE(n_layer >= 1, "{}: n_layer must be >= 1, got {}", where, n_layer);
  ANVIL_REQUIRE(n_head >= 1, "{}: n_head must be >= 1, got {}", where, n_head);
  ANVIL_REQUIRE(vocab_size >= 2, "{}: vocab_size must be >= 2, got {}", where, vocab_size);
  ANVIL_REQUIRE(block_size >= 1, "{}: block_size must be >= 1, got {}", where, block_size);
  ANVIL_REQUIRE(intermediate_size >= 0, "{}: intermediate_size must be >= 0 (0 = 4 * n_embd), got {}", where,
                intermediate_size);
  if (llama_family(family)) return validate_llama_family(*this, where);

  ANVIL_REQUIRE(n_embd >= 1 && n_embd % n_head == 0,
                "{}: n_embd ({}) must be a positive multiple of n_head ({})", where, n_embd, n_head);
  ANVIL_REQUIRE(eos_token_id < vocab_size, "{}: eos_token_id {} is outside the vocabulary (size {})", where,
                eos_token_id, vocab_size);
  require_no_llama_fields(*this, where);
  const bool tanh_gelu = hidden_act == "gelu_new" || hidden_act == "gelu_pytorch_tanh";
  if (!is_bert()) {
    // GptModel implements exactly these; anything else would be silently ignored.
    ANVIL_REQUIRE(ffn_size() == 4 * n_embd,
                  "{}: intermediate_size {} is not supported by gpt2 (only 4 * n_embd)", where,
                  intermediate_size);
    ANVIL_REQUIRE(layer_norm_eps == 1e-5, "{}: layer_norm_eps {} is not supported by gpt2 (1e-5)", where,
                  layer_norm_eps);
    ANVIL_REQUIRE(tanh_gelu, "{}: hidden_act '{}' is not supported by gpt2 (gelu_new)", where, hidden_act);
    return;
  }
  ANVIL_REQUIRE(hidden_act == "gelu" || tanh_gelu,
                "{}: hidden_act '{}' is not supported (gelu, gelu_new, gelu_pytorch_tanh)", where,
                hidden_act);
  ANVIL_REQUIRE(std::isfinite(layer_norm_eps) && layer_norm_eps > 0 && layer_norm_eps < 1,
                "{}: layer_norm_eps must be in (0, 1), got {}", where, layer_norm_eps);
  ANVIL_REQUIRE(type_vocab_size >= 1, "{}: type_vocab_size must be >= 1, got {}", where, type_vocab_size);
  ANVIL_REQUIRE(pad_token_id >= -1 && pad_token_id < vocab_size,
                "{}: pad_token_id {} is outside the vocabulary (size {}; -1 for none)", where, pad_token_id,
                vocab_size);
  ANVIL_REQUIRE(num_labels >= 1, "{}: num_labels must be >= 1, got {}", where, num_labels);
  ANVIL_REQUIRE(
      problem_type.empty() || problem_type == "regression" || problem_type == "single_label_classification",
      "{}: problem_type '{}' is not supported (regression, single_label_classification)", where,
      problem_type);
  ANVIL_REQUIRE(problem_type != "regression" || num_labels == 1,
                "{}: problem_type 'regression' needs num_labels 1, got {}", where, num_labels);
  ANVIL_REQUIRE(problem_type != "single_label_classification" || num_labels >= 2,
                "{}: problem_type 'single_label_classification' needs num_labels >= 2, got {}", where,
                num_labels);
  ANVIL_REQUIRE(label_names.empty() || int(label_names.size()) == num_labels,
                "{}: {} label names for num_labels {}", where, label_names.size(), num_labels);
  ANVIL_REQUIRE(initializer_range > 0 && std::isfinite(initializer_range),
                "{}: initializer_range must be > 0, got {}", where, initializer_range);
  for (const auto& [name, p] : {std::pair{"hidden_dropout_prob", hidden_dropout_prob},
                                std::pair{"attention_probs_dropout_prob", attention_probs_dropout_prob}})
    ANVIL_REQUIRE(p >= 0 && p < 1, "{}: {} must be in [0, 1), got {}", where, name, p);
  ANVIL_REQUIRE(classifier_dropout < 0 || classifier_dropout < 1,
                "{}: classifier_dropout must be in [0, 1) (or null: hidden_dropout_prob), got {}", where,
                classifier_dropout);
}

std::vector<std::string> TransformerConfig::preset_names() {
  return {"tiny",      "d12",        "d24",        "d36",      "d48",      "bert-tiny",
          "bert-base", "bert-large", "llama-tiny", "llama-1b", "llama-8b", "qwen2.5-0.5b"};
}

TransformerConfig TransformerConfig::preset(std::string_view name) {
  TransformerConfig c;
  auto gpt2 = [&](int L, int H, int C) {
    c.n_layer = L, c.n_head = H, c.n_embd = C, c.vocab_size = 50257, c.block_size = 1024,
    c.eos_token_id = 50256;
    return c;
  };
  // bert-base-uncased / bert-large-uncased shapes (BertConfig defaults) with a 2-label classifier.
  auto bert = [&](int L, int H, int C, int I, int V, int P) {
    c.family = "bert";
    c.n_layer = L, c.n_head = H, c.n_embd = C, c.intermediate_size = I, c.vocab_size = V, c.block_size = P;
    c.eos_token_id = -1, c.pad_token_id = 0, c.type_vocab_size = 2, c.num_labels = 2;
    c.layer_norm_eps = 1e-12, c.hidden_act = "gelu", c.initializer_range = 0.02;
    return c;
  };
  // A Llama-family shape; block_size is max_position_embeddings (RoPE has no position table, so it only
  // bounds the sequence length; training runs at its own seq_len).
  auto llama = [&](const char* family, int L, int H, int KV, int C, int I, int V, int P, double eps) {
    c.family = family;
    c.n_layer = L, c.n_head = H, c.n_kv_head = KV, c.n_embd = C, c.intermediate_size = I, c.vocab_size = V;
    c.block_size = P, c.layer_norm_eps = eps, c.hidden_act = "silu", c.pad_token_id = -1;
    c.tie_word_embeddings = false, c.eos_token_id = -1, c.bos_token_id = -1;
  };
  if (name == "tiny") {
    c.n_layer = 4, c.n_head = 4, c.n_embd = 128, c.vocab_size = 256, c.block_size = 128;
    return c;
  }
  if (name == "d12") return gpt2(12, 12, 768);
  if (name == "d24") return gpt2(24, 16, 1024);
  if (name == "d36") return gpt2(36, 20, 1280);
  if (name == "d48") return gpt2(48, 25, 1600);
  if (name == "bert-tiny") return bert(2, 4, 64, 256, 1024, 128);
  if (name == "bert-base") return bert(12, 12, 768, 3072, 30522, 512);
  if (name == "bert-large") return bert(24, 16, 1024, 4096, 30522, 512);
  if (name == "llama-tiny") {  // the CPU-trainable Llama: byte vocabulary, GQA, untied head
    llama("llama", 4, 4, 2, 128, 384, 256, 128, 1e-5);
    return c;
  }
  if (name == "llama-1b") {  // meta-llama/Llama-3.2-1B
    llama("llama", 16, 32, 8, 2048, 8192, 128256, 131072, 1e-5);
    c.tie_word_embeddings = true, c.rope_theta = 500000.0;
    c.rope_scaling = {.type = "llama3",
                      .factor = 32.0,
                      .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0,
                      .original_max_position_embeddings = 8192};
    c.bos_token_id = 128000, c.eos_token_id = 128001;
    return c;
  }
  if (name == "llama-8b") {  // meta-llama/Llama-3.1-8B: a model whose AdamW training needs ZeRO-3 (or more
                             // than one GPU's memory)
    llama("llama", 32, 32, 8, 4096, 14336, 128256, 131072, 1e-5);
    c.rope_theta = 500000.0;
    c.rope_scaling = {.type = "llama3",
                      .factor = 8.0,
                      .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0,
                      .original_max_position_embeddings = 8192};
    c.bos_token_id = 128000, c.eos_token_id = 128001;
    return c;
  }
  if (name == "qwen2.5-0.5b") {  // Qwen/Qwen2.5-0.5B
    llama("qwen2", 24, 14, 2, 896, 4864, 151936, 32768, 1e-6);
    c.tie_word_embeddings = true, c.rope_theta = 1000000.0;
    c.bos_token_id = 151643, c.eos_token_id = 151643;
    return c;
  }
  std::string names;
  for (const std::string& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
  ANVIL_THROW("unknown model preset '{}' (presets: {})", name, names);
}

namespace {
int hf_int(const nlohmann::json& j, const char* key, std::string_view source) {
  ANVIL_REQUIRE(j.contains(key), "{}: missing field '{}'", source, key);
  ANVIL_REQUIRE(j[key].is_number_integer(), "{}: field '{}' must be an integer, got {}", source, key,
                j[key].dump());
  return j[key].get<int>();
}

// An optional field: `fallback` (Hugging Face's default) when absent.
int hf_int_or(const nlohmann::json& j, const char* key, int fallback, std::string_view source) {
  return j.contains(key) ? hf_int(j, key, source) : fallback;
}

double hf_number_or(const nlohmann::json& j, const char* key, double fallback, std::string_view source) {
  if (!j.contains(key)) return fallback;
  ANVIL_REQUIRE(j[key].is_number(), "{}: field '{}' must be a number, got {}", source, key, j[key].dump());
  return j[key].get<double>();
}

std::string hf_string_or(const nlohmann::json& j, const char* key, const std::string& fallback,
                         std::string_view source) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  ANVIL_REQUIRE(j[key].is_string(), "{}: field '{}' must be a string, got {}", source, key, j[key].dump());
  return j[key].get<std::string>();
}

TransformerConfig gpt2_from_hf_json(const nlohmann::json& j, std::string_view source) {
  TransformerConfig c;
  c.family = "gpt2";
  c.n_layer = hf_int(j, "n_layer", source);
  c.n_head = hf_int(j, "n_head", source);
  c.n_embd = hf_int(j, "n_embd", source);
  c.vocab_size = hf_int(j, "vocab_size", source);
  c.block_size = hf_int(j, "n_positions", source);
  if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer()) c.eos_token_id = j["eos_token_id"];
  if (j.contains("n_inner") && !j["n_inner"].is_null())
    ANVIL_REQUIRE(j["n_inner"] == 4 * c.n_embd, "{}: n_inner {} is not supported (only 4 * n_embd)", source,
                  j["n_inner"].dump());
  const std::string act = j.value("activation_function", "gelu_new");
  ANVIL_REQUIRE(act == "gelu_new" || act == "gelu_pytorch_tanh",
                "{}: activation_function '{}' is not supported (gelu_new)", source, act);
  const double eps = j.value("layer_norm_epsilon", 1e-5);
  ANVIL_REQUIRE(eps == 1e-5, "{}: layer_norm_epsilon {} is not supported (1e-5)", source, eps);
  ANVIL_REQUIRE(j.value("tie_word_embeddings", true), "{}: untied word embeddings are not supported", source);
  c.validate(source);
  return c;
}

// BertConfig: the shape fields are required; the others take BertConfig's defaults when absent. The number of
// labels follows PretrainedConfig: an explicit num_labels wins over id2label (whose names are then
// regenerated), and with neither there are 2.
TransformerConfig bert_from_hf_json(const nlohmann::json& j, std::string_view source) {
  TransformerConfig c = TransformerConfig::preset("bert-base");
  c.n_layer = hf_int(j, "num_hidden_layers", source);
  c.n_head = hf_int(j, "num_attention_heads", source);
  c.n_embd = hf_int(j, "hidden_size", source);
  c.intermediate_size = hf_int(j, "intermediate_size", source);
  ANVIL_REQUIRE(c.intermediate_size >= 1, "{}: intermediate_size must be >= 1, got {}", source,
                c.intermediate_size);
  c.vocab_size = hf_int(j, "vocab_size", source);
  c.block_size = hf_int(j, "max_position_embeddings", source);
  c.type_vocab_size = hf_int_or(j, "type_vocab_size", 2, source);
  c.layer_norm_eps = hf_number_or(j, "layer_norm_eps", 1e-12, source);
  c.hidden_act = hf_string_or(j, "hidden_act", "gelu", source);
  c.initializer_range = hf_number_or(j, "initializer_range", 0.02, source);
  c.hidden_dropout_prob = hf_number_or(j, "hidden_dropout_prob", 0.1, source);
  c.attention_probs_dropout_prob = hf_number_or(j, "attention_probs_dropout_prob", 0.1, source);
  c.classifier_dropout = j.contains("classifier_dropout") && j["classifier_dropout"].is_null()
                             ? -1.0
                             : hf_number_or(j, "classifier_dropout", -1.0, source);
  ANVIL_REQUIRE(
      !j.contains("classifier_dropout") || j["classifier_dropout"].is_null() || c.classifier_dropout >= 0,
      "{}: classifier_dropout must be in [0, 1) or null, got {}", source, c.classifier_dropout);
  c.pad_token_id = j.contains("pad_token_id") && j["pad_token_id"].is_null()
                       ? -1
                       : hf_int_or(j, "pad_token_id", 0, source);
  const std::string pos = hf_string_or(j, "position_embedding_type", "absolute", source);
  ANVIL_REQUIRE(pos == "absolute", "{}: position_embedding_type '{}' is not supported (absolute)", source,
                pos);
  for (const char* flag : {"is_decoder", "add_cross_attention"})
    ANVIL_REQUIRE(!j.contains(flag) || j[flag] == false, "{}: {} = {} is not supported (an encoder only)",
                  source, flag, j[flag].dump());

  c.label_names.clear();
  if (j.contains("id2label") && !j["id2label"].is_null()) {
    const nlohmann::json& m = j["id2label"];
    ANVIL_REQUIRE(m.is_object(), "{}: field 'id2label' must be an object, got {}", source, m.dump());
    c.label_names.assign(m.size(), "");
    for (auto& [key, name] : m.items()) {
      size_t used = 0;
      int id = -1;
      try {
        id = std::stoi(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      ANVIL_REQUIRE(used == key.size() && id >= 0 && id < int(m.size()),
                    "{}: id2label key '{}' is not a label id in [0, {})", source, key, m.size());
      ANVIL_REQUIRE(name.is_string(), "{}: id2label['{}'] must be a string, got {}", source, key,
                    name.dump());
      c.label_names[size_t(id)] = name.get<std::string>();
    }
    c.num_labels = int(c.label_names.size());
  } else {
    c.num_labels = 2;
  }
  if (j.contains("num_labels") && !j["num_labels"].is_null()) {
    const int n = hf_int(j, "num_labels", source);
    ANVIL_REQUIRE(n >= 1, "{}: num_labels must be >= 1, got {}", source, n);
    if (n != c.num_labels) c.label_names.clear();
    c.num_labels = n;
  }
  c.problem_type = hf_string_or(j, "problem_type", "", source);
  ANVIL_REQUIRE(c.problem_type != "multi_label_classification",
                "{}: problem_type 'multi_label_classification' is not supported (regression, "
                "single_label_classification)",
                source);
  c.validate(source);
  return c;
}

nlohmann::json bert_to_hf_json(const TransformerConfig& c) {
  nlohmann::json id2label = nlohmann::json::object(), label2id = nlohmann::json::object();
  for (int i = 0; i < c.num_labels; ++i) {
    id2label[std::to_string(i)] = c.label_name(i);
    label2id[c.label_name(i)] = i;
  }
  nlohmann::json j = {{"model_type", "bert"},
                      {"architectures", {"BertForSequenceClassification"}},
                      {"vocab_size", c.vocab_size},
                      {"hidden_size", c.n_embd},
                      {"num_hidden_layers", c.n_layer},
                      {"num_attention_heads", c.n_head},
                      {"intermediate_size", c.ffn_size()},
                      {"hidden_act", c.hidden_act},
                      {"hidden_dropout_prob", c.hidden_dropout_prob},
                      {"attention_probs_dropout_prob", c.attention_probs_dropout_prob},
                      {"max_position_embeddings", c.block_size},
                      {"type_vocab_size", c.type_vocab_size},
                      {"initializer_range", c.initializer_range},
                      {"layer_norm_eps", c.layer_norm_eps},
                      {"position_embedding_type", "absolute"},
                      {"classifier_dropout", c.classifier_dropout < 0 ? nlohmann::json(nullptr)
                                                                      : nlohmann::json(c.classifier_dropout)},
                      {"id2label", id2label},
                      {"label2id", label2id},
                      {"torch_dtype", "float32"}};
  j["pad_token_id"] = c.pad_token_id >= 0 ? nlohmann::json(c.pad_token_id) : nlohmann::json(nullptr);
  j["problem_type"] = c.problem_type.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.problem_type);
  return j;
}

// --- Llama family (LlamaConfig, Qwen2Config, MistralConfig of transformers 4.4x and 5) ---

// What differs between the three configs' defaults (HF's values when a field is absent).
struct LlamaFamilyInfo {
  const char* architecture;
  int default_kv_heads;  // absent num_key_value_heads (null: num_attention_heads); 0 = num_attention_heads
  int default_bos, default_eos;  // -1: None
};

const LlamaFamilyInfo& llama_family_info(const std::string& family) {
  static const LlamaFamilyInfo llama{"LlamaForCausalLM", 0, 1, 2};
  static const LlamaFamilyInfo qwen2{"Qwen2ForCausalLM", 32, -1, -1};
  static const LlamaFamilyInfo mistral{"MistralForCausalLM", 8, 1, 2};
  return family == "qwen2" ? qwen2 : family == "mistral" ? mistral : llama;
}

bool present(const nlohmann::json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

bool hf_bool_or(const nlohmann::json& j, const char* key, bool fallback, std::string_view source) {
  if (!present(j, key)) return fallback;
  ANVIL_REQUIRE(j[key].is_boolean(), "{}: field '{}' must be true or false, got {}", source, key,
                j[key].dump());
  return j[key].get<bool>();
}

// A token id: null = none (-1), absent = the family's default; eos_token_id may be a list (generation stops
// at any of them): the first is kept.
int hf_token_id(const nlohmann::json& j, const char* key, int fallback, std::string_view source) {
  if (!j.contains(key)) return fallback;
  nlohmann::json v = j[key];
  if (v.is_array() && std::string_view(key) == "eos_token_id") v = v.empty() ? nlohmann::json() : v[0];
  if (v.is_null()) return -1;
  ANVIL_REQUIRE(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT32_MAX,
                "{}: field '{}' must be a token id (or null), got {}", source, key, j[key].dump());
  return v.get<int>();
}

// A field that must have a value that does not change the math, when present.
void require_value(const nlohmann::json& j, const char* key, const nlohmann::json& allowed, const char* why,
                   std::string_view source) {
  if (!present(j, key)) return;
  const bool same = allowed.is_number() ? j[key].is_number() && j[key].get<double>() == allowed.get<double>()
                                        : j[key] == allowed;
  ANVIL_REQUIRE(same, "{}: {} = {} is not supported ({})", source, key, j[key].dump(), why);
}

// rope_theta and rope_scaling. Accepted forms: transformers 4's top-level rope_theta and rope_scaling
// ({"type" or "rope_type": ..., ...}; null or absent = default), and transformers 5's rope_parameters
// ({"rope_type", "rope_theta", ...}). transformers 5 prefers a non-empty rope_scaling over rope_parameters
// and a rope_theta inside the dict over the top-level one (transformers 4 reads only the top level, so
// disagreeing values are refused). llama3's original_max_position_embeddings defaults to
// max_position_embeddings (transformers 5).
void hf_rope(const nlohmann::json& j, TransformerConfig& c, std::string_view source) {
  c.rope_theta = present(j, "rope_theta") ? hf_number_or(j, "rope_theta", 0, source) : 10000.0;
  c.rope_scaling = RopeScaling{};
  std::string field = "rope_scaling";
  if (!present(j, "rope_scaling") || j["rope_scaling"].empty()) field = "rope_parameters";
  if (!present(j, field.c_str()) || j[field].empty()) return;
  const nlohmann::json& r = j[field];
  ANVIL_REQUIRE(r.is_object(), "{}: field '{}' must be an object (or null), got {}", source, field, r.dump());
  for (auto& [key, v] : r.items())
    ANVIL_REQUIRE(!v.is_object(), "{}: {}.{}: per-layer RoPE parameters are not supported", source, field,
                  key);
  const std::string type = hf_string_or(r, "rope_type", "", source),
                    old_type = hf_string_or(r, "type", "", source);
  ANVIL_REQUIRE(type.empty() || old_type.empty() || type == old_type,
                "{}: {} has type '{}' and rope_type '{}' (transformers 4 reads type, 5 reads rope_type)",
                source, field, old_type, type);
  const std::string t = !type.empty() ? type : !old_type.empty() ? old_type : "default";
  if (present(r, "rope_theta")) {
    const double theta = hf_number_or(r, "rope_theta", 0, source);
    ANVIL_REQUIRE(!present(j, "rope_theta") || theta == c.rope_theta,
                  "{}: {}.rope_theta {} disagrees with rope_theta {}", source, field, theta, c.rope_theta);
    c.rope_theta = theta;
  }
  require_value(r, "partial_rotary_factor", 1.0, "the whole head is rotated", source);
  auto number = [&](const char* key) {
    ANVIL_REQUIRE(present(r, key), "{}: {} of rope_type '{}' needs '{}'", source, field, t, key);
    ANVIL_REQUIRE(r[key].is_number(), "{}: field '{}.{}' must be a number, got {}", source, field, key,
                  r[key].dump());
    return r[key].get<double>();
  };
  if (t == "default") return;
  if (t == "linear") {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = number("factor");
    return;
  }
  ANVIL_REQUIRE(t == "llama3", "{}: {}.rope_type '{}' is not supported (default, linear, llama3)", source,
                field, t);
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = number("factor");
  c.rope_scaling.low_freq_factor = number("low_freq_factor");
  c.rope_scaling.high_freq_factor = number("high_freq_factor");
  c.rope_scaling.original_max_position_embeddings =
      present(r, "original_max_position_embeddings") ? hf_int(r, "original_max_position_embeddings", source)
                                                     : c.block_size;
}

// v5's layer_types: one attention kind per layer, all the same (Qwen2's and Mistral's window applies to
// every layer or none here).
void check_layer_types(const nlohmann::json& j, const TransformerConfig& c, std::string_view source) {
  if (!present(j, "layer_types")) return;
  const nlohmann::json& lt = j["layer_types"];
  const std::string want = c.sliding_window > 0 ? "sliding_attention" : "full_attention";
  bool ok = lt.is_array() && int(lt.size()) == c.n_layer;
  for (const nlohmann::json& t : lt) ok = ok && t == want;
  ANVIL_REQUIRE(ok, "{}: layer_types {} is not supported (every layer '{}')", source, lt.dump(), want);
}

// LlamaConfig / Qwen2Config / MistralConfig. The shape fields are required; the others take the family's
// transformers defaults when absent (rms_norm_eps 1e-6, rope_theta 10000, untied, no biases; Mistral's
// sliding_window 4096). Fields that do not change the math (dtype, use_cache, pad handling in generation,
// transformers_version, ...) are ignored, those that would are refused.
TransformerConfig llama_family_from_hf_json(const nlohmann::json& j, const std::string& family,
                                            std::string_view source) {
  const LlamaFamilyInfo& info = llama_family_info(family);
  TransformerConfig c;
  c.family = family;
  c.hidden_act = "silu";
  c.n_layer = hf_int(j, "num_hidden_layers", source);
  c.n_head = hf_int(j, "num_attention_heads", source);
  c.n_embd = hf_int(j, "hidden_size", source);
  c.intermediate_size = hf_int(j, "intermediate_size", source);
  ANVIL_REQUIRE(c.intermediate_size >= 1, "{}: intermediate_size must be >= 1, got {}", source,
                c.intermediate_size);
  c.vocab_size = hf_int(j, "vocab_size", source);
  c.block_size = hf_int(j, "max_position_embeddings", source);

  if (present(j, "architectures")) {
    const nlohmann::json& a = j["architectures"];
    ANVIL_REQUIRE(a.is_array() && a.size() == 1 && a[0] == info.architecture,
                  "{}: architectures {} is not supported ({}: [\"{}\"])", source, a.dump(), family,
                  info.architecture);
  }
  const std::string act = hf_string_or(j, "hidden_act", "silu", source);
  ANVIL_REQUIRE(act == "silu", "{}: hidden_act '{}' is not supported (silu)", source, act);

  // Absent: the family's default (Qwen2Config 32, MistralConfig 8); null: one per query head. Values equal
  // to what they would derive to are stored as 0.
  c.n_kv_head = j.contains("num_key_value_heads")
                    ? (j["num_key_value_heads"].is_null() ? 0 : hf_int(j, "num_key_value_heads", source))
                    : info.default_kv_heads;
  ANVIL_REQUIRE(c.n_kv_head >= 1 || !present(j, "num_key_value_heads"),
                "{}: num_key_value_heads must be >= 1, got {}", source, c.n_kv_head);
  if (c.n_kv_head == c.n_head) c.n_kv_head = 0;
  c.head_dim = present(j, "head_dim") ? hf_int(j, "head_dim", source) : 0;
  ANVIL_REQUIRE(c.head_dim >= 1 || !present(j, "head_dim"), "{}: head_dim must be >= 1 (or null), got {}",
                source, c.head_dim);
  if (c.n_head > 0 && c.n_embd % c.n_head == 0 && c.head_dim == c.n_embd / c.n_head) c.head_dim = 0;

  c.layer_norm_eps = hf_number_or(j, "rms_norm_eps", 1e-6, source);
  c.initializer_range =
      present(j, "initializer_range") ? hf_number_or(j, "initializer_range", 0, source) : 0.02;
  c.tie_word_embeddings = hf_bool_or(j, "tie_word_embeddings", false, source);
  hf_rope(j, c, source);

  if (family == "llama") {
    c.attention_bias = hf_bool_or(j, "attention_bias", false, source);
    c.mlp_bias = hf_bool_or(j, "mlp_bias", false, source);
    // transformers 4 splits the projections into pretraining_tp slices; 5 ignores it.
    require_value(j, "pretraining_tp", 1, "only 1", source);
  }
  if (family == "qwen2") {
    // Qwen2 windows only the layers from max_window_layers on, and transformers 4's eager attention windows
    // every layer: neither is the Decoder's single window.
    require_value(j, "use_sliding_window", false, "Qwen2 windows only some layers", source);
    require_value(j, "use_mrope", false, "multimodal RoPE is Qwen2-VL's", source);
  }
  if (family == "mistral") {
    if (!j.contains("sliding_window")) {
      c.sliding_window = 4096;  // MistralConfig's default
    } else if (!j["sliding_window"].is_null()) {
      c.sliding_window = hf_int(j, "sliding_window", source);
      ANVIL_REQUIRE(c.sliding_window >= 1, "{}: sliding_window must be >= 1 (or null: none), got {}", source,
                    c.sliding_window);
    }
  }
  check_layer_types(j, c, source);
  require_value(j, "attention_dropout", 0.0, "no dropout", source);
  require_value(j, "partial_rotary_factor", 1.0, "the whole head is rotated", source);
  ANVIL_REQUIRE(!present(j, "quantization_config"), "{}: quantization_config {} is not supported", source,
                j["quantization_config"].dump());

  c.bos_token_id = hf_token_id(j, "bos_token_id", info.default_bos, source);
  c.eos_token_id = hf_token_id(j, "eos_token_id", info.default_eos, source);
  // The embedding's padding_idx: its row gets no gradient from the lookup (HF nn.Embedding semantics).
  c.pad_token_id = hf_token_id(j, "pad_token_id", -1, source);
  c.validate(source);
  return c;
}

nlohmann::json llama_family_to_hf_json(const TransformerConfig& c) {
  auto id = [](int v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json rope = nullptr;
  const RopeScaling& r = c.rope_scaling;
  if (!r.type.empty()) {
    // Both spellings of the type: older transformers 4 read "type", 4.4x and 5 "rope_type".
    rope = {{"rope_type", r.type}, {"type", r.type}, {"factor", r.factor}};
    if (r.type == "llama3") {
      rope["low_freq_factor"] = r.low_freq_factor;
      rope["high_freq_factor"] = r.high_freq_factor;
      rope["original_max_position_embeddings"] = r.original_max_position_embeddings;
    }
  }
  nlohmann::json j = {{"model_type", c.family},
                      {"architectures", {llama_family_info(c.family).architecture}},
                      {"vocab_size", c.vocab_size},
                      {"hidden_size", c.n_embd},
                      {"intermediate_size", c.ffn_size()},
                      {"num_hidden_layers", c.n_layer},
                      {"num_attention_heads", c.n_head},
                      {"num_key_value_heads", c.kv_heads()},
                      {"hidden_act", "silu"},
                      {"max_position_embeddings", c.block_size},
                      {"initializer_range", c.initializer_range},
                      {"rms_norm_eps", c.layer_norm_eps},
                      {"rope_theta", c.rope_theta},
                      {"rope_scaling", rope},
                      {"tie_word_embeddings", c.tie_word_embeddings},
                      {"attention_dropout", 0.0},
                      {"bos_token_id", id(c.bos_token_id)},
                      {"eos_token_id", id(c.eos_token_id)},
                      {"pad_token_id", id(c.pad_token_id)},
                      {"use_cache", true},
                      {"torch_dtype", "float32"}};
  if (c.family != "qwen2") j["head_dim"] = c.head_size();  // Qwen2 always derives it
  if (c.family == "llama") {
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = c.mlp_bias;
    j["pretraining_tp"] = 1;
  }
  if (c.family == "qwen2") {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = c.n_layer;
  }
  // Explicit null: an absent sliding_window means MistralConfig's 4096.
  if (c.family == "mistral")
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
  return j;
}
}  // namespace

TransformerConfig TransformerConfig::from_hf_json(const nlohmann::json& j, std::string_view source) {
  ANVIL_REQUIRE(j.is_object(), "{}: config.json must be a JSON object", source);
  const std::string type =
      j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  if (type == "gpt2") return gpt2_from_hf_json(j, source);
  if (type == "bert") return bert_from_hf_json(j, source);
  if (llama_family(type)) return llama_family_from_hf_json(j, type, source);
  ANVIL_THROW("{}: model_type '{}' is not supported (supported: gpt2, llama, qwen2, mistral, bert)", source,
              type);
}

nlohmann::json TransformerConfig::to_hf_json() const {
  if (is_bert()) return bert_to_hf_json(*this);
  if (llama_family(family)) return llama_family_to_hf_json(*this);
  nlohmann::json j = {{"model_type", "gpt2"},        {"architectures", {"GPT2LMHeadModel"}},
                      {"vocab_size", vocab_size},    {"n_positions", block_size},
                      {"n_ctx", block_size},         {"n_embd", n_embd},
                      {"n_layer", n_layer},          {"n_head", n_head},
                      {"n_inner", nullptr},          {"activation_function", "gelu_new"},
                      {"layer_norm_epsilon", 1e-5},  {"resid_pdrop", 0.0},
                      {"embd_pdrop", 0.0},           {"attn_pdrop", 0.0},
                      {"initializer_range", 0.02},   {"scale_attn_weights", true},
                      {"tie_word_embeddings", true}, {"torch_dtype", "float32"}};
  if (eos_token_id >= 0) j["bos_token_id"] = eos_token_id, j["eos_token_id"] = eos_token_id;
  return j;
}

}  // namespace anvil
