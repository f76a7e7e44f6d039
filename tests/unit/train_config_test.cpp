#include "anvil/train_config.hpp"

#include <gtest/gtest.h>

#include <set>

#include "anvil/error.hpp"
#include "precision/loss_scaler.hpp"
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
  // Whole numbers written as floats count, but not ones beyond int64 (the fuzzer's 3.3e116 was undefined
  // behaviour when cast), nor unsigned values that would wrap.
  e = error_of({{"per_device_train_batch_size", 3.28889e116}});
  EXPECT_NE(e.find("'per_device_train_batch_size' must be an integer"), std::string::npos) << e;
  e = error_of({{"max_steps", uint64_t(18446744073709551615ull)}});
  EXPECT_NE(e.find("'max_steps' must be an integer"), std::string::npos) << e;
  e = error_of({{"max_steps", 2.5}});
  EXPECT_NE(e.find("'max_steps' must be an integer"), std::string::npos) << e;
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

TEST(TrainConfig, EveryKeyIsWrittenAndRoundTrips) {
  const json defaults = TrainConfig().to_json();
  std::set<std::string> written;
  for (const auto& [k, _] : defaults.items()) written.insert(k);
  const std::vector<std::string> keys = TrainConfig::keys();
  EXPECT_EQ(written, std::set<std::string>(keys.begin(), keys.end()));
  // Non-default values of the precision keys survive to_json -> from_json.
  const json j = {{"fp16", true},
                  {"tf32", true},
                  {"loss_scale", 0},
                  {"initial_scale_power", 12},
                  {"loss_scale_window", 50},
                  {"hysteresis", 3},
                  {"consecutive_hysteresis", true},
                  {"min_loss_scale", 0.25},
                  {"max_overflows_at_min_scale", 7},
                  {"grad_accum_dtype", "fp16"},
                  {"debug_inject_overflow_steps", {5, 3, 4}}};
  const TrainConfig c = TrainConfig::from_json(j, "x");
  EXPECT_TRUE(c.fp16);
  EXPECT_FALSE(c.bf16);
  EXPECT_EQ(c.precision(), "fp16");
  EXPECT_EQ(c.debug_inject_overflow_steps, (std::vector<int64_t>{3, 4, 5}));
  const TrainConfig d = TrainConfig::from_json(c.to_json(), "y");
  EXPECT_EQ(d.to_json(), c.to_json());
  for (const auto& [k, v] : j.items())
    EXPECT_EQ(c.to_json()[k], k == "debug_inject_overflow_steps" ? json({3, 4, 5}) : v) << k;
  const TrainConfig b = TrainConfig::from_json(
      {{"bf16", true}, {"stochastic_rounding", true}, {"grad_accum_dtype", "bf16"}}, "x");
  EXPECT_EQ(b.precision(), "bf16");
  EXPECT_EQ(TrainConfig::from_json(b.to_json(), "y").to_json(), b.to_json());
}

TEST(TrainConfig, LossScalerSettings) {
  const TrainConfig def;
  EXPECT_FALSE(def.fp16);
  EXPECT_FALSE(def.bf16);
  EXPECT_EQ(def.precision(), "fp32");
  EXPECT_EQ(def.grad_accum_dtype, "fp32");
  const LossScalerConfig d = def.loss_scaler();
  EXPECT_EQ(d.loss_scale, 0);
  EXPECT_EQ(d.initial_scale_power, 16);
  EXPECT_EQ(d.loss_scale_window, 1000);
  EXPECT_EQ(d.hysteresis, 2);
  EXPECT_FALSE(d.consecutive_hysteresis);
  EXPECT_EQ(d.min_loss_scale, 1);
  EXPECT_EQ(d.max_overflows_at_min_scale, 20);
  const TrainConfig c = TrainConfig::from_json({{"fp16", true},
                                                {"loss_scale", 512},
                                                {"initial_scale_power", 10},
                                                {"loss_scale_window", 7},
                                                {"hysteresis", 4},
                                                {"consecutive_hysteresis", true},
                                                {"min_loss_scale", 2},
                                                {"max_overflows_at_min_scale", 3}},
                                               "x");
  const LossScalerConfig l = c.loss_scaler();
  EXPECT_EQ(l.loss_scale, 512);
  EXPECT_EQ(l.initial_scale_power, 10);
  EXPECT_EQ(l.loss_scale_window, 7);
  EXPECT_EQ(l.hysteresis, 4);
  EXPECT_TRUE(l.consecutive_hysteresis);
  EXPECT_EQ(l.min_loss_scale, 2);
  EXPECT_EQ(l.max_overflows_at_min_scale, 3);
  EXPECT_EQ(LossScaler(l).scale(), 512);
}

