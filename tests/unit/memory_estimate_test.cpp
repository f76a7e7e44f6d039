// The memory estimate and what rests on it: the plan's categories add up to the arena, the device's
// allocator hands out exactly the plan, `anvil estimate` (table, --json, --sweep) reports it, and the
// start-up fit (auto_find_batch_size, out-of-memory with the cheapest configurations that fit) searches
// plans with a given "available bytes" figure.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "anvil/trainer.hpp"
#include "data/byte_corpus.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"
#include "train/memory_fit.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

TransformerConfig small_model() {
  TransformerConfig c;
  c.n_layer = 4, c.n_head = 2, c.n_embd = 32, c.vocab_size = 61, c.block_size = 16;
  return c;
}

// A config of the small model (no data needed: nothing here reads it).
TrainConfig small_config(int batch, int accumulation = 1) {
  TrainConfig c;
  c.model = small_model();
  c.model_preset.clear();
  c.per_device_train_batch_size = batch;
  c.gradient_accumulation_steps = accumulation;
  c.device = "cpu";
  return c;
}

size_t arena_of(const TrainConfig& cfg) {
  return estimate_memory(cfg.model, cfg, DeviceKind::CPU, 0).arena;
}

// --- the plan -------------------------------------------------------------------------------------

TEST(MemoryPlan, CategoriesAddUpToTheArena) {
  MemoryPlan p;
  p.add("a", MemoryCategory::Weights, 1000);
  p.add("b", MemoryCategory::Activations, 1);
  p.add("c", MemoryCategory::Activations, 256);
  p.add("d", MemoryCategory::Data, 300);
  EXPECT_EQ(p.bytes(MemoryCategory::Weights), 1024u);
  EXPECT_EQ(p.requested_bytes(MemoryCategory::Activations), 257u);
  EXPECT_EQ(p.bytes(MemoryCategory::Activations), 512u);
  EXPECT_EQ(p.bytes(MemoryCategory::MasterWeights), 0u);
  EXPECT_EQ(p.buffers()[3].offset, 1536u);
  size_t sum = 0;
  for (int c = 0; c < kMemoryCategories; ++c) sum += p.bytes(MemoryCategory(c));
  EXPECT_EQ(sum, p.total_bytes());
  EXPECT_EQ(p.total_bytes(), 2048u);
  // Master weights and communication are listed (as 0), not hidden.
  const std::string report = p.report();
  EXPECT_NE(report.find("master weights"), std::string::npos);
  EXPECT_NE(report.find("communication"), std::string::npos);
}

