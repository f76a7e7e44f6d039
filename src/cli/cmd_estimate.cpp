// anvil estimate: the per-device memory of a training config, without running it (docs/memory.md).
//   --json             the estimate as JSON
//   --sweep            a table over micro-batch x checkpointing x precision x optimizer
//   --gpu NAME         plan for that GPU (h100, h200, a100-80gb, ...): its memory is the budget and a typical
//                      CUDA context overhead is assumed; works without a GPU here
//   --gpu_memory SIZE  the memory to fit in (default: --gpu's, else what the GPU here has free, if any)
//   --overhead_bytes   the CUDA context overhead to assume instead of measuring it (default without a GPU
//                      here: the typical overhead below)
#include <algorithm>
#include <memory>
#include <optional>

#include "cli/config_flags.hpp"
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

std::string model_line(const TransformerConfig& m) {
  if (m.is_bert())
    return fmt::format(
        "bert ({} layers, {} heads, {} dims, intermediate {}, vocab {}, {} labels; {:.2f}M parameters)",
        m.n_layer, m.n_head, m.n_embd, m.ffn_size(), m.vocab_size, m.num_labels, m.num_parameters() / 1e6);
  return fmt::format("gpt2 ({} layers, {} heads, {} dims, vocab {}; {:.2f}M parameters)", m.n_layer, m.n_head,
                     m.n_embd, m.vocab_size, m.num_parameters() / 1e6);
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
  return 0;
}

int run_estimate(const TrainConfig& cfg, const TransformerConfig& model, const Target& t,
                 std::optional<size_t> budget, const EstimateFlags& f) {
  const MemoryEstimate e = estimate_memory(model, cfg, t.kind, t.overhead);
  const MemoryScenario& s = e.scenario;
  const bool fits = budget && e.total() <= *budget;
  std::vector<MemoryEstimate> alternatives;
  if (budget && !fits)
    alternatives =
        cheapest_fitting(model, cfg, t.kind, *budget > t.overhead ? *budget - t.overhead : 0, t.overhead, 3);
  if (f.json) {
    json j = estimate_json(e);
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
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("Memory estimate for training {}\n", model_line(model));
  fmt::print(
      "  micro-batch {} x {} tokens, {} accumulation (effective batch {}), checkpointing {}, {}, {}, on "
      "{}\n\n",
      s.micro_batch, e.seq_len, s.accumulation, s.effective_batch(), s.checkpointing_name(),
      precision_name(s.precision), optimizer_name(s.optimizer), t.name);
  fmt::print("{}", estimate_table(e, overhead_note(t)));
  if (budget) {
    fmt::print("\n{} in {} ({} bytes{})\n", fits ? "fits" : "does NOT fit", format_bytes(*budget), *budget,
               budget_note(t, f));
    if (!fits) {
      if (alternatives.empty()) fmt::print("no micro-batch / checkpointing combination fits\n");
      for (const MemoryEstimate& a : alternatives)
        fmt::print("  {}    # total {}, ~{:.2f}x time per token\n", a.scenario.flags_from(s),
                   format_bytes(a.total()), a.time_cost / e.time_cost);
    }
  } else {
    print_no_budget_hint(t);
  }
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
  return {app, [flags, ef] {
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
