// The checkpoints of a training run (docs/formats.md): when they are saved (every save_steps and at the end,
// unless save_strategy is "no"), what trainer_state.json records so that a resume reproduces the
// uninterrupted run, and the rotation of old ones (save_total_limit).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "anvil/train_config.hpp"
#include "data/prefetch_ring.hpp"
#include "dist/process_group.hpp"
#include "dist/zero_sync.hpp"
#include "io/base_reference.hpp"
#include "io/optimizer_state.hpp"
#include "precision/loss_scaler.hpp"
#include "train/engine.hpp"
#include "train/resolved_config.hpp"
#include "train/run_directory.hpp"

namespace anvil {

// The training state a checkpoint records besides the weights and the optimizer.
struct TrainingState {
  int64_t step = 0;  // the global step just finished (1-based)
  int64_t total_steps = 0;
  data::LoaderPosition loader;  // the first batch not yet consumed by a finished step
  uint64_t rng_state = 0;
  double loss_sum = 0;  // the running train-loss total over all steps so far (including before a resume)
  int64_t loss_steps = 0;
  const LossScaler* scaler = nullptr;  // fp16
};

class Checkpointer {
 public:
  // `tokenizer_file` is copied into every checkpoint ("" for the byte tokenizer). A null `dir`: a
  // data-parallel rank other than 0, which saves nothing under stage 0 (its state is rank 0's) and its shard
  // of the optimizer state under ZeRO (`zero`; every rank then calls save() together).
  Checkpointer(const TrainConfig& cfg, const ResolvedTrainConfig& rc, Engine& e, RunDirectory* dir,
               std::string tokenizer_file, dist::ProcessGroup* group = nullptr,
               const dist::ZeroSync* zero = nullptr);

  // Whether global step `step` (1-based) saves a checkpoint.
  bool due(int64_t step, int64_t total_steps) const;
  // Writes checkpoint-N (N = state.step), then deletes the ones beyond save_total_limit.
  void save(const TrainingState& state);
  // The last checkpoint this run wrote ("" if none).
  const std::string& last() const { return last_; }

 private:
  const TrainConfig& cfg_;
  const bool enabled_;
  const int world_size_;  // recorded: a resume on another world size keeps the global batch
  Engine& e_;
  RunDirectory* dir_;
  dist::ProcessGroup* group_;
  const dist::ZeroSync* zero_;
  io::StateSlices slices_;  // ZeRO: this rank's slices of the optimizer state
  const std::string tokenizer_file_;
  const std::optional<io::BaseReference> base_;  // checkpoint_base
  std::string last_;
};

// The base a LoRA run's checkpoints refer to instead of holding it (io/base_reference.hpp), or none: the run
// trains its adapters alone (a store of the trainable tensors only), save_base_model is off, and its base
// came from a model directory (model_name_or_path), or from the base the checkpoint it starts from refers to.
// A base that is a checkpoint itself (a random start, saved) is copied: rotation could delete it.
std::optional<io::BaseReference> checkpoint_base(const TrainConfig& cfg, Engine& e);

}  // namespace anvil
