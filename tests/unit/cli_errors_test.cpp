// Bad input through the `anvil` command: one clear message naming the file/field/value, a non-zero
// exit code, and no partial output left behind.
#include <fmt/format.h>
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
  // The summary states its units.
  for (const char* needle : {"Samples/second", "  Time: ", " s\n", "data wait: ", "memory occupied: ",
                             " MiB.\n", "allocator peak: ", " MiB (plan: "})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
}

TEST_F(CliErrors, MissingConfigFile) {
  expect_failure("train --config " + (dir / "none.json"),
                 "--config " + (dir / "none.json") + ": no such file");
}

TEST_F(CliErrors, ConfigIsADirectory) {
  expect_failure("train --config " + dir.str(),
                 "--config " + dir.str() + ": is a directory; give a JSON config file");
}

// Command-line errors: exit status 1 and exactly one line, `error: ...`.
void expect_one_line_error(const std::string& args, const std::string& message) {
  const test::CommandResult r = test::run_anvil(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
  EXPECT_EQ(r.output, "error: " + message + "\n") << args;
}

TEST_F(CliErrors, UnknownFlagSuggestsTheNearest) {
  expect_one_line_error("train --learing_rate 3e-4",
                        "unknown flag --learing_rate (did you mean --learning_rate?)");
  expect_one_line_error(
      "estimate --per_device_train_batch_sise=4",
      "unknown flag --per_device_train_batch_sise (did you mean --per_device_train_batch_size?)");
  expect_one_line_error("generate --checkpoint x --top-k 3", "unknown flag --top-k (did you mean --top_k?)");
  expect_one_line_error("train --zzzzzzzz",
                        "unknown flag --zzzzzzzz; run 'anvil train --help' for the flags");
  expect_one_line_error("train stray", "unexpected argument 'stray'; run 'anvil train --help' for the flags");
}

// Found by fuzz_train_flags: an argument holding a newline made the error two lines.
TEST_F(CliErrors, ControlCharactersInArgumentsAreEscaped) {
  const test::CommandResult r = test::run_anvil("train '--le\nring_rate' 3");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(r.output.starts_with("error: unknown flag --le\\nring_rate")) << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << r.output;
}

// Found by fuzz_train_flags: a flag of dashes alone before '=' threw std::out_of_range.
TEST_F(CliErrors, FlagWithoutAName) {
  expect_one_line_error("train --=3", "unknown flag --; run 'anvil train --help' for the flags");
}

// Found by fuzz_train_flags: a flag value that is not UTF-8 escaped as nlohmann's type_error.
TEST_F(CliErrors, FlagValueThatIsNotUtf8) {
  expect_one_line_error("train --fp16=$(printf 'a\\217b')", "--fp16: the value is not valid UTF-8 text");
}

TEST_F(CliErrors, UnknownCommandSuggestsTheNearest) {
  expect_one_line_error("trian", "unknown command 'trian' (did you mean 'train'?)");
  expect_one_line_error(
      "--max_steps 3",
      "unknown flag --max_steps: flags go after a command (anvil COMMAND --flags); run 'anvil "
      "--help' for the commands");
}

TEST_F(CliErrors, ValuesAreCheckedWithoutNumericLimits) {
  expect_one_line_error("generate --checkpoint x --top_k -3",
                        "--top_k must be a non-negative integer, got -3");
  expect_one_line_error("generate --checkpoint x --temperature -1",
                        "--temperature must be a non-negative number, got -1");
  expect_one_line_error("generate --checkpoint x --max_new_tokens abc",
                        "--max_new_tokens must be a non-negative integer, got abc");
  expect_one_line_error("generate --checkpoint x --seed -1", "--seed must be a non-negative integer, got -1");
  expect_one_line_error("prepare-data --input x --output y --val_fraction lots",
                        "--val_fraction must be a number, got lots");
  expect_one_line_error("train --learning_rate", "--learning_rate needs a value");
  expect_one_line_error("generate --top_k 3", "--checkpoint is required");
}

TEST_F(CliErrors, BadFlagValueIsBlamedOnTheFlag) {
  test::write_file(dir / "c.json", "{\"max_steps\": 2}");
  expect_one_line_error(base + " --config " + (dir / "c.json") + " --learning_rate abc",
                        "--learning_rate must be a number, got \"abc\"");
  expect_one_line_error(base + " --config " + (dir / "c.json") + " --fp16 maybe",
                        "--fp16 must be true or false, got \"maybe\"");
  expect_one_line_error(base + " --max_steps 2.5", "--max_steps must be an integer, got 2.5");
  expect_one_line_error(base + " --init_from a --model_name_or_path b",
                        "--init_from and --model_name_or_path name the same setting; give one");
  // The same value in the file is blamed on the file.
  test::write_file(dir / "bad.json", "{\"learning_rate\": \"abc\"}");
  expect_one_line_error(base + " --config " + (dir / "bad.json"),
                        dir / "bad.json" + ": 'learning_rate' must be a number, got a string (\"abc\")");
  EXPECT_FALSE(fs::exists(out()));
}

TEST_F(CliErrors, BareBooleanFlags) {
  // Given alone, before another flag or at the end of the line, a boolean flag means true.
  const std::string estimate =
      "estimate --device cpu --model '{\"n_layer\":1,\"n_head\":2,\"n_embd\":16,\"block_size\":16}' --json";
  test::CommandResult r =
      test::run_anvil(estimate + " --gradient_checkpointing --per_device_train_batch_size 2 --bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"checkpointing\": \"full\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"precision\": \"bf16\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\"micro_batch\": 2"), std::string::npos) << r.output;
  r = test::run_anvil(estimate + " --gradient_checkpointing false");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"checkpointing\": \"none\""), std::string::npos) << r.output;
}

