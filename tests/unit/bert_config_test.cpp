// The BERT family of TransformerConfig (presets, parameter counts against Hugging Face's, config.json import
// and export, errors naming the field) and its parameter layout (Hugging Face names and shapes, the fused QKV
// adjacency, the unit conventions the optimizers' parameter groups rely on).
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/model_config.hpp"
#include "model/param_layout.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

// A config.json as transformers writes it for BertForSequenceClassification (bert-base-uncased, 3 labels).
json hf_bert_config() {
  return json::parse(R"({
    "_name_or_path": "bert-base-uncased",
    "architectures": ["BertForSequenceClassification"],
    "attention_probs_dropout_prob": 0.1,
    "classifier_dropout": null,
    "gradient_checkpointing": false,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "id2label": {"0": "negative", "1": "neutral", "2": "positive"},
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "label2id": {"negative": 0, "neutral": 1, "positive": 2},
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "model_type": "bert",
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "problem_type": "single_label_classification",
    "torch_dtype": "float32",
    "transformers_version": "4.44.0",
    "type_vocab_size": 2,
    "use_cache": true,
    "vocab_size": 30522
  })");
}

std::string import_error(const json& j) {
  try {
    TransformerConfig::from_hf_json(j, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(BertConfig, PresetsHaveHuggingFaceParameterCounts) {
  // BertForSequenceClassification(num_labels=2).num_parameters() for bert-base-uncased / bert-large-uncased.
  EXPECT_EQ(TransformerConfig::preset("bert-base").num_parameters(), 109'483'778);
  const TransformerConfig large = TransformerConfig::preset("bert-large");
  EXPECT_EQ(large.num_parameters(), 335'143'938);
  EXPECT_EQ(large.n_layer, 24);
  EXPECT_EQ(large.n_embd, 1024);
  EXPECT_EQ(large.n_head, 16);
  EXPECT_EQ(large.ffn_size(), 4096);
  EXPECT_EQ(large.vocab_size, 30522);
  EXPECT_EQ(large.block_size, 512);
  EXPECT_EQ(large.num_labels, 2);
  EXPECT_EQ(large.layer_norm_eps, 1e-12);
  EXPECT_TRUE(large.exact_gelu());
  EXPECT_FALSE(large.is_regression());
  for (const std::string& name : TransformerConfig::preset_names())
    TransformerConfig::preset(name).validate();
  // The layout holds exactly the parameters Hugging Face counts (no padded vocabulary rows for BERT).
  for (const char* name : {"bert-tiny", "bert-base"}) {
    const TransformerConfig c = TransformerConfig::preset(name);
    EXPECT_EQ(int64_t(ParamLayout::bert(c).total_numel()), c.num_parameters()) << name;
  }
  test::expect_error([] { TransformerConfig::preset("bert-huge"); }, {"bert-huge", "bert-large", "d12"});
}

TEST(BertConfig, ImportsHuggingFaceConfig) {
  const TransformerConfig c = TransformerConfig::from_hf_json(hf_bert_config(), "cfg.json");
  EXPECT_EQ(c.family, "bert");
  EXPECT_EQ(c.n_layer, 12);
  EXPECT_EQ(c.n_head, 12);
  EXPECT_EQ(c.n_embd, 768);
  EXPECT_EQ(c.ffn_size(), 3072);
  EXPECT_EQ(c.vocab_size, 30522);
  EXPECT_EQ(c.block_size, 512);
  EXPECT_EQ(c.type_vocab_size, 2);
  EXPECT_EQ(c.pad_token_id, 0);
  EXPECT_EQ(c.num_labels, 3);
  EXPECT_EQ(c.label_names, (std::vector<std::string>{"negative", "neutral", "positive"}));
  EXPECT_EQ(c.problem_type, "single_label_classification");
  EXPECT_EQ(c.layer_norm_eps, 1e-12);
  EXPECT_EQ(c.hidden_act, "gelu");

  // A BertModel config (no id2label): PretrainedConfig's default of 2 labels; an explicit num_labels wins
  // over id2label, as in transformers.
  json j = hf_bert_config();
  j.erase("id2label"), j.erase("label2id"), j.erase("problem_type");
  j["architectures"] = {"BertModel"};
  TransformerConfig m = TransformerConfig::from_hf_json(j, "cfg.json");
  EXPECT_EQ(m.num_labels, 2);
  EXPECT_TRUE(m.label_names.empty());
  j["num_labels"] = 1;
  m = TransformerConfig::from_hf_json(j, "cfg.json");
  EXPECT_EQ(m.num_labels, 1);
  EXPECT_TRUE(m.is_regression());
  // A null pad_token_id: no padding_idx.
  j["pad_token_id"] = nullptr;
  EXPECT_EQ(TransformerConfig::from_hf_json(j, "cfg.json").pad_token_id, -1);
}

TEST(BertConfig, ExportRoundTrips) {
  TransformerConfig c = TransformerConfig::from_hf_json(hf_bert_config(), "cfg.json");
  c.hidden_dropout_prob = 0.2;
  const json out = c.to_hf_json();
  EXPECT_EQ(out["model_type"], "bert");
  EXPECT_EQ(out["architectures"], json::array({"BertForSequenceClassification"}));
  EXPECT_EQ(out["id2label"]["2"], "positive");
  EXPECT_EQ(out["label2id"]["neutral"], 1);
  EXPECT_EQ(out["layer_norm_eps"], 1e-12);
  const TransformerConfig back = TransformerConfig::from_hf_json(json::parse(out.dump()), "exported");
  EXPECT_EQ(back.to_hf_json(), out);
  EXPECT_EQ(back.hidden_dropout_prob, 0.2);
  EXPECT_TRUE(out["classifier_dropout"].is_null());  // null: the classifier uses hidden_dropout_prob
  EXPECT_EQ(back.classifier_dropout_prob(), 0.2);
  c.classifier_dropout = 0.3;
  const TransformerConfig with_cls = TransformerConfig::from_hf_json(c.to_hf_json(), "exported");
  EXPECT_EQ(with_cls.classifier_dropout_prob(), 0.3);
  EXPECT_EQ(with_cls.to_hf_json()["classifier_dropout"], 0.3);
  // Default label names and no problem type.
  const json tiny = TransformerConfig::preset("bert-tiny").to_hf_json();
  EXPECT_EQ(tiny["id2label"], json({{"0", "LABEL_0"}, {"1", "LABEL_1"}}));
  EXPECT_TRUE(tiny["problem_type"].is_null());
  EXPECT_EQ(TransformerConfig::from_hf_json(tiny, "t").to_hf_json(), tiny);
}

TEST(BertConfig, BadInputNamesFieldAndValue) {
  auto with = [](const char* key, json v) {
    json j = hf_bert_config();
    if (v.is_discarded())
      j.erase(key);
    else
      j[key] = v;
    return j;
  };
  const json drop = json(json::value_t::discarded);
  EXPECT_NE(import_error(with("hidden_size", drop)).find("missing field 'hidden_size'"), std::string::npos);
  EXPECT_NE(import_error(with("num_hidden_layers", "12"))
                .find("'num_hidden_layers' must be an integer, got \"12\""),
            std::string::npos);
  EXPECT_NE(import_error(with("hidden_act", "relu")).find("hidden_act 'relu' is not supported"),
            std::string::npos);
  EXPECT_NE(
      import_error(with("hidden_size", 770)).find("n_embd (770) must be a positive multiple of n_head (12)"),
      std::string::npos);
  EXPECT_NE(
      import_error(with("position_embedding_type", "relative_key")).find("'relative_key' is not supported"),
      std::string::npos);
  EXPECT_NE(
      import_error(with("problem_type", "multi_label_classification")).find("multi_label_classification"),
      std::string::npos);
  EXPECT_NE(import_error(with("problem_type", "regression")).find("'regression' needs num_labels 1, got 3"),
            std::string::npos);
  EXPECT_NE(import_error(with("id2label", json{{"0", "a"}, {"x", "b"}})).find("id2label key 'x'"),
            std::string::npos);
  EXPECT_NE(import_error(with("layer_norm_eps", "tiny")).find("'layer_norm_eps' must be a number"),
            std::string::npos);
  EXPECT_NE(import_error(with("layer_norm_eps", -1.0)).find("layer_norm_eps must be in (0, 1), got -1"),
            std::string::npos);
  EXPECT_NE(import_error(with("pad_token_id", 30522)).find("pad_token_id 30522 is outside the vocabulary"),
            std::string::npos);
  EXPECT_NE(import_error(with("is_decoder", true)).find("is_decoder = true is not supported"),
            std::string::npos);
  EXPECT_NE(import_error(with("model_type", "roberta"))
                .find("model_type 'roberta' is not supported (supported: gpt2, llama, qwen2, mistral, bert)"),
            std::string::npos);
  EXPECT_NE(import_error(with("type_vocab_size", 0)).find("type_vocab_size must be >= 1, got 0"),
            std::string::npos);
  EXPECT_NE(
      import_error(with("hidden_dropout_prob", 1.0)).find("hidden_dropout_prob must be in [0, 1), got 1"),
      std::string::npos);
  EXPECT_NE(import_error(with("attention_probs_dropout_prob", -0.1))
                .find("attention_probs_dropout_prob must be in [0, 1), got -0.1"),
            std::string::npos);
  EXPECT_NE(import_error(with("classifier_dropout", 1.5)).find("classifier_dropout must be in [0, 1)"),
            std::string::npos);
}

// GPT-2 configs keep their behaviour: the encoder fields must stay at GPT-2's values, and a BERT config
// cannot be built as a decoder (or the other way round).
TEST(BertConfig, FamiliesStayApart) {
  TransformerConfig g = TransformerConfig::preset("tiny");
  g.validate();
  EXPECT_EQ(g.to_hf_json()["model_type"], "gpt2");
  g.layer_norm_eps = 1e-12;
  test::expect_error([&] { g.validate(); }, {"layer_norm_eps", "gpt2"});
  g = TransformerConfig::preset("tiny");
  g.hidden_act = "gelu";
  test::expect_error([&] { g.validate(); }, {"hidden_act 'gelu'", "gpt2"});
  g = TransformerConfig::preset("tiny");
  g.intermediate_size = 100;
  test::expect_error([&] { g.validate(); }, {"intermediate_size 100"});
  test::expect_error([] { ParamLayout::decoder(TransformerConfig::preset("bert-tiny")); },
                     {"'bert'", "not a decoder"});
  test::expect_error([] { ParamLayout::bert(TransformerConfig::preset("tiny")); }, {"'gpt2'", "BERT"});
  g = TransformerConfig::preset("tiny");
  g.family = "t5";
  test::expect_error([&] { g.validate(); },
                     {"family 't5' is not supported (supported: gpt2, llama, qwen2, mistral, bert)"});
}

// Every tensor of BertForSequenceClassification.named_parameters(), with Hugging Face's shapes.
std::map<std::string, std::vector<int64_t>> hf_bert_parameters(const TransformerConfig& c) {
  const int64_t C = c.n_embd, F = c.ffn_size();
  std::map<std::string, std::vector<int64_t>> p = {
      {"bert.embeddings.word_embeddings.weight", {c.vocab_size, C}},
      {"bert.embeddings.position_embeddings.weight", {c.block_size, C}},
      {"bert.embeddings.token_type_embeddings.weight", {c.type_vocab_size, C}},
      {"bert.embeddings.LayerNorm.weight", {C}},
      {"bert.embeddings.LayerNorm.bias", {C}},
      {"bert.pooler.dense.weight", {C, C}},
      {"bert.pooler.dense.bias", {C}},
      {"classifier.weight", {c.num_labels, C}},
      {"classifier.bias", {c.num_labels}}};
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string l = "bert.encoder.layer." + std::to_string(i) + ".";
    for (const char* m :
         {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"})
      p[l + m + ".weight"] = {C, C}, p[l + m + ".bias"] = {C};
    p[l + "attention.output.LayerNorm.weight"] = {C};
    p[l + "attention.output.LayerNorm.bias"] = {C};
    p[l + "intermediate.dense.weight"] = {F, C};
    p[l + "intermediate.dense.bias"] = {F};
    p[l + "output.dense.weight"] = {C, F};
    p[l + "output.dense.bias"] = {C};
    p[l + "output.LayerNorm.weight"] = {C};
    p[l + "output.LayerNorm.bias"] = {C};
  }
  return p;
}

TEST(BertLayout, HuggingFaceNamesShapesAndUnits) {
  TransformerConfig c = TransformerConfig::preset("bert-tiny");
  c.n_layer = 3, c.intermediate_size = 80, c.num_labels = 5, c.type_vocab_size = 3;
  const ParamLayout l = ParamLayout::bert(c);
  std::map<std::string, std::vector<int64_t>> got;
  size_t expect_offset = 0;
  for (const ParamTensor& t : l.tensors()) {
    EXPECT_EQ(t.offset, expect_offset) << t.name;  // contiguous, in layout order
    expect_offset += t.numel();
    EXPECT_FALSE(t.hf_transposed) << t.name;
    got[t.name] = {t.shape.dims.begin(), t.shape.dims.begin() + t.shape.ndim};
  }
  EXPECT_EQ(got, hf_bert_parameters(c));
  EXPECT_EQ(l.total_numel(), expect_offset);

  // Units: embedding, block.0..L-1, final; contiguous; decayed tensors (matrices, embeddings) first and
  // exactly those; no-decay = biases and LayerNorm parameters.
  ASSERT_EQ(l.units().size(), size_t(c.n_layer + 2));
  EXPECT_EQ(l.units().front().name, "embedding");
  EXPECT_EQ(l.units()[1].name, "block.0");
  EXPECT_EQ(l.units().back().name, "final");
  size_t unit_offset = 0;
  for (const ParamUnit& u : l.units()) {
    EXPECT_EQ(u.offset, unit_offset) << u.name;
    unit_offset += u.numel;
    size_t decayed = 0;
    for (size_t ti : u.tensors) {
      const ParamTensor& t = l.tensors()[ti];
      const bool no_decay = t.name.ends_with(".bias") || t.name.find("LayerNorm") != std::string::npos;
      EXPECT_EQ(t.decay, !no_decay) << t.name;
      if (t.decay) {
        EXPECT_EQ(t.offset, u.offset + decayed) << t.name;
        decayed += t.numel();
      }
    }
    EXPECT_EQ(u.decay_numel, decayed) << u.name;
  }
  // Query, key, value: one [3C, C] matrix and one [3C] bias.
  const int64_t C = c.n_embd;
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string p = "bert.encoder.layer." + std::to_string(i) + ".attention.self.";
    const size_t q = l.get(p + "query.weight").offset, qb = l.get(p + "query.bias").offset;
    EXPECT_EQ(l.get(p + "key.weight").offset, q + C * C);
    EXPECT_EQ(l.get(p + "value.weight").offset, q + 2 * C * C);
    EXPECT_EQ(l.get(p + "key.bias").offset, qb + C);
    EXPECT_EQ(l.get(p + "value.bias").offset, qb + 2 * C);
  }
}

}  // namespace
}  // namespace anvil
