// `anvil prepare-data`: corpora (text files and directories, JSON Lines, CSV) -> tokenised shards.
// docs/data.md describes the behaviour (document and split rules, EOS, bad input, the summary).
//
// Language-model data (text, JSONL) -> <output>/train.bin and val.bin (token shards), each document as the
// model's tokenizer encodes it with its special tokens (encode_with_special; EOS after it when the template
// adds nothing there); CSV with a text and a label column -> <output>/train.cls and val.cls
// (classification shards). Both also write <output>/prepare_summary.json. The inputs are streamed: a
// reader thread cuts them into batches of records (~1 MiB), N worker threads tokenise whole batches, and
// the calling thread writes the batches in input order, so memory stays bounded and the output is
// identical for any thread count.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "data/text_sources.hpp"
#include "data/tokenizer.hpp"

namespace anvil::data {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string output_dir;
  std::string tokenizer = "bytes";  // "bytes", a tokenizer file or a model directory (see load_tokenizer)
  InputFormat format = InputFormat::Auto;
  std::string text_field = "text";   // JSONL
  std::string text_column = "text";  // CSV
  std::string label_column = "label";
  std::vector<std::string> labels;  // CSV: the label set, in id order; empty = collect (sorted)
  double val_fraction = 0.1;        // in [0, 0.5]
  uint64_t seed = 1234;
  unsigned threads = 0;       // tokenising workers; 0 = the hardware concurrency
  bool strict = false;        // a bad record is an error instead of being skipped
  uint32_t max_length = 512;  // CSV: tokens per example, [CLS]/[SEP] included
  bool progress = false;      // progress bar on stderr
};

struct SplitReport {
  std::string path;
  uint64_t documents = 0;  // documents (LM) or examples (classification) written
  uint64_t tokens = 0;
  std::map<std::string, uint64_t> label_counts;  // classification
};

struct PrepareReport {
  std::string task;  // "lm" or "classification"
  SplitReport train, val;
  std::string summary_path;
  uint64_t files = 0, empty_files = 0;
  uint64_t bytes = 0;                           // input bytes read
  uint64_t documents = 0, empty_documents = 0;  // LM: documents (pieces cut at the split counted once)
  // LM: the ids written before and after each document's tokens (the tokenizer's special-token template,
  // e.g. <s> first for Llama 2; after the document its suffix, else EOS).
  std::vector<uint32_t> document_prefix, document_suffix;
  uint64_t skipped = 0;
  std::map<std::string, uint64_t> skipped_by_reason;
  std::vector<std::string> skipped_examples;  // the first few, as "file:line: problem"
  uint64_t utf8_replacements = 0;
  uint64_t truncated = 0;           // classification examples cut to max_length
  std::vector<std::string> labels;  // classification, in id order
  unsigned threads = 0;
  double seconds = 0;
};

// How a text becomes a classification example, in prepare-data and in `anvil predict` alike: the
// tokenizer's ids cut to max_length tokens in all, and when the tokenizer has [CLS] and [SEP] (BERT-style
// WordPiece) wrapped as [CLS] ids [SEP] (the text then cut to max_length - 2).
class ClassificationEncoder {
 public:
  // Throws anvil::Error when max_length cannot hold one token (and [CLS] / [SEP]); `what` prefixes it.
  ClassificationEncoder(const Tokenizer& tokenizer, uint32_t max_length, const std::string& what = "prepare");
  // The example's ids; *truncated (if given) says whether the text was cut.
  std::vector<uint32_t> encode(std::string_view text, bool* truncated = nullptr) const;
  bool wraps() const { return cls_.has_value() && sep_.has_value(); }
  std::optional<uint32_t> cls_id() const { return cls_; }
  std::optional<uint32_t> sep_id() const { return sep_; }

 private:
  const Tokenizer& tokenizer_;
  std::optional<uint32_t> cls_, sep_;
  size_t content_max_ = 0;
};

// Runs the preparation; throws anvil::Error (naming the file, line, field or value) on bad options
// or input, and then leaves nothing behind: outputs are written under temporary names and renamed at
// the end, and an output directory created by the run is removed again.
PrepareReport prepare_data(const PrepareOptions& options);
// The same with a tokenizer object (options.tokenizer is only recorded in the summary). The tokenizer
// is shared by the worker threads: its const methods must be thread-safe.
PrepareReport prepare_data(const PrepareOptions& options, const Tokenizer& tokenizer);

// The deterministic train/validation assignment of document (or example) `index`: true (validation)
// when splitmix64(splitmix64(seed) ^ index) / 2^64 < val_fraction.
bool assign_to_validation(uint64_t seed, uint64_t index, double val_fraction);

}  // namespace anvil::data
