// LoRA under ZeRO (CPU, Gloo): the frozen base has no master weights, gradients or optimizer state at any
// stage; each rank keeps the trainable part of its shard of the layout (ParamStore::optimizer_range), and
// stage 3 its shard of the base's weights. Stages 1-3 give stage 0's loss curve and adapters, with every
// optimizer and 2 or 3 ranks; their checkpoints resume on another world size and stage.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/memory_plan.hpp"
#include "dist/communicator.hpp"
#include "io/peft_adapter.hpp"
#include "io/safetensors.hpp"
#include "safetensors_util.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// llama-tiny with LoRA r 4 on every block Linear, 8 steps of 2 x 32 per rank on the CPU.
std::string write_config(const test::ByteCorpus& c, const std::string& name, const json& extra) {
  json j = {{"model", "llama-tiny"},
            {"train_data", c.dir / "data/train.bin"},
            {"per_device_train_batch_size", 2},
            {"max_seq_length", 32},
            {"max_steps", 8},
            {"save_steps", 8},
            {"learning_rate", 1e-2},
            {"logging_steps", 1},
            {"device", "cpu"},
            {"seed", 5},
            {"dataloader_pin_memory", false},
            {"lora_r", 4},
            {"lora_target_modules", "all-linear"},
            {"optim_8bit_min_size", 256},  // the factors get 8-bit states
            {"adafactor_relative_step", false},
            {"output_dir", c.dir / name}};
  j.update(extra);
  const std::string path = c.dir / (name + ".json");
  test::write_file(path, j.dump());
  return path;
}

bool same_bytes(const std::string& a_path, const std::string& b_path) {
  return test::read_file(a_path) == test::read_file(b_path);
}

// The plan of one rank of a LoRA run of `o` (llama-tiny, r 4, every block Linear).
EngineOptions lora_options(int stage, int world, int rank, bool trainable_only = true) {
  EngineOptions o;
  o.device = DeviceKind::CPU;
  o.training = true;
  o.batch_size = 2, o.seq_len = 32;
  o.lora.r = 4;
  o.lora.alpha = 8;
  o.lora.target_modules = {"all-linear"};
  o.precision = Precision::BF16;  // (fp32 weights would be the whole store's master weights)
  o.zero_stage = stage, o.zero_world = world, o.zero_rank = rank;
  o.trainable_only_store = trainable_only;
  return o;
}

size_t bytes_of(const MemoryPlan& plan, MemoryCategory c) {
  return plan.requested_bytes(c);
}

// Each rank's plan holds master weights for its part of the adapters only (the base has none), and under
// stage 3 its shard of the weights; every rank's parts cover the adapters once.
TEST(LoraZeroPlan, NoMasterWeightsOrGradientsForTheBase) {
  const TransformerConfig cfg = TransformerConfig::preset("llama-tiny");
  const EngineOptions one = lora_options(0, 1, 0);
  const ParamLayout layout = ParamLayout::decoder(cfg, one.lora);
  size_t adapters = 0;
  for (const ParamTensor& t : layout.tensors())
    if (t.is_adapter()) adapters += t.numel();
  ASSERT_GT(adapters, 0u);
  EXPECT_EQ(bytes_of(plan_engine_memory(cfg, one), MemoryCategory::MasterWeights), adapters * sizeof(float));
  for (int stage : {1, 2, 3})
    for (int world : {2, 3}) {
      SCOPED_TRACE(fmt::format("stage {}, {} ranks", stage, world));
      size_t master = 0, weights = 0;
      for (int rank = 0; rank < world; ++rank) {
        const MemoryPlan p = plan_engine_memory(cfg, lora_options(stage, world, rank));
        master += bytes_of(p, MemoryCategory::MasterWeights);
        // The whole layout's master weights (sharded) are what ZeRO kept before.
        const MemoryPlan whole = plan_engine_memory(cfg, lora_options(stage, world, rank, false));
        EXPECT_LT(bytes_of(p, MemoryCategory::MasterWeights), bytes_of(whole, MemoryCategory::MasterWeights));
        EXPECT_LT(bytes_of(p, MemoryCategory::Gradients), bytes_of(whole, MemoryCategory::Gradients));
        for (const PlannedBuffer& b : p.buffers())
          if (b.name.rfind("weights (", 0) == 0) weights += b.bytes;
      }
      EXPECT_EQ(master, adapters * sizeof(float));
      // The bf16 weights are whole on every rank below stage 3, one copy over the ranks at stage 3.
      EXPECT_EQ(weights, (stage == 3 ? 1 : size_t(world)) * layout.total_numel() * 2);
    }
}

