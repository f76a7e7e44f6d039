#include "anvil/train_config.hpp"

#include <gtest/gtest.h>

#include "anvil/error.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

std::string error_of(const json& j) {
  try {
    TrainConfig::from_json(j, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainConfig, DefaultsAndPresets) {
  const TrainConfig c = TrainConfig::from_json({{"model", "d12"}, {"max_seq_length", 256}}, "x");
  EXPECT_EQ(c.model.n_layer, 12);
  EXPECT_EQ(c.model.vocab_size, 50257);
  EXPECT_EQ(c.model.padded_vocab_size(), 50304);
  EXPECT_EQ(c.seq_len(), 256);
  EXPECT_EQ(c.tokens_per_step(), 8 * 256);
  EXPECT_EQ(c.lr_scheduler_type, "linear");
}

TEST(TrainConfig, ExplicitModelShape) {
  const TrainConfig c = TrainConfig::from_json(
      {{"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"block_size", 64}}}}, "x");
  EXPECT_EQ(c.model.n_embd, 32);
  EXPECT_EQ(c.seq_len(), 64);
  EXPECT_TRUE(c.model_preset.empty());
  // Round trip through to_json.
  const TrainConfig d = TrainConfig::from_json(c.to_json(), "y");
  EXPECT_EQ(d.to_json(), c.to_json());
}

TEST(TrainConfig, UnknownKeySuggestsNearest) {
  const std::string e = error_of({{"learnig_rate", 0.1}});
  EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key 'learnig_rate'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'learning_rate'"), std::string::npos) << e;
  const std::string m = error_of({{"model", {{"n_layers", 2}}}});
  EXPECT_NE(m.find("model.n_layers"), std::string::npos) << m;
  EXPECT_NE(m.find("model.n_layer'"), std::string::npos) << m;
}

TEST(TrainConfig, WrongTypesNameTheKeyAndValue) {
  std::string e = error_of({{"per_device_train_batch_size", "eight"}});
  EXPECT_NE(e.find("'per_device_train_batch_size' must be an integer"), std::string::npos) << e;
  EXPECT_NE(e.find("\"eight\""), std::string::npos) << e;
  e = error_of({{"tf32", 1}});
  EXPECT_NE(e.find("'tf32' must be true or false"), std::string::npos) << e;
  e = error_of({{"learning_rate", "fast"}});
  EXPECT_NE(e.find("'learning_rate' must be a number"), std::string::npos) << e;
}

TEST(TrainConfig, OutOfRangeValues) {
  EXPECT_NE(error_of({{"per_device_train_batch_size", 0}}).find("per_device_train_batch_size must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of({{"learning_rate", -1.0}}).find("learning_rate"), std::string::npos);
  EXPECT_NE(error_of({{"adam_beta2", 1.0}}).find("adam_beta2"), std::string::npos);
  EXPECT_NE(error_of({{"max_seq_length", 4096}}).find("block_size 128"), std::string::npos);
  EXPECT_NE(error_of({{"lr_scheduler_type", "polynomial"}}).find("'polynomial'"), std::string::npos);
  EXPECT_NE(error_of({{"device", "tpu"}}).find("'tpu'"), std::string::npos);
  EXPECT_NE(error_of({{"model", "d13"}}).find("unknown model preset 'd13'"), std::string::npos);
  EXPECT_NE(error_of({{"model", {{"n_embd", 30}, {"n_head", 4}}}}).find("n_embd (30)"), std::string::npos);
  EXPECT_NE(error_of(json::array()).find("must be a JSON object"), std::string::npos);
}

TEST(TrainConfig, CommandLineOverridesAreTyped) {
  json j = json::object();
  set_config_override(j, "learning_rate", "3e-4");
  set_config_override(j, "max_steps", "12");
  set_config_override(j, "tf32", "true");
  set_config_override(j, "output_dir", "runs/x");
  EXPECT_TRUE(j["learning_rate"].is_number_float());
  EXPECT_TRUE(j["max_steps"].is_number_integer());
  EXPECT_TRUE(j["tf32"].is_boolean());
  EXPECT_TRUE(j["output_dir"].is_string());
  const TrainConfig c = TrainConfig::from_json(j, "flags");
  EXPECT_DOUBLE_EQ(c.learning_rate, 3e-4);
  EXPECT_EQ(c.max_steps, 12);
  EXPECT_TRUE(c.tf32);
}

TEST(TrainConfig, MissingOrMalformedFile) {
  test::TempDir dir;
  try {
    TrainConfig::from_file(dir / "nope.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.json"), std::string::npos);
  }
  test::write_file(dir / "bad.json", "{ \"max_steps\": 3, ");
  try {
    TrainConfig::from_file(dir / "bad.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.json: not valid JSON"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace anvil
