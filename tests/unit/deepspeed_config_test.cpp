// DeepSpeed config import: HF "auto" semantics, conflicts, supported blocks and errors.
#include "train/deepspeed_config.hpp"

#include <gtest/gtest.h>

#include "anvil/error.hpp"
#include "precision/loss_scaler.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;
using Keys = std::set<std::string>;

TrainConfig apply(const json& ds, const Keys& given = {}, TrainConfig c = TrainConfig()) {
  apply_deepspeed_json(c, ds, "ds.json", given);
  return c;
}

void expect_error(const json& ds, std::initializer_list<std::string> needles, const Keys& given = {},
                  const TrainConfig& c = TrainConfig()) {
  test::expect_error([&] { apply(ds, given, c); }, needles);
}

TEST(DeepSpeedConfig, Fp16Block) {
  const TrainConfig c =
      apply(json::parse(R"({"fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
      "loss_scale_window": 500, "hysteresis": 1, "consecutive_hysteresis": true, "min_loss_scale": 0.5}})"));
  EXPECT_TRUE(c.fp16);
  EXPECT_FALSE(c.bf16);
  EXPECT_EQ(c.loss_scale, 0);
  EXPECT_EQ(c.initial_scale_power, 12);
  EXPECT_EQ(c.loss_scale_window, 500);
  EXPECT_EQ(c.hysteresis, 1);
  EXPECT_TRUE(c.consecutive_hysteresis);
  EXPECT_EQ(c.min_loss_scale, 0.5);
  EXPECT_EQ(apply({{"fp16", {{"loss_scale", 128}}}}).loss_scale, 128);
  EXPECT_FALSE(apply({{"fp16", {{"enabled", false}}}}).fp16);
  expect_error({{"fp16", {{"enabled", "yes"}}}},
               {"ds.json", "'fp16.enabled' must be true or false", "\"yes\""});
  expect_error({{"fp16", {{"hysteresis", 1.5}}}}, {"'fp16.hysteresis' must be an integer", "1.5"});
  expect_error({{"fp16", {{"auto_cast", true}}}}, {"ds.json", "'fp16.auto_cast'", "loss_scale_window"});
  expect_error({{"fp16", {{"hysteresys", 2}}}}, {"'fp16.hysteresys'", "did you mean 'fp16.hysteresis'"});
  expect_error({{"fp16", true}}, {"'fp16' must be an object"});
}

TEST(DeepSpeedConfig, Bf16AndDataTypes) {
  TrainConfig c = apply({{"bf16", {{"enabled", true}}}, {"data_types", {{"grad_accum_dtype", "bf16"}}}});
  EXPECT_TRUE(c.bf16);
  EXPECT_EQ(c.grad_accum_dtype, "bf16");
  EXPECT_TRUE(apply({{"bfloat16", {{"enabled", true}}}}).bf16);  // DeepSpeed's old name
  expect_error({{"bf16", {{"enabled", true}}}, {"bfloat16", {{"enabled", true}}}}, {"'bfloat16'"});
  expect_error({{"bf16", {{"immediate_grad_update", true}}}}, {"'bf16.immediate_grad_update'"});
  expect_error({{"data_types", {{"grad_accum_dtype", "fp8"}}}}, {"data_types.grad_accum_dtype", "'fp8'"});
  expect_error({{"data_types", {{"params_dtype", "bf16"}}}}, {"'data_types.params_dtype'"});
  // Both enabled, or enabled against the Anvil config's other 16-bit type.
  expect_error({{"bf16", {{"enabled", true}}}, {"fp16", {{"enabled", true}}}}, {"ds.json", "fp16 and bf16"});
  TrainConfig f16;
  f16.fp16 = true;
  expect_error({{"bf16", {{"enabled", true}}}}, {"fp16 and bf16"}, {"fp16"}, f16);
}

