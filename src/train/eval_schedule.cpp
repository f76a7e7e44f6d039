#include "train/eval_schedule.hpp"

namespace anvil {

EvalSchedule::EvalSchedule(const TrainConfig& cfg, Task& task, Engine& e, MetricsLog& metrics,
                           int64_t total_steps)
    : cfg_(cfg), task_(task), e_(e), metrics_(metrics), total_steps_(total_steps) {}

void EvalSchedule::after_step(int64_t step, int free_slot) {
  const bool due = (cfg_.eval_steps > 0 && step % cfg_.eval_steps == 0) || step == total_steps_;
  if (!task_.has_eval() || !due) return;
  last_ = task_.evaluate(e_, free_slot);
  task_.report_eval(last_, step, total_steps_, metrics_);
}

}  // namespace anvil
