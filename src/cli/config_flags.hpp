// `--config FILE` plus one flag per TrainConfig key (named like Hugging Face TrainingArguments); flags
// override the file. Shared by `train` and `estimate`.
#pragma once
#include <map>
#include <string>

#include "anvil/train_config.hpp"
#include "cli/command.hpp"

namespace anvil::cli {

struct ConfigFlags {
  std::string config_path;
  std::map<std::string, std::string> values;

  void add_to(CLI::App* cmd);
  TrainConfig resolve();
};

}  // namespace anvil::cli
