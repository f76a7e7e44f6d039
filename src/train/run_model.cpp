#include "train/run_model.hpp"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/classification_loader.hpp"
#include "io/atomic_dir.hpp"
#include "io/checkpoint.hpp"
#include "train/resume_check.hpp"

namespace anvil {
namespace {

// Whether a model directory's config.json fixes the labels (id2label or num_labels given).
bool config_fixes_labels(const std::string& dir) {
  try {
    const nlohmann::json j = nlohmann::json::parse(io::read_text_file(dir + "/config.json"));
    return j.is_object() && (j.contains("id2label") || j.contains("num_labels"));
  } catch (const nlohmann::json::exception&) {
    return true;  // read_model_config has already parsed it; unreachable in practice
  }
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string comma_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ",") + n;
  return out;
}

std::string label_list(const TransformerConfig& m) {
  std::vector<std::string> names;
  for (int i = 0; i < m.num_labels; ++i) names.push_back(m.label_name(i));
  return join(names);
}

const char* kPrepareHint =
    "prepare labelled data with `anvil prepare-data --input data.csv --tokenizer tokenizer.json --output "
    "DIR` "
    "(a CSV with text and label columns; docs/data.md)";

// Shards record the vocabulary size of the tokenizer that prepared them (prepare-data): data prepared by
// another tokenizer than the run's would train on ids that mean other tokens.
void check_tokenizer_vocab(const RunModel& rm, const std::string& path, const char* key,
                           uint64_t shard_vocab) {
  if (!rm.tokenizer_known) return;
  const uint64_t tok_vocab = rm.tokenizer_vocab_size;
  const std::string tok = rm.tokenizer_file.empty() ? "bytes" : rm.tokenizer_file;
  ANVIL_REQUIRE(
      shard_vocab == tok_vocab,
      "{} '{}' was prepared with a vocabulary of {} tokens but the run's tokenizer '{}' has {}: the "
      "ids would mean other tokens; prepare the data with this tokenizer (anvil prepare-data "
      "--tokenizer {}), or train with the tokenizer that prepared it",
      key, path, shard_vocab, tok, tok_vocab, tok);
}

}  // namespace

RunModel resolve_run_model(const TrainConfig& cfg) {
  RunModel r;
  r.config = cfg.model;
  r.labels_from_data = cfg.labels_from_data;
  if (!cfg.resume_from_checkpoint.empty()) {
    // Fails first, and clearly, if it is no checkpoint.
    r.resume_state = io::read_trainer_state(cfg.resume_from_checkpoint);
    r.weights_from = cfg.resume_from_checkpoint;
  } else if (!cfg.init_from.empty()) {
    r.weights_from = cfg.init_from;
  }
  if (!r.weights_from.empty()) {
    r.config = io::read_model_config(r.weights_from);
    r.labels_from_data = r.config.is_bert() && !config_fixes_labels(r.weights_from);
  }
  if (r.resume_state) check_resume_consistency(cfg, cfg.resume_from_checkpoint, r.config, *r.resume_state);

  // The tokenizer: given, or the one the starting checkpoint carries, or bytes.
  r.tokenizer_file = cfg.tokenizer == "bytes" ? "" : cfg.tokenizer;
  if (cfg.tokenizer.empty() && !r.weights_from.empty())
    r.tokenizer_file = io::find_tokenizer_file(r.weights_from);
  r.tokenizer_known = !cfg.tokenizer.empty() || !r.tokenizer_file.empty();
  r.tokenizer = data::load_tokenizer(r.tokenizer_file.empty() ? "bytes" : r.tokenizer_file);
  r.tokenizer_vocab_size = r.tokenizer->vocab_size();
  const int tok_vocab = int(r.tokenizer->vocab_size());
  if (!cfg.tokenizer.empty() && r.weights_from.empty() && cfg.vocab_from_tokenizer) {
    r.config.vocab_size = tok_vocab;
    r.config.eos_token_id = r.tokenizer->eos_id() ? int(*r.tokenizer->eos_id()) : -1;
    // BERT's padding_idx is the tokenizer's [PAD] (0 in BERT vocabularies, not in every WordPiece one).
    if (r.config.is_bert()) {
      const std::optional<uint32_t> pad = r.tokenizer->token_to_id("[PAD]");
      r.config.pad_token_id = pad ? int(*pad) : 0;
    }
  }
  // The byte tokenizer stands in when none is given; a classifier never encodes text in training (its data
  // is already tokenised, checked against the model by open_run_data), so only a chosen one must fit.
  const bool implicit_bytes = r.tokenizer_file.empty() && cfg.tokenizer.empty();
  ANVIL_REQUIRE(tok_vocab <= r.config.vocab_size || (implicit_bytes && r.config.is_bert()),
                "tokenizer '{}' has {} tokens but the model's vocab_size is {}",
                r.tokenizer_file.empty() ? "bytes" : r.tokenizer_file, tok_vocab, r.config.vocab_size);
  ANVIL_REQUIRE(cfg.max_seq_length <= r.config.block_size,
                "max_seq_length {} exceeds the model's block_size {}", cfg.max_seq_length,
                r.config.block_size);
  return r;
}

