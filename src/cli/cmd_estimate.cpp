// anvil estimate: the per-device memory of a training config, without running it (docs/memory.md).
//   --json             the estimate as JSON
//   --sweep            a table over micro-batch x checkpointing x precision x optimizer
//   --gpu NAME         plan for that GPU (h100, h200, a100-80gb, ...): its memory is the budget and a typical
//                      CUDA context overhead is assumed; works without a GPU here
//   --gpu_memory SIZE  the memory to fit in (default: --gpu's, else what the GPU here has free, if any)
//   --overhead_bytes   the CUDA context overhead to assume instead of measuring it (default without a GPU
//                      here: the typical overhead below)
//   --num_gpus N       a data-parallel job of N processes (GPUs) per node on --num_nodes M nodes: the global
//   --num_nodes M      batch, each node's host memory, and DeepSpeed's ZeRO-2/3 model-states estimates
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <memory>
#include <optional>

#include "cli/config_flags.hpp"
#include "cli/help.hpp"
#include "dist/dist_env.hpp"
#include "memory/deepspeed_estimate.hpp"
#include "memory/host_staging.hpp"
#include "model/freeze.hpp"
#include "runtime/device.hpp"
#include "train/engine.hpp"
#include "train/memory_fit.hpp"
#include "train/run_model.hpp"

namespace anvil::cli {
namespace {

using json = nlohmann::ordered_json;

struct EstimateFlags {
  bool json = false;
  bool sweep = false;
  std::string gpu;
  std::string gpu_memory;
  std::string overhead_bytes;
  // A data-parallel job (--num_gpus processes per node, --num_nodes nodes); `job`: either flag was given, so
  // the estimate prints the job's section.
  int num_gpus = 1;
  int num_nodes = 1;
  bool job = false;