TEST_F(CliErrors, HelpAndCommandList) {
  for (const std::string& args : {std::string(""), std::string("--help")}) {
    const test::CommandResult r = test::run_anvil(args);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("Commands:"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("  train "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("  estimate "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("train a model"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("config-reference"), std::string::npos) << "a hidden command is listed:\n"
                                                                    << r.output;
  }
  const test::CommandResult train = test::run_anvil("train --help");
  EXPECT_EQ(train.exit_code, 0);
  EXPECT_EQ(train.output.find("debug_inject_overflow_steps"), std::string::npos) << "a test hook is listed";
  // The test hook is still accepted.
  EXPECT_EQ(test::run_anvil(base + " --fp16 --debug_inject_overflow_steps 1").exit_code, 0);
  const test::CommandResult generate = test::run_anvil("generate --help");
  EXPECT_EQ(generate.exit_code, 0);
  EXPECT_NE(generate.output.find("(default: 40)"), std::string::npos) << generate.output;
  EXPECT_NE(generate.output.find("(default: \\n)"), std::string::npos) << generate.output;
}

TEST_F(CliErrors, UnknownConfigKey) {
  test::write_file(dir / "c.json", "{\"per_device_train_batch_sise\": 4}");
  expect_failure("train --config " + (dir / "c.json"), "did you mean 'per_device_train_batch_size'");
}

TEST_F(CliErrors, BadValueOnTheCommandLine) {
  expect_failure(base + " --learning_rate -3", "--learning_rate must be in [0, 10), got -3");
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

TEST_F(CliErrors, GenerateWithAnotherVocabularyIsRefused) {
  ASSERT_EQ(test::run_anvil(with_data(dir / "data/train.bin", dir / "ok")).exit_code, 0);
  const std::string ck = dir / "ok/checkpoint-2";  // a byte-level model: vocabulary 256
  std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n";
  for (int i = 0; i < 300; ++i) vocab += fmt::format("w{}\n", i);
  test::write_file(dir / "vocab.txt", vocab);
  const std::string gen = "generate --device cpu --max_new_tokens 4 --checkpoint " + ck;
  EXPECT_EQ(test::run_anvil(gen + " --prompt ab").exit_code, 0);
  const test::CommandResult r = test::run_anvil(gen + " --prompt w1 --tokenizer " + (dir / "vocab.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("has 304 tokens but the model in " + ck + " has a vocabulary of 256"),
            std::string::npos)
      << r.output;
}

TEST_F(CliErrors, GenerateFromMissingCheckpoint) {
  const test::CommandResult r =
      test::run_anvil("generate --checkpoint " + (dir / "nowhere") + " --device cpu");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("nowhere"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace anvil
