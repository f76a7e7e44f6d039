// trainer_state.json of an Anvil checkpoint: the typed, validated state a resume starts from. Its own file
// (JSON and errors only) so that the libFuzzer target tests/fuzz/fuzz_trainer_state.cpp builds it alone.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace anvil::io {

// trainer_state.json, validated: every field the trainer reads has its type and range checked here, so a
// resume never starts from a corrupt or hand-edited state (a negative step, a fractional position...).
struct TrainerState {
  int64_t global_step = 0;                      // >= 0: the optimizer steps done
  int64_t total_steps = -1;                     // the run's planned steps (-1: not recorded)
  uint64_t loader_epoch = 0, loader_batch = 0;  // the first batch not yet consumed
  uint64_t rng_state = 0;
  double train_loss_sum = 0;     // the running train-loss total (finite)
  int64_t train_loss_steps = 0;  // >= 0: the steps summed into train_loss_sum
  nlohmann::json loss_scaler;  // fp16: the scaler's state object (LossScaler::load_state checks it); or null
  nlohmann::json config;       // the training config of the run that saved it (an object), or null
  int64_t world_size = 1;      // >= 1: the processes of the run that saved it (data parallel)
};

// Parses and validates the text of a trainer_state.json; `path` names it in errors. Any input (arbitrary
// bytes included) either yields a state or throws anvil::Error naming the path and the field: it is a
// fuzz target's entry point.
TrainerState parse_trainer_state(std::string_view text, const std::string& path);
// <dir>/trainer_state.json through parse_trainer_state; a missing file is an error saying that `dir` is
// no Anvil checkpoint.
TrainerState read_trainer_state(const std::string& dir);

}  // namespace anvil::io