TEST(DeepSpeedConfig, AutoTakesTheAnvilValue) {
  TrainConfig base;
  base.fp16 = true;
  base.learning_rate = 3e-4;
  base.adam_beta1 = 0.8;
  base.adam_beta2 = 0.95;
  base.adam_epsilon = 1e-6;
  base.weight_decay = 0.1;
  base.per_device_train_batch_size = 4;
  base.gradient_accumulation_steps = 2;
  base.max_grad_norm = 0.5;
  base.logging_steps = 7;
  base.hysteresis = 3;
  const json ds = json::parse(R"({
    "fp16": {"enabled": "auto", "hysteresis": "auto", "loss_scale": "auto"},
    "bf16": {"enabled": "auto"},
    "data_types": {"grad_accum_dtype": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
    "gradient_clipping": "auto", "steps_per_print": "auto", "wall_clock_breakdown": false})");
  const Keys given = {"fp16",         "learning_rate", "adam_beta1",    "adam_beta2",
                      "adam_epsilon", "weight_decay",  "max_grad_norm", "hysteresis"};
  const TrainConfig c = apply(ds, given, base);
  EXPECT_EQ(c.to_json(), base.to_json());
  // "auto" against defaults keeps the defaults.
  EXPECT_EQ(apply(ds).to_json(), TrainConfig().to_json());
}

TEST(DeepSpeedConfig, ConcreteValuesOverrideDefaults) {
  const json ds = json::parse(R"({
    "optimizer": {"type": "adam", "params": {"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-6, "weight_decay": 0.01,
                                             "adam_w_mode": true}},
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8, "train_batch_size": 32,
    "gradient_clipping": 0.5, "steps_per_print": 25, "zero_optimization": {"stage": 0, "overlap_comm": true},
    "wall_clock_breakdown": true})");
  const TrainConfig c = apply(ds);
  EXPECT_EQ(c.learning_rate, 0.001);
  EXPECT_EQ(c.adam_beta1, 0.9);
  EXPECT_EQ(c.adam_beta2, 0.95);
  EXPECT_EQ(c.adam_epsilon, 1e-6);
  EXPECT_EQ(c.weight_decay, 0.01);
  EXPECT_EQ(c.per_device_train_batch_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  EXPECT_EQ(c.max_grad_norm, 0.5);
  EXPECT_EQ(c.logging_steps, 25);
  // The same values given in the Anvil config too: no conflict.
  TrainConfig same = c;
  EXPECT_EQ(
      apply(ds, {"learning_rate", "adam_beta1", "adam_beta2", "per_device_train_batch_size"}, same).to_json(),
      c.to_json());
}