TEST(MemoryPlan, ParsesSizes) {
  EXPECT_EQ(parse_bytes("1000", "x"), 1000u);
  EXPECT_EQ(parse_bytes("80GiB", "x"), 80ull << 30);
  EXPECT_EQ(parse_bytes("81559MiB", "x"), 81559ull << 20);
  EXPECT_EQ(parse_bytes("80GB", "x"), 80'000'000'000ull);
  EXPECT_EQ(parse_bytes("24G", "x"), 24ull << 30);
  EXPECT_EQ(parse_bytes("1.5 KiB", "x"), 1536u);
  for (const char* bad : {"", "GiB", "-1GiB", "80 parsecs", "1e30TB"})
    test::expect_error([&] { parse_bytes(bad, "--gpu_memory"); }, {"--gpu_memory", "not a size"});
}

// --- the allocator --------------------------------------------------------------------------------

TEST(DeviceMemoryStats, CountsDeviceAndPinnedMemorySeparately) {
  auto dev = make_cpu_device();
  void* a = dev->alloc(1000);
  void* b = dev->alloc(500);
  void* pinned = dev->alloc_host_pinned(4096);
  Device::MemoryStats s = dev->memory_stats();
  EXPECT_EQ(s.allocated_bytes, 1500u);
  EXPECT_EQ(s.allocations, 2u);
  EXPECT_EQ(s.pinned_bytes, 4096u);
  dev->free(a);
  void* c = dev->alloc(200);
  s = dev->memory_stats();
  EXPECT_EQ(s.allocated_bytes, 700u);
  EXPECT_EQ(s.peak_allocated_bytes, 1500u);
  dev->free(b), dev->free(c), dev->free_host_pinned(pinned), dev->free(nullptr);
  s = dev->memory_stats();
  EXPECT_EQ(s.allocated_bytes, 0u);
  EXPECT_EQ(s.pinned_bytes, 0u);
  EXPECT_EQ(s.peak_pinned_bytes, 4096u);
  EXPECT_EQ(dev->context_overhead_bytes(), 0u);
  EXPECT_FALSE(dev->available_memory_bytes().has_value());
}

// The training run allocates exactly the plan: after the engine is built and a few optimizer steps
// have run, the device allocator's peak equals the plan's total to the byte (the plan rounds every
// buffer up to 256 bytes, so there is no further alignment), well inside the 1% the estimate promises.
TEST(DeviceMemoryStats, AllocatorPeakIsThePlanDuringTraining) {
  for (const CheckpointPolicy policy : {CheckpointPolicy{}, CheckpointPolicy{CheckpointMode::Selective, 2}}) {
    EngineOptions o;
    o.batch_size = 3, o.seq_len = 16, o.training = true, o.checkpointing = policy;
    const size_t planned = plan_engine_memory(small_model(), o).total_bytes();
    Engine e(small_model(), o);
    e.model().init_weights(7, e.device());
    std::mt19937 rng(3);
    std::vector<int32_t> ids(48), targets(48);
    for (int step = 1; step <= 3; ++step) {
      for (int i = 0; i < 48; ++i) ids[i] = int32_t(rng() % 61), targets[i] = int32_t(rng() % 61);
      e.device().copy_to_device(e.tokens(0), ids.data(), ids.size() * 4);
      e.device().copy_to_device(e.targets(0), targets.data(), targets.size() * 4);
      const size_t n = e.model().layout().total_numel();
      e.device().fill_zero(e.model().grads(), n * sizeof(float));
      e.decoder().forward(e.ops(), e.tokens(0), e.targets(0), 3, 16, 1.0f, true);
      e.decoder().backward(e.ops(), e.tokens(0), 3, 16);
      e.optimizer().step(e.ops(), e.model().params(), e.model().grads(), 1e-3f, step, 1.0f / 48);
    }
    const Device::MemoryStats s = e.device().memory_stats();
    EXPECT_EQ(s.peak_allocated_bytes, planned);
    EXPECT_EQ(s.allocated_bytes, planned);
    EXPECT_EQ(s.allocations, 1u);  // the arena, nothing else
    EXPECT_EQ(e.plan().total_bytes(), planned);
  }
}

TEST(DeviceMemoryStats, TrainSummaryRecordsTheAllocatorPeak) {
  test::TempDir dir;
  test::write_file(dir / "corpus.txt", test::small_corpus(20000));
  data::prepare_byte_corpus({dir / "corpus.txt"}, dir / "data", 0.1);
  const json j = {
      {"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 256}, {"block_size", 32}}},
      {"train_data", dir / "data/train.bin"},
      {"val_data", dir / "data/val.bin"},
      {"per_device_train_batch_size", 4},
      {"per_device_eval_batch_size", 6},
      {"max_steps", 3},
      {"max_eval_batches", 2},
      {"device", "cpu"},
      {"auto_find_batch_size", true},
      {"output_dir", dir / "run"}};
  const TrainConfig cfg = TrainConfig::from_json(j, "test");
  const TrainSummary s = train(cfg);
  const json summary = json::parse(test::read_file(dir / "run/summary.json"));
  const size_t planned = summary["planned_memory_bytes"].get<size_t>();
  EXPECT_EQ(summary["allocator_peak_bytes"].get<size_t>(), planned);
  EXPECT_EQ(s.allocator_peak_bytes, planned);
  EXPECT_EQ(summary["context_overhead_bytes"].get<size_t>(), 0u);
  // The estimate of the same config is the run's plan (eval batch 6 > train batch 4 sizes it).
  EXPECT_EQ(estimate_memory(cfg.model, cfg, DeviceKind::CPU, 0).arena, planned);
  // auto_find_batch_size on the CPU keeps the configured batch (no reliable available-memory figure).
  const json run_cfg = json::parse(test::read_file(dir / "run/train_config.json"));
  EXPECT_EQ(run_cfg["per_device_train_batch_size"], 4);
}

// --- the estimate ---------------------------------------------------------------------------------

TEST(MemoryEstimate, CategoriesAreThePlansAndAddUp) {
  TrainConfig cfg = small_config(4, 2);
  const MemoryEstimate e = estimate_memory(cfg.model, cfg, DeviceKind::CPU, 12345);
  const MemoryPlan plan = plan_engine_memory(cfg.model, training_engine_options(cfg, DeviceKind::CPU));
  EXPECT_EQ(e.arena, plan.total_bytes());
  EXPECT_EQ(e.weights + e.master_weights + e.gradients + e.optimizer_states + e.activations() + e.workspace +
                e.communication,
            e.arena);
  EXPECT_EQ(e.total(), e.arena + 12345);
  EXPECT_EQ(e.weights, e.gradients);
  // AdamW: two fp32 moments, plus the parameter-group table (a few hundred bytes).
  EXPECT_GE(e.optimizer_states, 2 * e.weights);
  EXPECT_LE(e.optimizer_states, 2 * e.weights + 1024);
  EXPECT_EQ(e.master_weights, 0u);
  EXPECT_EQ(e.communication, 0u);
  EXPECT_EQ(e.recompute, 0u);
  EXPECT_EQ(e.data, 4 * MemoryPlan::aligned(4 * 16 * sizeof(int32_t)));
  EXPECT_EQ(e.parameters, cfg.model.num_parameters());

  const nlohmann::ordered_json j = estimate_json(e);
  for (const char* k : {"parameters", "weights", "master_weights", "gradients", "optimizer_states",
                        "activations", "workspace", "communication", "overhead", "total"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["breakdown"]["saved_activations"].get<size_t>() +
                j["breakdown"]["recompute_buffers"].get<size_t>() +
                j["breakdown"]["data_buffers"].get<size_t>(),
            j["activations"].get<size_t>());
  EXPECT_EQ(j["breakdown"]["buffers"].size(), plan.buffers().size());
  EXPECT_EQ(j["gradient_accumulation_steps"], 2);
  EXPECT_EQ(j["effective_batch"], 8);
  EXPECT_EQ(j["precision"], "fp32");
  EXPECT_EQ(j["optimizer"], "adamw_torch_fused");
}

TEST(MemoryEstimate, CheckpointingTradesActivationsForRecompute) {
  TrainConfig none = small_config(4), full = small_config(4), selective = small_config(4);
  full.gradient_checkpointing = selective.gradient_checkpointing = true;
  selective.gradient_checkpointing_mode = "selective";
  const MemoryEstimate en = estimate_memory(none.model, none, DeviceKind::CPU, 0);
  const MemoryEstimate ef = estimate_memory(full.model, full, DeviceKind::CPU, 0);
  const MemoryEstimate es = estimate_memory(selective.model, selective, DeviceKind::CPU, 0);
  EXPECT_LT(ef.activations(), es.activations());
  EXPECT_LT(es.activations(), en.activations());
  EXPECT_GT(ef.recompute, 0u);
  EXPECT_EQ(ef.weights + ef.gradients + ef.optimizer_states, en.weights + en.gradients + en.optimizer_states);
  // Recomputation costs time; so do small micro-batches.
  EXPECT_LT(en.time_cost, es.time_cost);
  EXPECT_LT(es.time_cost, ef.time_cost);
  EXPECT_LT(relative_time_per_token(none.model, 16, scenario_of(small_config(8))),
            relative_time_per_token(none.model, 16, scenario_of(small_config(2, 4))));
}

// --- the search -----------------------------------------------------------------------------------

TEST(MemoryFit, FindBatchSizeHalvesAndKeepsTheEffectiveBatch) {
  const TrainConfig cfg = small_config(16, 2);  // effective batch 32
  // Exactly the arena of micro-batch 4: 16 and 8 do not fit, 4 does.
  std::optional<MemoryScenario> s =
      find_batch_size(cfg.model, cfg, DeviceKind::CPU, arena_of(small_config(4)));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->micro_batch, 4);
  EXPECT_EQ(s->accumulation, 8);
  EXPECT_EQ(s->effective_batch(), 32);
  // One byte less: micro-batch 2.
  s = find_batch_size(cfg.model, cfg, DeviceKind::CPU, arena_of(small_config(4)) - 1);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->micro_batch, 2);
  EXPECT_EQ(s->accumulation, 16);
  // Everything fits: the configured batch and accumulation stay.
  s = find_batch_size(cfg.model, cfg, DeviceKind::CPU, size_t(1) << 40);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->micro_batch, 16);
  EXPECT_EQ(s->accumulation, 2);
  // Nothing fits.
  EXPECT_FALSE(find_batch_size(cfg.model, cfg, DeviceKind::CPU, arena_of(small_config(1)) - 1));
  // 7 -> 3: the accumulation rounds the effective batch up to a multiple of the micro-batch (9).
  const TrainConfig odd = small_config(7);
  s = find_batch_size(odd.model, odd, DeviceKind::CPU, arena_of(small_config(3)));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->micro_batch, 3);
  EXPECT_EQ(s->accumulation, 3);
}

