#include "train/progress_log.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace anvil {

using json = nlohmann::json;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

ProgressLog::ProgressLog(const TrainConfig& cfg, const ResolvedTrainConfig& rc, const Task& task, Engine& e,
                         MetricsLog& metrics, const LossScaler* scaler, int64_t start_step,
                         int64_t total_steps)
    : cfg_(cfg),
      task_(task),
      e_(e),
      metrics_(metrics),
      scaler_(scaler),
      start_step_(start_step),
      total_steps_(total_steps),
      t0_(Clock::now()),
      peak_(anvil::peak_flops(e.device().name(), rc.precision_label(), cfg.peak_flops)),
      world_size_(rc.world_size) {}

size_t ProgressLog::peak_memory() const {
  return std::max(e_.plan().total_bytes(), totals_.peak_driver);
}

void ProgressLog::step_done(int64_t step, const StepResult& r, Clock::time_point started) {
  totals_.loss_sum += r.skipped ? 0.0 : r.loss;
  totals_.tokens += r.tokens;
  totals_.flops += r.flops;
  if (r.comm_seconds >= 0) {
    totals_.comm_seconds += r.comm_seconds;
    totals_.comm_exposed_seconds += r.comm_exposed_seconds;
  }
  totals_.peak_driver = std::max(totals_.peak_driver, e_.device().driver_used_bytes());
  const double step_time = seconds_since(started);
  const double elapsed = seconds_since(t0_);
  if ((step + 1) % cfg_.logging_steps == 0 || step + 1 == total_steps_ || step == start_step_ || r.skipped)
    log(step, r, step_time, elapsed);
}

namespace {
// "33", or "0.4" below 10 ms (a small model's collectives take well under a millisecond).
std::string milliseconds_text(double seconds) {
  const double ms = 1e3 * seconds;
  return ms < 10 ? fmt::format("{:.1f}", ms) : fmt::format("{:.0f}", ms);
}
}  // namespace

void ProgressLog::log(int64_t step, const StepResult& r, double step_time, double elapsed) {
  const size_t peak_mem = peak_memory();
  const double tps = double(r.tokens) / step_time;
  // Per device: the world's FLOPs over the world's peak.
  const double mfu = peak_.flops > 0 ? r.flops / step_time / (peak_.flops * world_size_) : -1;
  const std::string mfu_text = mfu >= 0 ? fmt::format(" | MFU {:4.1f}%", 100 * mfu) : "";
  // Several processes: this rank's communication, and the part compute waited for.
  const std::string comm_text =
      r.comm_seconds >= 0 ? fmt::format(" | comm {} ms ({} exposed)", milliseconds_text(r.comm_seconds),
                                        milliseconds_text(r.comm_exposed_seconds))
                          : "";
  const std::string scale_text =
      scaler_ ? fmt::format(" | scale {} | skipped {}", format_loss_scale(scaler_->scale()),
                            scaler_->skipped_steps())
              : "";
  fmt::print(
      "step {:>5}/{} | loss {:.4f} | lr {:.3e} | grad norm {:.4f}{} |{} {:>9.0f} tok/s{}{} | {:7.1f}s | "
      "peak {}\n",
      step + 1, total_steps_, r.loss, r.lr, r.grad_norm, scale_text, task_.progress_text(step_time), tps,
      mfu_text, comm_text, elapsed, format_bytes(peak_mem));
  std::fflush(stdout);
  json line = {{"step", step + 1},
               {"loss", std::isfinite(r.loss) ? json(r.loss) : json(nullptr)},
               {"learning_rate", r.lr},
               {"grad_norm", std::isfinite(r.grad_norm) ? json(r.grad_norm) : json(nullptr)},
               {"tokens_per_second", tps},
               {"step_time", step_time},
               {"elapsed", elapsed},
               {"data_wait_seconds", task_.data_wait_seconds()},
               {"peak_memory_bytes", peak_mem}};
  task_.add_progress_metrics(line, step_time);
  if (mfu >= 0) line["mfu"] = mfu;
  if (r.comm_seconds >= 0) {
    line["comm_seconds"] = r.comm_seconds;
    line["comm_exposed_seconds"] = r.comm_exposed_seconds;
  }
  if (scaler_) {
    line["loss_scale"] = scaler_->scale();
    line["skipped_steps"] = scaler_->skipped_steps();
    line["overflow"] = r.skipped;
  }
  metrics_.write(line);
}

}  // namespace anvil
