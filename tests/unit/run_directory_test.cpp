// The run directory (issue 27, "nothing lost, nothing mixed"): one run at a time per output_dir (a lock
// naming the holder's pid), no fresh run mixing with an earlier one's files unless overwrite_output_dir,
// save_total_limit rotation, leftovers of interrupted saves cleaned and never loaded, failed metrics writes
// stopping the run, and the error of a failed run written beside its metrics and last checkpoint.
#include "train/run_directory.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "anvil/trainer.hpp"
#include "io/checkpoint.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json small_json(const test::ByteCorpus& c, const std::string& out) {
  return {{"model", {{"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}, {"vocab_size", 256}, {"block_size", 16}}},
          {"train_data", c.dir / "data/train.bin"},
          {"per_device_train_batch_size", 2},
          {"max_steps", 2},
          {"learning_rate", 1e-3},
          {"logging_steps", 1},
          {"device", "cpu"},
          {"seed", 3},
          {"output_dir", out}};
}

TrainConfig small_config(const test::ByteCorpus& c, const std::string& out) {
  return TrainConfig::from_json(small_json(c, out), "test");
}

// The train() call, with its progress lines kept out of the test log.
TrainSummary quiet_train(const TrainConfig& cfg) {
  return test::quietly([&] { return train(cfg); });
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<int64_t> metric_steps(const std::string& path) {
  std::vector<int64_t> steps;
  std::istringstream in(test::read_file(path));
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.contains("loss")) steps.push_back(j["step"].get<int64_t>());
  }
  return steps;
}

TEST(OutputDirLock, ASecondHolderIsRefusedWithThePidOfTheFirst) {
  test::TempDir dir;
  {
    OutputDirLock held(dir.str());
    EXPECT_EQ(test::read_file(dir / ".anvil.lock"), std::to_string(::getpid()) + "\n");
    test::expect_error([&] { OutputDirLock second(dir.str()); },
                       {"output_dir " + dir.str() + " is in use by another anvil run (pid " +
                            std::to_string(::getpid()) + ")",
                        "wait for it or choose another --output_dir"});
  }
  EXPECT_FALSE(fs::exists(dir / ".anvil.lock"));  // released and removed
  OutputDirLock again(dir.str());
}

// A second `anvil train` into a directory a run holds fails at once, naming the holder, and writes nothing
// there.
TEST(RunDirectory, TrainIntoALockedOutputDirFailsNamingTheHolder) {
  test::ByteCorpus c(20000);
  const std::string out = c.dir / "out";
  fs::create_directories(out);
  OutputDirLock held(out);
  const test::CommandResult r = test::run_anvil(
      "train --device cpu --model '{\"n_layer\":1,\"n_head\":2,\"n_embd\":16,\"block_size\":16}' "
      "--per_device_train_batch_size 2 --max_steps 2 --output_dir " +
      out + " --train_data " + (c.dir / "data/train.bin"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("is in use by another anvil run (pid " + std::to_string(::getpid()) + ")"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(entries(out), std::vector<std::string>{".anvil.lock"});
}

TEST(RunDirectory, FreshRunIntoAnEarlierRunsOutputsIsRefusedUnlessOverwrite) {
  test::ByteCorpus c(20000);
  const std::string out = c.dir / "out";
  TrainConfig first = small_config(c, out);
  first.max_steps = 4;
  first.save_steps = 2;
  quiet_train(first);
  ASSERT_TRUE(fs::exists(out + "/checkpoint-4"));

  TrainConfig second = small_config(c, out);
  test::expect_error([&] { quiet_train(second); },
                     {"output_dir '" + out +
                          "' holds the outputs of an earlier run (checkpoint-2, checkpoint-4, "
                          "metrics.jsonl, summary.json, train_config.json)",
                      "--resume_from_checkpoint", "--overwrite_output_dir"});
  EXPECT_EQ(metric_steps(out + "/metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4}));  // untouched

  // --overwrite_output_dir deletes the earlier run's outputs first: nothing of it is left to mix with.
  second.overwrite_output_dir = true;
  quiet_train(second);
  EXPECT_EQ(entries(out),
            (std::vector<std::string>{"checkpoint-2", "metrics.jsonl", "summary.json", "train_config.json"}));
  EXPECT_EQ(metric_steps(out + "/metrics.jsonl"), (std::vector<int64_t>{1, 2}));

  // ... but never the checkpoint the new run starts from.
  TrainConfig third = small_config(c, out);
  third.overwrite_output_dir = true;
  third.init_from = out + "/checkpoint-2";
  test::expect_error([&] { quiet_train(third); },
                     {"init_from '" + out + "/checkpoint-2' is part of the earlier run in output_dir",
                      "copy it elsewhere first"});
  EXPECT_TRUE(fs::exists(out + "/checkpoint-2/model.safetensors"));
}

TEST(RunDirectory, SaveTotalLimitKeepsTheNewestCheckpoints) {
  test::ByteCorpus c(20000);
  TrainConfig cfg = small_config(c, c.dir / "out");
  cfg.max_steps = 5;
  cfg.save_steps = 1;
  cfg.save_total_limit = 2;
  const TrainSummary s = quiet_train(cfg);
  EXPECT_EQ(s.last_checkpoint, c.dir / "out/checkpoint-5");
  EXPECT_EQ(entries(c.dir / "out"), (std::vector<std::string>{"checkpoint-4", "checkpoint-5", "metrics.jsonl",
                                                              "summary.json", "train_config.json"}));
}

// A save killed before its rename leaves checkpoint-N.tmp-<pid>: the next run in that output_dir removes it,
// and nothing loads it meanwhile.
TEST(RunDirectory, LeftoversOfInterruptedSavesAreRemovedAndNeverLoaded) {
  test::ByteCorpus c(20000);
  TrainConfig cfg = small_config(c, c.dir / "a");
  quiet_train(cfg);
  const std::string leftover = c.dir / "out/checkpoint-7.tmp-4194301";
  fs::create_directories(c.dir / "out");
  fs::copy(c.dir / "a/checkpoint-2", leftover);

  test::expect_error([&] { io::read_model_config(leftover); },
                     {"'" + leftover + "' is an incomplete checkpoint left by an interrupted save",
                      "use '" + (c.dir / "out/checkpoint-7") + "' instead"});
  test::expect_error([&] { io::read_trainer_state(leftover + "/"); }, {"incomplete checkpoint"});
  const test::CommandResult r =
      test::run_anvil("generate --device cpu --max_new_tokens 2 --checkpoint " + leftover);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("is an incomplete checkpoint left by an interrupted save"), std::string::npos)
      << r.output;
  TrainConfig from_leftover = small_config(c, c.dir / "b");
  from_leftover.init_from = leftover;
  test::expect_error([&] { quiet_train(from_leftover); }, {"incomplete checkpoint"});
  EXPECT_FALSE(fs::exists(c.dir / "b"));  // a start-up error leaves nothing behind

  cfg.output_dir = c.dir / "out";
  quiet_train(cfg);
  EXPECT_FALSE(fs::exists(leftover));
  EXPECT_EQ(entries(c.dir / "out"),
            (std::vector<std::string>{"checkpoint-2", "metrics.jsonl", "summary.json", "train_config.json"}));
}

// A save killed between moving the previous checkpoint-N aside and renaming the new one into place leaves
// only checkpoint-N.old-<pid>, which is complete: the next run puts it back.
TEST(RunDirectory, ACheckpointMovedAsideByAnInterruptedSaveIsRestored) {
  test::ByteCorpus c(20000);
  TrainConfig cfg = small_config(c, c.dir / "out");
  cfg.max_steps = 4;
  cfg.save_steps = 2;
  quiet_train(cfg);
  fs::rename(c.dir / "out/checkpoint-4", c.dir / "out/checkpoint-4.old-4194302");
  TrainConfig resumed = cfg;
  resumed.resume_from_checkpoint = c.dir / "out/checkpoint-2";
  resumed.max_steps = 3;
  resumed.save_steps = 0;
  quiet_train(resumed);
  EXPECT_TRUE(fs::exists(c.dir / "out/checkpoint-4/trainer_state.json"));
  EXPECT_FALSE(fs::exists(c.dir / "out/checkpoint-4.old-4194302"));
  // The resumed run's metrics continue the checkpoint's: the steps after it, logged by the run that went on
  // to step 4, are replaced rather than mixed in.
  EXPECT_EQ(metric_steps(c.dir / "out/metrics.jsonl"), (std::vector<int64_t>{1, 2, 3}));
}

// An error after start-up (here a non-finite gradient at step 3) leaves metrics up to the failure, the last
// good checkpoint and the error in error.txt.
TEST(RunDirectory, AFailedRunLeavesItsErrorBesideMetricsAndLastCheckpoint) {
  test::ByteCorpus c(20000);
  TrainConfig cfg = small_config(c, c.dir / "out");
  cfg.max_steps = 5;
  cfg.save_steps = 2;
  cfg.debug_inject_overflow_steps = {3};
  test::expect_error([&] { quiet_train(cfg); }, {"step 3: the loss"});
  const std::string error = test::read_file(c.dir / "out/error.txt");
  EXPECT_NE(error.find("step 3: the loss ("), std::string::npos) << error;
  EXPECT_EQ(metric_steps(c.dir / "out/metrics.jsonl"), (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(fs::exists(c.dir / "out/checkpoint-2/model.safetensors"));
  EXPECT_FALSE(fs::exists(c.dir / "out/summary.json"));

  // Resuming from that checkpoint completes the run; the earlier attempt's error goes.
  cfg.debug_inject_overflow_steps.clear();
  cfg.resume_from_checkpoint = c.dir / "out/checkpoint-2";
  quiet_train(cfg);
  EXPECT_FALSE(fs::exists(c.dir / "out/error.txt"));
  EXPECT_EQ(metric_steps(c.dir / "out/metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

// A metrics write that fails (here: metrics.jsonl is /dev/full, a device that is always full) stops the run
// with an error naming the file, instead of training on without metrics.
TEST(RunDirectory, AFailedMetricsWriteStopsTheRun) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  test::ByteCorpus c(20000);
  TrainConfig cfg = small_config(c, c.dir / "out");
  cfg.max_steps = 4;
  cfg.save_steps = 2;
  quiet_train(cfg);
  fs::remove(c.dir / "out/metrics.jsonl");
  fs::create_symlink("/dev/full", c.dir / "out/metrics.jsonl");
  cfg.resume_from_checkpoint = c.dir / "out/checkpoint-2";
  cfg.save_steps = 1;
  test::expect_error([&] { quiet_train(cfg); }, {c.dir / "out/metrics.jsonl",
                                                 "cannot write a metrics record (No space left on device)"});
  EXPECT_TRUE(fs::exists("/dev/full"));
  // Nothing of step 3 was saved; the checkpoints before it are as they were.
  EXPECT_TRUE(fs::exists(c.dir / "out/checkpoint-2/model.safetensors"));
  EXPECT_TRUE(fs::exists(c.dir / "out/checkpoint-4/model.safetensors"));
  EXPECT_FALSE(fs::exists(c.dir / "out/checkpoint-3"));
  const std::string error = test::read_file(c.dir / "out/error.txt");
  EXPECT_NE(error.find("cannot write a metrics record"), std::string::npos) << error;
}

}  // namespace
}  // namespace anvil