TEST(MemoryFit, AutoFindBatchSizeRewritesTheConfig) {
  TrainConfig cfg = small_config(16);
  cfg.auto_find_batch_size = true;
  const MemoryFit fit =
      fit_to_memory(cfg, cfg.model, DeviceKind::CPU, arena_of(small_config(8)), 0, "test device");
  EXPECT_EQ(fit.config.per_device_train_batch_size, 8);
  EXPECT_EQ(fit.config.gradient_accumulation_steps, 2);
  EXPECT_EQ(fit.config.tokens_per_step(), cfg.tokens_per_step());
  EXPECT_NE(fit.message.find("micro-batch 8 x 2 accumulation = effective batch 16"), std::string::npos)
      << fit.message;
  // Unknown available memory (the CPU): unchanged, and said so.
  const MemoryFit cpu = fit_to_memory(cfg, cfg.model, DeviceKind::CPU, std::nullopt, 0, "cpu");
  EXPECT_EQ(cpu.config.per_device_train_batch_size, 16);
  EXPECT_NE(cpu.message.find("keeping micro-batch 16"), std::string::npos);
}

TEST(MemoryFit, ConfigThatFitsIsUntouched) {
  const TrainConfig cfg = small_config(16);
  const MemoryFit fit = fit_to_memory(cfg, cfg.model, DeviceKind::CPU, arena_of(cfg), 0, "test device");
  EXPECT_EQ(fit.config.per_device_train_batch_size, 16);
  EXPECT_TRUE(fit.message.empty());
}