  int64_t world() const { return int64_t(num_gpus) * num_nodes; }
};

// The CUDA context overhead (context, streams, library state, and the 32 MiB reserve for what loads
// lazily) measured on an NVIDIA H100 80GB HBM3 with CUDA 13 and driver 580 (docs/memory.md). Assumed for a
// GPU that is not here: contexts of other recent GPUs and drivers take a similar few hundred MiB.
constexpr size_t kTypicalCudaOverheadBytes = 588'054'528;  // 560.8 MiB

// GPUs `--gpu` plans for: the memory CUDA reports as the device's total (cudaMemGetInfo), the budget of a
// run on an idle GPU. docs/memory.md says where each figure comes from.
struct KnownGpu {
  const char* name;   // the --gpu value
  const char* label;  // as the estimate prints it
  size_t memory_bytes;
};
constexpr size_t mib_bytes(size_t mib) {
  return mib << 20;
}
const KnownGpu kKnownGpus[] = {
    {"h100", "NVIDIA H100 80GB HBM3", 85'017'493'504},          // measured: 79.18 GiB
    {"h200", "NVIDIA H200", mib_bytes(142'925)},                // 139.58 GiB, approximate
    {"a100-80gb", "NVIDIA A100 80GB", mib_bytes(81'050)},       // 79.15 GiB
    {"a100-40gb", "NVIDIA A100 40GB", mib_bytes(40'335)},       // 39.39 GiB
    {"rtx4090", "NVIDIA GeForce RTX 4090", mib_bytes(24'207)},  // 23.64 GiB
};

std::string known_gpu_names() {
  std::string names;
  for (const KnownGpu& g : kKnownGpus) names += (names.empty() ? "" : ", ") + std::string(g.name);
  return names;
}

const KnownGpu& find_gpu(const std::string& name) {
  for (const KnownGpu& g : kKnownGpus)
    if (name == g.name) return g;
  ANVIL_THROW(
      "--gpu {}: not a GPU this estimate knows ({}); for another GPU give --device cuda --gpu_memory "
      "SIZE [--overhead_bytes SIZE]",
      name, known_gpu_names());
}

// The device a run of the config would use, and what it costs outside the arena.
struct Target {
  DeviceKind kind = DeviceKind::CPU;
  std::string name;  // "cpu (2 threads)", "cuda (NVIDIA H100 80GB HBM3)", "cuda (no GPU here)"
  size_t overhead = 0;
  std::string overhead_source;      // measured | flag | gpu | assumed | none
  std::optional<size_t> available;  // for the arena, on a device that is here (CUDA only)
  const KnownGpu* gpu = nullptr;    // --gpu
};

Target target_device(const std::string& device, const EstimateFlags& f) {
  std::optional<size_t> override;
  if (!f.overhead_bytes.empty()) override = parse_bytes(f.overhead_bytes, "--overhead_bytes");
  Target t;
  if (!f.gpu.empty()) {
    t.gpu = &find_gpu(f.gpu);
    ANVIL_REQUIRE(device != "cpu", "--gpu {} plans a CUDA run, but device is cpu: drop one of them", f.gpu);
  }
  t.kind = device == "cpu"             ? DeviceKind::CPU
           : device == "cuda" || t.gpu ? DeviceKind::CUDA
           : cuda_available()          ? DeviceKind::CUDA
                                       : DeviceKind::CPU;
  t.overhead_source = override ? "flag" : "none";
  t.overhead = override.value_or(0);
  if (t.kind == DeviceKind::CPU) {
    t.name = make_cpu_device()->name();
    return t;
  }
  ANVIL_REQUIRE(
      cuda_compiled(),
      "--device cuda: this Anvil was built without CUDA, so it cannot plan for the CUDA backend (build "
      "with a CUDA toolkit; a GPU is not needed to estimate)");
  if (t.gpu) {  // the named GPU, even where another one is visible
    t.name = fmt::format("cuda ({}, --gpu {})", t.gpu->label, t.gpu->name);
    if (!override) t.overhead = kTypicalCudaOverheadBytes, t.overhead_source = "gpu";
  } else if (cuda_available()) {
    const std::unique_ptr<Device> dev = make_cuda_device();
    t.name = "cuda (" + dev->name() + ")";
    t.available = dev->available_memory_bytes();
    if (!override) t.overhead = dev->context_overhead_bytes(), t.overhead_source = "measured";
  } else {
    t.name = "cuda (no GPU here)";
    if (!override) t.overhead = kTypicalCudaOverheadBytes, t.overhead_source = "assumed";
  }
  return t;
}

std::string overhead_note(const Target& t) {
  if (t.overhead_source == "measured") return "(measured here, with the lazy-loading reserve)";
  if (t.overhead_source == "flag") return "(--overhead_bytes)";
  if (t.overhead_source == "gpu" || t.overhead_source == "assumed")
    return "(assumed: typical, measured on an H100; --overhead_bytes to change)";
  return "";
}

// Where the budget came from, after "fits in SIZE (N bytes".
std::string budget_note(const Target& t, const EstimateFlags& f) {
  if (!f.gpu_memory.empty()) return ", --gpu_memory";
  if (t.gpu) return fmt::format(": the memory of an {}, --gpu {}", t.gpu->label, t.gpu->name);
  return ": free on this GPU now + the overhead already in use";
}

// Without a budget: how to get one (CUDA only; the CPU has no memory figure to compare with).
void print_no_budget_hint(const Target& t) {
  if (t.kind == DeviceKind::CUDA)
    fmt::print("\nno GPU here to compare with: give --gpu NAME ({}) or --gpu_memory SIZE\n",
               known_gpu_names());
}

// Micro-batches of the sweep: powers of two up to max(64, configured), and the configured one.
std::vector<int> sweep_batches(int configured) {
  std::vector<int> out;
  for (int b = 1; b <= std::max(64, configured); b *= 2) out.push_back(b);
  if (std::find(out.begin(), out.end(), configured) == out.end()) out.push_back(configured);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<CheckpointPolicy> sweep_policies(const CheckpointPolicy& configured) {
  std::vector<CheckpointPolicy> out = {
      {CheckpointMode::None, 1}, {CheckpointMode::Selective, 1}, {CheckpointMode::Full, 1}};
  if (configured.mode != CheckpointMode::None && configured.every != 1) out.push_back(configured);
  return out;
}

// What freeze_parameters (or LoRA: everything but the adapters) freezes in `model` (none: nothing frozen);
// errors as training gives them.
std::optional<FrozenCount> frozen_count(const TrainConfig& cfg, const TransformerConfig& model) {
  const std::vector<std::string> patterns = split_patterns(cfg.freeze_parameters);
  const LoraConfig lora = lora_config(cfg);
  if (patterns.empty() && !lora.enabled()) return std::nullopt;
  ParamLayout layout = model.is_bert() ? ParamLayout::bert(model) : ParamLayout::decoder(model, lora);
  return patterns.empty() ? count_frozen(layout) : freeze_parameters(layout, patterns);
}

// Whether the plan keeps master weights and gradients for the trainable tensors only (LoRA without ZeRO).
bool plans_trainable_only(const TrainConfig& cfg, const TransformerConfig& model, DeviceKind device) {
  const EngineOptions o = training_engine_options(cfg, device);
  if (model.is_bert() || !o.lora.enabled()) return false;
  ParamLayout layout = ParamLayout::decoder(model, o.lora);
  if (!o.freeze.empty()) freeze_parameters(layout, o.freeze);
  return keeps_trainable_only(o, layout);
}

std::string model_line(const TransformerConfig& m) {
  if (m.is_bert())
    return fmt::format(
        "bert ({} layers, {} heads, {} dims, intermediate {}, vocab {}, {} labels; {:.2f}M parameters)",
        m.n_layer, m.n_head, m.n_embd, m.ffn_size(), m.vocab_size, m.num_labels, m.num_parameters() / 1e6);
  // Decoders: the family's name; key/value heads where they are fewer (grouped-query attention).
  const std::string kv =
      m.n_kv_head > 0 && m.n_kv_head != m.n_head ? fmt::format(" ({} key/value)", m.n_kv_head) : "";
  return fmt::format("{} ({} layers, {} heads{}, {} dims, vocab {}; {:.2f}M parameters)", m.family, m.n_layer,
                     m.n_head, kv, m.n_embd, m.vocab_size, m.num_parameters() / 1e6);
}

// --- a data-parallel job (--num_gpus, --num_nodes) -----------------------------------------------------

// The DeepSpeed importer divides train_batch_size by the launcher's world (dist_env.hpp): while it resolves
// the config, the environment is that of rank 0 of the planned job (torchrun's variables), so the estimate
// settles the batch as the job's processes will. Restored afterwards.
class PlannedJobEnvironment {
 public:
  PlannedJobEnvironment(int gpus_per_node, int nodes) {
    set("RANK", "0");
    set("WORLD_SIZE", std::to_string(int64_t(gpus_per_node) * nodes));
    set("LOCAL_RANK", "0");
    set("LOCAL_WORLD_SIZE", std::to_string(gpus_per_node));
    set("GROUP_RANK", "0");
    set("GROUP_WORLD_SIZE", std::to_string(nodes));
    set("MASTER_ADDR", "127.0.0.1");
  }
  ~PlannedJobEnvironment() {
    for (const auto& [name, old] : saved_) {
      if (old)
        setenv(name.c_str(), old->c_str(), 1);
      else
        unsetenv(name.c_str());
    }
  }
  PlannedJobEnvironment(const PlannedJobEnvironment&) = delete;
  PlannedJobEnvironment& operator=(const PlannedJobEnvironment&) = delete;

 private:
  void set(const char* name, const std::string& value) {
    const char* old = std::getenv(name);
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    setenv(name, value.c_str(), 1);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

void require_job_size(const EstimateFlags& f) {
  ANVIL_REQUIRE(f.world() <= INT_MAX, "--num_gpus {} x --num_nodes {}: more processes than {}", f.num_gpus,
                f.num_nodes, INT_MAX);
}

// The plan of every ZeRO stage this version runs, for the job's world (stage 0 with one process).
std::vector<MemoryEstimate> stage_estimates(const TrainConfig& cfg, const TransformerConfig& model,
                                            const Target& t) {
  std::vector<MemoryEstimate> out;
  // Optimizer offload with several processes runs under a ZeRO stage only (each rank offloads its shard).
  const bool offload_job = cfg.offload_optimizer != "none" && dist::read_dist_env().world_size > 1;
  for (int stage = offload_job ? 1 : 0; stage <= max_zero_stage(model, cfg); ++stage) {
    TrainConfig c = cfg;
    c.zero_stage = stage;
    out.push_back(estimate_memory(model, c, t.kind, t.overhead));
  }
  return out;
}

// 1234567 -> "1,234,567"
std::string group_digits(size_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// What one process of the job is: a GPU, or a CPU process (Gloo).
const char* process_word(const Target& t) {
  return t.kind == DeviceKind::CUDA ? "GPU" : "process";
}

std::string count(int64_t n, const std::string& word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : (word == "process" ? "es" : "s"));
}

// "8 GPUs per node x 2 nodes"
std::string job_shape(const Target& t, const EstimateFlags& f) {
  return fmt::format("{} per node x {}", count(f.num_gpus, process_word(t)), count(f.num_nodes, "node"));
}

// DeepSpeed's ZeRO-2 and ZeRO-3 model-states estimates for the job, in DeepSpeed's own format.
void print_deepspeed_estimates(const TransformerConfig& model, const EstimateFlags& f) {
  const DeepSpeedParamCounts c = deepspeed_param_counts(model);
  fmt::print(
      "\nDeepSpeed's estimates for ZeRO-2 and ZeRO-3, beside Anvil's plan: its model-states estimators,\n");
  fmt::print("computed as DeepSpeed computes them from {} parameters and the largest layer, {} ({}).\n",
             group_digits(size_t(c.total_params)), c.largest_layer,
             group_digits(size_t(c.largest_layer_params)));
  fmt::print(
      "Model states only: parameters, gradients and Adam states of 16-bit mixed-precision training,\n");
  fmt::print("whatever this config's precision and optimizer; no activations, buffers or CUDA context.\n");
  fmt::print("These are DeepSpeed's figures, not Anvil's plan (Anvil's per stage is above).\n");
  fmt::print(
      "\nZeRO-2 (deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold):\n{}",
      deepspeed_zero2_table(c.total_params, f.num_gpus, f.num_nodes));
  fmt::print("\nZeRO-3 (deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs_all_cold):\n{}",
             deepspeed_zero3_table(c.total_params, c.largest_layer_params, f.num_gpus, f.num_nodes));
}

// The job's section of the estimate: Anvil's plan per GPU for each ZeRO stage, the global batch, each node's
// host memory, and DeepSpeed's figures beside them.
void print_job(const MemoryEstimate& e, const std::vector<MemoryEstimate>& stages, const HostStaging& host,
               const TransformerConfig& model, const Target& t, const EstimateFlags& f) {
  const MemoryScenario& s = e.scenario;
  const char* unit = process_word(t);
  const int stage = f.world() > 1 ? s.zero_stage : 0;
  fmt::print("\ndata parallel: {} = {} (ZeRO stage {})\n", job_shape(t, f), count(f.world(), unit), stage);
  fmt::print("  per {0}: every {0} holds this plan ({1} total on each{2})\n", unit, format_bytes(e.total()),
             stage == 3 ? ", with the largest shard's weights, master weights, gradients and optimizer state"
             : stage == 2 ? ", with the largest shard's master weights, gradients and optimizer state"
             : stage == 1 ? ", with the largest shard's master weights and optimizer state"
                          : "");
  fmt::print("  per {} by ZeRO stage (Anvil's plan for this job; * the configured one):\n", unit);
  // The communication column: gradients staged in communication_data_type, when it is not theirs.
  const bool staged =
      std::any_of(stages.begin(), stages.end(), [](const MemoryEstimate& r) { return r.communication > 0; });
  const std::string comm_head = staged ? fmt::format(" {:>14}", "communication") : "";
  fmt::print("    {:<7} {:>12} {:>15} {:>12} {:>17}{} {:>12}\n", "stage", "weights", "master weights",
             "gradients", "optimizer states", comm_head, "total");
  for (const MemoryEstimate& r : stages)
    fmt::print("    {:<7} {:>12} {:>15} {:>12} {:>17}{} {:>12}\n",
               fmt::format("{}{}", r.scenario.zero_stage, r.scenario.zero_stage == stage ? " *" : ""),
               format_bytes(r.weights), format_bytes(r.master_weights), format_bytes(r.gradients),
               format_bytes(r.optimizer_states),
               staged ? fmt::format(" {:>14}", format_bytes(r.communication)) : std::string(),
               format_bytes(r.total()));
  fmt::print("  global batch {} sequences = micro-batch {} x {} accumulation x {} per node x {}\n",
             s.effective_batch() * f.world(), s.micro_batch, s.accumulation, count(f.num_gpus, unit),
             count(f.num_nodes, "node"));
  fmt::print("  not in the plan: {} (docs/memory.md)\n",
             t.kind == DeviceKind::CUDA ? "NCCL's own device memory, its communicators' buffers"
                                        : "Gloo's own memory");

  fmt::print("\nhost memory per node (Anvil's plan: what each process stages on the host, x {} per node):\n",
             count(f.num_gpus, "process"));
  size_t width = 24;
  for (const HostBuffer& b : host.buffers) width = std::max(width, b.name.size());
  auto row = [&](const std::string& name, const std::string& kind, size_t bytes) {
    fmt::print("  {:<{}} {:<8} {:>14}  {:>10}\n", name, width, kind, group_digits(bytes),
               format_bytes(bytes));
  };
  for (const HostBuffer& b : host.buffers) row(b.name, b.pinned ? "pinned" : "pageable", b.bytes);
  row("per process", "", host.total_bytes());
  row(fmt::format("per node (x {})", count(f.num_gpus, "process")), "",
      host.total_bytes() * size_t(f.num_gpus));
  if (host.pinned_bytes() != host.total_bytes())
    fmt::print("  (pinned per node: {})\n", format_bytes(host.pinned_bytes() * size_t(f.num_gpus)));
  fmt::print(
      "  not planned, so not counted: the memory-mapped token shards (page cache), the shuffle order, "
      "checkpoint "
      "writing, the communicator's host memory\n");
  print_deepspeed_estimates(model, f);
}

nlohmann::ordered_json deepspeed_json(const TransformerConfig& model, const EstimateFlags& f) {
  const DeepSpeedParamCounts c = deepspeed_param_counts(model);
  json zero2 = json::array(), zero3 = json::array();
  auto device = [](bool offloaded) { return offloaded ? "cpu" : "none"; };
  for (const DeepSpeedEstimateRow& r : deepspeed_zero2_estimates(c.total_params, f.num_gpus, f.num_nodes))
    zero2.push_back({{"offload_optimizer", device(r.offload_optimizer)},
                     {"cpu_bytes_per_node", r.cpu_bytes},
                     {"gpu_bytes", r.gpu_bytes}});
  for (const DeepSpeedEstimateRow& r :
       deepspeed_zero3_estimates(c.total_params, c.largest_layer_params, f.num_gpus, f.num_nodes))
    zero3.push_back({{"offload_param", device(r.offload_param)},
                     {"offload_optimizer", device(r.offload_optimizer)},
                     {"zero_init", r.zero_init},
                     {"cpu_bytes_per_node", r.cpu_bytes},
                     {"gpu_bytes", r.gpu_bytes}});
  return {{"total_params", c.total_params},
          {"largest_layer", c.largest_layer},
          {"largest_layer_params", c.largest_layer_params},
          {"zero2", zero2},
          {"zero3", zero3}};
}

// The job in the estimate's JSON ("data_parallel"); `host` is null for a sweep (its rows differ in batch).
nlohmann::ordered_json job_json(const MemoryScenario& s, const HostStaging* host,
                                const std::vector<MemoryEstimate>& stages, const TransformerConfig& model,
                                const EstimateFlags& f) {
  json per_stage = json::array();
  for (const MemoryEstimate& r : stages)
    per_stage.push_back({{"zero_stage", r.scenario.zero_stage},
                         {"weights", r.weights},
                         {"master_weights", r.master_weights},
                         {"gradients", r.gradients},
                         {"optimizer_states", r.optimizer_states},
                         {"communication", r.communication},
                         {"total", r.total()}});
  json j = {{"zero_stage", f.world() > 1 ? s.zero_stage : 0},
            {"stages", per_stage},
            {"num_gpus", f.num_gpus},
            {"num_nodes", f.num_nodes},
            {"world_size", f.world()},
            {"global_batch", s.effective_batch() * f.world()}};
  if (host) {
    json buffers = json::array();
    for (const HostBuffer& b : host->buffers)
      buffers.push_back({{"name", b.name}, {"bytes", b.bytes}, {"pinned", b.pinned}});
    j["host_per_process"] = {
        {"buffers", buffers}, {"bytes", host->total_bytes()}, {"pinned_bytes", host->pinned_bytes()}};
    j["host_per_node"] = {{"bytes", host->total_bytes() * size_t(f.num_gpus)},
                          {"pinned_bytes", host->pinned_bytes() * size_t(f.num_gpus)}};
  }
  j["deepspeed"] = deepspeed_json(model, f);
  return j;
}

int run_sweep(const TrainConfig& cfg, const TransformerConfig& model, const Target& t,
              std::optional<size_t> budget, const EstimateFlags& f) {
  const MemoryScenario configured = scenario_of(cfg);
  const double base_cost = relative_time_per_token(model, cfg.seq_len(), configured);
  std::vector<MemoryEstimate> rows;
  for (int micro : sweep_batches(configured.micro_batch))
    for (const CheckpointPolicy& policy : sweep_policies(configured.checkpointing))
      for (Precision precision : plannable_precisions())
        for (OptimizerKind optimizer : plannable_optimizers()) {
          MemoryScenario s = with_micro_batch(configured, micro, configured.effective_batch());
          s.checkpointing = policy, s.precision = precision, s.optimizer = optimizer;
          rows.push_back(estimate_memory(model, with_scenario(cfg, s), t.kind, t.overhead));
        }
  if (f.json) {
    json out = {{"device", device_name(t.kind)},
                {"device_name", t.name},
                {"gpu", t.gpu ? json(t.gpu->name) : json(nullptr)},
                {"overhead_source", t.overhead_source},
                {"budget_bytes", budget ? json(*budget) : json(nullptr)},
                {"rows", json::array()}};
    if (f.job) out["data_parallel"] = job_json(configured, nullptr, stage_estimates(cfg, model, t), model, f);
    for (const MemoryEstimate& e : rows) {
      json j = estimate_json(e);
      j["breakdown"].erase("buffers");
      j["fits"] = budget ? json(e.total() <= *budget) : json(nullptr);
      j["time_per_token_vs_configured"] = e.time_cost / base_cost;
      out["rows"].push_back(std::move(j));
    }
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("Memory sweep for {}, {} tokens per sequence, effective batch {}, on {}\n", model_line(model),
             cfg.seq_len(), configured.effective_batch(), t.name);
  if (budget)
    fmt::print("fits: total <= {} ({} bytes{})\n", format_bytes(*budget), *budget, budget_note(t, f));
  else
    fmt::print("fits: give --gpu NAME or --gpu_memory SIZE to compare with a budget\n");
  if (f.job)
    fmt::print(
        "data parallel: {} (ZeRO stage {}): every {} holds its row's plan; global batch = effective batch x "
        "{}\n",
        job_shape(t, f), f.world() > 1 ? configured.zero_stage : 0, process_word(t), f.world());
  fmt::print("{:>6} {:>6} {:<16} {:<9} {:<9} {:>12} {:>12} {:>11} {:>11} {:>12} {:>5} {:>11}\n", "micro",
             "accum", "checkpointing", "precision", "optimizer", "model states", "activations", "workspace",
             "overhead", "total", "fits", "time/token");
  for (const MemoryEstimate& e : rows) {
    const MemoryScenario& s = e.scenario;
    fmt::print("{:>6} {:>6} {:<16} {:<9} {:<9} {:>12} {:>12} {:>11} {:>11} {:>12} {:>5} {:>10.2f}x\n",
               s.micro_batch, s.accumulation, s.checkpointing_name(), precision_name(s.precision),
               optimizer_name(s.optimizer),
               format_bytes(e.weights + e.master_weights + e.gradients + e.optimizer_states),
               format_bytes(e.activations()), format_bytes(e.workspace + e.communication),
               format_bytes(e.overhead), format_bytes(e.total()),
               budget ? (e.total() <= *budget ? "yes" : "no") : "-", e.time_cost / base_cost);
  }
  fmt::print(
      "(model states = weights + master weights + gradients + optimizer states; time/token: a heuristic "
      "relative to the configured run, docs/memory.md)\n");
  if (f.job) print_deepspeed_estimates(model, f);
  return 0;
}

int run_estimate(const TrainConfig& cfg, const TransformerConfig& model, const Target& t,
                 std::optional<size_t> budget, const EstimateFlags& f) {
  const MemoryEstimate e = estimate_memory(model, cfg, t.kind, t.overhead);
  const MemoryScenario& s = e.scenario;
  // Optimizer offload: what the host holds for the master weights and the optimizer state.
  const std::optional<MemoryPlan> offloaded =
      host_optimizer_plan(model, training_engine_options(cfg, t.kind));
  const HostStaging host = host_staging_per_process(cfg, model, e.plan, offloaded ? &*offloaded : nullptr);
  const bool fits = budget && e.total() <= *budget;
  std::vector<MemoryEstimate> alternatives;
  if (budget && !fits)
    alternatives =
        cheapest_fitting(model, cfg, t.kind, *budget > t.overhead ? *budget - t.overhead : 0, t.overhead, 3);
  if (f.json) {
    json j = estimate_json(e);
    const std::optional<FrozenCount> fz = frozen_count(cfg, model);
    j["frozen_parameters"] = fz ? json(fz->numel) : json(0);
    j["device_name"] = t.name;
    j["gpu"] = t.gpu ? json(t.gpu->name) : json(nullptr);
    j["overhead_source"] = t.overhead_source;
    j["budget_bytes"] = budget ? json(*budget) : json(nullptr);
    j["fits"] = budget ? json(fits) : json(nullptr);
    j["alternatives"] = json::array();
    for (const MemoryEstimate& a : alternatives)
      j["alternatives"].push_back({{"flags", a.scenario.flags_from(s)},
                                   {"total", a.total()},
                                   {"time_per_token_vs_configured", a.time_cost / e.time_cost}});
    if (offloaded) {
      j["host_optimizer"] = json::array();
      for (const PlannedBuffer& b : offloaded->buffers())
        j["host_optimizer"].push_back({{"name", b.name}, {"bytes", b.bytes}});
    }
    if (const auto swap = nvme_swap_sizes(model, training_engine_options(cfg, t.kind)))
      j["nvme_swap_file"] = {{"bytes", swap->file_bytes}, {"sub_groups", swap->groups}};
    if (f.job) j["data_parallel"] = job_json(s, &host, stage_estimates(cfg, model, t), model, f);
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("Memory estimate for training {}\n", model_line(model));
  if (const std::optional<FrozenCount> fz = frozen_count(cfg, model))
    fmt::print(
        "  frozen ({}): {} tensors, {:.2f}M parameters ({})\n",
        cfg.lora_r > 0 ? fmt::format("LoRA r {}: all but the adapters", cfg.lora_r) : "freeze_parameters",
        fz->tensors, double(fz->numel) / 1e6,
        plans_trainable_only(cfg, model, t.kind)
            ? "in the weights only: no master weights, gradients or optimizer state"
            : "no optimizer state; their gradients and master weights are still planned");
  fmt::print(
      "  micro-batch {} x {} tokens, {} accumulation (effective batch {}), checkpointing {}, {}, {}, on "
      "{}\n\n",
      s.micro_batch, e.seq_len, s.accumulation, s.effective_batch(), s.checkpointing_name(),
      precision_name(s.precision), optimizer_name(s.optimizer), t.name);
  fmt::print("{}", estimate_table(e, overhead_note(t)));
  if (offloaded) {
    fmt::print("\nhost memory for the offloaded optimizer (offload_optimizer {}; not on the device):\n",
               cfg.offload_optimizer);
    size_t total = 0;
    for (const PlannedBuffer& b : offloaded->buffers()) {
      fmt::print("  {:<44} {:>10}\n", b.name, format_bytes(b.bytes));
      total += b.bytes;
    }
    fmt::print("  {:<44} {:>10}\n", "total", format_bytes(total));
    if (const auto swap = nvme_swap_sizes(model, training_engine_options(cfg, t.kind)))
      fmt::print(
          "NVMe swap file per process (offload_nvme_path {}): {} of optimizer state, {} sub-group(s)\n",
          cfg.offload_nvme_path, format_bytes(swap->file_bytes), swap->groups);
    if (const auto pages = weight_pages_sizes(model, training_engine_options(cfg, t.kind)))
      fmt::print(
          "NVMe swap file per process (offload_nvme_path {}): {} of weights, paged through {} buffers of "
          "{}\n",
          cfg.offload_nvme_path, format_bytes(pages->file_bytes), pages->buffers,
          format_bytes(pages->buffer_bytes));
  }
  if (budget) {
    fmt::print("\n{} in {} ({} bytes{})\n", fits ? "fits" : "does NOT fit", format_bytes(*budget), *budget,
               budget_note(t, f));
    if (!fits) {
      if (alternatives.empty()) fmt::print("no micro-batch / checkpointing combination fits\n");
      for (const MemoryEstimate& a : alternatives)
        fmt::print("  {}    # total {}{}, ~{:.2f}x time per token\n", a.scenario.flags_from(s),
                   format_bytes(a.total()), offload_host_note(model, cfg, a.scenario, t.kind),
                   a.time_cost / e.time_cost);
    }
  } else {
    print_no_budget_hint(t);
  }
  if (f.job) print_job(e, stage_estimates(cfg, model, t), host, model, t, f);
  fmt::print("\nbuffers:\n{}", e.plan.report(true));
  return 0;
}

Command make_estimate(CLI::App& parent) {
  auto flags = std::make_shared<ConfigFlags>();
  auto ef = std::make_shared<EstimateFlags>();
  CLI::App* app = parent.add_subcommand(
      "estimate",
      "print the per-device memory of a training config (the run's memory plan) without running it");
  flags->add_to(app);
  app->add_flag("--json", ef->json, "print the estimate as JSON");
  app->add_flag("--sweep", ef->sweep, "a table over micro-batch x checkpointing x precision x optimizer");
  app->add_option("--gpu", ef->gpu,
                  "plan for this GPU (" + known_gpu_names() +
                      "): its memory is the budget, with a typical CUDA context overhead; no GPU needed here")
      ->type_name("NAME");
  app->add_option(
         "--gpu_memory", ef->gpu_memory,
         "memory to fit in, e.g. 80GiB, 81559MiB, 24GB (default: --gpu's, else the free memory of the GPU "
         "here)")
      ->type_name("SIZE");
  app->add_option(
         "--overhead_bytes", ef->overhead_bytes,
         "CUDA context overhead to assume instead of measuring it, e.g. 560MiB (default without a GPU "
         "here: 560.8 MiB, typical)")
      ->type_name("SIZE");
  // Either flag makes the estimate a job's (even 1 x 1: DeepSpeed's tables for one GPU).
  app->add_option(
         "--num_gpus", ef->num_gpus,
         "processes (GPUs) per node of a data-parallel job: prints its global batch, each node's host "
         "memory and DeepSpeed's ZeRO-2/3 estimates")
      ->check(positive_integer(INT_MAX))
      ->each([ef](const std::string&) { ef->job = true; });
  app->add_option("--num_nodes", ef->num_nodes, "nodes of that job")
      ->check(positive_integer(INT_MAX))
      ->each([ef](const std::string&) { ef->job = true; });
  return {app, [flags, ef] {
            // While the estimate is made, the environment of rank 0 of the planned job: the config is
            // resolved (DeepSpeed's train_batch_size) and the ZeRO shards planned as the job's processes do.
            require_job_size(*ef);
            std::optional<PlannedJobEnvironment> job;
            if (ef->job) job.emplace(ef->num_gpus, ef->num_nodes);
            TrainConfig cfg = flags->resolve();
            RunModel rm = resolve_run_model(cfg);
            // A classifier's plan depends on its data (the labels, and the sequence length when
            // max_seq_length is 0), exactly as the run will see it; without train_data the config's values
            // are planned.
            if (rm.config.is_bert() && !cfg.train_data.empty()) open_run_data(cfg, rm);
            const TransformerConfig model = rm.config;
            const Target t = target_device(cfg.device, *ef);
            // The budget for the total (arena + overhead).
            std::optional<size_t> budget;
            if (!ef->gpu_memory.empty())
              budget = parse_bytes(ef->gpu_memory, "--gpu_memory");
            else if (t.gpu)
              budget = t.gpu->memory_bytes;
            else if (t.available)
              budget = *t.available + t.overhead;
            return ef->sweep ? run_sweep(cfg, model, t, budget, *ef)
                             : run_estimate(cfg, model, t, budget, *ef);
          }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(20, make_estimate);

}  // namespace anvil::cli
