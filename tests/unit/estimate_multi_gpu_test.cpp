// `anvil estimate --num_gpus N --num_nodes M`: Anvil's stage-0 plan per GPU with the job's global batch, each
// node's host memory (what the loaders and the engine really pin, measured on the CPU), and DeepSpeed's
// ZeRO-2 and ZeRO-3 model-states estimates, checked against tables DeepSpeed printed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/classification_shard.hpp"
#include "kernels/step_values.hpp"
#include "memory/deepspeed_estimate.hpp"
#include "memory/host_staging.hpp"
#include "runtime/device.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"
#include "train/memory_fit.hpp"
#include "train/run_model.hpp"
#include "train/task.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// --- DeepSpeed's estimators ------------------------------------------------------------------------------

// The seed's table (shared/seeds, Hugging Face's DeepSpeed guide):
// estimate_zero3_model_states_mem_needs_all_live of bigscience/T0_3B (AutoModel, a T5 v1.1 XL shape: d_model
// 2048, d_ff 5120, 24 + 24 layers, 32 heads of 64, vocabulary 32128, shared embedding, no LM head) on 1 node
// with 1 GPU. Its parameters: embedding 65,798,144 + encoder 24 x 48,238,592 + 1,024 + 2,048 + decoder 24 x
// 65,017,856 + 1,024 + 2,048 = 2,783,959,040; its largest layer is the shared embedding, 32128 x 2048 =
// 65,798,144.
constexpr int64_t kT0Params = 2'783'959'040;
constexpr int64_t kT0LargestLayer = 65'798'144;