TEST(MemoryFit, OutOfMemoryListsTheCheapestConfigurationsThatFit) {
  TrainConfig cfg = small_config(16, 2);
  const size_t budget = arena_of(cfg) * 6 / 10;
  const std::vector<MemoryEstimate> alternatives =
      cheapest_fitting(cfg.model, cfg, DeviceKind::CPU, budget, 0);
  ASSERT_FALSE(alternatives.empty());
  EXPECT_LE(alternatives.size(), 3u);
  for (size_t i = 0; i < alternatives.size(); ++i) {
    const MemoryEstimate& a = alternatives[i];
    EXPECT_LE(a.arena, budget);
    EXPECT_FALSE(a.scenario == scenario_of(cfg));
    if (i) {
      EXPECT_LE(alternatives[i - 1].time_cost, a.time_cost);
    }
    // The flags, applied to the config, give that plan and keep the effective batch.
    json j = cfg.to_json();
    std::istringstream flags(a.scenario.flags_from(scenario_of(cfg)));
    for (std::string key, value; flags >> key >> value;) set_config_override(j, key.substr(2), value);
    const TrainConfig applied = TrainConfig::from_json(j, "flags");
    EXPECT_EQ(arena_of(applied), a.arena) << a.scenario.flags_from(scenario_of(cfg));
    EXPECT_EQ(applied.per_device_train_batch_size * applied.gradient_accumulation_steps, 32);
  }

  try {
    fit_to_memory(cfg, cfg.model, DeviceKind::CPU, budget, 0, "test device");
    ADD_FAILURE() << "expected the out-of-memory error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* needle :
         {"out of memory at start-up", "test device", "weights", "gradients", "optimizer state",
          "activations", "total (arena)", "cheapest first", "--gradient_checkpointing", "--bf16 true"})
      EXPECT_NE(msg.find(needle), std::string::npos) << needle << "\n" << msg;
  }
  // Not even the weights fit: said so, no alternatives.
  test::expect_error([&] { fit_to_memory(cfg, cfg.model, DeviceKind::CPU, 1000, 0, "test device"); },
                     {"out of memory at start-up", "no micro-batch / checkpointing combination fits"});
  // auto_find_batch_size that finds nothing falls back to the same error.
  cfg.auto_find_batch_size = true;
  test::expect_error(
      [&] { fit_to_memory(cfg, cfg.model, DeviceKind::CPU, arena_of(small_config(1)) - 1, 0, "d"); },
      {"out of memory at start-up", "not even micro-batch 1 fits", "gradient_checkpointing"});
}

