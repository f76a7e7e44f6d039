#include "precision/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

#include "anvil/error.hpp"

namespace anvil {

using json = nlohmann::json;

namespace {
constexpr double kScaleFactor = 2.0;  // DeepSpeed's scale_factor
}  // namespace

void LossScalerConfig::validate(const std::string& s) const {
  ANVIL_REQUIRE(std::isfinite(loss_scale) && loss_scale >= 0,
                "{}: loss_scale must be >= 0 (0: dynamic loss scaling), got {}", s, loss_scale);
  ANVIL_REQUIRE(
      initial_scale_power >= 0 && initial_scale_power <= 63,
      "{}: initial_scale_power must be between 0 and 63 (the scale starts at 2^initial_scale_power), "
      "got {}",
      s, initial_scale_power);
  ANVIL_REQUIRE(loss_scale_window >= 1, "{}: loss_scale_window must be >= 1, got {}", s, loss_scale_window);
  ANVIL_REQUIRE(hysteresis >= 1, "{}: hysteresis must be >= 1, got {}", s, hysteresis);
  ANVIL_REQUIRE(std::isfinite(min_loss_scale) && min_loss_scale > 0, "{}: min_loss_scale must be > 0, got {}",
                s, min_loss_scale);
  ANVIL_REQUIRE(!dynamic() || min_loss_scale <= std::ldexp(1.0, initial_scale_power),
                "{}: min_loss_scale ({}) must not exceed the initial loss scale 2^initial_scale_power = {}",
                s, format_loss_scale(min_loss_scale),
                format_loss_scale(std::ldexp(1.0, initial_scale_power)));
  ANVIL_REQUIRE(max_overflows_at_min_scale >= 1, "{}: max_overflows_at_min_scale must be >= 1, got {}", s,
                max_overflows_at_min_scale);
}

std::string format_loss_scale(double scale) {
  if (std::isfinite(scale) && scale == std::floor(scale) && std::fabs(scale) < 1e15)
    return fmt::format("{}", int64_t(scale));
  return fmt::format("{}", scale);
}

LossScaler::LossScaler(const LossScalerConfig& config) : cfg_(config) {
  cfg_.validate("loss scaler config");
  cur_scale_ = cfg_.dynamic() ? std::ldexp(1.0, cfg_.initial_scale_power) : cfg_.loss_scale;
  cur_hysteresis_ = cfg_.hysteresis;
}

LossScaler::Update LossScaler::update(bool overflow, int64_t step) {
  Update u;
  u.old_scale = cur_scale_;
  if (overflow) {
    u.skip = true;
    ++skipped_steps_;
    const bool at_min = cfg_.dynamic() ? cur_scale_ <= cfg_.min_loss_scale : true;
    overflows_at_min_ = at_min ? overflows_at_min_ + 1 : 0;
    if (cfg_.dynamic()) {
      if (cfg_.hysteresis == 1 || cur_hysteresis_ == 1)
        cur_scale_ = std::max(cur_scale_ / kScaleFactor, cfg_.min_loss_scale);
      else
        --cur_hysteresis_;
      last_overflow_iter_ = cur_iter_;
    }
    ++cur_iter_;
    u.new_scale = cur_scale_;
    u.message = fmt::format("OVERFLOW: skipping step {}, loss scale {} -> {}", step,
                            format_loss_scale(u.old_scale), format_loss_scale(u.new_scale));
    if (overflows_at_min_ >= cfg_.max_overflows_at_min_scale) {
      if (cfg_.dynamic())
        ANVIL_THROW(
            "fp16 training is stuck skipping steps at the minimum loss scale: {} consecutive steps "
            "overflowed at "
            "loss scale {} (min_loss_scale), the last one step {}; {} steps skipped in all "
            "(max_overflows_at_min_scale = {}). The gradients overflow fp16 even at the smallest scale: "
            "train in "
            "bf16 instead (--bf16: fp32's range, no loss scaling), lower the learning rate, or check the "
            "data "
            "for bad batches",
            overflows_at_min_, format_loss_scale(cur_scale_), step, skipped_steps_,
            cfg_.max_overflows_at_min_scale);
      ANVIL_THROW(
          "fp16 training is stuck skipping steps at the static loss scale: {} consecutive steps overflowed "
          "at "
          "loss scale {} (loss_scale), the last one step {}; {} steps skipped in all "
          "(max_overflows_at_min_scale = {}). Use a smaller loss_scale or dynamic scaling (loss_scale 0), "
          "train "
          "in bf16 instead (--bf16: fp32's range, no loss scaling), lower the learning rate, or check the "
          "data "
          "for bad batches",
          overflows_at_min_, format_loss_scale(cur_scale_), step, skipped_steps_,
          cfg_.max_overflows_at_min_scale);
    }
    return u;
  }
  overflows_at_min_ = 0;
  if (cfg_.dynamic()) {
    if (cfg_.consecutive_hysteresis) cur_hysteresis_ = cfg_.hysteresis;
    const int64_t stable = cur_iter_ - last_overflow_iter_ - 1;
    if (stable > 0 && stable % cfg_.loss_scale_window == 0) {
      if (!cfg_.consecutive_hysteresis) cur_hysteresis_ = cfg_.hysteresis;
      cur_scale_ *= kScaleFactor;
    }
  }
  ++cur_iter_;
  u.new_scale = cur_scale_;
  return u;
}

json LossScaler::state() const {
  return {{"dynamic", cfg_.dynamic()},
          {"cur_scale", cur_scale_},
          {"cur_iter", cur_iter_},
          {"last_overflow_iter", last_overflow_iter_},
          {"cur_hysteresis", cur_hysteresis_},
          {"skipped_steps", skipped_steps_},
          {"overflows_at_min_scale", overflows_at_min_}};
}

void LossScaler::load_state(const json& st, const std::string& source) {
  ANVIL_REQUIRE(st.is_object(), "{}: the loss scaler state must be a JSON object, got {}", source, st.dump());
  auto field = [&](const char* key) -> const json& {
    ANVIL_REQUIRE(st.contains(key), "{}: the loss scaler state has no '{}'", source, key);
    return st.at(key);
  };
  auto integer = [&](const char* key, int64_t lo) {
    const json& v = field(key);
    ANVIL_REQUIRE(v.is_number_integer() && v.get<int64_t>() >= lo,
                  "{}: loss scaler state '{}' must be an integer >= {}, got {}", source, key, lo, v.dump());
    return v.get<int64_t>();
  };
  const json& scale = field("cur_scale");
  ANVIL_REQUIRE(scale.is_number() && std::isfinite(scale.get<double>()) && scale.get<double>() > 0,
                "{}: loss scaler state 'cur_scale' must be a number > 0, got {}", source, scale.dump());
  const int64_t iter = integer("cur_iter", 0);
  const int64_t last = integer("last_overflow_iter", -1);
  ANVIL_REQUIRE(last < iter, "{}: loss scaler state 'last_overflow_iter' ({}) must be before 'cur_iter' ({})",
                source, last, iter);
  const int64_t hyst = integer("cur_hysteresis", 1);
  const int64_t skipped = integer("skipped_steps", 0);
  const int64_t at_min = integer("overflows_at_min_scale", 0);
  ANVIL_REQUIRE(hyst <= 1 << 30 && at_min <= 1 << 30, "{}: loss scaler state counters out of range: {}",
                source, st.dump());
  if (cfg_.dynamic()) cur_scale_ = scale.get<double>();
  cur_iter_ = iter;
  last_overflow_iter_ = last;
  cur_hysteresis_ = int(hyst);
  skipped_steps_ = skipped;
  overflows_at_min_ = int(at_min);
}

}  // namespace anvil