TEST(EstimateMultiGpu, DeepSpeedZero3ReproducesTheSeedTable) {
  EXPECT_EQ(deepspeed_zero3_table(kT0Params, kT0LargestLayer, 1, 1),
            "Estimated memory needed for params, optim states and gradients for a:\n"
            "HW: Setup with 1 node, 1 GPU per node.\n"
            "SW: Model with 2783M total params, 65M largest layer params.\n"
            "  per CPU  |  per GPU |   Options\n"
            "   70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"
            "   70.00GB |   0.25GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"
            "   62.23GB |   5.43GB | offload_param=none, offload_optimizer=cpu , zero_init=1\n"
            "   62.23GB |   5.43GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"
            "    0.37GB |  46.91GB | offload_param=none, offload_optimizer=none, zero_init=1\n"
            "   15.56GB |  46.91GB | offload_param=none, offload_optimizer=none, zero_init=0\n");
  // The bytes behind the rows (DeepSpeed's formulas evaluated in Python for these counts).
  const std::vector<DeepSpeedEstimateRow> rows = deepspeed_zero3_estimates(kT0Params, kT0LargestLayer, 1, 1);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0].cpu_bytes, 75'166'894'080);
  EXPECT_EQ(rows[0].gpu_bytes, 263'192'576);
  EXPECT_EQ(rows[2].cpu_bytes, 66'815'016'960);
  EXPECT_EQ(rows[2].gpu_bytes, 5'831'110'656);
  EXPECT_EQ(rows[4].cpu_bytes, 394'788'864);
  EXPECT_EQ(rows[5].cpu_bytes, 16'703'754'240);
  EXPECT_EQ(rows[5].gpu_bytes, 50'374'455'296);
}

// DeepSpeed's own documentation (docs/code-docs/source/memory.rst): the cold estimate of a 2851M-parameter
// model with a 32M largest layer on 1 node with 8 GPUs.
TEST(EstimateMultiGpu, DeepSpeedZero3MatchesItsDocumentedTable) {
  EXPECT_EQ(deepspeed_zero3_table(2'851'000'000, 32'000'000, 8, 1),
            "Estimated memory needed for params, optim states and gradients for a:\n"
            "HW: Setup with 1 node, 8 GPUs per node.\n"
            "SW: Model with 2851M total params, 32M largest layer params.\n"
            "  per CPU  |  per GPU |   Options\n"
            "   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"
            "  127.45GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"
            "   63.72GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=1\n"
            "  127.45GB |   0.78GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"
            "    1.43GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=1\n"
            "  127.45GB |   6.09GB | offload_param=none, offload_optimizer=none, zero_init=0\n");
}

TEST(EstimateMultiGpu, DeepSpeedZero2) {
  // DeepSpeed's documented ZeRO-2 case, the same 2851M parameters on 8 GPUs: 127.45GB | 5.31GB with the
  // optimizer offloaded, and 127.45GB on the CPU without. Its GPU figure without offload (15.93GB, 4P + 16P /
  // 8) predates PR #5099, which made it 2P + 18P / GPUs: 11.28GB, as DeepSpeed computes it now.
  EXPECT_EQ(deepspeed_zero2_table(2'851'000'000, 8, 1),
            "Estimated memory needed for params, optim states and gradients for a:\n"
            "HW: Setup with 1 node, 8 GPUs per node.\n"
            "SW: Model with 2851M total params.\n"
            "  per CPU  |  per GPU |   Options\n"
            "  127.45GB |   5.31GB | offload_optimizer=cpu \n"
            "  127.45GB |  11.28GB | offload_optimizer=none\n");
  // On one GPU both formulas give 20 bytes per parameter: the seed's model.
  EXPECT_EQ(deepspeed_zero2_table(kT0Params, 1, 1),
            "Estimated memory needed for params, optim states and gradients for a:\n"
            "HW: Setup with 1 node, 1 GPU per node.\n"
            "SW: Model with 2783M total params.\n"
            "  per CPU  |  per GPU |   Options\n"
            "   62.23GB |   5.19GB | offload_optimizer=cpu \n"
            "   15.56GB |  51.86GB | offload_optimizer=none\n");
  const std::vector<DeepSpeedEstimateRow> rows = deepspeed_zero2_estimates(kT0Params, 1, 1);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_TRUE(rows[0].offload_optimizer);
  EXPECT_EQ(rows[1].gpu_bytes, 20 * kT0Params);
}

// Several nodes (gpus_factor = 1 / nodes, the max() of the zero_init=0 rows, the integer divisions), against
// DeepSpeed's functions evaluated in Python for 7,000,000,003 parameters, a 131,000,001 largest layer, 3 GPUs
// per node and 5 nodes.
TEST(EstimateMultiGpu, DeepSpeedOnSeveralNodesToTheByte) {
  const int64_t P = 7'000'000'003, L = 131'000'001;
  const std::vector<std::pair<int64_t, int64_t>> zero3 = {
      {37'800'000'016, 524'000'004},    {126'000'000'054, 524'000'004}, {33'600'000'014, 1'457'333'337},
      {126'000'000'054, 1'457'333'337}, {2'358'000'018, 8'924'000'007}, {126'000'000'054, 8'924'000'007}};
  const std::vector<DeepSpeedEstimateRow> r3 = deepspeed_zero3_estimates(P, L, 3, 5);
  ASSERT_EQ(r3.size(), zero3.size());
  for (size_t i = 0; i < r3.size(); ++i) {
    EXPECT_EQ(r3[i].cpu_bytes, zero3[i].first) << "row " << i;
    EXPECT_EQ(r3[i].gpu_bytes, zero3[i].second) << "row " << i;
  }
  const std::vector<DeepSpeedEstimateRow> r2 = deepspeed_zero2_estimates(P, 3, 5);
  ASSERT_EQ(r2.size(), 2u);
  EXPECT_EQ(r2[0].cpu_bytes, 630'000'000'270);
  EXPECT_EQ(r2[0].gpu_bytes, 14'000'000'006);
  EXPECT_EQ(r2[1].cpu_bytes, 126'000'000'054);
  EXPECT_EQ(r2[1].gpu_bytes, 22'400'000'009);
  EXPECT_TRUE(contains(deepspeed_zero3_table(P, L, 3, 5), "HW: Setup with 5 nodes, 3 GPUs per node.\n"));
}

// The largest layer as DeepSpeed counts it: the most parameters one Hugging Face module holds itself.
TEST(EstimateMultiGpu, ParamCountsFollowDeepSpeedsModules) {
  TransformerConfig gpt2 = TransformerConfig::preset("d12");
  DeepSpeedParamCounts c = deepspeed_param_counts(gpt2);
  EXPECT_EQ(c.total_params, 124'439'808);  // GPT2LMHeadModel, the tied head counted once
  EXPECT_EQ(c.total_params, gpt2.num_parameters());
  EXPECT_EQ(c.largest_layer, "transformer.wte");  // 50257 x 768 (the real vocabulary, not Anvil's padded one)
  EXPECT_EQ(c.largest_layer_params, 50257 * 768);

  // A Llama whose MLP outgrows its embedding: gate_proj's weight and bias (64 x 1000 + 1000) are one module.
  TransformerConfig llama;
  llama.family = "llama";
  llama.n_layer = 2, llama.n_head = 4, llama.n_embd = 64, llama.vocab_size = 256, llama.block_size = 64;
  llama.intermediate_size = 1000, llama.mlp_bias = true, llama.tie_word_embeddings = false;
  c = deepspeed_param_counts(llama);
  EXPECT_EQ(c.total_params, llama.num_parameters());
  EXPECT_EQ(c.largest_layer_params, 65'000);
  EXPECT_EQ(c.largest_layer, "model.layers.0.mlp.gate_proj");

  const TransformerConfig bert = TransformerConfig::preset("bert-base");
  c = deepspeed_param_counts(bert);
  EXPECT_EQ(c.total_params, bert.num_parameters());
  EXPECT_EQ(c.largest_layer, "bert.embeddings.word_embeddings");
  EXPECT_EQ(c.largest_layer_params, int64_t(bert.vocab_size) * bert.n_embd);
}

// --- host memory ---------------------------------------------------------------------------------------

// What one process of the run pins: the engine (its step values, a BERT's dropout state) and the task's
// loaders, as the trainer opens them for rank 0 of `ranks`.
size_t measured_pinned_bytes(TrainConfig cfg, int ranks) {
  RunModel rm = resolve_run_model(cfg);
  const RunData data = open_run_data(cfg, rm);
  // The engine owns the device, so it outlives the loaders that pin its memory.
  Engine engine(rm.config, training_engine_options(cfg, DeviceKind::CPU));
  std::unique_ptr<Task> task = make_task(cfg, data, rm.config, std::move(rm.tokenizer));
  task->open_loaders(cfg, engine.device(), 0, ranks);
  return engine.device().memory_stats().pinned_bytes;
}

HostStaging planned_staging(TrainConfig cfg) {
  RunModel rm = resolve_run_model(cfg);
  open_run_data(cfg, rm);  // a classifier's sequence length
  return host_staging_per_process(cfg, rm.config, estimate_memory(rm.config, cfg, DeviceKind::CPU, 0).plan);
}

TEST(EstimateMultiGpu, HostStagingIsWhatAProcessPins) {
  test::ByteCorpus corpus(20000);
  json j = {
      {"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 256}, {"block_size", 32}}},
      {"train_data", corpus.dir / "data/train.bin"},
      {"val_data", corpus.dir / "data/val.bin"},
      {"per_device_train_batch_size", 4},
      {"per_device_eval_batch_size", 3},
      {"device", "cpu"},
      {"output_dir", corpus.dir / "run"}};
  TrainConfig cfg = TrainConfig::from_json(j, "test");
  HostStaging h = planned_staging(cfg);
  EXPECT_EQ(h.pinned_bytes(), measured_pinned_bytes(cfg, 2));
  EXPECT_EQ(h.total_bytes(), h.pinned_bytes());
  // Train: 6 slots of 4 x 32 inputs and targets; eval: 4 slots of 3 x 32; the step values' host copy.
  ASSERT_EQ(h.buffers.size(), 3u);
  EXPECT_EQ(h.buffers[0].bytes, 6u * 2 * 4 * 32 * 4);
  EXPECT_EQ(h.buffers[1].bytes, 4u * 2 * 3 * 32 * 4);
  EXPECT_EQ(h.buffers[2].name, "step values (host copy)");

  // Without pin_memory the loaders stage in pageable memory: only the step values stay pinned.
  j["dataloader_pin_memory"] = false;
  j.erase("val_data");
  cfg = TrainConfig::from_json(j, "test");
  h = planned_staging(cfg);
  EXPECT_EQ(h.pinned_bytes(), measured_pinned_bytes(cfg, 1));
  EXPECT_EQ(h.total_bytes(), h.pinned_bytes() + 6u * 2 * 4 * 32 * 4);
  EXPECT_FALSE(h.buffers[0].pinned);
}

TEST(EstimateMultiGpu, HostStagingOfAClassifier) {
  test::TempDir dir;
  data::write_classification_shard(dir / "train.cls", 30, 16, {"no", "yes"},
                                   {{2, 6, 3}, {4, 5}, {7, 8, 9, 10, 11}, {3}, {12, 13}}, {0, 1, 1, 0, 1});
  const json j = {{"model",
                   {{"family", "bert"},
                    {"n_layer", 1},
                    {"n_head", 2},
                    {"n_embd", 16},
                    {"vocab_size", 30},
                    {"block_size", 32},
                    {"intermediate_size", 32}}},
                  {"train_data", dir / "train.cls"},
                  {"per_device_train_batch_size", 2},
                  {"device", "cpu"},
                  {"output_dir", dir / "run"}};
  const TrainConfig cfg = TrainConfig::from_json(j, "test");
  const HostStaging h = planned_staging(cfg);
  EXPECT_EQ(h.pinned_bytes(), measured_pinned_bytes(cfg, 2));  // rank 0 of 2
  // 6 slots of 2 x 8 ids (the longest example rounded up to 8) + 2 lengths + 2 labels; BERT trains with
  // dropout, whose state has a host copy too.
  EXPECT_EQ(h.buffers[0].bytes, 6u * (2 * 8 + 2 + 2) * 4);
  ASSERT_EQ(h.buffers.size(), 3u);
  EXPECT_EQ(h.buffers[1].name, "dropout state (host copy)");
  EXPECT_EQ(h.buffers[2].name, "step values (host copy)");
}

// --- the command -------------------------------------------------------------------------------------------

// examples/gpt2-124m.json plans for CUDA; a build without CUDA plans it for the CPU.
std::string gpt2_124m() {
  return std::string(" --config ") + ANVIL_SOURCE_DIR + "/examples/gpt2-124m.json" +
         (cuda_compiled() ? "" : " --device cpu");
}

TEST(EstimateMultiGpu, CommandPrintsTheJob) {
  test::CommandResult r = test::run_anvil("estimate" + gpt2_124m() + " --num_gpus 8 --num_nodes 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string unit = cuda_compiled() ? "GPU" : "process";
  const std::string units = cuda_compiled() ? "GPUs" : "processes";
  const std::string& out = r.output;
  EXPECT_TRUE(contains(out, fmt::format("per {0}: every {0} holds this plan", unit))) << out;
  EXPECT_TRUE(
      contains(out, fmt::format("data parallel: 8 {0} per node x 2 nodes = 16 {0} (ZeRO stage 0)", units)))
      << out;
  EXPECT_TRUE(contains(
      out,
      fmt::format("global batch 128 sequences = micro-batch 8 x 1 accumulation x 8 {} per node x 2 nodes",
                  units)))
      << out;
  // DeepSpeed's tables for GPT-2 124M on 2 nodes of 8 GPUs (its formulas evaluated in Python).
  for (const char* line :
       {"These are DeepSpeed's figures, not Anvil's plan (Anvil's per stage is above).\n",
        "from 124,439,808 parameters and the largest layer, transformer.wte (38,597,376)",
        "HW: Setup with 2 nodes, 8 GPUs per node.\nSW: Model with 124M total params.\n  per CPU  |  per GPU "
        "|   "
        "Options\n   11.13GB |   0.23GB | offload_optimizer=cpu \n    5.56GB |   0.36GB | "
        "offload_optimizer=none\n",
        "SW: Model with 124M total params, 38M largest layer params.\n  per CPU  |  per GPU |   Options\n"
        "    1.56GB |   0.14GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"
        "    5.56GB |   0.14GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"
        "    1.39GB |   0.16GB | offload_param=none, offload_optimizer=cpu , zero_init=1\n"
        "    5.56GB |   0.16GB | offload_param=none, offload_optimizer=cpu , zero_init=0\n"
        "    1.73GB |   0.27GB | offload_param=none, offload_optimizer=none, zero_init=1\n"
        "    5.56GB |   0.27GB | offload_param=none, offload_optimizer=none, zero_init=0\n"})
    EXPECT_TRUE(contains(out, line)) << line << "\n---\n" << out;
  // Host memory: train (6 slots) and eval (4 slots) staging of 8 x 1024 tokens, the step values, x 8.
  EXPECT_TRUE(contains(out, "host memory per node")) << out;

  r = test::run_anvil("estimate" + gpt2_124m() + " --num_gpus 8 --num_nodes 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  const json& dp = j.at("data_parallel");
  EXPECT_EQ(dp.at("zero_stage"), 0);
  EXPECT_EQ(dp.at("world_size"), 16);
  EXPECT_EQ(dp.at("global_batch"), 128);
  const size_t per_process = dp.at("host_per_process").at("bytes").get<size_t>();
  EXPECT_EQ(per_process, (6u + 4u) * 2 * 8 * 1024 * 4 + sizeof(StepValues));
  EXPECT_EQ(dp.at("host_per_node").at("bytes").get<size_t>(), 8 * per_process);
  EXPECT_EQ(dp.at("deepspeed").at("total_params"), 124'439'808);
  EXPECT_EQ(dp.at("deepspeed").at("zero3").size(), 6u);
  EXPECT_EQ(dp.at("deepspeed").at("zero2").at(1).at("gpu_bytes"), 388'874'400);

  // Without the flags the estimate is the one-process estimate, as before.
  r = test::run_anvil("estimate" + gpt2_124m());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "data parallel")) << r.output;
  EXPECT_FALSE(contains(r.output, "DeepSpeed")) << r.output;

  // The sweep names the job and DeepSpeed's tables too.
  r = test::run_anvil("estimate" + gpt2_124m() + " --num_gpus 2 --sweep");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "global batch = effective batch x 2")) << r.output;
  EXPECT_TRUE(contains(r.output, "HW: Setup with 1 node, 2 GPUs per node.")) << r.output;
}

// communication_data_type other than the gradients' type: the job plans the staging buffer (2 bytes a
// parameter in bf16 under stage 0, the unit slots' size under stages 2-3) and the stage table shows it; one
// process reduces nothing and plans none.
TEST(EstimateMultiGpu, CommunicationTypeIsPlanned) {
  const std::string flags = gpt2_124m() + " --bf16 true --communication_data_type bf16";
  test::CommandResult r = test::run_anvil("estimate" + flags + " --num_gpus 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json j = json::parse(r.output);
  // (The buffer covers the padded vocabulary's rows too.)
  const size_t params = j.at("parameters").get<size_t>(), staged = j.at("communication").get<size_t>();
  EXPECT_GE(staged, 2 * params);
  EXPECT_LT(staged, 2 * params + 2 * params / 100);
  const json& stages = j.at("data_parallel").at("stages");
  ASSERT_EQ(stages.size(), 4u);
  EXPECT_LT(stages.at(2).at("communication").get<size_t>(), stages.at(0).at("communication").get<size_t>());
  EXPECT_GT(stages.at(2).at("communication").get<size_t>(), 0u);
  r = test::run_anvil("estimate" + flags + " --num_gpus 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "optimizer states  communication")) << r.output;
  r = test::run_anvil("estimate" + flags + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(r.output).at("communication").get<size_t>(), 0u);
}

// A DeepSpeed config's train_batch_size counts every process of the planned job, as it will in the job.
TEST(EstimateMultiGpu, TrainBatchSizeCountsThePlannedJob) {
  test::TempDir dir;
  test::write_file(dir / "ds.json", R"({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 8})");
  const std::string cmd = "estimate" + gpt2_124m() + " --deepspeed " + (dir / "ds.json") + " --json";
  test::CommandResult r = test::run_anvil(cmd + " --num_gpus 8 --num_nodes 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json j = json::parse(r.output);
  EXPECT_EQ(j.at("gradient_accumulation_steps"), 2);
  EXPECT_EQ(j.at("data_parallel").at("global_batch"), 256);
  r = test::run_anvil(cmd);  // one process: all 256 sequences in 32 micro-batches
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(r.output).at("gradient_accumulation_steps"), 32);
  r = test::run_anvil(cmd + " --num_gpus 3");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.output, "train_batch_size 256 is not a multiple of the world size 3")) << r.output;
  // BERT-family models keep whole weights: their stage 3 is refused, saying what to use.
  r = test::run_anvil("estimate --model bert-tiny --device cpu --zero_stage 3 --num_gpus 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.output, "ZeRO stage 3 partitions the weights of decoder models")) << r.output;
  EXPECT_TRUE(contains(r.output, "use zero_stage 2 or lower")) << r.output;
  // Stage 3 from a DeepSpeed config: the plan of the partitioned weights.
  test::write_file(dir / "zero3.json", R"({"zero_optimization": {"stage": 3}})");
  r = test::run_anvil("estimate" + gpt2_124m() + " --deepspeed " + (dir / "zero3.json") + " --num_gpus 8");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "(ZeRO stage 3)")) << r.output;
  EXPECT_TRUE(
      contains(r.output, "with the largest shard's weights, master weights, gradients and optimizer state"))
      << r.output;
}

// ZeRO stages in the plan of a job: the configured stage's plan has the largest shard's master weights and
// optimizer state; every stage's model states are printed; and where the configured run does not fit, the
// fastest configuration that fits may be a ZeRO stage.
TEST(EstimateMultiGpu, ZeroStagesPlanTheShards) {
  const std::string cmd = "estimate" + gpt2_124m() + " --bf16 --num_gpus 2";
  test::CommandResult r = test::run_anvil(cmd + " --zero_stage 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  const json& stages = j.at("data_parallel").at("stages");
  EXPECT_EQ(j.at("data_parallel").at("zero_stage"), 2);
  ASSERT_EQ(stages.size(), 4u);
  auto bytes = [&](int s, const char* what) { return double(stages.at(size_t(s)).at(what).get<size_t>()); };
  for (int s : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(s));
    EXPECT_EQ(stages.at(size_t(s)).at("zero_stage"), s);
    if (s < 3) {
      EXPECT_EQ(bytes(s, "weights"), bytes(0, "weights"));  // the bf16 weights stay whole
    } else {  // the shard's bf16 weights plus the unit slots they are gathered into
      EXPECT_LT(bytes(s, "weights"), bytes(0, "weights"));
      EXPECT_GT(bytes(s, "weights"), bytes(0, "weights") / 2);
    }
    if (s == 1) {
      EXPECT_EQ(bytes(s, "gradients"), bytes(0, "gradients"));
    } else {  // the shard's reduced gradients plus the unit slots backward writes (the embedding's is large)
      EXPECT_LT(bytes(s, "gradients"), bytes(0, "gradients"));
      EXPECT_GT(bytes(s, "gradients"), bytes(0, "gradients") / 2);
    }
    EXPECT_NEAR(bytes(s, "master_weights"), bytes(0, "master_weights") / 2, 1e5);
    EXPECT_NEAR(bytes(s, "optimizer_states"), bytes(0, "optimizer_states") / 2, 1e5);
    EXPECT_LT(bytes(s, "total"), bytes(0, "total"));
  }
  // The configured stage is the estimate itself.
  EXPECT_EQ(j.at("optimizer_states"), stages.at(2).at("optimizer_states"));
  EXPECT_EQ(j.at("total"), stages.at(2).at("total"));

  r = test::run_anvil(cmd + " --zero_stage 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "(ZeRO stage 1)")) << r.output;
  EXPECT_TRUE(contains(r.output, "by ZeRO stage (Anvil's plan for this job; * the configured one)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "    1 *")) << r.output;

  // A budget one byte below stage 0's total: ZeRO-2 fits, and it is the cheapest change.
  const size_t stage0 = size_t(bytes(0, "total"));
  r = test::run_anvil(cmd + fmt::format(" --gpu_memory {}", stage0 - 1));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "does NOT fit")) << r.output;
  const size_t line = r.output.find('\n', r.output.find("does NOT fit")) + 1;
  const std::string first_alternative = r.output.substr(line, r.output.find('\n', line) - line);
  EXPECT_TRUE(contains(first_alternative, "--zero_stage 2")) << r.output;
  // One process: no stage is proposed (every stage is stage 0).
  r = test::run_anvil("estimate" + gpt2_124m() + " --bf16" + fmt::format(" --gpu_memory {}", stage0 - 1));
  EXPECT_FALSE(contains(r.output, "--zero_stage")) << r.output;
}

TEST(EstimateMultiGpu, BadFlags) {
  test::CommandResult r = test::run_anvil("estimate" + gpt2_124m() + " --num_gpus 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "error: --num_gpus must be a positive integer, got 0\n");
  r = test::run_anvil("estimate" + gpt2_124m() + " --num_nodes -2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "error: --num_nodes must be a positive integer, got -2\n");
  r = test::run_anvil("estimate" + gpt2_124m() + " --num_gpus eight");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "error: --num_gpus must be a positive integer, got eight\n");
  r = test::run_anvil("estimate" + gpt2_124m() + " --num_gpus 100000 --num_nodes 100000");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "error: --num_gpus 100000 x --num_nodes 100000: more processes than 2147483647\n");
}

// A BERT classifier's job. Its largest layer as DeepSpeed counts it is the MLP input: 256 x 16 weights + 256
// biases.
TEST(EstimateMultiGpu, ClassifierJob) {
  test::TempDir dir;
  test::write_file(dir / "bert.json", R"({"model": {"family": "bert", "n_layer": 1, "n_head": 2, "n_embd": 16,
      "vocab_size": 30, "block_size": 32, "num_labels": 2}, "max_seq_length": 16,
      "per_device_train_batch_size": 4, "gradient_accumulation_steps": 3, "device": "cpu"})");
  const test::CommandResult r =
      test::run_anvil("estimate --config " + (dir / "bert.json") + " --num_gpus 2 --num_nodes 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(
      contains(r.output, "data parallel: 2 processes per node x 3 nodes = 6 processes (ZeRO stage 0)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "global batch 72 sequences = micro-batch 4 x 3 accumulation")) << r.output;
  EXPECT_TRUE(contains(r.output, "largest layer, bert.encoder.layer.0.intermediate.dense (4,352)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "dropout state (host copy)")) << r.output;
}

}  // namespace
}  // namespace anvil
