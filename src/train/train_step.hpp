// One optimizer step of a training run: its micro-batches with gradient accumulation (each batch's copy
// overlapping the previous micro-batch's compute), the fp16 loss scaler and its overflow skip, the global
// gradient norm and clipping, the optimizer update and the weight cast, and the CUDA graphs that replay them
// (step_graphs.hpp). What a batch is and what its loss is averaged over come from the task.
//
// No host synchronisation inside a step: its loss, gradient norm and clip factor are computed into the
// engine's device StepScalars, the optimizer reads the clip factor from there, and the host reads them once,
// after the step's final synchronisation. (With the fp16 loss scaler the host reads them once before the
// optimizer instead: an overflowing step must be skipped before it touches the weights.)
#pragma once
#include <cstdint>
#include <optional>

#include "anvil/train_config.hpp"
#include "dist/grad_sync.hpp"
#include "dist/process_group.hpp"
#include "dist/zero_sync.hpp"
#include "precision/loss_scaler.hpp"
#include "train/engine.hpp"
#include "train/resolved_config.hpp"
#include "train/step_graphs.hpp"
#include "train/step_instruments.hpp"
#include "train/task.hpp"

namespace anvil {

// What the host learns of a step.
struct StepResult {
  double loss = 0;       // the mean loss over the step's rows with a target
  double grad_norm = 0;  // the global norm of the true gradient (before clipping)
  double lr = 0;         // the scheduled learning rate
  bool skipped = false;  // fp16: the step overflowed and was not applied
  int64_t tokens = 0;    // B x T summed over the micro-batches and the ranks (padded for classification)
  double flops = 0;      // the model's training FLOPs of those tokens
  // Several processes: this rank's device collectives of the step (dist::CommTimes); -1 with one process.
  double comm_seconds = -1;
  double comm_exposed_seconds = -1;
};

class TrainStep {
 public:
  // Keeps references to everything; touches no device memory until stage_first(). Makes the loss scaler
  // (fp16). Several processes: `sync` reduces the gradients (null for one process) and the step's target
  // count and loss are summed over `group`'s ranks; with `zero` (ZeRO stages 1-3) the norm and the update
  // cover this rank's shard and the updated weights are all-gathered (stage 3: as the units are acquired).
  TrainStep(const TrainConfig& cfg, const ResolvedTrainConfig& rc, const TransformerConfig& model_cfg,
            Engine& e, Task& task, int64_t total_steps, dist::ProcessGroup& group, dist::GradSync* sync,
            dist::ZeroSync* zero = nullptr);

  // The nonzero seed with which step `step` (1-based) casts the master weights under stochastic rounding
  // (before a ZeRO shard's offset: shard_rounding_seed). A resumed run casts its loaded master weights with
  // its last step's seed, so its compute weights are the uninterrupted run's.
  static uint64_t weight_cast_seed(uint64_t run_seed, int64_t step);

  // The fp16 loss scaler (null otherwise): resumed from a checkpoint, saved in one, shown in the logs.
  LossScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }
  const LossScaler* scaler() const { return scaler_ ? &*scaler_ : nullptr; }

  // Stages the first micro-batch; afterwards each micro-batch's copy is issued before the previous compute
  // ends.
  void stage_first();
  // Runs global step `step` (0-based). Throws anvil::Error when a step without a loss scaler has a non-finite
  // loss or gradient norm (after its update was queued, before anything of it is logged or saved).
  StepResult run(int64_t step, StepInstruments& instruments);

  // The input slot that does not hold the staged next batch (free for evaluation).
  int free_slot() const { return slot_ ^ 1; }
  // The first batch not yet consumed by a finished step (what a checkpoint records).
  data::LoaderPosition resume_position() const { return resume_pos_; }
  const StepGraphs& graphs() const { return graphs_; }
  int64_t whole_step_replays() const { return whole_step_replays_; }

 private:
  // The current step: what its parts read.
  struct Current {
    int64_t step = 0;       // 0-based global step
    double loss_scale = 1;  // fp16: the scaler's scale; 1 otherwise
    float grad_scale = 0;   // loss_scale / nominal rows: the loss gradient's factor
    bool eager = true;      // no CUDA graphs (CPU, cuda_graphs off, profiled / traced / injected step)
    bool whole = false;     // the whole step is one graph
    bool inject = false;    // debug_inject_overflow_steps
    int64_t valid = 0;      // rows with a target so far (this rank's)
    int64_t global_valid =
        -1;                // every rank's rows with a target, once the step's are all staged (-1: not yet)
    double lr = 0;         // the scheduled learning rate
    int64_t opt_step = 0;  // the optimizer's count of applied updates including this one
    StepResult result;
  };

  void begin(int64_t step, StepInstruments& instruments);
  void stage(int slot);
  void micro_batches();
  bool tail();  // true: the fp16 loss scaler skipped the step
  void inject_overflow();
  StepResult end(bool skipped);

  // The parts of a step (and of its graphs).
  void head();
  void micro_batch(int slot);
  void norm_part();
  void update_part();
  void write_values();
  void require_targets();
  void read_scalars();
  bool not_finite() const;

  const TrainConfig& cfg_;
  const ResolvedTrainConfig& rc_;
  const TransformerConfig& model_cfg_;  // for the FLOPs of a batch
  Engine& e_;
  Device& dev_;
  Model& model_;
  Task& task_;
  const int64_t total_steps_;
  const int accum_;
  const double nominal_rows_;
  const bool use_graphs_;
  const size_t
      nparams_;  // what the optimizer updates (the trainable tensors only, where the store keeps those)
  const DType grad_dtype_;
  StepScalars* const scalars_;  // device memory
  dist::ProcessGroup& group_;
  dist::GradSync* const sync_;
  dist::ZeroSync* const zero_;
  std::optional<LossScaler> scaler_;
  StepGraphs graphs_;
  int64_t whole_step_replays_ = 0;

  StagedBatch staged_[2];  // the batch staged in each input slot
  int slot_ = 0;
  data::LoaderPosition resume_pos_;
  Current cur_;
  StepInstruments* instruments_ = nullptr;  // during run()
  StepScalars host_;                        // the step's scalars as the host reads them (once per step)
};

}  // namespace anvil
