#include "train/run_model.hpp"

#include "io/checkpoint.hpp"

namespace anvil {

RunModel resolve_run_model(const TrainConfig& cfg) {
  RunModel r;
  r.config = cfg.model;
  if (!cfg.resume_from_checkpoint.empty()) {
    io::read_trainer_state(cfg.resume_from_checkpoint);  // fails first, and clearly, if it is no checkpoint
    r.weights_from = cfg.resume_from_checkpoint;
  } else if (!cfg.init_from.empty()) {
    r.weights_from = cfg.init_from;
  }
  if (!r.weights_from.empty()) r.config = io::read_model_config(r.weights_from);

  // The tokenizer: given, or the one the starting checkpoint carries, or bytes.
  r.tokenizer_file = cfg.tokenizer == "bytes" ? "" : cfg.tokenizer;
  if (cfg.tokenizer.empty() && !r.weights_from.empty())
    r.tokenizer_file = io::find_tokenizer_file(r.weights_from);
  r.tokenizer = data::load_tokenizer(r.tokenizer_file.empty() ? "bytes" : r.tokenizer_file);
  const int tok_vocab = int(r.tokenizer->vocab_size());
  if (!cfg.tokenizer.empty() && r.weights_from.empty() && cfg.vocab_from_tokenizer) {
    r.config.vocab_size = tok_vocab;
    r.config.eos_token_id = r.tokenizer->eos_id() ? int(*r.tokenizer->eos_id()) : -1;
  }
  ANVIL_REQUIRE(tok_vocab <= r.config.vocab_size,
                "tokenizer '{}' has {} tokens but the model's vocab_size is {}",
                r.tokenizer_file.empty() ? "bytes" : r.tokenizer_file, tok_vocab, r.config.vocab_size);
  ANVIL_REQUIRE(cfg.seq_len() <= r.config.block_size, "max_seq_length {} exceeds the model's block_size {}",
                cfg.seq_len(), r.config.block_size);
  return r;
}

}  // namespace anvil
