// The fp16 loss scaler, with DeepSpeed's semantics and names (DynamicLossScaler in
// deepspeed/runtime/fp16/loss_scaler.py, configured by the "fp16" block of a DeepSpeed config).
//
// Dynamic scaling (loss_scale == 0) starts at 2^initial_scale_power. On an overflowing step the step
// is skipped and:
//   - if hysteresis == 1 or the remaining hysteresis is 1, the scale is divided by 2 (never below
//     min_loss_scale);
//   - otherwise the remaining hysteresis is decremented and the scale is kept.
// On a clean step, with consecutive_hysteresis the remaining hysteresis is refilled to `hysteresis`;
// and when the number of clean steps since the last overflow (the scaler's first step counting as if an
// overflow had preceded it) reaches a positive multiple of loss_scale_window, the scale is doubled (and
// the remaining hysteresis refilled, without consecutive_hysteresis). As in DeepSpeed, a scale decrease
// does not refill the hysteresis: after the first decrease, each further overflow halves the scale
// until a window of clean steps (or, with consecutive_hysteresis, one clean step) refills it.
//
// Static scaling (loss_scale > 0) never changes the scale; overflowing steps are still skipped.
//
// Unlike DeepSpeed, which stops at the first overflow at the minimum scale, Anvil stops (throws Error)
// when max_overflows_at_min_scale consecutive steps overflow at the minimum (or static) scale.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace anvil {

struct LossScalerConfig {
  double loss_scale = 0;         // > 0: static scale; 0: dynamic scaling
  int initial_scale_power = 16;  // dynamic: the scale starts at 2^initial_scale_power
  int loss_scale_window = 1000;  // dynamic: clean steps before the scale doubles
  int hysteresis = 2;            // dynamic: overflows tolerated before halving (DeepSpeed delayed_shift)
  bool consecutive_hysteresis = false;  // dynamic: refill the hysteresis on every clean step
  double min_loss_scale = 1;            // dynamic: the scale never goes below this
  // Consecutive overflows at the minimum (or static) scale before the run stops.
  int max_overflows_at_min_scale = 20;

  bool dynamic() const { return loss_scale == 0; }
  // Errors name `source`, the key and the value.
  void validate(const std::string& source) const;
};

// A loss scale as the scaler prints it: 65536, 32768, 0.5, 1.5258789e-05 style (integers without ".0").
std::string format_loss_scale(double scale);

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& config);  // validates the config

  const LossScalerConfig& config() const { return cfg_; }
  bool dynamic() const { return cfg_.dynamic(); }
  double scale() const { return cur_scale_; }

  struct Update {
    // The step overflowed: do not apply it (the weights, the optimizer and its step count stay as they were).
    bool skip = false;
    double old_scale = 0, new_scale = 0;
    std::string message;  // on overflow: "OVERFLOW: skipping step N, loss scale X -> Y"; else empty
  };
  // Records whether step `step` (1-based global step, used in the message) overflowed and updates the
  // scale for the next step. Throws Error once max_overflows_at_min_scale consecutive steps overflow at
  // the minimum (or static) scale.
  Update update(bool overflow, int64_t step);

  int64_t skipped_steps() const { return skipped_steps_; }
  // DeepSpeed's counters.
  int64_t cur_iter() const { return cur_iter_; }
  int64_t last_overflow_iter() const { return last_overflow_iter_; }
  int cur_hysteresis() const { return cur_hysteresis_; }
  int overflows_at_min_scale() const { return overflows_at_min_; }  // consecutive, at the current step

  // Every counter, for checkpoints: load_state(state()) resumes exactly. Under a static config the
  // scale stays the configured one; the counters are restored. `source` names the state in errors.
  nlohmann::json state() const;
  void load_state(const nlohmann::json& state, const std::string& source);

 private:
  LossScalerConfig cfg_;
  double cur_scale_ = 1;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int cur_hysteresis_ = 1;
  int64_t skipped_steps_ = 0;
  int overflows_at_min_ = 0;
};

}  // namespace anvil