TEST(DeepSpeedConfig, ConflictsNameBothKeysAndValues) {
  TrainConfig base;
  base.learning_rate = 3e-4;
  base.adam_beta2 = 0.99;
  base.per_device_train_batch_size = 16;
  base.fp16 = false;
  const json ds =
      json::parse(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.95]}},
    "train_micro_batch_size_per_gpu": 8, "fp16": {"enabled": true}})");
  try {
    apply(ds, {"learning_rate", "adam_beta2", "per_device_train_batch_size", "fp16"}, base);
    FAIL() << "expected a conflict";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ds.json: DeepSpeed config values disagree"), std::string::npos) << m;
    EXPECT_NE(m.find("- ds optimizer.params.lr=0.001 vs learning_rate=0.0003"), std::string::npos) << m;
    EXPECT_NE(m.find("- ds optimizer.params.betas=[0.9,0.95] vs adam_beta1=0.9, adam_beta2=0.99"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("- ds train_micro_batch_size_per_gpu=8 vs per_device_train_batch_size=16"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("- ds fp16.enabled=true vs fp16=false"), std::string::npos) << m;
    EXPECT_NE(m.find("\"auto\""), std::string::npos) << m;
  }
  // Keys not given in the Anvil config never conflict.
  EXPECT_NO_THROW(apply(ds, {}, base));
}

TEST(DeepSpeedConfig, TrainBatchSize) {
  // All three: must agree (world size 1).
  EXPECT_EQ(apply({{"train_batch_size", 12},
                   {"train_micro_batch_size_per_gpu", 4},
                   {"gradient_accumulation_steps", 3}})
                .gradient_accumulation_steps,
            3);
  expect_error(
      {{"train_batch_size", 16}, {"train_micro_batch_size_per_gpu", 4}, {"gradient_accumulation_steps", 3}},
      {"ds.json", "train_batch_size 16", "train_micro_batch_size_per_gpu 4", "gradient_accumulation_steps 3",
       "world size 1", "= 12"});
  // "auto" factors take the Anvil values (defaults 8 x 1).
  expect_error({{"train_batch_size", 16},
                {"train_micro_batch_size_per_gpu", "auto"},
                {"gradient_accumulation_steps", "auto"}},
               {"train_batch_size 16", "= 8"});
  // One factor missing: derived as DeepSpeed does.
  TrainConfig c = apply({{"train_batch_size", 32}, {"train_micro_batch_size_per_gpu", 4}});
  EXPECT_EQ(c.gradient_accumulation_steps, 8);
  c = apply({{"train_batch_size", 32}, {"gradient_accumulation_steps", 2}});
  EXPECT_EQ(c.per_device_train_batch_size, 16);
  c = apply({{"train_batch_size", 6}});
  EXPECT_EQ(c.per_device_train_batch_size, 6);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  // A factor given in the Anvil config counts as known.
  TrainConfig base;
  base.per_device_train_batch_size = 2;
  EXPECT_EQ(
      apply({{"train_batch_size", 10}}, {"per_device_train_batch_size"}, base).gradient_accumulation_steps,
      5);
  expect_error({{"train_batch_size", 10}, {"train_micro_batch_size_per_gpu", 4}},
               {"not a multiple", "10", "4"});
  expect_error({{"train_batch_size", 0}}, {"'train_batch_size' must be >= 1"});
  expect_error({{"train_batch_size", "lots"}},
               {"'train_batch_size' must be an integer or \"auto\"", "\"lots\""});
}

TEST(DeepSpeedConfig, Optimizer) {
  EXPECT_EQ(apply({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 2e-4}}}}}}).learning_rate, 2e-4);
  EXPECT_EQ(apply({{"optimizer", {{"type", "Adam"}}}}).learning_rate, TrainConfig().learning_rate);
  expect_error({{"optimizer", {{"type", "Lamb"}}}}, {"ds.json", "'Lamb' is not supported", "Adam, AdamW"});
  expect_error({{"optimizer", {{"params", {{"lr", 1e-3}}}}}}, {"needs a 'type'"});
  expect_error({{"optimizer", {{"type", "AdamW"}, {"params", {{"momentum", 0.9}}}}}},
               {"'optimizer.params.momentum'", "lr, betas, eps, weight_decay"});
  expect_error({{"optimizer", {{"type", "Adam"}, {"params", {{"adam_w_mode", false}}}}}},
               {"'optimizer.params.adam_w_mode'", "not supported"});
  expect_error({{"optimizer", {{"type", "AdamW"}, {"params", {{"betas", {0.9}}}}}}},
               {"'optimizer.params.betas' must be a list of two numbers"});
  expect_error({{"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "fast"}}}}}},
               {"'optimizer.params.lr' must be a number", "\"fast\""});
}

TEST(DeepSpeedConfig, ZeroStages) {
  EXPECT_NO_THROW(apply({{"zero_optimization", {{"stage", 0}}}}));
  EXPECT_NO_THROW(apply({{"zero_optimization", json::object()}}));
  EXPECT_NO_THROW(apply({{"zero_optimization", false}}));
  EXPECT_EQ(apply({{"zero_optimization", {{"stage", 1}}}}).zero_stage, 1);
  EXPECT_EQ(apply({{"zero_optimization", {{"stage", 2}}}}).zero_stage, 2);
  EXPECT_EQ(apply({{"zero_optimization", true}}).zero_stage, 1);  // the legacy form
  EXPECT_EQ(apply({{"zero_optimization", {{"stage", 2}, {"allgather_bucket_size", 2e8}}}})
                .zero_allgather_bucket_size,
            200000000);
  EXPECT_EQ(
      apply({{"zero_optimization", {{"stage", 3}, {"stage3_prefetch_bucket_size", "auto"}}}}).zero_stage, 3);
  expect_error({{"zero_optimization", {{"stage", 4}}}}, {"must be 0..3", "4"});
  expect_error({{"zero_optimization", {{"stage", "auto"}}}}, {"zero_optimization.stage", "\"auto\""});
}

// train_batch_size counts every process's sequences: under a launcher of 2 processes, 16 with micro-batch 4
// means 2 accumulation steps.
TEST(DeepSpeedConfig, TrainBatchSizeCountsTheWorld) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("LOCAL_RANK", "0", 1);
  const TrainConfig c = apply({{"train_batch_size", 16}, {"train_micro_batch_size_per_gpu", 4}});
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  test::expect_error([] { apply({{"train_batch_size", 15}}); }, {"not a multiple of the world size 2"});
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("LOCAL_RANK");
}

