// What model a training config describes, resolved once for both `train` and `estimate`: the shape
// (from the config, or from the checkpoint being resumed or started from), where its weights come from,
// and its tokenizer (which also sets the vocabulary of a fresh model when the config names one).
#pragma once
#include <memory>
#include <string>

#include "anvil/train_config.hpp"
#include "data/tokenizer.hpp"

namespace anvil {

struct RunModel {
  TransformerConfig config;
  std::string weights_from;    // checkpoint or HF directory, or "" for a fresh initialisation
  std::string tokenizer_file;  // tokenizer.json / vocab.txt, or "" for bytes
  std::unique_ptr<data::Tokenizer> tokenizer;
};

RunModel resolve_run_model(const TrainConfig& cfg);

}  // namespace anvil
