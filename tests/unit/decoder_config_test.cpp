// The Llama family of TransformerConfig (llama, qwen2, mistral): config.json import of real checkpoints'
// configs in transformers 4 and 5 forms, export round trips, errors naming field and value, parameter counts
// against Hugging Face's, presets, and the RoPE inverse frequencies against the formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numbers>
#include <string>
#include <vector>

#include "anvil/model_config.hpp"
#include "model/rope.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

// config.json of meta-llama/Llama-3.2-1B.
json llama32_1b() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": false,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
      "factor": 32.0,
      "high_freq_factor": 4.0,
      "low_freq_factor": 1.0,
      "original_max_position_embeddings": 8192,
      "rope_type": "llama3"
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": true,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0",
    "use_cache": true,
    "vocab_size": 128256
  })");
}

// config.json of Qwen/Qwen2.5-0.5B.
json qwen25_05b() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": true,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1",
    "use_cache": true,
    "use_mrope": false,
    "use_sliding_window": false,
    "vocab_size": 151936
  })");
}

// config.json of mistralai/Mistral-7B-v0.1.
json mistral_7b() {
  return json::parse(R"({
    "architectures": ["MistralForCausalLM"],
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 32768,
    "model_type": "mistral",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": 4096,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0",
    "use_cache": true,
    "vocab_size": 32000
  })");
}

// config.json of TinyLlama/TinyLlama-1.1B-Chat-v1.0.
json tinyllama() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": false,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5632,
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 22,
    "num_key_value_heads": 4,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": null,
    "rope_theta": 10000.0,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.35.0",
    "use_cache": true,
    "vocab_size": 32000
  })");
}

TransformerConfig import(const json& j) {
  return TransformerConfig::from_hf_json(j, "cfg.json");
}

std::string import_error(const json& j) {
  try {
    import(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// `j` with key set to v (a discarded value erases it).
json with(json j, const std::string& key, const json& v) {
  if (v.is_discarded())
    j.erase(key);
  else
    j[key] = v;
  return j;
}
const json kErase = json(json::value_t::discarded);

// Every field the Llama family uses.
void expect_same(const TransformerConfig& a, const TransformerConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.n_kv_head, b.n_kv_head);
  EXPECT_EQ(a.n_embd, b.n_embd);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.block_size, b.block_size);
  EXPECT_EQ(a.layer_norm_eps, b.layer_norm_eps);
  EXPECT_EQ(a.hidden_act, b.hidden_act);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling, b.rope_scaling);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.mlp_bias, b.mlp_bias);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
  EXPECT_EQ(a.pad_token_id, b.pad_token_id);
  EXPECT_EQ(a.initializer_range, b.initializer_range);
}

TEST(DecoderConfig, ImportsLlama32) {
  const TransformerConfig c = import(llama32_1b());
  EXPECT_EQ(c.family, "llama");
  EXPECT_TRUE(c.is_decoder());
  EXPECT_EQ(c.n_layer, 16);
  EXPECT_EQ(c.n_head, 32);
  EXPECT_EQ(c.kv_heads(), 8);
  EXPECT_EQ(c.n_embd, 2048);
  EXPECT_EQ(c.head_size(), 64);
  EXPECT_EQ(c.head_dim, 0);  // = hidden / heads: stored as derived
  EXPECT_EQ(c.ffn_size(), 8192);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.block_size, 131072);
  EXPECT_EQ(c.layer_norm_eps, 1e-5);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling, (RopeScaling{.type = "llama3",
                                         .factor = 32,
                                         .low_freq_factor = 1,
                                         .high_freq_factor = 4,
                                         .original_max_position_embeddings = 8192}));
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.mlp_bias);
  EXPECT_EQ(c.sliding_window, 0);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_id, 128001);
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.num_parameters(), 1'235'814'400);
  expect_same(c, TransformerConfig::preset("llama-1b"));

  // The instruct model's list of end tokens: the first is kept.
  EXPECT_EQ(import(with(llama32_1b(), "eos_token_id", {128001, 128008, 128009})).eos_token_id, 128001);
}

