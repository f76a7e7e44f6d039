// `--config FILE` plus one flag per TrainConfig key and alias (named like Hugging Face TrainingArguments,
// described from the key table of src/train/config_keys.hpp, grouped by its sections); flags override the
// file. Boolean keys also work as bare flags (`--fp16` is `--fp16 true`). A `deepspeed` config (file or flag)
// is applied by TrainConfig::from_json. Shared by `train` and `estimate`.
#pragma once
#include <map>
#include <string>

#include "anvil/train_config.hpp"
#include "cli/command.hpp"

namespace anvil::cli {

struct ConfigFlags {
  std::string config_path;
  std::map<std::string, std::string> values;    // flag name (a key or an alias) -> the value given
  std::map<std::string, CLI::Option*> options;  // flag name -> its option

  void add_to(CLI::App* cmd);
  // The config file with the flags applied. Errors blame the flag for a bad flag value and the file for a
  // bad value in it.
  TrainConfig resolve();
};

}  // namespace anvil::cli