// communication_data_type sets Anvil's key of the same name, whatever the gradient type ("auto" leaves it);
// another type is refused naming it.
TEST(DeepSpeedConfig, CommunicationDataType) {
  EXPECT_EQ(apply({{"communication_data_type", "fp32"}}).communication_data_type, "fp32");
  EXPECT_EQ(apply({{"communication_data_type", "auto"}}).communication_data_type, "");
  EXPECT_EQ(
      apply({{"bf16", {{"enabled", true}}}, {"communication_data_type", "bf16"}}).communication_data_type,
      "bf16");
  const TrainConfig c = apply({{"bf16", {{"enabled", true}}},
                               {"data_types", {{"grad_accum_dtype", "bf16"}}},
                               {"communication_data_type", "fp32"}});
  EXPECT_EQ(c.grad_accum_dtype, "bf16");
  EXPECT_EQ(c.communication_data_type, "fp32");
  expect_error({{"communication_data_type", "int8"}}, {"must be fp32, fp16 or bf16", "int8"});
}

// Stage 0's keys: reduce_bucket_size (elements) sets ddp_bucket_cap_mb as fp32 megabytes, overlap_comm false
// one reduction after backward; the partitioning stages' keys are accepted as DeepSpeed accepts them under
// stage 0; offload is refused; unknown keys are named.
TEST(DeepSpeedConfig, ZeroStageZeroKeys) {
  EXPECT_DOUBLE_EQ(
      apply({{"zero_optimization", {{"stage", 0}, {"reduce_bucket_size", 5e8}}}}).ddp_bucket_cap_mb,
      5e8 * 4 / (1024.0 * 1024.0));
  EXPECT_DOUBLE_EQ(
      apply({{"zero_optimization", {{"stage", 0}, {"reduce_bucket_size", "auto"}}}}).ddp_bucket_cap_mb, 25.0);
  EXPECT_EQ(apply({{"zero_optimization", {{"overlap_comm", false}}}}).ddp_bucket_cap_mb, 0.0);
  EXPECT_EQ(apply({{"zero_optimization", {{"overlap_comm", true}}}}).ddp_bucket_cap_mb, 25.0);
  EXPECT_NO_THROW(apply({{"zero_optimization",
                          {{"stage", 0},
                           {"contiguous_gradients", true},
                           {"allgather_partitions", true},
                           {"allgather_bucket_size", 2e8},
                           {"reduce_scatter", true},
                           {"round_robin_gradients", false},
                           {"sub_group_size", 1e9},
                           {"stage3_prefetch_bucket_size", "auto"},
                           {"stage3_gather_16bit_weights_on_model_save", true},
                           {"offload_optimizer", {{"device", "none"}}}}}}));
  // Offload to the CPU is offload_optimizer / offload_param cpu; to NVMe it is refused.
  EXPECT_EQ(apply({{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}, {"pin_memory", true}}}}}})
                .offload_optimizer,
            "cpu");
  const TrainConfig both = apply({{"zero_optimization",
                                   {{"stage", 3},
                                    {"offload_optimizer", {{"device", "cpu"}}},
                                    {"offload_param", {{"device", "cpu"}, {"pin_memory", true}}}}}});
  EXPECT_EQ(both.offload_param, "cpu");
  EXPECT_EQ(both.offload_optimizer, "cpu");
  // NVMe: the optimizer's state goes to nvme_path (sub_group_size and aio, at the top level or inside
  // zero_optimization as the HF guide's example has it, set the sub-groups and the I/O).
  const TrainConfig nvme = apply({{"zero_optimization",
                                   {{"stage", 3},
                                    {"sub_group_size", 2e7},
                                    {"offload_optimizer",
                                     {{"device", "nvme"},
                                      {"nvme_path", "/local_nvme"},
                                      {"pin_memory", true},
                                      {"buffer_count", 4},
                                      {"fast_init", false}}},
                                    {"aio",
                                     {{"block_size", 262144},
                                      {"queue_depth", 32},
                                      {"thread_count", 1},
                                      {"single_submit", false},
                                      {"overlap_events", true}}}}}});
  EXPECT_EQ(nvme.offload_optimizer, "nvme");
  EXPECT_EQ(nvme.offload_nvme_path, "/local_nvme");
  EXPECT_EQ(nvme.sub_group_size, 20000000);
  EXPECT_EQ(nvme.aio_block_size, 262144);
  EXPECT_EQ(nvme.aio_threads, 32);
  EXPECT_EQ(apply({{"aio", {{"thread_count", 2}}}}).aio_threads, 16);  // DeepSpeed's queue_depth 8
  expect_error(
      {{"zero_optimization", {{"offload_optimizer", {{"device", "nvme"}}}}}},
      {"ds.json", "'zero_optimization.offload_optimizer.device' is \"nvme\"", "nvme_path' is missing"});
  // The parameters on NVMe (the HF guide's ZeRO-3 NVMe example): the same directory, buffer_count its own.
  const TrainConfig params =
      apply({{"zero_optimization",
              {{"stage", 3},
               {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/local_nvme"}}},
               {"offload_param",
                {{"device", "nvme"},
                 {"nvme_path", "/local_nvme"},
                 {"pin_memory", true},
                 {"buffer_count", 7},
                 {"buffer_size", 1e8},
                 {"max_in_cpu", 1e9}}}}}});
  EXPECT_EQ(params.offload_param, "nvme");
  EXPECT_EQ(params.offload_nvme_path, "/local_nvme");
  EXPECT_EQ(params.offload_param_buffer_count, 7);
  EXPECT_EQ(
      apply({{"zero_optimization",
              {{"offload_param", {{"device", "nvme"}, {"nvme_path", "/x"}, {"buffer_count", "auto"}}}}}})
          .offload_param_buffer_count,
      5);
  expect_error({{"zero_optimization", {{"offload_param", {{"device", "nvme"}}}}}},
               {"'zero_optimization.offload_param.device' is \"nvme\"", "nvme_path' is missing"});
  expect_error({{"zero_optimization",
                 {{"offload_optimizer", {{"device", "nvme"}, {"nvme_path", "/a"}}},
                  {"offload_param", {{"device", "nvme"}, {"nvme_path", "/b"}}}}}},
               {"'zero_optimization.offload_optimizer.nvme_path' (\"/a\")",
                "'zero_optimization.offload_param.nvme_path' (\"/b\") differ", "one directory"});
  expect_error({{"zero_optimization", {{"offload_param", {{"device", "disk"}}}}}},
               {"'zero_optimization.offload_param.device' is \"disk\"", "none, cpu and nvme"});
  expect_error({{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}, {"ratio", 0.3}}}}}},
               {"ratio' is 0.3", "partial optimizer offload"});
  expect_error({{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}, {"nvme_pth", "/x"}}}}}},
               {"'zero_optimization.offload_optimizer.nvme_pth'", "did you mean"});
  expect_error({{"aio", {{"queue_depth", 0}}}}, {"'aio.queue_depth' must be >= 1"});
  expect_error(
      {{"zero_optimization", {{"reduce_bucket_sise", 1}}}},
      {"'zero_optimization.reduce_bucket_sise'", "did you mean 'zero_optimization.reduce_bucket_size'"});
  expect_error({{"zero_optimization", {{"overlap_comm", "yes"}}}},
               {"'zero_optimization.overlap_comm'", "true or false"});
  expect_error({{"zero_optimization", {{"reduce_bucket_size", 0}}}}, {"reduce_bucket_size' must be >= 1"});
}

