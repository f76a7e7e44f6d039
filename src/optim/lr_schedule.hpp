// Learning-rate schedules, with Hugging Face semantics: the rate for optimizer step s (0-based) is
// learning_rate * lambda(s).
//   constant              lambda = 1
//   constant_with_warmup  s / warmup during warmup, then 1          (DeepSpeed WarmupLR, linear warmup)
//   linear                warmup, then linear decay to 0 at total   (HF "linear", DeepSpeed WarmupDecayLR)
//   cosine                warmup, then half-cosine decay to 0 at total
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace anvil {

enum class LrSchedule { Constant, ConstantWithWarmup, Linear, Cosine };

LrSchedule parse_lr_schedule(std::string_view name);  // throws naming the value and the valid names
std::string lr_schedule_name(LrSchedule s);
double lr_at(LrSchedule s, double base_lr, int64_t step, int64_t warmup_steps, int64_t total_steps);

}  // namespace anvil
