// Classification shards: tokenised (text, label) examples for sequence classification, and the
// assembly of padded batches from them. docs/formats.md ("Classification shard") is the reference.
//
// Layout (little-endian; every section starts at a multiple of 8 bytes, so the mapped arrays are
// aligned):
//   offset  0  char[8]  magic "ANVILCLS"
//   offset  8  uint32   format version (= 1)
//   offset 12  uint32   token dtype code: 1 = uint16, 2 = uint32 (uint16 whenever vocab_size <= 65536)
//   offset 16  uint64   number of examples N
//   offset 24  uint64   vocabulary size (every token id is < this)
//   offset 32  uint32   max_length (no example is longer)
//   offset 36  uint32   number of labels K
//   offset 40  uint64   byte length J of the label-names JSON
//   offset 48  uint64   total number of tokens T
//   offset 56  zero bytes up to offset 64
//   offset 64  label names: a UTF-8 JSON array of K distinct strings (J bytes; label i is names[i]),
//              zero-padded to a multiple of 8
//   then       offsets: uint64[N + 1]; example i is tokens [offsets[i], offsets[i+1]); offsets[0] = 0,
//              offsets[N] = T
//   then       tokens: T ids in the dtype, zero-padded to a multiple of 8 bytes
//   then       labels: int32[N], each in [0, K)
//   the file ends there (zero-padded to a multiple of 8 bytes).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/token_shard.hpp"
#include "io/mapped_file.hpp"

namespace anvil::data {

inline constexpr size_t kClassificationHeaderBytes = 64;
inline constexpr uint32_t kClassificationShardVersion = 1;

// Streaming writer. Token ids stream to a scratch token shard next to the output (<path>.tokens.tmp,
// written by TokenShardWriter); per-example offsets and labels (12 bytes each) stay in memory. commit()
// writes <path>.tmp, fsyncs and renames it over <path>; an uncommitted writer leaves no file behind.
class ClassificationShardWriter {
 public:
  ClassificationShardWriter(std::string path, uint64_t vocab_size, uint32_t max_length);
  ~ClassificationShardWriter();
  ClassificationShardWriter(const ClassificationShardWriter&) = delete;
  ClassificationShardWriter& operator=(const ClassificationShardWriter&) = delete;

  // One example: ids.size() <= max_length, every id < vocab_size, label >= 0.
  void append(std::span<const uint32_t> ids, int32_t label);
  // Renumbers the labels written so far: label l becomes mapping[l] (for a label set that is only
  // known, and sorted, once all examples have been seen).
  void remap_labels(std::span<const int32_t> mapping);
  // Every label must be < label_names.size(); names must be distinct.
  void commit(const std::vector<std::string>& label_names);

  uint64_t size() const { return labels_.size(); }  // examples
  uint64_t num_tokens() const { return offsets_.back(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_, tokens_path_;
  uint64_t vocab_size_;
  uint32_t max_length_;
  std::unique_ptr<TokenShardWriter> tokens_;
  std::vector<uint64_t> offsets_{0};
  std::vector<int32_t> labels_;
  bool committed_ = false;
};

// Whether `path` is a file that starts with the classification shard's magic ("ANVILCLS"): how the trainer
// tells classification data from token shards (whatever the file is named). No other validation.
bool is_classification_shard(const std::string& path);

// Writes a whole shard (tests and small data sets).
void write_classification_shard(const std::string& path, uint64_t vocab_size, uint32_t max_length,
                                const std::vector<std::string>& label_names,
                                const std::vector<std::vector<uint32_t>>& examples,
                                const std::vector<int32_t>& labels);

// A read-only, memory-mapped view, fully validated on open (magic, version, dtype, section sizes
// against the file size, label names, offsets monotonic and within max_length, ids < vocab_size,
// labels < num_labels); each failure is an anvil::Error naming the file.
class ClassificationShard {
 public:
  explicit ClassificationShard(const std::string& path);
  ~ClassificationShard();
  ClassificationShard(const ClassificationShard&) = delete;
  ClassificationShard& operator=(const ClassificationShard&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return num_examples_; }
  uint64_t vocab_size() const { return vocab_size_; }
  uint32_t max_length() const { return max_length_; }
  uint64_t num_tokens() const { return num_tokens_; }
  TokenDType dtype() const { return dtype_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  uint32_t num_labels() const { return static_cast<uint32_t>(label_names_.size()); }

  uint32_t length(uint64_t i) const;  // tokens in example i (bounds-checked)
  int32_t label(uint64_t i) const;    // bounds-checked
  std::vector<uint32_t> tokens(uint64_t i) const;
  // Copies example i's ids to out[0, length(i)) as int32.
  void read(uint64_t i, int32_t* out) const;

 private:
  std::string path_;
  io::MappedFile map_;  // the whole file
  const uint64_t* offsets_ = nullptr;
  const unsigned char* tokens_ = nullptr;
  const int32_t* labels_ = nullptr;
  uint64_t num_examples_ = 0, vocab_size_ = 0, num_tokens_ = 0;
  uint32_t max_length_ = 0;
  TokenDType dtype_ = TokenDType::U16;
  std::vector<std::string> label_names_;
};

// ---------------------------------------------------------------------------------------------------
// Batches. A batch of B examples is [B, L] with L = the longest example (at least 1) rounded up to a
// multiple of pad_multiple (8 by default: Tensor Core friendly shapes; 64 for the largest GEMM tiles),
// capped at the shard's max_length (which no example exceeds). Rows hold the example's ids then
// pad_id; the attention mask is 1 over the ids and 0 over the padding.

struct ClassificationBatch {
  uint32_t batch_size = 0, length = 0;
  std::vector<int32_t> ids;             // [batch_size, length]
  std::vector<int32_t> attention_mask;  // [batch_size, length]
  std::vector<int32_t> labels;          // [batch_size]
};

uint32_t classification_batch_length(const ClassificationShard& shard, std::span<const uint64_t> indices,
                                     uint32_t pad_multiple = 8);
// Fills caller-provided buffers ([B, length], [B, length], [B]); length must be at least the longest
// example. Indices are bounds-checked, pad_id must be a valid id.
void fill_classification_batch(const ClassificationShard& shard, std::span<const uint64_t> indices,
                               uint32_t length, int32_t pad_id, int32_t* ids, int32_t* attention_mask,
                               int32_t* labels);
ClassificationBatch assemble_classification_batch(const ClassificationShard& shard,
                                                  std::span<const uint64_t> indices, int32_t pad_id,
                                                  uint32_t pad_multiple = 8);

}  // namespace anvil::data