TEST(DeepSpeedConfig, UnknownKeysNameTheKeyAndFile) {
  expect_error({{"zero_optimisation", {{"stage", 0}}}},
               {"ds.json", "'zero_optimisation'", "did you mean 'zero_optimization'", "supported:"});
  expect_error({{"gradient_cliping", 1.0}}, {"did you mean 'gradient_clipping'"});
  expect_error({{"activation_checkpointing", json::object()}}, {"ds.json", "'activation_checkpointing'"});
  expect_error({{"scheduler", {{"type", "WarmupLR"}}}},
               {"'scheduler' is not supported", "lr_scheduler_type"});
  expect_error(json::array(), {"ds.json", "must be a JSON object"});
}

TEST(DeepSpeedConfig, FilesThroughTheTrainConfig) {
  test::TempDir dir;
  const std::string ds = dir / "ds.json";
  test::write_file(ds, R"({"fp16": {"enabled": true, "hysteresis": 4},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.05}},
    "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2})");
  const json j = {{"deepspeed", ds}, {"learning_rate", 1e-3}, {"per_device_train_batch_size", 3}};
  const TrainConfig c = TrainConfig::from_json(j, "cfg.json");
  EXPECT_TRUE(c.fp16);
  EXPECT_EQ(c.hysteresis, 4);
  EXPECT_EQ(c.learning_rate, 1e-3);
  EXPECT_EQ(c.weight_decay, 0.05);
  EXPECT_EQ(c.per_device_train_batch_size, 3);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.deepspeed, ds);
  // The resolved config round-trips (the file is applied again and agrees).
  EXPECT_EQ(TrainConfig::from_json(c.to_json(), "again").to_json(), c.to_json());
  // A conflict with a key the Anvil config sets.
  test::expect_error(
      [&] {
        TrainConfig::from_json({{"deepspeed", ds}, {"weight_decay", 0.1}}, "cfg.json");
      },
      {ds, "- ds optimizer.params.weight_decay=0.05 vs weight_decay=0.1"});
  // Validation after the import names both files.
  test::write_file(dir / "both.json",
                   R"({"fp16": {"enabled": true}, "data_types": {"grad_accum_dtype": "bf16"}})");
  test::expect_error(
      [&] {
        TrainConfig::from_json({{"deepspeed", dir / "both.json"}}, "cfg.json");
      },
      {"cfg.json with deepspeed", "both.json", "grad_accum_dtype 'bf16' needs bf16 true"});
  // Missing and malformed files.
  test::expect_error(
      [&] {
        TrainConfig::from_json({{"deepspeed", dir / "nope.json"}}, "cfg.json");
      },
      {"nope.json", "not found", "cfg.json"});
  test::write_file(dir / "bad.json", R"({"fp16": {"enabled": true},)");
  test::expect_error(
      [&] {
        TrainConfig::from_json({{"deepspeed", dir / "bad.json"}}, "cfg.json");
      },
      {"bad.json: not valid JSON"});
  test::write_file(dir / "unknown.json", R"({"fp16": {"enabled": true}, "amp": {"enabled": false}})");
  test::expect_error(
      [&] {
        TrainConfig::from_json({{"deepspeed", dir / "unknown.json"}}, "cfg.json");
      },
      {"unknown.json", "'amp'"});
}

