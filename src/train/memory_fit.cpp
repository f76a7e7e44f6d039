#include "train/memory_fit.hpp"

#include <algorithm>
#include <cmath>

#include "dist/dist_env.hpp"
#include "kernels/quantization.hpp"
#include "train/resolved_config.hpp"

namespace anvil {
namespace {

using json = nlohmann::ordered_json;

// 1234567 -> "1,234,567"
std::string group_digits(size_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// The checkpointing policies the search tries: none, selective and full on every block, and the
// configured one.
std::vector<CheckpointPolicy> candidate_policies(const CheckpointPolicy& configured) {
  std::vector<CheckpointPolicy> out = {
      {CheckpointMode::None, 1}, {CheckpointMode::Selective, 1}, {CheckpointMode::Full, 1}};
  const bool listed = std::any_of(out.begin(), out.end(), [&](const CheckpointPolicy& p) {
    return p.mode == configured.mode && (p.mode == CheckpointMode::None || p.every == configured.every);
  });
  if (!listed) out.push_back(configured);
  return out;
}

bool same_policy(const CheckpointPolicy& a, const CheckpointPolicy& b) {
  return a.mode == b.mode && (a.mode == CheckpointMode::None || a.every == b.every);
}

// B, B/2, B/4, ..., 1
std::vector<int> halving_chain(int batch) {
  std::vector<int> out;
  for (int b = batch; b >= 1; b /= 2) out.push_back(b);
  return out;
}

}  // namespace

// --- MemoryScenario ------------------------------------------------------------------------------

std::string MemoryScenario::checkpointing_name() const {
  std::string name = checkpoint_mode_name(checkpointing.mode);
  if (checkpointing.mode != CheckpointMode::None && checkpointing.every > 1)
    name += fmt::format(" every {}", checkpointing.every);
  return name;
}

std::string MemoryScenario::flags_from(const MemoryScenario& base) const {
  std::vector<std::string> f;
  if (micro_batch != base.micro_batch)
    f.push_back(fmt::format("--per_device_train_batch_size {}", micro_batch));
  if (accumulation != base.accumulation)
    f.push_back(fmt::format("--gradient_accumulation_steps {}", accumulation));
  if (!same_policy(checkpointing, base.checkpointing)) {
    if (checkpointing.mode == CheckpointMode::None) {
      f.push_back("--gradient_checkpointing false");
    } else {
      if (base.checkpointing.mode == CheckpointMode::None) f.push_back("--gradient_checkpointing true");
      f.push_back(fmt::format("--gradient_checkpointing_mode {}", checkpoint_mode_name(checkpointing.mode)));
      if (checkpointing.every != base.checkpointing.every)
        f.push_back(fmt::format("--gradient_checkpointing_every {}", checkpointing.every));
    }
  }
  if (precision != base.precision) {
    if (base.precision == Precision::BF16) f.push_back("--bf16 false");
    if (base.precision == Precision::FP16) f.push_back("--fp16 false");
    if (precision != Precision::FP32)
      f.push_back(precision == Precision::BF16 ? "--bf16 true" : "--fp16 true");
  }
  if (optimizer != base.optimizer) f.push_back(fmt::format("--optim {}", optimizer_name(optimizer)));
  if (zero_stage != base.zero_stage) f.push_back(fmt::format("--zero_stage {}", zero_stage));
  if (offload != base.offload) {
    f.push_back(fmt::format("--offload_optimizer {}", offload >= 1 ? "cpu" : "none"));
    if (offload == 2 || base.offload == 2)
      f.push_back(fmt::format("--offload_param {}", offload == 2 ? "cpu" : "none"));
  }
  std::string out;
  for (const std::string& s : f) out += (out.empty() ? "" : " ") + s;
  return out;
}

bool MemoryScenario::operator==(const MemoryScenario& o) const {
  return micro_batch == o.micro_batch && accumulation == o.accumulation &&
         same_policy(checkpointing, o.checkpointing) && precision == o.precision &&
         optimizer == o.optimizer && zero_stage == o.zero_stage && offload == o.offload;
}

MemoryScenario scenario_of(const TrainConfig& cfg) {
  MemoryScenario s;
  s.micro_batch = cfg.per_device_train_batch_size;
  s.accumulation = cfg.gradient_accumulation_steps;
  const ResolvedTrainConfig rc = resolve_train_config(cfg);
  s.checkpointing = rc.checkpointing;
  s.precision = rc.precision;
  s.optimizer = rc.optimizer;
  s.zero_stage = cfg.zero_stage;
  s.offload = cfg.offload_param != "none" ? 2 : cfg.offload_optimizer != "none" ? 1 : 0;
  return s;
}

TrainConfig with_scenario(TrainConfig cfg, const MemoryScenario& s) {
  const OptimizerKind configured_optimizer = scenario_of(cfg).optimizer;
  cfg.per_device_train_batch_size = s.micro_batch;
  cfg.gradient_accumulation_steps = s.accumulation;
  cfg.zero_stage = s.zero_stage;
  // (NVMe offload stays where it was asked for: the same host memory for the master weights, less for the
  // state and the weights.)
  cfg.offload_optimizer = s.offload == 0 ? "none" : cfg.offload_optimizer == "nvme" ? "nvme" : "cpu";
  cfg.offload_param = s.offload < 2 ? "none" : cfg.offload_param == "nvme" ? "nvme" : "cpu";
  if (cfg.offload_optimizer != "nvme" && cfg.offload_param != "nvme") cfg.offload_nvme_path.clear();
  cfg.gradient_checkpointing = s.checkpointing.mode != CheckpointMode::None;
  if (cfg.gradient_checkpointing) {
    cfg.gradient_checkpointing_mode = checkpoint_mode_name(s.checkpointing.mode);
    cfg.gradient_checkpointing_every = s.checkpointing.every;
  }
  cfg.bf16 = s.precision == Precision::BF16;
  cfg.fp16 = s.precision == Precision::FP16;
  // 16-bit gradients and stochastic rounding follow the 16-bit type (or go with it).
  if (cfg.grad_accum_dtype != "fp32")
    cfg.grad_accum_dtype = s.precision == Precision::FP32 ? "fp32" : precision_name(s.precision);
  if (!cfg.bf16) cfg.stochastic_rounding = false;
  if (!cfg.fp16) cfg.debug_inject_overflow_steps.clear();
  if (configured_optimizer != s.optimizer) {
    cfg.optim = optimizer_name(s.optimizer);
    cfg.adamw_bf16_moments = false;
    cfg.momentum = cfg.dampening = 0;
    cfg.nesterov = false;
  }
  return cfg;
}

MemoryScenario with_micro_batch(MemoryScenario s, int micro, int64_t effective_batch) {
  s.micro_batch = micro;
  s.accumulation = int(std::max<int64_t>(1, (effective_batch + micro - 1) / micro));
  return s;
}

std::vector<Precision> plannable_precisions() {
  return {Precision::FP32, Precision::BF16, Precision::FP16};
}

std::vector<OptimizerKind> plannable_optimizers() {
  return {OptimizerKind::AdamW, OptimizerKind::Adafactor, OptimizerKind::AdamW8bit, OptimizerKind::SGD};
}

double relative_time_per_token(const TransformerConfig& m, int seq_len, const MemoryScenario& s) {
  const double C = m.n_embd, T = seq_len, L = m.n_layer, F = m.ffn_size();
  // Multiply-adds per token of one block's forward: qkv 3C^2, attention 2TC, projection C^2, MLP 2CF
  // (8C^2 for GPT-2).
  const double block = 4 * C * C + 2 * C * F + 2 * T * C;
  // The LM head multiplies every token (GPT-2); BERT's pooler and classifier run once per sequence.
  const double head = m.is_bert() ? 0 : double(m.padded_vocab_size()) * C;
  const double step = 3 * (L * block + head);  // forward + backward (2x forward)
  // Re-running a checkpointed block's forward (checkpointing.hpp): full repeats all but the MLP's output
  // projection (the block output is stored); selective repeats the attention and MLP input projections.
  double recompute = 0;
  if (s.checkpointing.mode != CheckpointMode::None) {
    int checkpointed = 0;
    for (int l = 0; l < m.n_layer; ++l) checkpointed += s.checkpointing.checkpointed(l) ? 1 : 0;
    const double per_block =
        s.checkpointing.mode == CheckpointMode::Full ? 4 * C * C + C * F + 2 * T * C : C * C + C * F;
    recompute = checkpointed * per_block;
  }
  const double tokens = double(s.micro_batch) * seq_len;
  return (step + recompute) / step * (1 + kMicroBatchFixedTokens / tokens) *
         kZeroStageTimeFactor[std::clamp(s.zero_stage, 0, 3)] *
         kOffloadTimeFactor[std::clamp(s.offload, 0, 2)] *
         (s.offload >= 1 && s.zero_stage >= 2 ? kOffloadGradsTimeFactor : 1.0);
}

int max_zero_stage(const TransformerConfig& model, const TrainConfig& cfg) {
  const bool quantized = parse_weight_storage(cfg.quantization, "quantization") != WeightStorage::Compute;
  return model.is_bert() || quantized ? 2 : 3;
}

// --- estimates -----------------------------------------------------------------------------------

MemoryEstimate estimate_memory(const TransformerConfig& model, const TrainConfig& cfg, DeviceKind device,
                               size_t overhead) {
  using M = MemoryCategory;
  MemoryEstimate e;
  e.scenario = scenario_of(cfg);
  e.device = device;
  e.seq_len = cfg.seq_len();
  e.parameters = model.num_parameters();
  EngineOptions o = training_engine_options(cfg, device);
  o.precision = e.scenario.precision;
  o.optimizer = e.scenario.optimizer;
  e.plan = plan_engine_memory(model, o);
  e.weights = e.plan.bytes(M::Weights);
  e.master_weights = e.plan.bytes(M::MasterWeights);
  e.gradients = e.plan.bytes(M::Gradients);
  e.optimizer_states = e.plan.bytes(M::OptimizerState);
  e.saved_activations = e.plan.bytes(M::Activations);
  e.recompute = e.plan.bytes(M::Recompute);
  e.data = e.plan.bytes(M::Data);
  e.workspace = e.plan.bytes(M::Workspace);
  e.communication = e.plan.bytes(M::Communication);
  e.overhead = overhead;
  e.shared = e.plan.shared_bytes();
  e.arena = e.plan.total_bytes();
  e.time_cost = relative_time_per_token(model, e.seq_len, e.scenario);
  return e;
}

json estimate_json(const MemoryEstimate& e) {
  json buffers = json::array();
  for (const PlannedBuffer& b : e.plan.buffers())
    buffers.push_back({{"name", b.name},
                       {"category", memory_category_name(b.category)},
                       {"bytes", b.bytes},
                       {"offset", b.offset},
                       {"shared_bytes", b.shared_bytes}});
  const MemoryScenario& s = e.scenario;
  return {{"parameters", e.parameters},
          {"weights", e.weights},
          {"master_weights", e.master_weights},
          {"gradients", e.gradients},
          {"shared", e.shared},
          {"optimizer_states", e.optimizer_states},
          {"activations", e.activations()},
          {"workspace", e.workspace},
          {"communication", e.communication},
          {"overhead", e.overhead},
          {"total", e.total()},
          {"arena", e.arena},
          {"device", device_name(e.device)},
          {"micro_batch", s.micro_batch},
          {"gradient_accumulation_steps", s.accumulation},
          {"effective_batch", s.effective_batch()},
          {"seq_len", e.seq_len},
          {"checkpointing", s.checkpointing_name()},
          {"precision", precision_name(s.precision)},
          {"optimizer", optimizer_name(s.optimizer)},
          {"relative_time_per_token", e.time_cost},
          {"breakdown",
           {{"saved_activations", e.saved_activations},
            {"recompute_buffers", e.recompute},
            {"data_buffers", e.data},
            {"buffers", buffers}}}};
}

std::string estimate_table(const MemoryEstimate& e, const std::string& overhead_note) {
  std::string out = fmt::format("  {:<28} {:>17}  {:>10}\n", "per device", "bytes", "");
  auto row = [&](const std::string& name, size_t bytes, const std::string& note = "") {
    out += fmt::format("  {:<28} {:>17}  {:>10}{}\n", name, group_digits(bytes), format_bytes(bytes),
                       note.empty() ? "" : "  " + note);
  };
  row("weights", e.weights);
  row("master weights", e.master_weights);
  row("gradients", e.gradients);
  row("optimizer states", e.optimizer_states);
  row("activations", e.activations());
  row("  saved activations", e.saved_activations);
  row("  recompute buffers", e.recompute);
  row("  data (token buffers)", e.data);
  row("workspaces", e.workspace);
  row("communication buffers", e.communication);
  if (e.shared)
    out += fmt::format("  {:<28} {:>17}  {:>10}  gradients in activation memory backward is done with\n",
                       "shared (counted twice above)", fmt::format("-{}", group_digits(e.shared)),
                       fmt::format("-{}", format_bytes(e.shared)));
  row("arena (allocated at start)", e.arena);
  row(e.device == DeviceKind::CUDA ? "CUDA context overhead" : "runtime overhead", e.overhead, overhead_note);
  row("total", e.total());
  return out;
}

// --- the search ----------------------------------------------------------------------------------

std::vector<MemoryEstimate> cheapest_fitting(const TransformerConfig& model, const TrainConfig& cfg,
                                             DeviceKind device, size_t arena_budget, size_t overhead,
                                             int max_results) {
  const MemoryScenario configured = scenario_of(cfg);
  const int64_t effective = configured.effective_batch();
  std::vector<MemoryEstimate> found;
  // Precision changes suggested: bf16 from fp32 (the seeds' standard memory saver; fp16 needs loss scaling,
  // so it is never proposed unasked).
  std::vector<Precision> precisions = {configured.precision};
  if (configured.precision == Precision::FP32) precisions.push_back(Precision::BF16);
  // ZeRO stages, with several processes (the launcher's world, as the plan reads it): each stage changes
  // memory, not the training. The optimizer is never changed unasked (it changes the training itself);
  // `anvil estimate --sweep` shows what each would take.
  std::vector<int> stages = {configured.zero_stage};
  if (dist::read_dist_env().world_size > 1)
    for (int stage = 0; stage <= max_zero_stage(model, cfg); ++stage)
      if (stage != configured.zero_stage && (stage > 0 || cfg.offload_optimizer == "none"))
        stages.push_back(stage);  // (offload with several processes needs a stage: each rank its shard)
  // Offload (full training, where the config allows it: no LoRA, no stochastic rounding): 1 the optimizer;
  // 2 the optimizer and ZeRO-3's weight shard (decoders; stage 3 whatever the stage axis holds, taken once).
  // Several processes offload under a ZeRO stage only.
  const bool can_offload = cfg.lora_r == 0 && !cfg.stochastic_rounding;
  const bool many = dist::read_dist_env().world_size > 1;
  // One process offloads its gradients too under stage 2 (decoders: gradients by unit), a stage it runs for
  // that alone.
  const bool offload_grads_alone =
      !many && can_offload && configured.zero_stage < 2 && max_zero_stage(model, cfg) >= 3;
  if (offload_grads_alone) stages.push_back(2);
  for (const CheckpointPolicy& policy : candidate_policies(configured.checkpointing))
    for (Precision precision : precisions)
      for (int stage : stages)
        for (int offload = configured.offload; offload <= 2; ++offload)
          for (int micro : halving_chain(configured.micro_batch)) {
            MemoryScenario s = with_micro_batch(configured, micro, effective);
            if (micro == configured.micro_batch) s.accumulation = configured.accumulation;
            s.checkpointing = policy;
            s.precision = precision;
            s.zero_stage = stage;
            if (offload != configured.offload) {
              if (!can_offload || (offload == 2 && max_zero_stage(model, cfg) < 3)) break;
              if (offload == 2) {
                if (stage != configured.zero_stage) break;
                s.zero_stage = 3;
              }
              if (many && s.zero_stage == 0) break;
              s.offload = offload;
            }
            if (!many && stage != configured.zero_stage && s.offload != 1) break;  // (stage 2 for offload)
            if (s == configured) continue;
            MemoryEstimate e = estimate_memory(model, with_scenario(cfg, s), device, overhead);
            if (e.arena <= arena_budget) {  // the largest micro-batch of this combination that fits
              found.push_back(std::move(e));
              break;
            }
          }
  std::stable_sort(found.begin(), found.end(), [](const MemoryEstimate& a, const MemoryEstimate& b) {
    return a.time_cost != b.time_cost ? a.time_cost < b.time_cost : a.arena < b.arena;
  });
  if (found.size() > size_t(max_results)) found.resize(size_t(max_results));
  return found;
}

std::string offload_host_note(const TransformerConfig& model, const TrainConfig& cfg, const MemoryScenario& s,
                              DeviceKind device) {
  if (s.offload == 0) return "";
  const std::optional<MemoryPlan> h =
      host_optimizer_plan(model, training_engine_options(with_scenario(cfg, s), device));
  return h ? fmt::format(" and {} of host memory", format_bytes(h->total_bytes())) : "";
}

std::optional<MemoryScenario> find_batch_size(const TransformerConfig& model, const TrainConfig& cfg,
                                              DeviceKind device, size_t arena_budget) {
  const MemoryScenario configured = scenario_of(cfg);
  for (int micro : halving_chain(configured.micro_batch)) {
    MemoryScenario s = with_micro_batch(configured, micro, configured.effective_batch());
    if (micro == configured.micro_batch) s.accumulation = configured.accumulation;
    if (estimate_memory(model, with_scenario(cfg, s), device, 0).arena <= arena_budget) return s;
  }
  return std::nullopt;
}

MemoryFit fit_to_memory(const TrainConfig& cfg, const TransformerConfig& model, DeviceKind device,
                        std::optional<size_t> arena_budget, size_t overhead, const std::string& device_name) {
  MemoryFit fit{cfg, ""};
  if (!arena_budget) {
    if (cfg.auto_find_batch_size)
      fit.message = fmt::format(
          "  auto_find_batch_size: {} gives no reliable available-memory figure; keeping micro-batch {} "
          "(docs/memory.md)\n",
          device_name, cfg.per_device_train_batch_size);
    return fit;
  }
  const MemoryScenario configured = scenario_of(cfg);
  if (cfg.auto_find_batch_size) {
    if (const std::optional<MemoryScenario> s = find_batch_size(model, cfg, device, *arena_budget)) {
      fit.config = with_scenario(cfg, *s);
      const int64_t effective = configured.effective_batch();
      fit.message = fmt::format(
          "  auto_find_batch_size: micro-batch {} x {} accumulation = effective batch {}{} "
          "(configured {} x {}; {} available on {})\n",
          s->micro_batch, s->accumulation, s->effective_batch(),
          s->effective_batch() == effective
              ? ""
              : fmt::format(", rounded up from {} to a multiple of the micro-batch", effective),
          configured.micro_batch, configured.accumulation, format_bytes(*arena_budget), device_name);
      return fit;
    }
  }
  const MemoryEstimate e = estimate_memory(model, cfg, device, overhead);
  if (e.arena <= *arena_budget) return fit;

  std::string msg = fmt::format(
      "out of memory at start-up: the memory plan needs {} ({} bytes) but {} has {} ({} bytes) available to "
      "it{}\n",
      format_bytes(e.arena), e.arena, device_name, format_bytes(*arena_budget), *arena_budget,
      cfg.auto_find_batch_size ? " (auto_find_batch_size: not even micro-batch 1 fits)" : "");
  msg += fmt::format("plan for micro-batch {} x {} tokens, checkpointing {}, {}, {}:\n{}",
                     configured.micro_batch, e.seq_len, configured.checkpointing_name(),
                     precision_name(configured.precision), optimizer_name(configured.optimizer),
                     e.plan.report());
  const std::vector<MemoryEstimate> alternatives =
      cheapest_fitting(model, cfg, device, *arena_budget, overhead, 3);
  if (alternatives.empty()) {
    msg += fmt::format(
        "no micro-batch / checkpointing combination fits: the weights, gradients and optimizer states alone "
        "take {}",
        format_bytes(e.weights + e.master_weights + e.gradients + e.optimizer_states));
  } else {
    msg +=
        "configurations that fit, cheapest first (time per token estimated relative to the configured run):";
    for (const MemoryEstimate& a : alternatives)
      msg += fmt::format("\n  {}    # plan {}{}, ~{:.2f}x time per token", a.scenario.flags_from(configured),
                         format_bytes(a.arena), offload_host_note(model, cfg, a.scenario, device),
                         a.time_cost / e.time_cost);
  }
  throw Error(msg);
}

}  // namespace anvil
