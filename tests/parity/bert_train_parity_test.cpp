// BERT classification training on the GPU through the trainer: batches of different padded lengths with CUDA
// graphs (one graph per input slot and batch shape) compute what eager execution computes, and the CUDA run
// follows the CPU run, with dropout 0.1 (the same masks on both backends; graph replays draw each step's). A
// learnable task on a small shard (label: does token 7 occur?), fp32 and bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "anvil/trainer.hpp"
#include "data/classification_shard.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// A directory under the system temp dir, removed at the end.
struct ScratchDir {
  fs::path path =
      fs::temp_directory_path() / ("anvil_bert_train_parity_" + std::to_string(std::random_device{}()));
  ScratchDir() { fs::create_directories(path); }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& rel) const { return (path / rel).string(); }
};

// `n` examples of 3..60 tokens (ids 8..63 between [CLS] = 2 and [SEP] = 3), label 1 when token 7 occurs (half
// of them), written as a 2-label classification shard.
void write_task(const std::string& path, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint32_t>> examples;
  std::vector<int32_t> labels;
  for (int i = 0; i < n; ++i) {
    const int len = 1 + int(rng() % 58);
    std::vector<uint32_t> ids = {2};
    for (int k = 0; k < len; ++k) ids.push_back(8 + rng() % 56);
    const bool positive = rng() % 2;
    if (positive) ids[1 + rng() % size_t(len)] = 7;
    ids.push_back(3);
    examples.push_back(ids);
    labels.push_back(positive ? 1 : 0);
  }
  data::write_classification_shard(path, 64, 64, {"absent", "present"}, examples, labels);
}

std::vector<double> losses(const std::string& out) {
  std::vector<double> l;
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.contains("loss")) l.push_back(j["loss"].get<double>());
  }
  return l;
}

TrainSummary run(const ScratchDir& d, const std::string& name, const std::string& device, bool graphs,
                 bool bf16, int batch = 8, int accumulation = 2, double dropout = 0.1,
                 const std::string& fp32_matmul = "fp32") {
  const json j = {{"model",
                   {{"family", "bert"},
                    {"vocab_size", 64},
                    {"block_size", 64},
                    {"hidden_dropout_prob", dropout},
                    {"attention_probs_dropout_prob", dropout}}},
                  {"train_data", d / "train.cls"},
                  {"val_data", d / "val.cls"},
                  {"per_device_train_batch_size", batch},
                  {"gradient_accumulation_steps", accumulation},
                  {"max_steps", 100},
                  {"learning_rate", 2e-3},
                  {"warmup_steps", 10},
                  {"logging_steps", 1},
                  {"eval_steps", 100},
                  {"max_eval_batches", 100},
                  {"device", device},
                  {"cuda_graphs", graphs},
                  {"bf16", bf16},
                  {"fp32_matmul", fp32_matmul},
                  {"seed", 3},
                  {"output_dir", d / name}};
  return train(TrainConfig::from_json(j, "test"));
}

