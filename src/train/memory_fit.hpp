// Fitting a training run to a device's memory (docs/memory.md): the per-device estimate of a
// configuration by category, the search over the settings that change memory (micro-batch with
// gradient accumulation, activation checkpointing, precision, optimizer), `auto_find_batch_size`, and
// the start-up out-of-memory check with the cheapest configurations that fit. Everything here plans
// without a device, so it runs (and is tested) on the CPU with any "available bytes" figure.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "anvil/train_config.hpp"
#include "train/engine.hpp"

namespace anvil {

// The settings of a run that decide its per-device memory, besides the model and sequence length.
struct MemoryScenario {
  int micro_batch = 1;   // per_device_train_batch_size
  int accumulation = 1;  // gradient_accumulation_steps
  CheckpointPolicy checkpointing;
  Precision precision = Precision::FP32;
  OptimizerKind optimizer = OptimizerKind::AdamW;
  int zero_stage = 0;  // zero_stage (it changes memory with several processes only)
  // Offload to the host: 0 none, 1 the optimizer (offload_optimizer cpu), 2 the optimizer and ZeRO-3's weight
  // shard (offload_param cpu, or nvme where the run asked for it; zero_stage 3, with one process too).
  int offload = 0;

  int64_t effective_batch() const { return int64_t(micro_batch) * accumulation; }
  std::string checkpointing_name() const;  // none | full | selective, with " every N" when N > 1
  // The command-line flags that turn `base` into this scenario (only those that differ).
  std::string flags_from(const MemoryScenario& base) const;
  bool operator==(const MemoryScenario& o) const;
};

MemoryScenario scenario_of(const TrainConfig& cfg);
// " and <bytes> of host memory" for a scenario that offloads (its host share, per process), else "".
std::string offload_host_note(const TransformerConfig& model, const TrainConfig& cfg, const MemoryScenario& s,
                              DeviceKind device);
TrainConfig with_scenario(TrainConfig cfg, const MemoryScenario& s);
// `s` with micro-batch `micro` and the accumulation that keeps `effective_batch`: ceil(effective / micro)
// (so the effective batch is kept exactly when `micro` divides it, else rounded up to a multiple of it).
MemoryScenario with_micro_batch(MemoryScenario s, int micro, int64_t effective_batch);

// The values of the precision and optimizer axes that this version can plan.
std::vector<Precision> plannable_precisions();
std::vector<OptimizerKind> plannable_optimizers();

// Heuristic training time per token, relative to no recomputation and micro-batches so large that their
// fixed cost vanishes: (step FLOPs + recomputed forward FLOPs) / step FLOPs (backward = 2 x forward)
// times (1 + kMicroBatchFixedTokens / tokens per micro-batch), times a ZeRO stage's communication factor
// (kZeroStageTimeFactor: stage 2 moves what stage 0 moves, a reduce-scatter and an all-gather for an
// all-reduce; stage 1 all-gathers the weights on top of stage 0's all-reduce; stage 3 gathers every unit's
// weights twice a micro-batch, which overlaps compute only in part). It ranks configurations; it is no
// measurement (docs/memory.md).
constexpr double kMicroBatchFixedTokens = 256;
constexpr double kZeroStageTimeFactor[4] = {1.0, 1.02, 1.01, 1.10};
// Offload's factor (offload none / optimizer / optimizer and weights): the update on the CPU, bound by the
// host's memory bandwidth, made the Llama-1B step about 4x longer on an H200 (docs/memory.md), and the
// weights' copies add to it.
constexpr double kOffloadTimeFactor[3] = {1.0, 4.0, 4.3};
// Offload under ZeRO-2/3 puts the shard's gradients in host memory too, written by the device over the bus
// during backward (Llama-1B: 1% slower than the optimizer's offload alone; the 8B shape: as fast;
// docs/memory.md). Enough to rank it after the optimizer's offload alone where both fit.
constexpr double kOffloadGradsTimeFactor = 1.02;
// The ZeRO stages a run of `cfg` takes: 0-3 for decoders, 0-2 for BERT (whose weights stay whole) and for a
// quantized base (QLoRA: kept whole on every process).
int max_zero_stage(const TransformerConfig& model, const TrainConfig& cfg);
double relative_time_per_token(const TransformerConfig& model, int seq_len, const MemoryScenario& s);

// Per-device bytes of a run by category. Every figure but `overhead` is the arena's: each buffer
// counted with its alignment padding, so the categories less `shared` (memory that gradients reuse from
// activations backward is done with, counted in both) add up to `arena` exactly.
struct MemoryEstimate {
  MemoryScenario scenario;
  DeviceKind device = DeviceKind::CPU;
  int seq_len = 0;
  int64_t parameters = 0;  // the model's parameter count (the unpadded vocabulary)
  size_t weights = 0, master_weights = 0, gradients = 0, optimizer_states = 0;
  size_t saved_activations = 0, recompute = 0, data = 0;  // "activations" in the JSON
  size_t workspace = 0, communication = 0;
  size_t shared = 0;     // MemoryPlan::shared_bytes
  size_t overhead = 0;   // outside the arena: the CUDA context and runtime (0 on the CPU)
  size_t arena = 0;      // the plan's total, what the allocator hands out
  double time_cost = 1;  // relative_time_per_token
  MemoryPlan plan;

  size_t activations() const { return saved_activations + recompute + data; }
  size_t total() const { return arena + overhead; }
};

MemoryEstimate estimate_memory(const TransformerConfig& model, const TrainConfig& cfg, DeviceKind device,
                               size_t overhead);

// The estimate as JSON: parameters, weights, master_weights, gradients, optimizer_states, activations,
// workspace, communication, overhead, total (bytes), the run's settings, and "breakdown" (the parts of
// activations and every buffer of the plan). Schema in docs/memory.md.
nlohmann::ordered_json estimate_json(const MemoryEstimate& e);
// The per-category table (bytes and human-readable), with the totals.
std::string estimate_table(const MemoryEstimate& e, const std::string& overhead_note);

// Up to `max_results` configurations whose arena fits in `arena_budget` bytes, cheapest
// (relative_time_per_token) first: for each checkpointing policy (none, selective, full and the configured
// one) x precision (bf16 added to fp32) x ZeRO stage (0-2 with several processes), the largest micro-batch of
// the halving chain B, B/2, ..., 1 that fits, with the accumulation that keeps the effective batch. The
// configured scenario itself is left out.
std::vector<MemoryEstimate> cheapest_fitting(const TransformerConfig& model, const TrainConfig& cfg,
                                             DeviceKind device, size_t arena_budget, size_t overhead,
                                             int max_results = 3);

// The largest micro-batch of the halving chain per_device_train_batch_size, /2, ..., 1 whose arena fits
// in `arena_budget`, with the accumulation that keeps the effective batch; nullopt if none does.
std::optional<MemoryScenario> find_batch_size(const TransformerConfig& model, const TrainConfig& cfg,
                                              DeviceKind device, size_t arena_budget);

// The start-up decision for a run on a device with `arena_budget` bytes available to the arena
// (nullopt: unknown, as on the CPU; nothing is checked). With auto_find_batch_size, the config comes
// back with the chosen micro-batch and accumulation; a config that does not fit throws anvil::Error
// with the plan's breakdown and the cheapest configurations that fit, as flags. `message` says what was
// decided (empty when nothing was).
struct MemoryFit {
  TrainConfig config;
  std::string message;
};
MemoryFit fit_to_memory(const TrainConfig& cfg, const TransformerConfig& model, DeviceKind device,
                        std::optional<size_t> arena_budget, size_t overhead, const std::string& device_name);

}  // namespace anvil
