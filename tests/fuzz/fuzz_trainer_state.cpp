// libFuzzer target: io::parse_trainer_state on arbitrary bytes (a checkpoint's trainer_state.json, read
// before a resume), and LossScaler::load_state on the fp16 scaler state it carries. Beyond "no crash, only
// anvil::Error naming the file", an accepted state must satisfy what the trainer relies on.
#include <optional>
#include <string_view>

#include "fuzz_common.hpp"
#include "io/trainer_state.hpp"
#include "precision/loss_scaler.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "checkpoint-7/trainer_state.json";
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::optional<anvil::io::TrainerState> state;
  if (!anvil::fuzz::parses(path, [&] { state.emplace(anvil::io::parse_trainer_state(text, path)); }))
    return 0;
  const anvil::io::TrainerState& s = *state;
  anvil::fuzz::check(s.global_step >= 0, "accepted a negative global_step");
  anvil::fuzz::check(s.train_loss_steps >= 0, "accepted a negative train_loss_steps");
  anvil::fuzz::check(s.total_steps == -1 || s.total_steps >= s.global_step,
                     "accepted total_steps < global_step");
  anvil::fuzz::check(s.config.is_null() || s.config.is_object(), "accepted a config that is no object");
  if (s.loss_scaler.is_object()) {
    const std::string where = path + ": loss_scaler";
    anvil::LossScaler scaler(anvil::LossScalerConfig{});
    anvil::fuzz::parses(where, [&] { scaler.load_state(s.loss_scaler, where); });
  }
  return 0;
}
