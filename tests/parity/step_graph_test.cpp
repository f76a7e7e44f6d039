// Whole-step CUDA graphs through the trainer: with cuda_graphs on, a step of one micro-batch is replayed
// whole from one graph (zeroing, forward, backward, norm, clip, optimizer, weight cast), gradient
// accumulation replays micro-batch graphs and a tail graph, and the fp16 loss scaler replays the norm and the
// update separately. Each configuration trains as eager execution does: the same losses (to the run-to-run
// noise of the GPU's atomics), the same learning-rate schedule reaching the kernels through the step values
// (a frozen lr or step would show at once in the losses), and the graphs are really used (the summary's
// counts). Every optimizer, bf16 moments and stochastic rounding included.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "anvil/trainer.hpp"
#include "data/byte_corpus.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct ScratchDir {
  fs::path path = fs::temp_directory_path() / ("anvil_step_graph_" + std::to_string(std::random_device{}()));
  ScratchDir() { fs::create_directories(path); }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& rel) const { return (path / rel).string(); }
};

std::vector<double> losses(const std::string& out) {
  std::vector<double> l;
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.contains("loss") && !j["loss"].is_null()) l.push_back(j["loss"].get<double>());
  }
  return l;
}

class StepGraphTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScratchDir;
    std::ofstream f(*dir_ / "corpus.txt");
    std::mt19937 rng(3);
    const char* words[] = {"the ", "slings ", "and ", "arrows ", "of ", "outrageous ", "fortune\n"};
    for (int i = 0; i < 20000; ++i) f << words[rng() % 7];
    f.close();
    data::prepare_byte_corpus({*dir_ / "corpus.txt"}, *dir_ / "data", 0.1);
  }
  static void TearDownTestSuite() { delete dir_; }

  // Trains 12 steps of a small GPT-2 with `extra` settings, graphs on or off.
  static TrainSummary run(const std::string& name, bool graphs, const json& extra) {
    json j = {
        {"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 64}, {"vocab_size", 256}, {"block_size", 64}}},
        {"train_data", *dir_ / "data/train.bin"},
        {"per_device_train_batch_size", 8},
        {"max_steps", 12},
        {"learning_rate", 3e-3},
        {"warmup_steps", 4},
        {"lr_scheduler_type", "cosine"},
        {"logging_steps", 1},
        {"save_steps", 0},
        {"device", "cuda"},
        {"cuda_graphs", graphs},
        {"seed", 5},
        {"output_dir", *dir_ / name}};
    j.update(extra);
    ::testing::internal::CaptureStdout();  // the progress lines of 16 runs; released on an error too
    try {
      TrainSummary s = train(TrainConfig::from_json(j, "test"));
      ::testing::internal::GetCapturedStdout();
      return s;
    } catch (...) {
      std::cerr << ::testing::internal::GetCapturedStdout();
      throw;
    }
  }

  // Graphs and eager execution train alike; returns the graph run's summary.
  static TrainSummary compare(const std::string& name, const json& extra, double tol) {
    const TrainSummary eager = run(name + "_eager", false, extra);
    const TrainSummary graphs = run(name + "_graphs", true, extra);
    const std::vector<double> le = losses(*dir_ / (name + "_eager")), lg = losses(*dir_ / (name + "_graphs"));
    EXPECT_EQ(le.size(), 12u);
    EXPECT_EQ(lg.size(), le.size());
    for (size_t i = 0; i < std::min(le.size(), lg.size()); ++i)
      EXPECT_NEAR(lg[i], le[i], tol * (1 + std::abs(le[i]))) << name << " step " << i + 1;
    EXPECT_LT(lg.back(), lg.front()) << name << ": the loss falls";
    EXPECT_EQ(eager.cuda_graph_launches, 0);
    return graphs;
  }

  static ScratchDir* dir_;
};
ScratchDir* StepGraphTest::dir_ = nullptr;

TEST_F(StepGraphTest, WholeStepReplaysTrainAsEager) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  struct Case {
    const char* name;
    json extra;
  };
  const std::vector<Case> cases = {
      {"fp32_adamw", json::object()},
      {"bf16_adamw", {{"bf16", true}}},
      {"bf16_moments_sr", {{"bf16", true}, {"adamw_bf16_moments", true}, {"stochastic_rounding", true}}},
      {"bf16_sgd", {{"bf16", true}, {"optim", "sgd"}, {"momentum", 0.9}, {"learning_rate", 0.05}}},
      {"bf16_adamw_8bit", {{"bf16", true}, {"optim", "adamw_8bit"}}},
      {"bf16_adafactor", {{"bf16", true}, {"optim", "adafactor"}}},
  };
  for (const Case& c : cases) {
    const TrainSummary s = compare(c.name, c.extra, 2e-3);
    // Steps 1 and 2 run eagerly (the first use of each input slot); each slot's graph is recorded once and
    // every later step is one replay.
    EXPECT_EQ(s.cuda_graphs_recorded, 2) << c.name;
    EXPECT_EQ(s.cuda_graph_whole_steps, 10) << c.name;
    EXPECT_EQ(s.cuda_graph_launches, 10) << c.name;
  }
}

TEST_F(StepGraphTest, AccumulationAndLossScalerReplayParts) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  // Two micro-batches: micro-batch graphs per slot, then one tail graph per step.
  const TrainSummary accum =
      compare("accum",
              {{"bf16", true}, {"gradient_accumulation_steps", 2}, {"per_device_train_batch_size", 4}}, 2e-3);
  EXPECT_EQ(accum.cuda_graph_whole_steps, 0);
  EXPECT_EQ(accum.cuda_graphs_recorded, 3);           // two micro-batch slots and the tail
  EXPECT_EQ(accum.cuda_graph_launches, 11 * 2 + 11);  // steps 2..12: two micro-batches and the tail each
  // fp16 with the loss scaler: micro-batch, norm and update graphs around the host's overflow decision.
  const TrainSummary fp16 = compare("fp16", {{"fp16", true}}, 2e-3);
  EXPECT_EQ(fp16.cuda_graph_whole_steps, 0);
  EXPECT_GE(fp16.cuda_graphs_recorded, 4);  // two micro-batch slots, norm, update
  EXPECT_GT(fp16.cuda_graph_launches, 20);
}

}  // namespace
}  // namespace anvil
