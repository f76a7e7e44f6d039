// Optimizer offload (offload_optimizer cpu, src/offload/): a run whose master weights and optimizer state
// live in host memory, updated by the CPU, is the run without offload, bit for bit (every optimizer; fp32,
// bf16, fp16 with its loss scaler; gradient accumulation), with the same checkpoints, so each resumes the
// other; the device plan holds neither the master weights nor the state, and the estimate shows the host's
// share.
#include <gtest/gtest.h>

#include <filesystem>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/trainer.hpp"
#include "dist/communicator.hpp"
#include "io/safetensors.hpp"
#include "offload_run_config.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {
using json = nlohmann::json;
namespace fs = std::filesystem;

TrainConfig run_config(const test::ByteCorpus& c, const std::string& out, const json& extra) {
  return test::offload_run_config(c, out, extra);
}

std::string file_bytes(const std::string& path) {
  return test::read_file(path);
}

bool lists(const MemoryPlan& plan, const std::string& name) {
  for (const PlannedBuffer& b : plan.buffers())
    if (b.name == name) return true;
  return false;
}

// `anvil estimate` of llama-tiny in bf16 on the CPU with `args` succeeds and prints every one of `needles`.
void expect_estimate_prints(const std::string& args, std::initializer_list<const char*> needles) {
  const test::CommandResult r = test::run_anvil("estimate --model llama-tiny --device cpu --bf16 " + args);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* needle : needles)
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
}

std::string example(const std::string& name) {
  return std::string(ANVIL_SOURCE_DIR) + "/examples/" + name;
}

// `cfg` resumed from the run without offload's step-3 checkpoint (c.dir/device) gives `uninterrupted`'s
// steps 4-6 exactly.
void expect_resume_continues(const test::ByteCorpus& c, json cfg, const std::vector<double>& uninterrupted) {
  cfg["resume_from_checkpoint"] = c.dir / "device/checkpoint-3";
  test::quietly([&] { return train(run_config(c, c.dir / "resumed", cfg)); });
  const std::vector<double> r = test::metrics_losses(c.dir / "resumed/metrics.jsonl");
  ASSERT_EQ(r.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r[i], uninterrupted[3 + i]) << "step " << 4 + i;
}

// One process: the run of `extra` and the same run with `offload` added give the same losses and the same
// model file; the offloaded run resumes from the other's step-3 checkpoint.
void expect_offloaded_run_equals(const test::ByteCorpus& c, const json& extra, const json& offload) {
  test::quietly([&] { return train(run_config(c, c.dir / "device", extra)); });
  json off = extra;
  off.update(offload);
  test::quietly([&] { return train(run_config(c, c.dir / "host", off)); });
  const std::vector<double> a = test::metrics_losses(c.dir / "device/metrics.jsonl"),
                            b = test::metrics_losses(c.dir / "host/metrics.jsonl");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(file_bytes(c.dir / "device/checkpoint-6/model.safetensors"),
            file_bytes(c.dir / "host/checkpoint-6/model.safetensors"));
  expect_resume_continues(c, off, a);
}

class Offload : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Offload, EqualsTheRunWithoutIt) {
  const auto [optim, precision] = GetParam();
  test::ByteCorpus c;
  json extra = {{"optim", optim}, {"gradient_accumulation_steps", 2}};
  if (precision != "fp32") extra[precision] = true;
  if (optim == "adamw_8bit") extra["optim_8bit_min_size"] = 64;
  test::quietly([&] { return train(run_config(c, c.dir / "device", extra)); });
  json off = extra;
  off["offload_optimizer"] = "cpu";
  test::quietly([&] { return train(run_config(c, c.dir / "host", off)); });
  const std::vector<double> a = test::metrics_losses(c.dir / "device/metrics.jsonl"),
                            b = test::metrics_losses(c.dir / "host/metrics.jsonl");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
  // The same weights and the same optimizer state, file for file.
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(file_bytes(c.dir / "device/checkpoint-6/" + f), file_bytes(c.dir / "host/checkpoint-6/" + f))
        << f;
  // A checkpoint of either resumes the other: steps 4-6 again, from the run without offload's step 3.
  expect_resume_continues(c, off, a);
}