TEST(TrainConfig, PrecisionErrorsNameKeysAndValues) {
  auto has = [](const json& j, std::initializer_list<std::string> needles) {
    const std::string e = error_of(j);
    EXPECT_NE(e.find("cfg.json"), std::string::npos) << e;
    for (const auto& n : needles) EXPECT_NE(e.find(n), std::string::npos) << e;
  };
  has({{"fp16", true}, {"bf16", true}}, {"fp16 and bf16 are both true"});
  has({{"stochastic_rounding", true}}, {"stochastic_rounding", "bf16", "fp32"});
  has({{"stochastic_rounding", true}, {"fp16", true}}, {"stochastic_rounding", "fp16"});
  has({{"grad_accum_dtype", "fp8"}}, {"grad_accum_dtype", "'fp8'"});
  has({{"grad_accum_dtype", "bf16"}}, {"grad_accum_dtype 'bf16' needs bf16 true", "precision is fp32"});
  has({{"grad_accum_dtype", "fp16"}, {"bf16", true}}, {"grad_accum_dtype 'fp16' needs fp16 true", "bf16"});
  has({{"communication_data_type", "int8"}}, {"communication_data_type", "'int8'"});
  has({{"backward_grad_dtype", "bf16"}}, {"backward_grad_dtype 'bf16'", "the precision is fp32"});
  has({{"backward_grad_dtype", "fp16"}, {"bf16", true}, {"zero_stage", 2}},
      {"backward_grad_dtype 'fp16'", "bf16"});
  has({{"backward_grad_dtype", "bf16"}, {"bf16", true}, {"zero_stage", 1}},
      {"backward_grad_dtype 'bf16'", "zero_stage 1", "set zero_stage 2", "grad_accum_dtype bf16"});
  has({{"fp16", true}, {"loss_scale", -1}}, {"loss_scale", "-1"});
  has({{"initial_scale_power", 64}}, {"initial_scale_power", "64"});
  has({{"loss_scale_window", 0}}, {"loss_scale_window", "got 0"});
  has({{"hysteresis", 0}}, {"hysteresis must be >= 1", "got 0"});
  has({{"max_eval_batches", -1}}, {"max_eval_batches must be >= 0 (0: the default)", "got -1"});
  has({{"save_strategy", "epoch"}}, {"save_strategy must be steps or no", "'epoch'"});
  has({{"min_loss_scale", 0}}, {"min_loss_scale must be > 0", "got 0"});
  has({{"max_overflows_at_min_scale", 0}}, {"max_overflows_at_min_scale", "got 0"});
  has({{"hysteresis", 1e12}}, {"'hysteresis' is out of range", "1000000000000"});
  has({{"fp16", "yes"}}, {"'fp16' must be true or false", "\"yes\""});
  has({{"debug_inject_overflow_steps", {3}}}, {"debug_inject_overflow_steps needs fp16"});
  has({{"fp16", true}, {"debug_inject_overflow_steps", {0}}}, {"debug_inject_overflow_steps", "got 0"});
  has({{"fp16", true}, {"debug_inject_overflow_steps", {"a"}}}, {"debug_inject_overflow_steps", "\"a\""});
  has({{"fp16", true}, {"debug_inject_overflow_steps", true}}, {"debug_inject_overflow_steps", "array"});
}

TEST(TrainConfig, InjectedOverflowStepsFromTheCommandLine) {
  json j = json::object();
  set_config_override(j, "fp16", "true");
  set_config_override(j, "debug_inject_overflow_steps", "5,3,4,3");
  EXPECT_EQ(TrainConfig::from_json(j, "flags").debug_inject_overflow_steps, (std::vector<int64_t>{3, 4, 5}));
  set_config_override(j, "debug_inject_overflow_steps", "7");
  EXPECT_EQ(TrainConfig::from_json(j, "flags").debug_inject_overflow_steps, (std::vector<int64_t>{7}));
  set_config_override(j, "debug_inject_overflow_steps", "3,,4");
  EXPECT_NE(error_of(j).find("bad item \"\""), std::string::npos) << error_of(j);
  set_config_override(j, "debug_inject_overflow_steps", "3,x");
  EXPECT_NE(error_of(j).find("(e.g. 3,4,5), got \"3,x\""), std::string::npos) << error_of(j);
}

// Every boolean key is also a bare flag (`--fp16` means `--fp16 true`); `--fp16 false` still works.
TEST(TrainConfig, BooleanKeysAreBareFlags) {
  test::TempDir dir;
  const std::string base = "estimate --device cpu --output_dir " + (dir / "out") + " ";
  auto r = test::run_anvil(base + "--fp16 --bf16");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("fp16 and bf16 are both true"), std::string::npos) << r.output;
  r = test::run_anvil(base + "--stochastic_rounding --fp16");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("stochastic_rounding"), std::string::npos) << r.output;
  r = test::run_anvil(base + "--fp16 false --bf16 --tf32 --stochastic_rounding");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = test::run_anvil(base + "--fp16 true --bf16 false --debug_inject_overflow_steps 2,3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace anvil