TEST(BertTrainParity, GraphsPerShapeMatchEagerAndTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  ScratchDir d;
  write_task(d / "train.cls", 640, 1);
  write_task(d / "val.cls", 128, 2);
  const TrainSummary eager = run(d, "eager", "cuda", false, false);
  const TrainSummary graphs = run(d, "graphs", "cuda", true, false);
  const TrainSummary cpu = run(d, "cpu", "cpu", false, false);
  const std::vector<double> le = losses(d / "eager"), lg = losses(d / "graphs"), lc = losses(d / "cpu");
  ASSERT_EQ(le.size(), 100u);
  ASSERT_EQ(lg.size(), 100u);
  ASSERT_EQ(lc.size(), 100u);
  // The first step's micro-batches run eagerly in both runs: the same computation.
  EXPECT_EQ(lg[0], le[0]);
  for (size_t i = 0; i < le.size(); ++i) {
    // Replays differ from eager only where backward kernels reduce with atomics (the last bits of the
    // gradients), which the optimizer carries into later steps.
    EXPECT_NEAR(lg[i], le[i], 1e-4 * (1 + std::abs(le[i]))) << "step " << i + 1;
    EXPECT_NEAR(le[i], lc[i], 2e-3 * (1 + std::abs(lc[i]))) << "step " << i + 1;
  }
  EXPECT_NEAR(graphs.eval_loss, eager.eval_loss, 1e-3);
  EXPECT_NEAR(eager.eval_accuracy, cpu.eval_accuracy, 0.02);
  EXPECT_GT(graphs.eval_accuracy, 0.95) << "the task is learnt in 100 steps (on the CPU: accuracy 1.0)";
  // bf16 with graphs trains too.
  const TrainSummary half = run(d, "bf16", "cuda", true, true);
  EXPECT_TRUE(std::isfinite(half.train_loss));
  EXPECT_GT(half.eval_accuracy, 0.7);
}

// fp32_matmul 3xtf32 (fp32 GEMMs on the TF32 tensor cores, split into big and small parts) follows the CPU's
// native fp32 as closely as native fp32 GEMMs on the GPU do (the bound of the test above), under graphs.
TEST(BertTrainParity, ThreePassTf32FollowsTheCpuAsFp32Does) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  ScratchDir d;
  write_task(d / "train.cls", 640, 1);
  write_task(d / "val.cls", 128, 2);
  const TrainSummary x3 = run(d, "x3", "cuda", true, false, 8, 2, 0.1, "3xtf32");
  const TrainSummary cpu = run(d, "cpu", "cpu", false, false);
  const std::vector<double> lx = losses(d / "x3"), lc = losses(d / "cpu");
  ASSERT_EQ(lx.size(), 100u);
  ASSERT_EQ(lc.size(), 100u);
  for (size_t i = 0; i < lx.size(); ++i)
    EXPECT_NEAR(lx[i], lc[i], 2e-3 * (1 + std::abs(lc[i]))) << "step " << i + 1;
  EXPECT_NEAR(x3.eval_accuracy, cpu.eval_accuracy, 0.02);
  EXPECT_EQ(x3.precision, "3xtf32");
}

// One micro-batch of 16 per step: the gradients live in activation memory (backward zeroes each unit's just
// before writing it, inside the whole-step graph). The run follows two micro-batches of 8 with separate
// gradient memory on the GPU (the same examples per step, padded per micro-batch instead of per batch;
// without dropout, whose masks are drawn per micro-batch) and the same shared run on the CPU.
TEST(BertTrainParity, GradientsInActivationMemoryMatchSeparateGradients) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  ScratchDir d;
  write_task(d / "train.cls", 640, 1);
  write_task(d / "val.cls", 128, 2);
  const TrainSummary shared = run(d, "shared", "cuda", true, false, 16, 1, 0.0);
  const TrainSummary separate = run(d, "separate", "cuda", true, false, 8, 2, 0.0);
  const TrainSummary cpu = run(d, "cpu", "cpu", false, false, 16, 1, 0.0);
  const std::vector<double> ls = losses(d / "shared"), lp = losses(d / "separate"), lc = losses(d / "cpu");
  ASSERT_EQ(ls.size(), 100u);
  ASSERT_EQ(lp.size(), 100u);
  ASSERT_EQ(lc.size(), 100u);
  for (size_t i = 0; i < ls.size(); ++i) {
    EXPECT_NEAR(ls[i], lp[i], 1e-3 * (1 + std::abs(lp[i]))) << "step " << i + 1;
    EXPECT_NEAR(ls[i], lc[i], 2e-3 * (1 + std::abs(lc[i]))) << "step " << i + 1;
  }
  EXPECT_NEAR(shared.eval_loss, separate.eval_loss, 5e-3);
  EXPECT_GT(shared.eval_accuracy, 0.95);
}

}  // namespace
}  // namespace anvil