// A store of the trainable tensors only numbers its master weights by the trainable elements: a shard of the
// layout maps to the trainable elements inside it.
TEST(LoraZeroPlan, OptimizerIndexCountsTheTrainableElementsBefore) {
  const TransformerConfig cfg = TransformerConfig::preset("llama-tiny");
  Engine e(cfg, lora_options(0, 1, 0));
  const ParamStore& s = e.model().param_store();
  ASSERT_TRUE(s.trainable_only());
  const ParamLayout& l = s.layout();
  size_t trainable_before = 0;
  for (const ParamTensor& t : l.tensors()) {
    EXPECT_EQ(s.optimizer_index(t.offset), trainable_before) << t.name;
    if (t.trainable) {
      EXPECT_EQ(s.optimizer_index(t.offset + 1), trainable_before + 1) << t.name;
      trainable_before += t.numel();
    } else {
      EXPECT_EQ(s.optimizer_index(t.offset + t.numel() - 1), trainable_before) << t.name;
    }
  }
  EXPECT_EQ(s.optimizer_index(l.total_numel()), s.optimizer_layout().total_numel());
  size_t runs = 0;
  for (const ParamRange& r : s.trainable_runs()) {
    EXPECT_EQ(s.optimizer_range(r).numel(), r.numel());
    runs += r.numel();
  }
  EXPECT_EQ(runs, s.optimizer_layout().total_numel());
  // A unit's gradients: its adapters (the embedding has none).
  EXPECT_EQ(s.unit_grad_range(0).numel(), 0u);
  EXPECT_GT(s.unit_grad_range(1).numel(), 0u);
}

struct LoraZeroCase {
  std::string optim;
  int ranks;
  int accumulation;
  bool bf16 = false;
};

class LoraZeroStages : public ::testing::TestWithParam<LoraZeroCase> {
 protected:
  void SetUp() override {
    if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  }
};

// Stage 1 reduces as stage 0 and updates each element as it does: bit for bit. Stages 2-3 sum the norm's
// squares per shard (another order): the loss curve within 1e-6, the adapters within what AdamW makes of
// rounding noise (8-bit states: requantized blocks). The base never moves, and each rank wrote its optimizer
// shard.
TEST_P(LoraZeroStages, EqualStageZero) {
  const LoraZeroCase z = GetParam();
  test::ByteCorpus c;
  const json base = {{"optim", z.optim}, {"gradient_accumulation_steps", z.accumulation}, {"bf16", z.bf16}};
  for (int stage : {0, 1, 2, 3}) {
    json j = base;
    j["zero_stage"] = stage;
    const test::CommandResult r =
        test::launch_anvil(z.ranks, write_config(c, fmt::format("stage{}", stage), j));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    if (stage > 0) {
      EXPECT_NE(r.output.find(fmt::format("ZeRO stage {}: this rank keeps", stage)), std::string::npos)
          << r.output;
      EXPECT_NE(r.output.find("trainable parameters' master weights"), std::string::npos);
    }
  }
  const std::vector<double> ref = test::metrics_losses(c.dir / "stage0/metrics.jsonl");
  ASSERT_EQ(ref.size(), 8u);
  const bool same_order = z.ranks == 2 && z.accumulation == 1;
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(fmt::format("stage {}", stage));
    const std::string run = c.dir / fmt::format("stage{}", stage);
    const std::vector<double> got = test::metrics_losses(run + "/metrics.jsonl");
    ASSERT_EQ(got.size(), 8u);
    for (size_t i = 0; i < ref.size(); ++i) {
      if (stage == 1)
        EXPECT_EQ(got[i], ref[i]) << "step " << i + 1;
      else
        EXPECT_NEAR(got[i], ref[i], 1e-6 * std::fabs(ref[i])) << "step " << i + 1;
    }
    const std::string ckpt = run + "/checkpoint-8";
    ASSERT_TRUE(io::has_peft_adapter(ckpt));
    const double rel = test::max_rel_diff(c.dir / "stage0/checkpoint-8/adapter_model.safetensors",
                                          ckpt + "/adapter_model.safetensors");
    if (stage == 1)
      EXPECT_EQ(rel, 0.0);
    else
      EXPECT_LT(rel, same_order || z.optim == "sgd" ? 1e-6 : z.optim == "adamw_8bit" ? 2e-2 : 1e-3);
    EXPECT_TRUE(same_bytes(c.dir / "stage0/checkpoint-8/model.safetensors", ckpt + "/model.safetensors"));
    for (int r = 0; r < z.ranks; ++r)
      EXPECT_TRUE(
          fs::exists(ckpt + fmt::format("/zero/optimizer-rank-{:05d}-of-{:05d}.safetensors", r, z.ranks)));
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, LoraZeroStages,
                         ::testing::Values(LoraZeroCase{"adamw_torch_fused", 2, 1},
                                           LoraZeroCase{"adamw_torch_fused", 2, 1, true},
                                           LoraZeroCase{"adamw_torch_fused", 3, 2},
                                           LoraZeroCase{"adamw_8bit", 3, 1}, LoraZeroCase{"adafactor", 2, 1},
                                           LoraZeroCase{"sgd", 2, 1}),
                         [](const auto& info) {
                           return info.param.optim + "_" + std::to_string(info.param.ranks) + "ranks_accum" +
                                  std::to_string(info.param.accumulation) + (info.param.bf16 ? "_bf16" : "");
                         });

