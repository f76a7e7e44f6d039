// What a run is told must agree with what it continues: a resume refuses explicitly given keys that
// contradict the checkpoint (its shape, tokenizer, data order), and token shards must have the vocabulary
// of the run's tokenizer.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "anvil/trainer.hpp"
#include "data/token_shard.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

class ResumeCheck : public ::testing::Test {
 protected:
  // A 1-layer run of 2 steps into `a`, checkpointed at step 2.
  void SetUp() override {
    base = {
        {"model", {{"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}, {"vocab_size", 256}, {"block_size", 16}}},
        {"train_data", c.dir / "data/train.bin"},
        {"per_device_train_batch_size", 2},
        {"gradient_accumulation_steps", 1},
        {"max_steps", 2},
        {"seed", 3},
        {"device", "cpu"},
        {"output_dir", c.dir / "a"}};
    run(base);
    resume = base;
    resume["output_dir"] = c.dir / "b";
    resume["resume_from_checkpoint"] = checkpoint();
    resume["max_steps"] = 3;
  }
  std::string checkpoint() const { return c.dir / "a/checkpoint-2"; }
  static TrainSummary run(const json& j) {
    const TrainConfig cfg = TrainConfig::from_json(j, "test.json");
    return test::quietly([&] { return train(cfg); });
  }
  void expect_refused(const json& j, std::initializer_list<std::string> needles) {
    test::expect_error([&] { run(j); }, needles);
    EXPECT_FALSE(fs::exists(c.dir / "b")) << "a refused resume wrote its output_dir";
  }

  test::ByteCorpus c{20000};
  json base, resume;
};

TEST_F(ResumeCheck, LegitimateChangesAreAllowed) {
  json j = resume;
  j["max_steps"] = 4;
  j["save_steps"] = 1;
  j["logging_steps"] = 2;
  j["eval_steps"] = 1;
  j["learning_rate"] = 1e-4;
  EXPECT_EQ(run(j).global_step, 4);
}

TEST_F(ResumeCheck, AModelOfAnotherShapeIsRefused) {
  json j = resume;
  j["model"]["n_layer"] = 2;
  j["model"]["n_embd"] = 32;
  expect_refused(
      j, {"resume_from_checkpoint '" + checkpoint() + "': model is a shape (n_layer 2, n_embd 32)",
          "(set by test.json) but the checkpoint has n_layer 1, n_embd 16 (" + checkpoint() + "/config.json)",
          "leave model unset", "--init_from"});
}

TEST_F(ResumeCheck, APresetOfAnotherShapeOnTheCommandLineIsRefused) {
  const test::CommandResult r = test::run_anvil(
      "train --device cpu --model d12 --train_data " + (c.dir / "data/train.bin") + " --output_dir " +
      (c.dir / "b") + " --max_steps 3 --resume_from_checkpoint " + checkpoint());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("model is 'd12' (n_layer 12, n_head 12, n_embd 768"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(set by --model) but the checkpoint has n_layer 1, n_head 2, n_embd 16"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(c.dir / "b"));
}

TEST_F(ResumeCheck, SettingsThatFixTheDataOrderAreRefused) {
  json j = resume;
  j["seed"] = 4;
  expect_refused(
      j, {"seed is 4 (set by test.json) but the checkpoint has 3 (" + checkpoint() + "/trainer_state.json)"});
  j = resume;
  j["per_device_train_batch_size"] = 4;
  expect_refused(j, {"per_device_train_batch_size is 4", "but the checkpoint has 2"});
  j = resume;
  j["gradient_accumulation_steps"] = 2;
  expect_refused(j, {"gradient_accumulation_steps is 2", "but the checkpoint has 1"});
  j = resume;
  j["max_seq_length"] = 8;
  expect_refused(j, {"max_seq_length is 8", "but the checkpoint has 16"});
  j = resume;
  j["init_from"] = checkpoint();
  expect_refused(j, {"init_from is '" + checkpoint() + "'", "but the checkpoint has none"});
  // The same values again (as a reused config file gives them) are fine.
  j = resume;
  j["max_seq_length"] = 16;
  EXPECT_EQ(run(j).global_step, 3);
}

TEST_F(ResumeCheck, AnotherTokenizerIsRefused) {
  json j = resume;
  j["tokenizer"] = "bytes";  // what the checkpoint was trained with: fine
  j["output_dir"] = c.dir / "bytes";
  EXPECT_EQ(run(j).global_step, 3);
  test::write_file(c.dir / "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n");
  j = resume;
  j["tokenizer"] = c.dir / "vocab.txt";
  expect_refused(
      j, {"tokenizer is '" + (c.dir / "vocab.txt") + "'", "but the checkpoint has the byte tokenizer"});
}

// A 300-token WordPiece vocabulary: more ids than bytes, so byte-level shards fit a model sized by it and
// trained on silently before the check.
std::string write_vocab(const test::TempDir& dir) {
  std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n";
  for (int i = 0; i < 295; ++i) vocab += fmt::format("w{}\n", i);
  test::write_file(dir / "vocab.txt", vocab);
  return dir / "vocab.txt";
}

TEST(TokenizerData, ShardsOfAnotherVocabularyAreRefused) {
  test::ByteCorpus c(20000);  // byte-level shards: vocabulary 256
  const std::string vocab = write_vocab(c.dir);
  json j = {{"model", {{"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}, {"block_size", 16}}},
            {"tokenizer", vocab},
            {"train_data", c.dir / "data/train.bin"},
            {"per_device_train_batch_size", 2},
            {"max_steps", 2},
            {"device", "cpu"},
            {"output_dir", c.dir / "out"}};
  const auto train_json = [](const json& cfg) {
    test::quietly([&] { return train(TrainConfig::from_json(cfg, "test")); });
  };
  test::expect_error([&] { train_json(j); }, {"train_data '" + (c.dir / "data/train.bin") +
                                                  "' was prepared with a vocabulary of 256 tokens",
                                              "the run's tokenizer '" + vocab + "' has 300"});

  // Train data of the tokenizer's vocabulary, validation data of another.
  std::vector<uint32_t> ids(4000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = uint32_t(i * 7 % 300);
  data::write_token_shard(c.dir / "train300.bin", ids, 300);
  j["train_data"] = c.dir / "train300.bin";
  j["val_data"] = c.dir / "data/val.bin";
  test::expect_error([&] { train_json(j); }, {"val_data '" + (c.dir / "data/val.bin") +
                                              "' was prepared with a vocabulary of 256 tokens"});
  EXPECT_FALSE(fs::exists(c.dir / "out"));

  // Matching data trains; the checkpoint carries the tokenizer, which a run from it checks the data against.
  j.erase("val_data");
  train_json(j);
  json k = j;
  k.erase("tokenizer");
  k.erase("model");
  k["init_from"] = c.dir / "out/checkpoint-2";
  k["output_dir"] = c.dir / "out2";
  k["train_data"] = c.dir / "data/train.bin";
  k["max_seq_length"] = 16;  // (the default follows the config's model, not the checkpoint's)
  test::expect_error([&] { train_json(k); },
                     {"was prepared with a vocabulary of 256 tokens", "out/checkpoint-2/vocab.txt' has 300"});
}

}  // namespace
}  // namespace anvil
