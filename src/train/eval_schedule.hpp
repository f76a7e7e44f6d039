// When a training run evaluates (with val_data: every eval_steps steps and after the last one), and what it
// does with the result: the task's eval line and metrics record; the last result goes into the summary.
#pragma once
#include <cstdint>

#include "anvil/train_config.hpp"
#include "train/engine.hpp"
#include "train/metrics_log.hpp"
#include "train/task.hpp"

namespace anvil {

class EvalSchedule {
 public:
  EvalSchedule(const TrainConfig& cfg, Task& task, Engine& e, MetricsLog& metrics, int64_t total_steps);

  // After global step `step` (1-based): evaluates when it is due, on the device input buffers of
  // `free_slot` (which must not hold the staged next batch), prints and logs.
  void after_step(int64_t step, int free_slot);
  // The last evaluation (loss -1: none).
  const EvalResult& last() const { return last_; }

 private:
  const TrainConfig& cfg_;
  Task& task_;
  Engine& e_;
  MetricsLog& metrics_;
  const int64_t total_steps_;
  EvalResult last_;
};

}  // namespace anvil