// AdamW in every precision; the other optimizers in bf16 (the update is the optimizer's own CPU kernel either
// way: the precision changes what is copied, not the update).
using Case = std::tuple<std::string, std::string>;
INSTANTIATE_TEST_SUITE_P(Optimizers, Offload,
                         ::testing::Values(Case{"adamw_torch_fused", "fp32"},
                                           Case{"adamw_torch_fused", "bf16"},
                                           Case{"adamw_torch_fused", "fp16"}, Case{"adamw_8bit", "bf16"},
                                           Case{"adafactor", "bf16"}, Case{"sgd", "bf16"}),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

// The device plan has no master weights or optimizer state; the host holds them (and the staging copies).
TEST(OffloadPlan, MasterWeightsAndStateOnTheHost) {
  test::ByteCorpus c;
  const TrainConfig on = run_config(c, c.dir / "a", {{"bf16", true}, {"offload_optimizer", "cpu"}});
  const TrainConfig off = run_config(c, c.dir / "b", {{"bf16", true}});
  const EngineOptions o = training_engine_options(on, DeviceKind::CPU);
  const MemoryPlan device = plan_engine_memory(on.model, o);
  const MemoryPlan whole = plan_engine_memory(off.model, training_engine_options(off, DeviceKind::CPU));
  EXPECT_EQ(device.bytes(MemoryCategory::MasterWeights), 0u);
  EXPECT_EQ(device.bytes(MemoryCategory::OptimizerState), 0u);
  EXPECT_GT(whole.bytes(MemoryCategory::MasterWeights), 0u);
  EXPECT_EQ(device.bytes(MemoryCategory::Weights), whole.bytes(MemoryCategory::Weights));
  EXPECT_EQ(device.bytes(MemoryCategory::Gradients), whole.bytes(MemoryCategory::Gradients));
  const std::optional<MemoryPlan> host = host_optimizer_plan(on.model, o);
  ASSERT_TRUE(host.has_value());
  EXPECT_EQ(host->bytes(MemoryCategory::MasterWeights), whole.bytes(MemoryCategory::MasterWeights));
  EXPECT_GE(host->bytes(MemoryCategory::OptimizerState), whole.bytes(MemoryCategory::OptimizerState) - 4096);
  EXPECT_FALSE(host_optimizer_plan(off.model, training_engine_options(off, DeviceKind::CPU)).has_value());

  expect_estimate_prints("--offload_optimizer cpu --per_device_train_batch_size 4",
                         {"host memory for the offloaded optimizer", "master weights (fp32, host)"});
}

// ZeRO with offload, 2 Gloo processes: each rank offloads its shard; the run equals the same stage without
// offload (losses, the gathered weights and every rank's optimizer shard, file for file), and resumes from
// its checkpoint.
struct ZeroOffloadCase {
  int stage;
  std::string optim, precision;
};
class ZeroOffload : public ::testing::TestWithParam<ZeroOffloadCase> {
 protected:
  void SetUp() override {
    if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  }
};

std::string launch_config(const test::ByteCorpus& c, const std::string& name, const json& extra) {
  json j = run_config(c, c.dir / name, extra).to_json();
  const std::string path = c.dir / (name + ".json");
  test::write_file(path, j.dump());
  return path;
}

test::CommandResult launch2(const std::string& config) {
  return test::run_anvil("launch --nproc_per_node 2 --master_port 0 train --config " + config);
}

TEST_P(ZeroOffload, EqualsTheStageWithoutIt) {
  const ZeroOffloadCase z = GetParam();
  test::ByteCorpus c;
  json extra = {{"optim", z.optim},
                {"zero_stage", z.stage},
                {"per_device_train_batch_size", 2},
                {"gradient_accumulation_steps", 2},
                {"optim_8bit_min_size", 64}};
  if (z.precision != "fp32") extra[z.precision] = true;
  const test::CommandResult device = launch2(launch_config(c, "device", extra));
  ASSERT_EQ(device.exit_code, 0) << device.output;
  json off = extra;
  off["offload_optimizer"] = "cpu";
  const test::CommandResult host = launch2(launch_config(c, "host", off));
  ASSERT_EQ(host.exit_code, 0) << host.output;
  EXPECT_NE(host.output.find("offloaded (offload_optimizer cpu)"), std::string::npos) << host.output;
  const std::vector<double> a = test::metrics_losses(c.dir / "device/metrics.jsonl"),
                            b = test::metrics_losses(c.dir / "host/metrics.jsonl");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
  for (const std::string f : {"model.safetensors", "zero/optimizer-rank-00000-of-00002.safetensors",
                              "zero/optimizer-rank-00001-of-00002.safetensors"})
    EXPECT_EQ(file_bytes(c.dir / "device/checkpoint-6/" + f), file_bytes(c.dir / "host/checkpoint-6/" + f))
        << f;
  // The offloaded run resumes from the run without offload's step 3: steps 4-6 again.
  json resumed = off;
  resumed["resume_from_checkpoint"] = c.dir / "device/checkpoint-3";
  const test::CommandResult r = launch2(launch_config(c, "resumed", resumed));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> l = test::metrics_losses(c.dir / "resumed/metrics.jsonl");
  ASSERT_EQ(l.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(l[i], a[3 + i]) << "step " << 4 + i;
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroOffload,
                         ::testing::Values(ZeroOffloadCase{1, "adamw_torch_fused", "bf16"},
                                           ZeroOffloadCase{2, "adamw_8bit", "bf16"},
                                           ZeroOffloadCase{2, "adamw_torch_fused", "fp16"},
                                           ZeroOffloadCase{3, "adamw_torch_fused", "fp32"},
                                           ZeroOffloadCase{3, "adafactor", "bf16"}),
                         [](const auto& info) {
                           return "stage" + std::to_string(info.param.stage) + "_" + info.param.optim + "_" +
                                  info.param.precision;
                         });

// Under ZeRO the host holds the rank's shard: about half of one process's master weights with 2 ranks, and
// the estimate counts it per node.
TEST(OffloadPlan, ZeroShardOnTheHost) {
  test::ByteCorpus c;
  const TrainConfig on = run_config(c, c.dir / "a", {{"bf16", true}, {"offload_optimizer", "cpu"}});
  const std::optional<MemoryPlan> whole =
      host_optimizer_plan(on.model, training_engine_options(on, DeviceKind::CPU));
  ASSERT_TRUE(whole.has_value());
  EngineOptions o = training_engine_options(on, DeviceKind::CPU);
  o.zero_stage = 2, o.zero_world = 2, o.zero_rank = 1;
  const std::optional<MemoryPlan> shard = host_optimizer_plan(on.model, o);
  ASSERT_TRUE(shard.has_value());
  const double ratio = double(shard->bytes(MemoryCategory::MasterWeights)) /
                       double(whole->bytes(MemoryCategory::MasterWeights));
  EXPECT_NEAR(ratio, 0.5, 0.02);
  EXPECT_LT(shard->bytes(MemoryCategory::Gradients), whole->bytes(MemoryCategory::Gradients));

  expect_estimate_prints(
      "--offload_optimizer cpu --zero_stage 2 --num_gpus 2 --per_device_train_batch_size 4",
      {"master weights (fp32, host, this rank's shard)", "per node"});
}

// Parameter offload (offload_param cpu: ZeRO-3's weight shard in host memory, gathered from there). One
// process runs stage 3 on one rank; it trains as the run without any offload, and resumes from its
// checkpoint.
TEST(OffloadParam, OneProcessEqualsTheRunWithoutOffload) {
  test::ByteCorpus c;
  expect_offloaded_run_equals(c, {{"bf16", true}, {"gradient_accumulation_steps", 2}},
                              {{"zero_stage", 3}, {"offload_optimizer", "cpu"}, {"offload_param", "cpu"}});
  EXPECT_TRUE(fs::exists(c.dir / "host/checkpoint-6/zero/optimizer-rank-00000-of-00001.safetensors"));
}

// With 2 processes each rank's weight shard is on its host: the run is stage 3 with optimizer offload,
// file for file.
TEST(OffloadParam, TwoProcessesEqualStageThree) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  for (const char* precision : {"bf16", "fp32"}) {
    SCOPED_TRACE(precision);
    test::ByteCorpus c;
    json extra = {{"zero_stage", 3}, {"offload_optimizer", "cpu"}, {"per_device_train_batch_size", 2}};
    if (std::string(precision) == "bf16") extra["bf16"] = true;
    const test::CommandResult device = launch2(launch_config(c, "device", extra));
    ASSERT_EQ(device.exit_code, 0) << device.output;
    extra["offload_param"] = "cpu";
    const test::CommandResult host = launch2(launch_config(c, "host", extra));
    ASSERT_EQ(host.exit_code, 0) << host.output;
    EXPECT_EQ(test::metrics_losses(c.dir / "device/metrics.jsonl"),
              test::metrics_losses(c.dir / "host/metrics.jsonl"));
    for (const std::string f : {"model.safetensors", "zero/optimizer-rank-00001-of-00002.safetensors"})
      EXPECT_EQ(file_bytes(c.dir / "device/checkpoint-6/" + f), file_bytes(c.dir / "host/checkpoint-6/" + f))
          << f;
  }
}

// The device plan holds the gathered units' slots, not the shard; the host plan holds the shard.
TEST(OffloadParam, ShardOnTheHostInThePlans) {
  test::ByteCorpus c;
  const TrainConfig on =
      run_config(c, c.dir / "a",
                 {{"bf16", true}, {"zero_stage", 3}, {"offload_optimizer", "cpu"}, {"offload_param", "cpu"}});
  const TrainConfig off =
      run_config(c, c.dir / "b", {{"bf16", true}, {"zero_stage", 3}, {"offload_optimizer", "cpu"}});
  const EngineOptions o = training_engine_options(on, DeviceKind::CPU);
  EXPECT_EQ(o.zero_stage, 3);
  EXPECT_EQ(o.zero_world, 1);
  const MemoryPlan device = plan_engine_memory(on.model, o);
  for (const PlannedBuffer& b : device.buffers())
    EXPECT_EQ(b.name.find("this rank's shard)"), std::string::npos) << b.name;
  EXPECT_NE(device.bytes(MemoryCategory::Weights), 0u);  // the slots
  const size_t whole_weights = plan_engine_memory(off.model, training_engine_options(off, DeviceKind::CPU))
                                   .bytes(MemoryCategory::Weights);
  EXPECT_LT(device.bytes(MemoryCategory::Weights), whole_weights);
  const std::optional<MemoryPlan> host = host_optimizer_plan(on.model, o);
  ASSERT_TRUE(host.has_value());
  EXPECT_TRUE(lists(*host, "weights (offload_param, pinned)"));
  expect_estimate_prints("--zero_stage 3 --offload_optimizer cpu --offload_param cpu",
                         {"weights (offload_param, pinned)"});
}

// The example DeepSpeed config (the DeepSpeed guide's ZeRO-3 with both offloads) plans stage 3 with the
// weights and the optimizer on the host, with one process.
TEST(OffloadParam, ExampleDeepSpeedConfigPlans) {
  expect_estimate_prints(
      "--per_device_train_batch_size 2 --deepspeed " + example("deepspeed_zero3_offload.json"),
      {"weights (offload_param, pinned)", "master weights (fp32, host)", "weight slots"});
}

// Gradient offload: under ZeRO-2 and 3 the shard's gradients live in host memory (one process runs stage 2
// on one rank for it). The run equals the run without any offload (losses, the model file), with gradient
// accumulation (the first micro-batch overwrites the host gradients, the second adds) and without, in fp16
// with an overflow injected after backward (the step skipped, the next one overwrites), and in fp32 with the
// token embedding frozen; it resumes from the run without offload's checkpoint.
class OffloadGrads : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(OffloadGrads, OneProcessStageTwoEqualsTheRunWithoutOffload) {
  const auto [accumulation, precision] = GetParam();
  test::ByteCorpus c;
  json extra = {{"gradient_accumulation_steps", accumulation}};
  if (precision != "fp32") extra[precision] = true;
  if (precision == "fp16") extra["debug_inject_overflow_steps"] = {2};
  if (accumulation == 1 && precision == "fp32") extra["freeze_parameters"] = "model.embed_tokens.weight";
  expect_offloaded_run_equals(c, extra, {{"zero_stage", 2}, {"offload_optimizer", "cpu"}});
}

INSTANTIATE_TEST_SUITE_P(Steps, OffloadGrads,
                         ::testing::Values(std::tuple<int, std::string>{1, "bf16"},
                                           std::tuple<int, std::string>{2, "bf16"},
                                           std::tuple<int, std::string>{2, "fp16"},
                                           std::tuple<int, std::string>{1, "fp32"}),  // frozen embedding
                         [](const auto& info) {
                           return "accumulation" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

// The device plan keeps the two gradient slots, not the shard's gradients; the host plan holds them.
TEST(OffloadGradsPlan, ShardGradientsOnTheHost) {
  test::ByteCorpus c;
  const json extra = {{"bf16", true}, {"offload_optimizer", "cpu"}};
  const TrainConfig stage0 = run_config(c, c.dir / "a", extra);
  json two = extra;
  two["zero_stage"] = 2;
  const TrainConfig stage2 = run_config(c, c.dir / "b", two);
  const EngineOptions o = training_engine_options(stage2, DeviceKind::CPU);
  EXPECT_EQ(o.zero_stage, 2);
  EXPECT_EQ(o.zero_world, 1);
  const MemoryPlan device = plan_engine_memory(stage2.model, o);
  const MemoryPlan whole = plan_engine_memory(stage0.model, training_engine_options(stage0, DeviceKind::CPU));
  for (const PlannedBuffer& b : device.buffers())
    EXPECT_EQ(b.name.find("gradients (this rank's shard"), std::string::npos) << b.name;
  EXPECT_LT(device.bytes(MemoryCategory::Gradients), whole.bytes(MemoryCategory::Gradients));
  const std::optional<MemoryPlan> host = host_optimizer_plan(stage2.model, o);
  ASSERT_TRUE(host.has_value());
  EXPECT_TRUE(lists(*host, "gradients (offloaded, pinned)"));
  expect_estimate_prints("--zero_stage 2 --offload_optimizer cpu", {"gradients (offloaded, pinned)"});
}

// The example DeepSpeed config (the DeepSpeed guide's ZeRO-2 with the optimizer offloaded) plans stage 2 with
// one process, the gradients on the host.
TEST(OffloadGradsPlan, ExampleDeepSpeedConfigPlans) {
  expect_estimate_prints(
      "--per_device_train_batch_size 2 --deepspeed " + example("deepspeed_zero2_offload.json"),
      {"gradients (offloaded, pinned)", "master weights (fp32, host)", "gradient slots"});
}

TEST(OffloadErrors, SayWhatToDo) {
  test::ByteCorpus c;
  const std::string out = c.dir / "e";
  test::expect_error(
      [&] {
        run_config(c, out, {{"offload_optimizer", "nvme"}});
      },
      {"offload_optimizer", "set offload_nvme_path"});
  test::expect_error(
      [&] {
        run_config(c, out, {{"offload_optimizer", "cpu"}, {"lora_r", 8}});
      },
      {"offload_optimizer", "LoRA"});
  test::expect_error(
      [&] {
        run_config(c, out, {{"offload_optimizer", "cpu"}, {"bf16", true}, {"stochastic_rounding", true}});
      },
      {"stochastic_rounding"});
  test::expect_error(
      [&] {
        run_config(c, out, {{"offload_optimizer", "cpu"}, {"offload_param", "cpu"}, {"zero_stage", 2}});
      },
      {"offload_param", "set zero_stage 3"});
  test::expect_error(
      [&] {
        run_config(c, out, {{"offload_param", "cpu"}, {"zero_stage", 3}});
      },
      {"offload_param", "set offload_optimizer cpu too"});
  test::expect_error(
      [&] {
        run_config(c, out, {{"offload_param", "disk"}});
      },
      {"offload_param", "none, cpu or nvme", "'disk'"});
  // Several processes without a ZeRO stage: every rank would hold the whole model on its host.
  if (dist::gloo_compiled()) {
    const test::CommandResult r =
        launch2(launch_config(c, "stage0", {{"offload_optimizer", "cpu"}, {"zero_stage", 0}}));
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.output.find("set zero_stage 1, 2 or 3"), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace anvil