// When only the model states stand in the way, offload is proposed (with the host memory it takes), and
// the flags give that plan.
TEST(MemoryFit, OffloadIsProposedWhenTheModelStatesDoNotFit) {
  const TrainConfig cfg = small_config(1);
  TrainConfig off = cfg;
  off.offload_optimizer = "cpu";
  const size_t budget = arena_of(off);
  ASSERT_LT(budget, arena_of(cfg));
  const std::vector<MemoryEstimate> alternatives =
      cheapest_fitting(cfg.model, cfg, DeviceKind::CPU, budget, 0);
  ASSERT_FALSE(alternatives.empty());
  bool offloads = false;
  for (const MemoryEstimate& a : alternatives) {
    EXPECT_LE(a.arena, budget);
    EXPECT_GT(a.scenario.offload, 0) << a.scenario.flags_from(scenario_of(cfg));  // nothing else fits
    offloads |= a.scenario.flags_from(scenario_of(cfg)) == "--offload_optimizer cpu";
  }
  EXPECT_TRUE(offloads);
  EXPECT_EQ(arena_of(with_scenario(cfg, alternatives.front().scenario)), alternatives.front().arena);
  test::expect_error([&] { fit_to_memory(cfg, cfg.model, DeviceKind::CPU, budget, 0, "test device"); },
                     {"--offload_optimizer cpu", "of host memory"});
  // Not under LoRA (its state is small) or stochastic rounding (the host rounds to nearest).
  TrainConfig sr = cfg;
  sr.bf16 = true, sr.stochastic_rounding = true;
  for (const MemoryEstimate& a : cheapest_fitting(sr.model, sr, DeviceKind::CPU, budget, 0))
    EXPECT_EQ(a.scenario.offload, 0);
}

