// The progress of a training run: the totals of the steps this process ran, and for each logging step the
// progress line on the terminal and its record in metrics.jsonl (loss, learning rate, gradient norm, loss
// scale, throughput, MFU, time, peak memory; the task adds its own figures).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "anvil/train_config.hpp"
#include "precision/loss_scaler.hpp"
#include "train/engine.hpp"
#include "train/metrics_log.hpp"
#include "train/mfu.hpp"
#include "train/task.hpp"
#include "train/train_step.hpp"

namespace anvil {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0);

// Totals of the steps this process ran.
struct RunTotals {
  double loss_sum = 0;              // the losses of the applied steps (skipped ones count 0)
  int64_t tokens = 0;               // B x T of every micro-batch
  double flops = 0;                 // their training FLOPs
  double comm_seconds = 0;          // several processes: rank 0's device collectives (StepResult)
  double comm_exposed_seconds = 0;  // the part of them compute waited for
  size_t peak_driver = 0;           // the most the driver reported in use after a step (CUDA)
};

class ProgressLog {
 public:
  // The run's clock starts here. Steps start_step + 1 .. total_steps (1-based) are to run.
  ProgressLog(const TrainConfig& cfg, const ResolvedTrainConfig& rc, const Task& task, Engine& e,
              MetricsLog& metrics, const LossScaler* scaler, int64_t start_step, int64_t total_steps);

  // Adds step `step` (0-based), which began at `started`, to the totals; on a logging step (every
  // logging_steps, the first and the last step, and any skipped one) prints its line and writes its record.
  void step_done(int64_t step, const StepResult& r, Clock::time_point started);

  double elapsed() const { return seconds_since(t0_); }
  const RunTotals& totals() const { return totals_; }
  // The plan's total, or the driver's peak when that is more.
  size_t peak_memory() const;
  const PeakFlops& peak_flops() const { return peak_; }

 private:
  void log(int64_t step, const StepResult& r, double step_time, double elapsed);

  const TrainConfig& cfg_;
  const Task& task_;
  Engine& e_;
  MetricsLog& metrics_;
  const LossScaler* scaler_;
  const int64_t start_step_, total_steps_;
  const Clock::time_point t0_;
  const PeakFlops peak_;
  const int world_size_;  // MFU is per device
  RunTotals totals_;
};

}  // namespace anvil
