// trainer_state.json is validated field by field (io::parse_trainer_state): a negative or fractional step, a
// negative loader position, a missing field or arbitrary bytes are errors naming the file and the field,
// never a resume from a nonsense state (or a crash: the parser is a fuzz target's entry point).
#include <gtest/gtest.h>

#include <string>

#include "anvil/trainer.hpp"
#include "io/checkpoint.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;
using io::parse_trainer_state;

json valid_state() {
  return {{"global_step", 10},
          {"total_steps", 20},
          {"loader", {{"epoch", 0}, {"batch", 10}}},
          {"rng_state", 18446744073709551557ull},
          {"train_loss_sum", 31.5},
          {"train_loss_steps", 10},
          {"config", {{"seed", 5}}}};
}

void expect_invalid(const std::string& text, std::initializer_list<std::string> needles) {
  test::expect_error([&] { parse_trainer_state(text, "ck/trainer_state.json"); }, needles);
}

TEST(TrainerState, ParsesAValidState) {
  const io::TrainerState s = parse_trainer_state(valid_state().dump(), "ck/trainer_state.json");
  EXPECT_EQ(s.global_step, 10);
  EXPECT_EQ(s.total_steps, 20);
  EXPECT_EQ(s.loader_epoch, 0u);
  EXPECT_EQ(s.loader_batch, 10u);
  EXPECT_EQ(s.rng_state, 18446744073709551557ull);
  EXPECT_EQ(s.train_loss_sum, 31.5);
  EXPECT_EQ(s.train_loss_steps, 10);
  EXPECT_TRUE(s.loss_scaler.is_null());
  EXPECT_EQ(s.config["seed"], 5);
}

TEST(TrainerState, BadFieldsAreErrorsNamingTheFileAndField) {
  const auto with = [](const char* key, const json& v) {
    json j = valid_state();
    j[key] = v;
    return j.dump();
  };
  expect_invalid(with("global_step", -5),
                 {"ck/trainer_state.json: 'global_step' must be an integer >= 0", "-5"});
  expect_invalid(with("global_step", 2.5),
                 {"ck/trainer_state.json: 'global_step' must be an integer", "2.5"});
  expect_invalid(with("global_step", "10"), {"'global_step' must be an integer", "\"10\""});
  expect_invalid(with("global_step", 18446744073709551615ull), {"'global_step'", "<= 9223372036854775807"});
  expect_invalid(with("total_steps", 5), {"'total_steps' (5) is below 'global_step' (10)"});
  expect_invalid(with("loader", {{"epoch", 0}, {"batch", -1}}),
                 {"ck/trainer_state.json: 'loader.batch'", "-1"});
  expect_invalid(with("loader", {{"epoch", -2}, {"batch", 1}}), {"'loader.epoch'", "-2"});
  expect_invalid(with("loader", {{"epoch", 0}}), {"the field 'loader.batch' is missing"});
  expect_invalid(with("loader", json::array()), {"'loader' must be an object"});
  expect_invalid(with("rng_state", -1), {"'rng_state' must be an integer >= 0"});
  expect_invalid(with("train_loss_sum", "x"), {"'train_loss_sum' must be a finite number"});
  expect_invalid(with("train_loss_steps", -3), {"'train_loss_steps'", "-3"});
  expect_invalid(with("loss_scaler", 3), {"'loss_scaler' must be an object"});
  expect_invalid(with("config", "tiny"), {"'config' must be an object"});
  json no_step = valid_state();
  no_step.erase("global_step");
  expect_invalid(no_step.dump(), {"ck/trainer_state.json: the field 'global_step' is missing"});
}

TEST(TrainerState, ArbitraryBytesAreErrorsNotCrashes) {
  expect_invalid("", {"ck/trainer_state.json: not valid JSON"});
  expect_invalid("{\"global_step\": 1", {"ck/trainer_state.json: not valid JSON"});
  expect_invalid(std::string("\xff\xfe{}", 4), {"ck/trainer_state.json: not valid JSON"});
  expect_invalid("[1, 2]", {"ck/trainer_state.json: must be a JSON object, got an array"});
  expect_invalid("12", {"must be a JSON object, got 12"});
  expect_invalid(std::string(200000, '['), {"not valid JSON"});
  expect_invalid("{\"global_step\": " + std::string(100000, '[') + std::string(100000, ']') + "}",
                 {"'global_step' must be an integer >= 0, got an array"});
  expect_invalid("{\"global_step\": 1e400}", {"not valid JSON"});
}

// Resuming from a checkpoint whose state says step -5 is refused before anything runs.
TEST(TrainerState, ResumeFromANegativeStepIsRefused) {
  test::ByteCorpus c(20000);
  json j = {{"model", {{"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}, {"block_size", 16}}},
            {"train_data", c.dir / "data/train.bin"},
            {"per_device_train_batch_size", 2},
            {"max_steps", 2},
            {"device", "cpu"},
            {"output_dir", c.dir / "a"}};
  ::testing::internal::CaptureStdout();
  train(TrainConfig::from_json(j, "test"));
  ::testing::internal::GetCapturedStdout();
  const std::string state_path = c.dir / "a/checkpoint-2/trainer_state.json";
  json state = json::parse(test::read_file(state_path));
  state["global_step"] = -5;
  test::write_file(state_path, state.dump());
  j["output_dir"] = c.dir / "b";
  j["resume_from_checkpoint"] = c.dir / "a/checkpoint-2";
  test::expect_error([&] { train(TrainConfig::from_json(j, "test")); },
                     {state_path + ": 'global_step' must be an integer >= 0, got -5"});
}

}  // namespace
}  // namespace anvil