// One process: stage 2 with offload moves the gradients to the host too (less device memory, a slower step),
// so it is proposed where the optimizer's offload alone does not fit, and ranked after it where both fit.
TEST(MemoryFit, GradientOffloadIsProposedWithOneProcess) {
  TrainConfig cfg = small_config(1);
  cfg.bf16 = true;
  TrainConfig off = cfg, grads = cfg;
  off.offload_optimizer = grads.offload_optimizer = "cpu";
  grads.zero_stage = 2;
  ASSERT_LT(arena_of(grads), arena_of(off));
  const auto flags_of = [&](const MemoryEstimate& a) { return a.scenario.flags_from(scenario_of(cfg)); };
  bool proposed = false;
  for (const MemoryEstimate& a : cheapest_fitting(cfg.model, cfg, DeviceKind::CPU, arena_of(grads), 0)) {
    EXPECT_LE(a.arena, arena_of(grads));
    proposed |= flags_of(a) == "--zero_stage 2 --offload_optimizer cpu";
  }
  EXPECT_TRUE(proposed);
  const std::vector<MemoryEstimate> both =
      cheapest_fitting(cfg.model, cfg, DeviceKind::CPU, arena_of(off), 0);
  ASSERT_FALSE(both.empty());
  EXPECT_EQ(flags_of(both.front()), "--offload_optimizer cpu");
}

TEST(MemoryFit, FlagsOfAScenario) {
  MemoryScenario base = scenario_of(small_config(8));
  MemoryScenario s = with_micro_batch(base, 2, 8);
  s.checkpointing = {CheckpointMode::Selective, 1};
  EXPECT_EQ(s.flags_from(base),
            "--per_device_train_batch_size 2 --gradient_accumulation_steps 4 --gradient_checkpointing true "
            "--gradient_checkpointing_mode selective");
  MemoryScenario back = base;
  base.checkpointing = {CheckpointMode::Full, 2};
  EXPECT_EQ(back.flags_from(base), "--gradient_checkpointing false");
  EXPECT_EQ(base.checkpointing_name(), "full every 2");
  MemoryScenario both = back;
  both.zero_stage = 3, both.offload = 2;
  EXPECT_EQ(both.flags_from(back), "--zero_stage 3 --offload_optimizer cpu --offload_param cpu");
  EXPECT_EQ(back.flags_from(both), "--zero_stage 0 --offload_optimizer none --offload_param none");
}

// --- the command ----------------------------------------------------------------------------------

std::string write_config(const test::TempDir& dir) {
  const std::string path = dir / "config.json";
  test::write_file(path, R"({"model": {"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 256,
                             "block_size": 64}, "per_device_train_batch_size": 8, "device": "cpu"})");
  return path;
}