TEST(DeepSpeedConfig, ExampleFileLoads) {
  const std::string path = std::string(ANVIL_SOURCE_DIR) + "/examples/deepspeed_fp16.json";
  const TrainConfig c = TrainConfig::from_json({{"deepspeed", path}, {"learning_rate", 6e-4}}, "cfg.json");
  EXPECT_TRUE(c.fp16);
  EXPECT_EQ(c.learning_rate, 6e-4);
  EXPECT_EQ(c.loss_scaler().initial_scale_power, 16);
  EXPECT_EQ(c.loss_scaler().hysteresis, 2);
}

// The run's plan lists what each DeepSpeed key became: "auto" resolved to the run's value, concrete values,
// and keys accepted with nothing to change, saying why.
TEST(DeepSpeedConfig, ResolutionNamesEveryKey) {
  const json ds = {
      {"train_micro_batch_size_per_gpu", "auto"},
      {"gradient_clipping", 0.5},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", "auto"}, {"betas", {0.9, 0.95}}}}}},
      {"zero_optimization", {{"stage", 2}, {"reduce_bucket_size", "auto"}, {"contiguous_gradients", true}}},
      {"wall_clock_breakdown", false}};
  TrainConfig c;
  c.per_device_train_batch_size = 6;
  c.learning_rate = 3e-4;
  c = apply(ds, {"per_device_train_batch_size", "learning_rate"}, c);
  const std::vector<std::string> lines = deepspeed_resolution(ds, c);
  const std::vector<std::string> want = {
      R"(train_micro_batch_size_per_gpu: "auto" -> per_device_train_batch_size 6)",
      "gradient_clipping: 0.5 -> max_grad_norm 0.5",
      R"(optimizer.type: "AdamW" -> optim "adamw_torch_fused")",
      R"(optimizer.params.lr: "auto" -> learning_rate 0.0003)",
      "optimizer.params.betas: [0.9,0.95] -> adam_beta1 0.9, adam_beta2 0.95",
      "zero_optimization.stage: 2 -> zero_stage 2",
      R"(zero_optimization.reduce_bucket_size: "auto" -> ddp_bucket_cap_mb 25.0)",
      "zero_optimization.contiguous_gradients: true (accepted: the gradients are always one flat buffer)",
      "wall_clock_breakdown: false (accepted: Anvil always logs its timings)"};
  EXPECT_EQ(lines, want);
  // 16-bit ZeRO 2-3: a note on DeepSpeed's 16-bit gradients, unless backward_grad_dtype says the same.
  json half = ds;
  half["bf16"] = {{"enabled", true}};
  TrainConfig h = apply(half, {"per_device_train_batch_size", "learning_rate"}, c);
  std::vector<std::string> noted = deepspeed_resolution(half, h);
  ASSERT_FALSE(noted.empty());
  EXPECT_EQ(
      noted.back(),
      "note: DeepSpeed writes stage 2 gradients in bf16 and accumulates them in fp32; Anvil writes them in "
      "fp32 (stage 0's numbers) unless backward_grad_dtype is bf16 (half the gradient slots' memory)");
  h.backward_grad_dtype = "bf16";
  noted = deepspeed_resolution(half, h);
  EXPECT_EQ(noted.back().find("note:"), std::string::npos);
  // The legacy boolean zero_optimization has no keys to list.
  EXPECT_TRUE(
      deepspeed_resolution({{"zero_optimization", true}}, apply({{"zero_optimization", true}})).empty());
}

TEST(DeepSpeedConfig, CommandLine) {
  test::TempDir dir;
  test::write_file(
      dir / "ds.json",
      R"({"fp16": {"enabled": true}, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})");
  auto r = test::run_anvil("estimate --device cpu --deepspeed " + (dir / "ds.json"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("set offload_optimizer cpu too"), std::string::npos) << r.output;
  test::write_file(dir / "ok.json", R"({"fp16": {"enabled": true}, "gradient_clipping": "auto"})");
  r = test::run_anvil("estimate --device cpu --deepspeed " + (dir / "ok.json") + " --bf16");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("fp16 and bf16"), std::string::npos) << r.output;
  r = test::run_anvil("estimate --device cpu --deepspeed " + (dir / "ok.json"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace anvil