TEST(DecoderConfig, ImportsQwen25) {
  const TransformerConfig c = import(qwen25_05b());
  EXPECT_EQ(c.family, "qwen2");
  EXPECT_EQ(c.n_layer, 24);
  EXPECT_EQ(c.n_head, 14);
  EXPECT_EQ(c.kv_heads(), 2);
  EXPECT_EQ(c.head_size(), 64);
  EXPECT_EQ(c.ffn_size(), 4864);
  EXPECT_EQ(c.layer_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling, RopeScaling{});
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.sliding_window, 0);  // use_sliding_window false: sliding_window is not used
  EXPECT_FALSE(c.attention_bias);  // Qwen2's q/k/v biases are the family's, not this flag
  EXPECT_EQ(c.num_parameters(), 494'032'768);
  expect_same(c, TransformerConfig::preset("qwen2.5-0.5b"));
}

TEST(DecoderConfig, ImportsMistralAndTinyLlama) {
  const TransformerConfig m = import(mistral_7b());
  EXPECT_EQ(m.family, "mistral");
  EXPECT_EQ(m.kv_heads(), 8);
  EXPECT_EQ(m.head_size(), 128);
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_EQ(m.block_size, 32768);
  EXPECT_FALSE(m.tie_word_embeddings);
  EXPECT_EQ(m.bos_token_id, 1);
  EXPECT_EQ(m.eos_token_id, 2);
  EXPECT_EQ(m.num_parameters(), 7'241'732'096);
  // Mistral v0.2+: null = no window; absent = MistralConfig's default 4096.
  EXPECT_EQ(import(with(mistral_7b(), "sliding_window", nullptr)).sliding_window, 0);
  EXPECT_EQ(import(with(mistral_7b(), "sliding_window", kErase)).sliding_window, 4096);

  const TransformerConfig t = import(tinyllama());
  EXPECT_EQ(t.kv_heads(), 4);
  EXPECT_EQ(t.rope_scaling, RopeScaling{});
  EXPECT_FALSE(t.tie_word_embeddings);
  EXPECT_EQ(t.num_parameters(), 1'100'048'384);
}

// Absent fields take each family's transformers defaults.
TEST(DecoderConfig, FamilyDefaults) {
  json j = tinyllama();
  for (const char* k :
       {"num_key_value_heads", "rms_norm_eps", "rope_theta", "rope_scaling", "tie_word_embeddings",
        "bos_token_id", "eos_token_id", "hidden_act", "attention_bias", "architectures"})
    j.erase(k);
  TransformerConfig c = import(j);
  EXPECT_EQ(c.kv_heads(), 32);  // LlamaConfig: num_attention_heads
  EXPECT_EQ(c.layer_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  // Qwen2Config: 32 key/value heads, no bos/eos; a null count means one per query head.
  j["model_type"] = "qwen2";
  c = import(j);
  EXPECT_EQ(c.kv_heads(), 32);
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.eos_token_id, -1);
  // MistralConfig: 8 key/value heads, a 4096-token window.
  j["model_type"] = "mistral";
  c = import(j);
  EXPECT_EQ(c.kv_heads(), 8);
  EXPECT_EQ(c.sliding_window, 4096);
  j["num_key_value_heads"] = nullptr;
  EXPECT_EQ(import(j).kv_heads(), 32);
  // Ids outside the vocabulary do not matter to the math of these families (GPT-2 keeps its check).
  EXPECT_EQ(import(with(tinyllama(), "eos_token_id", 32000)).eos_token_id, 32000);
  EXPECT_EQ(import(with(tinyllama(), "bos_token_id", 99999)).bos_token_id, 99999);
  EXPECT_EQ(import(with(tinyllama(), "pad_token_id", 0)).pad_token_id, 0);
  // Fields that do not change the math.
  json extra = tinyllama();
  extra["dtype"] = "float32", extra["use_cache"] = false, extra["pad_token_id"] = nullptr;
  extra["_name_or_path"] = "x", extra["attention_dropout"] = 0;
  EXPECT_NO_THROW(import(extra));
}

// transformers 5 writes rope_parameters (with rope_theta inside), dtype, and Qwen2's layer_types.
TEST(DecoderConfig, ImportsTransformers5Form) {
  json j = llama32_1b();
  j.erase("rope_theta"), j.erase("rope_scaling"), j.erase("torch_dtype");
  j["dtype"] = "bfloat16";
  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                          {"factor", 32.0},          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  expect_same(import(j), import(llama32_1b()));
  // llama3 without original_max_position_embeddings: max_position_embeddings (transformers 5).
  j["rope_parameters"].erase("original_max_position_embeddings");
  EXPECT_EQ(import(j).rope_scaling.original_max_position_embeddings, 131072);
  // A non-empty rope_scaling replaces rope_parameters, its rope_theta included, as in transformers 5.
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(import(j).rope_scaling, (RopeScaling{.type = "linear", .factor = 2.0}));
  EXPECT_EQ(import(j).rope_theta, 10000.0);
  // The classic "type" spelling, and a default dict.
  json q = qwen25_05b();
  q["rope_scaling"] = {{"type", "linear"}, {"factor", 4}};
  EXPECT_EQ(import(q).rope_scaling, (RopeScaling{.type = "linear", .factor = 4.0}));
  q["rope_scaling"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  EXPECT_EQ(import(q).rope_scaling, RopeScaling{});
  q.erase("rope_scaling"), q.erase("rope_theta");
  q["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  q["layer_types"] = std::vector<std::string>(24, "full_attention");
  q["sliding_window"] = nullptr;
  expect_same(import(q), import(qwen25_05b()));
}

TEST(DecoderConfig, ExportRoundTrips) {
  std::vector<TransformerConfig> configs = {import(llama32_1b()), import(qwen25_05b()), import(mistral_7b()),
                                            import(tinyllama())};
  for (const char* p : {"llama-tiny", "llama-1b", "llama-8b", "qwen2.5-0.5b"})
    configs.push_back(TransformerConfig::preset(p));
  TransformerConfig odd = TransformerConfig::preset("llama-tiny");
  odd.n_embd = 64, odd.head_dim = 24, odd.attention_bias = true, odd.mlp_bias = true, odd.pad_token_id = 3;
  odd.rope_scaling = {.type = "linear", .factor = 2.0};
  configs.push_back(odd);
  TransformerConfig mq = import(with(mistral_7b(), "sliding_window", nullptr));
  mq.n_kv_head = 1, mq.head_dim = 96;
  configs.push_back(mq);
  for (const TransformerConfig& c : configs) {
    SCOPED_TRACE(c.family + " " + std::to_string(c.n_embd));
    const json out = c.to_hf_json();
    const TransformerConfig back = import(json::parse(out.dump()));
    expect_same(back, c);
    EXPECT_EQ(back.to_hf_json(), out);
    EXPECT_EQ(back.num_parameters(), c.num_parameters());
  }
  // The classic form transformers 4 and 5 both read; explicit nulls where absence means a default.
  const json l = TransformerConfig::preset("llama-1b").to_hf_json();
  EXPECT_EQ(l["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(l["rope_theta"], 500000.0);
  EXPECT_EQ(l["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(l["rope_scaling"]["original_max_position_embeddings"], 8192);
  EXPECT_EQ(l["head_dim"], 64);
  EXPECT_EQ(l["num_key_value_heads"], 8);
  EXPECT_EQ(l["tie_word_embeddings"], true);
  EXPECT_TRUE(l["pad_token_id"].is_null());
  const json q = TransformerConfig::preset("qwen2.5-0.5b").to_hf_json();
  EXPECT_EQ(q["architectures"], json::array({"Qwen2ForCausalLM"}));
  EXPECT_FALSE(q.contains("head_dim"));
  EXPECT_EQ(q["use_sliding_window"], false);
  EXPECT_TRUE(q["rope_scaling"].is_null());
  EXPECT_TRUE(mq.to_hf_json()["sliding_window"].is_null());
  EXPECT_EQ(odd.to_hf_json()["rope_scaling"],
            json({{"rope_type", "linear"}, {"type", "linear"}, {"factor", 2.0}}));
}

TEST(DecoderConfig, BadInputNamesFieldAndValue) {
  auto expect = [](const json& j, const std::string& needle) {
    const std::string msg = import_error(j);
    EXPECT_NE(msg.find(needle), std::string::npos) << "want '" << needle << "' in: '" << msg << "'";
    EXPECT_NE(msg.find("cfg.json"), std::string::npos) << msg;
  };
  for (const char* type : {"yarn", "dynamic", "longrope"})
    expect(with(llama32_1b(), "rope_scaling", {{"rope_type", type}, {"factor", 4.0}}),
           std::string("rope_scaling.rope_type '") + type + "' is not supported (default, linear, llama3)");
  expect(with(tinyllama(), "rope_parameters", {{"rope_type", "yarn"}, {"factor", 4.0}}),
         "rope_parameters.rope_type 'yarn' is not supported");
  expect(with(tinyllama(), "rope_scaling", {{"type", "linear"}, {"rope_type", "dynamic"}, {"factor", 2.0}}),
         "rope_scaling has type 'linear' and rope_type 'dynamic'");
  expect(with(tinyllama(), "rope_scaling", {{"rope_type", "linear"}}),
         "rope_scaling of rope_type 'linear' needs 'factor'");
  expect(with(tinyllama(), "rope_scaling", {{"rope_type", "linear"}, {"factor", "2"}}),
         "'rope_scaling.factor' must be a number, got \"2\"");
  expect(with(tinyllama(), "rope_scaling", {{"rope_type", "linear"}, {"factor", 0.5}}),
         "rope_scaling factor must be >= 1, got 0.5");
  json no_low = llama32_1b();
  no_low["rope_scaling"].erase("low_freq_factor");
  expect(no_low, "needs 'low_freq_factor'");
  json bad_band = llama32_1b();
  bad_band["rope_scaling"]["high_freq_factor"] = 1.0;
  expect(bad_band, "high_freq_factor (1) must be greater than low_freq_factor (1)");
  expect(with(tinyllama(), "rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 5e5}}),
         "rope_scaling.rope_theta 500000 disagrees with rope_theta 10000");
  expect(with(tinyllama(), "rope_scaling", "linear"),
         "field 'rope_scaling' must be an object (or null), got \"linear\"");
  expect(with(tinyllama(), "partial_rotary_factor", 0.5), "partial_rotary_factor = 0.5 is not supported");
  expect(with(tinyllama(), "rope_theta", -1.0), "rope_theta must be > 0, got -1");
  expect(with(mistral_7b(), "rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}),
         "rope_scaling type 'linear' is not supported by mistral");

  expect(with(tinyllama(), "architectures", {"LlamaModel"}),
         "architectures [\"LlamaModel\"] is not supported (llama: [\"LlamaForCausalLM\"])");
  expect(with(qwen25_05b(), "architectures", {"LlamaForCausalLM"}), "architectures [\"LlamaForCausalLM\"]");
  expect(with(tinyllama(), "model_type", "gemma"),
         "model_type 'gemma' is not supported (supported: gpt2, llama, qwen2, mistral, bert)");
  expect(with(tinyllama(), "hidden_act", "gelu"), "hidden_act 'gelu' is not supported (silu)");
  expect(with(tinyllama(), "pretraining_tp", 2), "pretraining_tp = 2 is not supported");
  expect(with(tinyllama(), "attention_dropout", 0.1), "attention_dropout = 0.1 is not supported");
  expect(with(tinyllama(), "quantization_config", {{"quant_method", "gptq"}}), "quantization_config");
  expect(with(qwen25_05b(), "use_sliding_window", true), "use_sliding_window = true is not supported");
  expect(with(qwen25_05b(), "use_mrope", true), "use_mrope = true is not supported");
  expect(with(qwen25_05b(), "layer_types", std::vector<std::string>(24, "sliding_attention")),
         "layer_types [\"sliding_attention\"");
  expect(with(qwen25_05b(), "head_dim", 128),
         "head_dim 128 is not supported by qwen2 (only n_embd / n_head = 64)");
  expect(with(mistral_7b(), "sliding_window", 0), "sliding_window must be >= 1 (or null: none), got 0");
  expect(with(tinyllama(), "num_key_value_heads", 5), "n_head (32) must be a multiple of n_kv_head (5)");
  expect(with(tinyllama(), "head_dim", 63), "head_dim 63 must be even");
  expect(with(tinyllama(), "hidden_size", 2050), "n_embd (2050) must be a multiple of n_head (32)");
  expect(with(tinyllama(), "num_hidden_layers", kErase), "missing field 'num_hidden_layers'");
  expect(with(tinyllama(), "intermediate_size", 0), "intermediate_size must be >= 1, got 0");
  expect(with(tinyllama(), "tie_word_embeddings", "yes"),
         "'tie_word_embeddings' must be true or false, got \"yes\"");
  expect(with(tinyllama(), "eos_token_id", "</s>"),
         "'eos_token_id' must be a token id (or null), got \"</s>\"");
  expect(with(tinyllama(), "pad_token_id", 32000),
         "pad_token_id 32000 is outside the vocabulary (size 32000");
  expect(with(tinyllama(), "rms_norm_eps", 0), "layer_norm_eps (rms_norm_eps) must be in (0, 1), got 0");
}

// validate(): each family's options only, and the fields of other families at their defaults.
TEST(DecoderConfig, ValidateKeepsFamiliesApart) {
  for (const std::string& name : TransformerConfig::preset_names())
    TransformerConfig::preset(name).validate();
  auto fails = [](TransformerConfig c, std::initializer_list<std::string> needles) {
    SCOPED_TRACE(*needles.begin());
    test::expect_error([&] { c.validate(); }, needles);
  };
  TransformerConfig g = TransformerConfig::preset("tiny");
  g.n_kv_head = 2;
  fails(g, {"n_kv_head 2 is not supported by gpt2"});
  g = TransformerConfig::preset("tiny");
  g.rope_scaling.type = "linear";
  fails(g, {"rope_scaling 'linear' is not supported by gpt2"});
  g = TransformerConfig::preset("tiny");
  g.tie_word_embeddings = false;
  fails(g, {"tie_word_embeddings false is not supported by gpt2"});
  g = TransformerConfig::preset("bert-tiny");
  g.sliding_window = 8;
  fails(g, {"sliding_window 8 is not supported by bert"});
  g = TransformerConfig::preset("tiny");
  g.eos_token_id = 256;
  fails(g, {"eos_token_id 256 is outside the vocabulary"});  // GPT-2 keeps its check

  const TransformerConfig base = TransformerConfig::preset("llama-tiny");
  TransformerConfig c = base;
  c.family = "qwen2";
  c.attention_bias = true;
  fails(c, {"attention_bias true is not supported by qwen2"});
  c = base, c.family = "mistral", c.mlp_bias = true;
  fails(c, {"mlp_bias true is not supported by mistral"});
  c = base, c.sliding_window = 16;
  fails(c, {"sliding_window 16 is not supported by llama (mistral)"});
  c = base, c.family = "mistral", c.sliding_window = -1;
  fails(c, {"sliding_window must be >= 0", "-1"});
  c = base, c.hidden_act = "gelu_new";
  fails(c, {"hidden_act 'gelu_new' is not supported by llama (silu)"});
  c = base, c.n_kv_head = 3;
  fails(c, {"n_head (4) must be a multiple of n_kv_head (3)"});
  c = base, c.head_dim = 7;
  fails(c, {"head_dim 7 must be even"});
  c = base, c.rope_scaling = {.type = "llama3", .factor = 8.0};
  fails(c, {"original_max_position_embeddings must be >= 1, got 0"});
  c = base, c.rope_scaling = {.type = "linear", .factor = 2.0, .original_max_position_embeddings = 64};
  fails(c, {"linear rope_scaling uses only factor"});
  c = base, c.rope_scaling = {.type = "", .factor = 2.0};
  fails(c, {"rope_scaling without a type must keep its defaults (factor 2)"});
  c = base, c.rope_scaling.type = "yarn";
  fails(c, {"rope_scaling type 'yarn' is not supported (none, linear, llama3)"});
  c = base, c.num_labels = 3;
  fails(c, {"num_labels 3"});
  c = base, c.hidden_dropout_prob = 0.0;
  fails(c, {"hidden_dropout_prob", "BERT's"});
  c = base, c.family = "t5";
  fails(c, {"family 't5' is not supported (supported: gpt2, llama, qwen2, mistral, bert)"});
  // Mistral may leave n_embd / n_head uneven when head_dim is explicit (Llama may not: transformers 5).
  c = base, c.family = "mistral", c.n_embd = 90, c.head_dim = 32;
  EXPECT_NO_THROW(c.validate());
  c.family = "llama";
  fails(c, {"n_embd (90) must be a multiple of n_head (4)"});
}

TEST(DecoderConfig, PresetsAndParameterCounts) {
  const TransformerConfig t = TransformerConfig::preset("llama-tiny");
  EXPECT_EQ(t.family, "llama");
  EXPECT_EQ(t.n_layer, 4);
  EXPECT_EQ(t.n_head, 4);
  EXPECT_EQ(t.kv_heads(), 2);
  EXPECT_EQ(t.n_embd, 128);
  EXPECT_FALSE(t.tie_word_embeddings);
  // 256 * 128 * 2 (untied) + 4 * (2 * 128 + q 128*128 + k, v 2 * 128*64 + o 128*128 + 3 * 128*384) + 128
  EXPECT_EQ(t.num_parameters(), 65536 + 4 * (256 + 16384 + 16384 + 16384 + 147456) + 128);
  // Biases: Qwen2's q, k, v; Llama's attention_bias (q, k, v, o) and mlp_bias (gate, up, down).
  TransformerConfig b = t;
  b.attention_bias = true, b.mlp_bias = true;
  EXPECT_EQ(b.num_parameters() - t.num_parameters(), 4 * ((128 + 64 + 64 + 128) + (384 + 384 + 128)));
  b = t, b.family = "qwen2";
  EXPECT_EQ(b.num_parameters() - t.num_parameters(), 4 * (128 + 64 + 64));
  b = t, b.tie_word_embeddings = true;
  EXPECT_EQ(t.num_parameters() - b.num_parameters(), 256 * 128);
  EXPECT_EQ(TransformerConfig::preset("llama-1b").num_parameters(), 1'235'814'400);
  EXPECT_EQ(TransformerConfig::preset("llama-8b").num_parameters(), 8'030'261'248);  // Llama-3.1-8B's
  EXPECT_EQ(TransformerConfig::preset("qwen2.5-0.5b").num_parameters(), 494'032'768);
  // GPT-2 and BERT counts unchanged.
  EXPECT_EQ(TransformerConfig::preset("d12").num_parameters(), 124'439'808);
  EXPECT_EQ(TransformerConfig::preset("bert-base").num_parameters(), 109'483'778);
  test::expect_error([] { TransformerConfig::preset("llama-7b"); },
                     {"llama-7b", "llama-tiny", "qwen2.5-0.5b"});
}

// --- RoPE inverse frequencies ---

TransformerConfig rope_config(int head_dim, double theta, RopeScaling s) {
  TransformerConfig c = TransformerConfig::preset("llama-tiny");
  c.n_embd = 4 * head_dim, c.n_head = 4, c.n_kv_head = 2, c.rope_theta = theta, c.rope_scaling = s;
  c.validate();
  return c;
}

// The formulas of rope.hpp in fp64.
std::vector<double> inv_freq_fp64(const TransformerConfig& c) {
  const int HS = c.head_size();
  const RopeScaling& r = c.rope_scaling;
  std::vector<double> inv;
  for (int i = 0; i < HS / 2; ++i) {
    double f = 1.0 / std::pow(c.rope_theta, 2.0 * i / HS);
    if (r.type == "linear") f /= r.factor;
    if (r.type == "llama3") {
      const double orig = r.original_max_position_embeddings, wavelen = 2 * std::numbers::pi / f;
      if (wavelen > orig / r.low_freq_factor) {
        f /= r.factor;
      } else if (wavelen >= orig / r.high_freq_factor) {
        const double s = (orig / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = (1 - s) * f / r.factor + s * f;
      }
    }
    inv.push_back(f);
  }
  return inv;
}

// Units in the last place between two floats (same sign).
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4), std::memcpy(&ib, &b, 4);
  return std::abs(int64_t(ia) - int64_t(ib));
}

void expect_near_fp64(const TransformerConfig& c) {
  const std::vector<float> got = rope_inv_freq(c);
  const std::vector<double> want = inv_freq_fp64(c);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 2e-6 * want[i]) << c.rope_scaling.type << " i=" << i;
}

TEST(Rope, DefaultFrequencies) {
  const TransformerConfig c = rope_config(64, 10000.0, {});
  expect_near_fp64(c);
  const std::vector<float> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 32u);
  // transformers' fp32 computation (numpy float32 in PyTorch's order of operations).
  const std::vector<std::pair<int, float>> hf = {{0, 1.0f},
                                                 {1, 0.7498942017555237f},
                                                 {7, 0.1333521455526352f},
                                                 {16, 0.009999999776482582f},
                                                 {31, 0.0001333521504420787f}};
  for (auto [i, v] : hf) EXPECT_LE(ulps(f[size_t(i)], v), 1) << i << ": " << f[size_t(i)] << " vs " << v;
  expect_near_fp64(rope_config(24, 500000.0, {}));
  expect_near_fp64(rope_config(128, 1e6, {}));
}

TEST(Rope, LinearFrequencies) {
  const TransformerConfig c = rope_config(24, 1e6, {.type = "linear", .factor = 2.0});
  expect_near_fp64(c);
  const std::vector<float> hf = {0.5f,
                                 0.15811388194561005f,
                                 0.04999999701976776f,
                                 0.015811389312148094f,
                                 0.004999999422580004f,
                                 0.0015811390476301312f,
                                 0.0005000000237487257f,
                                 0.0001581139222253114f,
                                 4.999998418497853e-05f,
                                 1.581138712936081e-05f,
                                 5.000001692678779e-06f,
                                 1.581138462825038e-06f};
  const std::vector<float> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), hf.size());
  for (size_t i = 0; i < hf.size(); ++i) EXPECT_LE(ulps(f[i], hf[i]), 1) << i;
  expect_near_fp64(rope_config(64, 10000.0, {.type = "linear", .factor = 8.0}));
}

TEST(Rope, Llama3Frequencies) {
  // Llama 3.2 1B: 15 high frequencies kept, 3 in the smoothed band, 14 divided by 32.
  const TransformerConfig c = TransformerConfig::preset("llama-1b");
  expect_near_fp64(c);
  const std::vector<float> hf = {1.0f,
                                 0.663601279258728f,
                                 0.44036662578582764f,
                                 0.2922278344631195f,
                                 0.193922758102417f,
                                 0.12868738174438477f,
                                 0.08539710193872452f,
                                 0.05666961893439293f,
                                 0.03760603070259094f,
                                 0.02495540864765644f,
                                 0.016560440883040428f,
                                 0.010989529080688953f,
                                 0.00729266507551074f,
                                 0.00483942124992609f,
                                 0.0032114461064338684f,
                                 0.0012905480107292533f,
                                 0.000429556705057621f,
                                 9.708286233944818e-05f,
                                 1.9461638657958247e-05f,
                                 1.291476746700937e-05f,
                                 8.570255886297673e-06f,
                                 5.687232260243036e-06f,
                                 3.7740544485131977e-06f,
                                 2.504467147446121e-06f,
                                 1.6619674170215148e-06f,
                                 1.1028836297555245e-06f,
                                 7.318749339901842e-07f,
                                 4.856731266045244e-07f,
                                 3.2229328894572973e-07f,
                                 2.1387423032592778e-07f,
                                 1.4192720243499934e-07f,
                                 9.418306490260875e-08f};
  const std::vector<float> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), hf.size());
  for (size_t i = 0; i < hf.size(); ++i) EXPECT_LE(ulps(f[i], hf[i]), 1) << i;
  const std::vector<float> plain = rope_inv_freq(rope_config(64, 500000.0, {}));
  EXPECT_EQ(f[14], plain[14]);                               // high band: unchanged
  EXPECT_FLOAT_EQ(f[20], plain[20] / 32);                    // low band: divided by factor
  EXPECT_TRUE(f[16] < plain[16] && f[16] > plain[16] / 32);  // the band between

  // The golden fixture's small model: head_dim 24, original context 64: all three bands.
  const TransformerConfig tiny = rope_config(24, 10000.0,
                                             {.type = "llama3",
                                              .factor = 4.0,
                                              .low_freq_factor = 1.0,
                                              .high_freq_factor = 4.0,
                                              .original_max_position_embeddings = 64});
  expect_near_fp64(tiny);
  const std::vector<float> hf_tiny = {1.0f,
                                      0.46415889263153076f,
                                      0.11819706857204437f,
                                      0.02546478994190693f,
                                      0.011603971011936665f,
                                      0.005386087112128735f,
                                      0.0024999999441206455f,
                                      0.0011603974271565676f,
                                      0.0005386085831560194f,
                                      0.0002500000118743628f,
                                      0.00011603973689489067f,
                                      5.386085467762314e-05f};
  const std::vector<float> ft = rope_inv_freq(tiny);
  ASSERT_EQ(ft.size(), hf_tiny.size());
  for (size_t i = 0; i < hf_tiny.size(); ++i) EXPECT_LE(ulps(ft[i], hf_tiny[i]), 1) << i;

  test::expect_error([] { rope_inv_freq(TransformerConfig::preset("tiny")); }, {"'gpt2'", "no rotary"});
}

}  // namespace
}  // namespace anvil