TEST(EstimateCli, JsonHasTheKeysAndAddsUp) {
  test::TempDir dir;
  const test::CommandResult r = test::run_anvil("estimate --config " + write_config(dir) + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  size_t sum = 0;
  for (const char* k : {"weights", "master_weights", "gradients", "optimizer_states", "activations",
                        "workspace", "communication", "overhead"})
    sum += j.at(k).get<size_t>();
  EXPECT_EQ(sum, j.at("total").get<size_t>());
  EXPECT_EQ(j.at("total").get<size_t>(), j.at("arena").get<size_t>());  // no overhead on the CPU
  EXPECT_GT(j.at("parameters").get<int64_t>(), 100000);
  EXPECT_EQ(j.at("micro_batch"), 8);
  EXPECT_TRUE(j.at("fits").is_null());
  // It is the run's plan.
  TrainConfig cfg = TrainConfig::from_file(dir / "config.json");
  EXPECT_EQ(j.at("arena").get<size_t>(),
            plan_engine_memory(cfg.model, training_engine_options(cfg, DeviceKind::CPU)).total_bytes());
}

TEST(EstimateCli, TableAndBudget) {
  test::TempDir dir;
  const std::string cfg = write_config(dir);
  test::CommandResult r = test::run_anvil("estimate --config " + cfg);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* needle :
       {"weights", "master weights", "optimizer states", "saved activations", "recompute buffers",
        "communication buffers", "runtime overhead", "total", "buffers:"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle;
  r = test::run_anvil("estimate --config " + cfg + " --gpu_memory 3MiB");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("does NOT fit in 3.0 MiB"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--per_device_train_batch_size 2 --gradient_accumulation_steps 4"),
            std::string::npos)
      << r.output;
  r = test::run_anvil("estimate --config " + cfg + " --gpu_memory 1GiB");
  EXPECT_NE(r.output.find("fits in 1.00 GiB"), std::string::npos) << r.output;
  r = test::run_anvil("estimate --config " + cfg + " --gpu_memory lots");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--gpu_memory: 'lots' is not a size"), std::string::npos) << r.output;
}

TEST(EstimateCli, SweepPrintsATable) {
  test::TempDir dir;
  const std::string cfg = write_config(dir);
  test::CommandResult r = test::run_anvil("estimate --config " + cfg + " --sweep --gpu_memory 4MiB");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* needle :
       {"micro", "accum", "checkpointing", "precision", "optimizer", "total", "fits", "selective", "full",
        "fp32", "bf16", "fp16", "adamw_torch_fused", "adafactor", "adamw_8bit", "sgd", "yes", "no"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
  // 7 micro-batches (1..64) x 3 checkpointing policies x 3 precisions x 4 optimizers.
  const size_t rows = size_t(std::count(r.output.begin(), r.output.end(), '\n'));
  EXPECT_GE(rows, 252u);

  r = test::run_anvil("estimate --config " + cfg + " --sweep --json --gpu_memory 4MiB");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  ASSERT_EQ(j.at("rows").size(), 252u);
  std::map<std::string, size_t> fp32_total;  // by micro-batch and checkpointing
  for (const json& row : j["rows"]) {
    EXPECT_EQ(row.at("fits").get<bool>(), row.at("total").get<size_t>() <= (size_t(4) << 20));
    EXPECT_EQ(row.at("micro_batch").get<int>() * row.at("gradient_accumulation_steps").get<int>() >= 8, true);
    const std::string key =
        row.at("micro_batch").dump() + row.at("checkpointing").dump() + row.at("optimizer").dump();
    if (row.at("precision") == "fp32") fp32_total[key] = row.at("total").get<size_t>();
  }
  // 16-bit weights and activations (plus fp32 master weights) take less than fp32 for every shape here.
  for (const json& row : j["rows"])
    if (row.at("precision") != "fp32") {
      const std::string key =
          row.at("micro_batch").dump() + row.at("checkpointing").dump() + row.at("optimizer").dump();
      ASSERT_TRUE(fp32_total.count(key)) << key;
      EXPECT_LT(row.at("total").get<size_t>(), fp32_total[key]) << row.dump();
    }
}

TEST(EstimateCli, CudaWithoutAGpu) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is visible: the estimate measures the overhead";
  test::TempDir dir;
  const std::string cfg = write_config(dir) + " --device cuda";
  test::CommandResult r = test::run_anvil("estimate --config " + cfg);
  if (!cuda_compiled()) {
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("built without CUDA"), std::string::npos) << r.output;
    return;
  }
  // No GPU to measure: the typical overhead is assumed, and the table says so.
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(assumed: typical"), std::string::npos) << r.output;
  r = test::run_anvil("estimate --config " + cfg + " --overhead_bytes 500MiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  EXPECT_EQ(j.at("overhead").get<size_t>(), size_t(500) << 20);
  EXPECT_EQ(j.at("total").get<size_t>(), j.at("arena").get<size_t>() + (size_t(500) << 20));
  EXPECT_EQ(j.at("device"), "cuda");
  EXPECT_GE(j.at("workspace").get<size_t>(), kCudaGemmWorkspaceBytes);  // the cuBLASLt workspace is planned
}

}  // namespace
}  // namespace anvil
