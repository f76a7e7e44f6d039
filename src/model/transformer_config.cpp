#include <cmath>
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
  const int64_t per_block =
      2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  return int64_t(vocab_size) * C + int64_t(block_size) * C + L * per_block + 2 * C;
}

void TransformerConfig::validate(std::string_view where) const {
  ANVIL_REQUIRE(family == "gpt2" || family == "bert",
                "{}: family '{}' is not supported (supported: gpt2, bert)", where, family);
  ANVIL_REQUIRE(n_layer >= 1, "{}: n_layer must be >= 1, got {}", where, n_layer);
  ANVIL_REQUIRE(n_head >= 1, "{}: n_head must be >= 1, got {}", where, n_head);
  ANVIL_REQUIRE(n_embd >= 1 && n_embd % n_head == 0,
                "{}: n_embd ({}) must be a positive multiple of n_head ({})", where, n_embd, n_head);
  ANVIL_REQUIRE(vocab_size >= 2, "{}: vocab_size must be >= 2, got {}", where, vocab_size);
  ANVIL_REQUIRE(block_size >= 1, "{}: block_size must be >= 1, got {}", where, block_size);
  ANVIL_REQUIRE(eos_token_id < vocab_size, "{}: eos_token_id {} is outside the vocabulary (size {})", where,
                eos_token_id, vocab_size);
  ANVIL_REQUIRE(intermediate_size >= 0, "{}: intermediate_size must be >= 0 (0 = 4 * n_embd), got {}", where,
                intermediate_size);
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
  return {"tiny", "d12", "d24", "d36", "d48", "bert-tiny", "bert-base", "bert-large"};
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
}  // namespace

TransformerConfig TransformerConfig::from_hf_json(const nlohmann::json& j, std::string_view source) {
  ANVIL_REQUIRE(j.is_object(), "{}: config.json must be a JSON object", source);
  const std::string type =
      j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  if (type == "gpt2") return gpt2_from_hf_json(j, source);
  if (type == "bert") return bert_from_hf_json(j, source);
  ANVIL_THROW("{}: model_type '{}' is not supported (supported: gpt2, bert)", source, type);
}

nlohmann::json TransformerConfig::to_hf_json() const {
  if (is_bert()) return bert_to_hf_json(*this);
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