// A LoRA checkpoint of ZeRO-3 on 2 ranks resumes bit for bit on the same partition, and on one process
// (stage 0, the same global batch) and 4 ranks of stage 2 as the uninterrupted run within 1e-5.
TEST(LoraZeroResume, AnyWorldSizeAndStage) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  const std::string cfg = write_config(c, "full", {{"zero_stage", 3}, {"max_steps", 12}, {"save_steps", 6}});
  const test::CommandResult full = test::launch_anvil(2, cfg);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  EXPECT_NE(full.output.find("frozen base: in the fp32 weights only, this rank's shard"), std::string::npos)
      << full.output;
  const std::vector<double> a = test::metrics_losses(c.dir / "full/metrics.jsonl");
  ASSERT_EQ(a.size(), 12u);
  const std::string ckpt = c.dir / "full/checkpoint-6";
  auto resume = [&](const std::string& name, const std::string& how) {
    const test::CommandResult r =
        test::run_anvil(how + " --output_dir " + (c.dir / name) + " --resume_from_checkpoint " + ckpt);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return test::metrics_losses(c.dir / (name + "/metrics.jsonl"));
  };
  const std::vector<double> same =
      resume("same", fmt::format("launch --nproc_per_node 2 --master_port 0 train --config {}", cfg));
  ASSERT_EQ(same.size(), 6u);
  for (size_t i = 0; i < same.size(); ++i) EXPECT_EQ(same[i], a[6 + i]) << "step " << i + 7;
  EXPECT_TRUE(same_bytes(c.dir / "full/checkpoint-12/adapter_model.safetensors",
                         c.dir / "same/checkpoint-12/adapter_model.safetensors"));
  for (const auto& [name, how] : std::vector<std::pair<std::string, std::string>>{
           {"one", "train --config " + cfg + " --per_device_train_batch_size 4 --zero_stage 0"},
           {"stage2", fmt::format("launch --nproc_per_node 4 --master_port 0 train --config {} "
                                  "--per_device_train_batch_size 1 --zero_stage 2",
                                  cfg)}}) {
    SCOPED_TRACE(name);
    const std::vector<double> o = resume(name, how);
    ASSERT_EQ(o.size(), 6u);
    for (size_t i = 0; i < o.size(); ++i) EXPECT_NEAR(o[i], a[6 + i], 1e-5 * std::fabs(a[6 + i])) << i + 7;
  }
}

}  // namespace
}  // namespace anvil