RunData open_run_data(TrainConfig& cfg, RunModel& rm) {
  TransformerConfig& m = rm.config;
  ANVIL_REQUIRE(!cfg.train_data.empty(),
                "train_data is not set: give the {} to train on (see `anvil prepare-data`)",
                m.is_bert() ? "classification shard (train.cls)" : "token shard");
  RunData d;
  d.classification = data::is_classification_shard(cfg.train_data);
  const auto check_kind = [&](const std::string& path, const char* key) {
    // A file that cannot be read is no shard of either kind: say that, not that it is of the wrong kind.
    ANVIL_REQUIRE(std::ifstream(path).good(), "{} '{}': cannot open (no such file, or not readable)", key,
                  path);
    const bool cls = data::is_classification_shard(path);
    if (cls && !m.is_bert())
      ANVIL_THROW(
          "{} '{}' is a classification shard (labelled examples), but the model is a GPT-2 language model: "
          "classification trains a BERT model (e.g. --model bert-base, or --model_name_or_path a BERT "
          "directory)",
          key, path);
    if (!cls && m.is_bert())
      ANVIL_THROW(
          "{} '{}' is not a classification shard (a token shard holds language-modelling data), but "
          "the model is a BERT sequence classifier: {}",
          key, path, kPrepareHint);
  };
  check_kind(cfg.train_data, "train_data");
  if (!cfg.val_data.empty()) check_kind(cfg.val_data, "val_data");

  if (!d.classification) {
    const auto open = [&](const std::string& path, const char* key) {
      auto shard = std::make_shared<data::TokenShard>(path);
      check_tokenizer_vocab(rm, path, key, shard->vocab_size());
      ANVIL_REQUIRE(shard->vocab_size() <= uint64_t(m.vocab_size),
                    "{} '{}': its vocabulary has {} tokens but the model's vocab_size is {}", key, path,
                    shard->vocab_size(), m.vocab_size);
      return shard;
    };
    d.train_tokens = open(cfg.train_data, "train_data");
    if (!cfg.val_data.empty()) d.val_tokens = open(cfg.val_data, "val_data");
    return d;
  }

  ANVIL_REQUIRE(!m.is_regression(),
                "train_data '{}' holds class labels, but the model is a regression model (num_labels 1{}); "
                "classification needs num_labels >= 2",
                cfg.train_data, m.problem_type.empty() ? "" : ", problem_type " + m.problem_type);
  const auto open = [&](const std::string& path, const char* key) {
    auto shard = std::make_shared<data::ClassificationShard>(path);
    check_tokenizer_vocab(rm, path, key, shard->vocab_size());
    ANVIL_REQUIRE(shard->vocab_size() <= uint64_t(m.vocab_size),
                  "{} '{}': its vocabulary has {} tokens but the model's vocab_size is {}", key, path,
                  shard->vocab_size(), m.vocab_size);
    return shard;
  };
  d.train_examples = open(cfg.train_data, "train_data");
  if (!cfg.val_data.empty()) d.val_examples = open(cfg.val_data, "val_data");

  const std::vector<std::string>& names = d.train_examples->label_names();
  const int K = int(names.size());
  ANVIL_REQUIRE(K >= 2, "train_data '{}' has {} label ({}); classification needs at least 2", cfg.train_data,
                K, join(names));
  if (d.val_examples)
    ANVIL_REQUIRE(
        d.val_examples->label_names() == names,
        "val_data '{}' has the labels ({}) but train_data '{}' has ({}); prepare both from the same "
        "label set (prepare-data --labels)",
        cfg.val_data, join(d.val_examples->label_names()), cfg.train_data, join(names));
  if (rm.labels_from_data) {
    m.num_labels = K;
    m.label_names = names;
  } else {
    ANVIL_REQUIRE(
        m.num_labels == K,
        "label count mismatch: train_data '{}' has {} labels ({}) but the model's num_labels is {} "
        "({}); drop num_labels from the model config to take the data's labels, or prepare the data "
        "with the model's labels (prepare-data --labels)",
        cfg.train_data, K, join(names), m.num_labels, label_list(m));
    if (m.label_names.empty()) {
      m.label_names = names;
    } else {
      ANVIL_REQUIRE(
          m.label_names == names,
          "label mismatch: train_data '{}' has the labels ({}) but the model's are ({}), in id order; "
          "prepare the data with --labels {}",
          cfg.train_data, join(names), label_list(m), comma_list(m.label_names));
    }
  }
  m.validate("model");

  d.longest_example = data::ClassificationLoader::longest_example(*d.train_examples);
  if (d.val_examples)
    d.longest_example =
        std::max(d.longest_example, data::ClassificationLoader::longest_example(*d.val_examples));
  if (cfg.max_seq_length == 0) {
    const int rounded = int((uint64_t(std::max<uint32_t>(d.longest_example, 1)) + 7) / 8 * 8);
    cfg.max_seq_length = std::min(rounded, m.block_size);
    d.seq_len_note = fmt::format("the longest example ({} tokens) rounded up to a multiple of 8{}",
                                 d.longest_example, rounded > m.block_size ? ", capped at block_size" : "");
  } else {
    d.seq_len_note = "max_seq_length";
  }
  return d;
}

}  // namespace anvil
