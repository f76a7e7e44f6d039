// The end of a training run: the TrainSummary `train()` returns (the seed's summary: time, throughput,
// loss, memory) and summary.json beside metrics.jsonl (docs/formats.md).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "anvil/trainer.hpp"
#include "precision/loss_scaler.hpp"
#include "train/engine.hpp"
#include "train/mfu.hpp"
#include "train/progress_log.hpp"
#include "train/task.hpp"

namespace anvil {

// What the run did, as the loop left it.
struct RunRecord {
  int64_t start_step = 0, total_steps = 0;
  double runtime = 0;  // seconds, this process
  // The train-loss total and step count before a resume (from the checkpoint).
  double loss_sum_before = 0;
  int64_t steps_before = 0;
  RunTotals totals;
  EvalResult eval;
  std::string last_checkpoint;
  const LossScaler* scaler = nullptr;  // fp16
  std::string precision;               // fp32 | tf32 | 3xtf32 | bf16 | fp16
  int64_t graphs_recorded = 0, graph_launches = 0, whole_step_replays = 0;
  PeakFlops peak;
  int world_size = 1;  // processes training together: tokens and samples are the world's, MFU per device
};

// The summary (without the sample, which the task adds after it: the memory figures are taken before).
TrainSummary summarize_run(const RunRecord& r, const TrainConfig& cfg, const Task& task, Engine& e);
// summary.json's object.
nlohmann::json summary_json(const TrainSummary& s, const RunRecord& r, const Task& task, Engine& e);

}  // namespace anvil
