// `--config FILE` plus one flag per TrainConfig key (named like Hugging Face TrainingArguments); flags
// override the file. Boolean keys also work as bare flags (`--fp16` is `--fp16 true`). A `deepspeed`
// config (file or flag) is applied by TrainConfig::from_json. Shared by `train` and `estimate`.
#pragma once
#include <map>
#include <string>

#include "anvil/train_config.hpp"
#include "cli/command.hpp"

namespace anvil::cli {

struct ConfigFlags {
  std::string config_path;
  std::map<std::string, std::string> values;
  std::map<std::string, CLI::Option*> bare_flags;  // boolean keys: given without a value means true

  void add_to(CLI::App* cmd);
  TrainConfig resolve();
};

}  // namespace anvil::cli
