#include "optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

#include "anvil/error.hpp"

namespace anvil {

LrSchedule parse_lr_schedule(std::string_view name) {
  if (name == "constant") return LrSchedule::Constant;
  if (name == "constant_with_warmup") return LrSchedule::ConstantWithWarmup;
  if (name == "linear") return LrSchedule::Linear;
  if (name == "cosine") return LrSchedule::Cosine;
  ANVIL_THROW("lr_scheduler_type '{}' is not supported (constant, constant_with_warmup, linear, cosine)",
              name);
}

std::string lr_schedule_name(LrSchedule s) {
  switch (s) {
    case LrSchedule::Constant:
      return "constant";
    case LrSchedule::ConstantWithWarmup:
      return "constant_with_warmup";
    case LrSchedule::Linear:
      return "linear";
    case LrSchedule::Cosine:
      return "cosine";
  }
  return "?";
}

double lr_at(LrSchedule s, double base_lr, int64_t step, int64_t warmup, int64_t total) {
  if (s == LrSchedule::Constant) return base_lr;
  if (step < warmup) return base_lr * double(step) / double(std::max<int64_t>(1, warmup));
  if (s == LrSchedule::ConstantWithWarmup) return base_lr;
  const double progress = double(step - warmup) / double(std::max<int64_t>(1, total - warmup));
  if (s == LrSchedule::Linear) return base_lr * std::max(0.0, 1.0 - progress);
  return base_lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
}

}  // namespace anvil
