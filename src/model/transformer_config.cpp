#include <nlohmann/json.hpp>

#include "anvil/error.hpp"
#include "anvil/model_config.hpp"

namespace anvil {

int64_t TransformerConfig::num_parameters() const {
  const int64_t C = n_embd, L = n_layer;
  const int64_t per_block =
      2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  return int64_t(vocab_size) * C + int64_t(block_size) * C + L * per_block + 2 * C;
}

void TransformerConfig::validate(std::string_view where) const {
  ANVIL_REQUIRE(family == "gpt2", "{}: family '{}' is not supported (supported: gpt2)", where, family);
  ANVIL_REQUIRE(n_layer >= 1, "{}: n_layer must be >= 1, got {}", where, n_layer);
  ANVIL_REQUIRE(n_head >= 1, "{}: n_head must be >= 1, got {}", where, n_head);
  ANVIL_REQUIRE(n_embd >= 1 && n_embd % n_head == 0,
                "{}: n_embd ({}) must be a positive multiple of n_head ({})", where, n_embd, n_head);
  ANVIL_REQUIRE(vocab_size >= 2, "{}: vocab_size must be >= 2, got {}", where, vocab_size);
  ANVIL_REQUIRE(block_size >= 1, "{}: block_size must be >= 1, got {}", where, block_size);
  ANVIL_REQUIRE(eos_token_id < vocab_size, "{}: eos_token_id {} is outside the vocabulary (size {})", where,
                eos_token_id, vocab_size);
}

std::vector<std::string> TransformerConfig::preset_names() {
  return {"tiny", "d12", "d24", "d36", "d48"};
}

TransformerConfig TransformerConfig::preset(std::string_view name) {
  TransformerConfig c;
  auto gpt2 = [&](int L, int H, int C) {
    c.n_layer = L, c.n_head = H, c.n_embd = C, c.vocab_size = 50257, c.block_size = 1024,
    c.eos_token_id = 50256;
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
  ANVIL_THROW("unknown model preset '{}' (presets: tiny, d12, d24, d36, d48)", name);
}

namespace {
int hf_int(const nlohmann::json& j, const char* key, std::string_view source) {
  ANVIL_REQUIRE(j.contains(key), "{}: missing field '{}'", source, key);
  ANVIL_REQUIRE(j[key].is_number_integer(), "{}: field '{}' must be an integer, got {}", source, key,
                j[key].dump());
  return j[key].get<int>();
}
}  // namespace

TransformerConfig TransformerConfig::from_hf_json(const nlohmann::json& j, std::string_view source) {
  ANVIL_REQUIRE(j.is_object(), "{}: config.json must be a JSON object", source);
  const std::string type = j.value("model_type", "");
  ANVIL_REQUIRE(type == "gpt2", "{}: model_type '{}' is not supported (supported: gpt2)", source, type);
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

nlohmann::json TransformerConfig::to_hf_json() const {
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
