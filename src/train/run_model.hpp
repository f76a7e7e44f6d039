// What model and data a training config describes, resolved once for both `train` and `estimate`: the
// shape (from the config, or from the checkpoint being resumed or started from), where its weights come
// from, its tokenizer (which also sets the vocabulary of a fresh model when the config names one), and the
// training data with what it fixes (for a BERT classifier: the labels and the sequence length).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "anvil/train_config.hpp"
#include "data/classification_shard.hpp"
#include "data/token_shard.hpp"
#include "data/tokenizer.hpp"
#include "io/checkpoint.hpp"

namespace anvil {

struct RunModel {
  TransformerConfig config;
  std::string weights_from;    // checkpoint or HF directory, or "" for a fresh initialisation
  std::string tokenizer_file;  // tokenizer.json / vocab.txt, or "" for bytes
  std::unique_ptr<data::Tokenizer> tokenizer;
  // Whether the tokenizer was chosen (the config names one, "bytes" included, or the weights directory
  // carries one) rather than the byte tokenizer standing in: the data must then have its vocabulary.
  bool tokenizer_known = false;
  uint64_t tokenizer_vocab_size = 0;  // the tokenizer's (kept here: callers may take `tokenizer` away)
  // The validated trainer_state.json of the checkpoint being resumed.
  std::optional<io::TrainerState> resume_state;
  // BERT: num_labels and the label names follow the classification data (the config, or the config.json of
  // the weights, does not fix them).
  bool labels_from_data = true;
};

// A resume (resume_from_checkpoint) reads the checkpoint's trainer_state.json and config.json, and refuses
// keys set explicitly that contradict them (check_resume_consistency, train/resume_check.hpp).
RunModel resolve_run_model(const TrainConfig& cfg);

// The training data of a run. Token shards (language modelling) go with GPT-2, classification shards
// (labelled examples, `anvil prepare-data` from CSV) with a BERT classifier; the kind is read from the
// files' magic bytes.
struct RunData {
  bool classification = false;
  std::shared_ptr<data::TokenShard> train_tokens, val_tokens;               // GPT-2
  std::shared_ptr<data::ClassificationShard> train_examples, val_examples;  // BERT
  uint32_t longest_example = 0;  // classification: the longest example of train and val
  std::string seq_len_note;      // classification: how the sequence length was chosen (for the header)
};

// Opens cfg.train_data (required) and cfg.val_data (optional) and checks them against the model: the data
// kind against the family (a token shard for a BERT model, or a classification shard for GPT-2, is an error
// saying what to do instead), the vocabulary (ids below the model's vocab_size; and, when the tokenizer is
// known, the vocabulary size the shard was prepared with equal to the tokenizer's), and for classification
// the labels: num_labels and the label
// names come from the shard when `model.labels_from_data`, else they must agree with it (the count always;
// the names when the config gives them); train and val must have the same labels. For classification with
// max_seq_length 0 it also fixes cfg.max_seq_length: the longest example of train and val rounded up to a
// multiple of 8 (the batch padding multiple), at most the model's block_size, so the engine is planned for
// the longest batch the data can make rather than for block_size. Throws anvil::Error naming the file.
RunData open_run_data(TrainConfig& cfg, RunModel& model);

}  // namespace anvil
