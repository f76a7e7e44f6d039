// Bad input through the `anvil` command: one clear message naming the file/field/value, a non-zero
// exit code, and no partial output left behind.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "data/byte_corpus.hpp"
#include "data/token_shard.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;

class CliErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    test::write_file(dir / "corpus.txt", test::small_corpus(20000));
    data::prepare_byte_corpus({dir / "corpus.txt"}, dir / "data", 0.1);
    model =
        "train --device cpu --model '{\"n_layer\":1,\"n_head\":2,\"n_embd\":16,\"block_size\":16}' "
        "--per_device_train_batch_size 2 --max_steps 2 ";
    base = with_data(dir / "data/train.bin");
  }
  // A small valid command line training on `train_data`, writing into out().
  std::string with_data(const std::string& train_data, const std::string& out_dir = "") const {
    return model + "--output_dir " + (out_dir.empty() ? out() : out_dir) + " --train_data " + train_data;
  }
  std::string out() const { return dir / "out"; }
  void expect_failure(const std::string& args, const std::string& needle) {
    const test::CommandResult r = test::run_anvil(args);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.output;
    EXPECT_FALSE(fs::exists(out())) << "partial output left behind for: " << args;
  }
  test::TempDir dir;
  std::string model, base;
};

TEST_F(CliErrors, GoodRunSucceeds) {
  const test::CommandResult r = test::run_anvil(base);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Samples/second"), std::string::npos) << r.output;
}

TEST_F(CliErrors, MissingConfigFile) {
  expect_failure("train --config " + (dir / "none.json"), "none.json");
}

TEST_F(CliErrors, UnknownConfigKey) {
  test::write_file(dir / "c.json", "{\"per_device_train_batch_sise\": 4}");
  expect_failure("train --config " + (dir / "c.json"), "did you mean 'per_device_train_batch_size'");
}

TEST_F(CliErrors, BadValueOnTheCommandLine) {
  expect_failure(base + " --learning_rate -3", "learning_rate");
}

TEST_F(CliErrors, MissingTrainData) {
  expect_failure(with_data(dir / "nothing.bin"), "nothing.bin");
}

TEST_F(CliErrors, TokenFileWithBadMagic) {
  std::string bytes = test::read_file(dir / "data/train.bin");
  std::memcpy(bytes.data(), "NOTTOKEN", 8);
  test::write_file(dir / "bad.bin", bytes);
  expect_failure(with_data(dir / "bad.bin"), "bad.bin");
}

TEST_F(CliErrors, TruncatedTokenFile) {
  std::string bytes = test::read_file(dir / "data/train.bin");
  test::write_file(dir / "short.bin", bytes.substr(0, bytes.size() - 7));
  expect_failure(with_data(dir / "short.bin"), "short.bin");
}

TEST_F(CliErrors, TokenIdsOutsideTheModelVocabulary) {
  std::vector<uint32_t> toks(4000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = uint32_t(i % 300);
  data::write_token_shard(dir / "big_vocab.bin", toks, 300);
  expect_failure(with_data(dir / "big_vocab.bin"), "vocab_size is 256");
}

TEST_F(CliErrors, TruncatedSafetensorsCheckpoint) {
  ASSERT_EQ(test::run_anvil(with_data(dir / "data/train.bin", dir / "ok")).exit_code, 0);
  const std::string ck = dir / "ok/checkpoint-2";
  std::string st = test::read_file(ck + "/model.safetensors");
  test::write_file(ck + "/model.safetensors", st.substr(0, st.size() / 2));
  expect_failure(base + " --init_from " + ck, "model.safetensors");
}

TEST_F(CliErrors, CheckpointShapesDisagreeWithConfig) {
  ASSERT_EQ(test::run_anvil(with_data(dir / "data/train.bin", dir / "ok")).exit_code, 0);
  const std::string ck = dir / "ok/checkpoint-2";
  std::string cfg = test::read_file(ck + "/config.json");
  const size_t pos = cfg.find("\"n_embd\": 16");
  ASSERT_NE(pos, std::string::npos) << cfg;
  cfg.replace(pos, 12, "\"n_embd\": 32");
  test::write_file(ck + "/config.json", cfg);
  expect_failure(base + " --init_from " + ck, "has shape");
}

TEST_F(CliErrors, ResumeFromSomethingThatIsNotACheckpoint) {
  fs::create_directories(dir / "empty");
  expect_failure(base + " --resume_from_checkpoint " + (dir / "empty"), "trainer_state.json");
}

TEST_F(CliErrors, GenerateFromMissingCheckpoint) {
  const test::CommandResult r =
      test::run_anvil("generate --checkpoint " + (dir / "nowhere") + " --device cpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("nowhere"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace anvil
