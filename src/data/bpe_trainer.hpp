// Byte-level BPE training (GPT-2 style) and its Hugging Face tokenizer.json.
//
// Pipeline: text files -> special tokens cut out -> GPT-2 pre-tokenizer regex (PCRE2, UTF + UCP) ->
// word frequencies (multi-threaded, streaming) -> BPE merges (incremental pair counts) -> tokenizer.json
// that the `tokenizers` package and Anvil's BPE encoder load. See docs/train_tokenizer.md.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace anvil::data {

struct BpeTrainOptions {
  uint64_t vocab_size = 0;                  // 256 byte tokens + merges + special tokens
  std::vector<std::string> special_tokens;  // ids right after the BPE tokens, in this order
  uint64_t min_frequency = 2;               // pairs seen fewer times are never merged
  int threads = 0;                          // threads for counting and merging; 0 = all cores
  size_t chunk_bytes = size_t{4} << 20;     // text per thread per counting round
  bool progress = true;                     // progress lines on stderr
  uint64_t progress_every_merges = 1000;
  size_t parallel_merge_min_words = 8192;  // a merge touching this many words is split across threads
};

// Throws anvil::Error for a vocab_size below 256 + special tokens (or above 2^32 - 1) and for bad
// special tokens (empty, duplicated, not UTF-8, or equal to a byte token such as "!").
void validate_bpe_options(const BpeTrainOptions& options);

struct StringHash {
  using is_transparent = void;  // find(string_view) without building a std::string
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
// Pre-token (raw bytes, before the byte-to-unicode mapping) -> number of occurrences.
using WordCounts = std::unordered_map<std::string, uint64_t, StringHash, std::equal_to<>>;

// GPT-2's ByteLevel pre-tokenizer split (add_prefix_space = false) on raw bytes. Ill-formed UTF-8 is
// first replaced by U+FFFD (one per maximal subpart), as prepare-data and the BPE encoder do; the
// words then are of the repaired text. Thread-safe.
class GptPreTokenizer {
 public:
  GptPreTokenizer();
  ~GptPreTokenizer();
  GptPreTokenizer(const GptPreTokenizer&) = delete;
  GptPreTokenizer& operator=(const GptPreTokenizer&) = delete;

  void split(std::string_view text, const std::function<void(std::string_view)>& emit) const;
  std::vector<std::string> split(std::string_view text) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Counts the words of one in-memory text in one thread: the reference the streaming counter matches.
// Occurrences of `special_tokens` (leftmost-longest) are cut out and not counted.
WordCounts count_words_in_text(std::string_view text, const std::vector<std::string>& special_tokens);

struct CountStats {
  uint64_t files = 0, bytes = 0, words = 0;
  double seconds = 0;
};
// Streams the inputs (files, or directories: their regular files recursively, in path order), cut into
// pieces of about chunk_bytes at points where cutting changes no pre-token; rounds of threads x
// chunk_bytes are counted in parallel and added into the total (memory: one round + distinct words).
// A file boundary ends a word; a leading UTF-8 byte order mark is skipped. The result does not depend
// on threads or chunk_bytes. Throws naming a missing/unreadable input or an empty corpus.
WordCounts count_words(const std::vector<std::string>& inputs, const BpeTrainOptions& options,
                       CountStats* stats = nullptr);

struct BpeModel {
  std::vector<std::string> tokens;  // id -> raw bytes; ids 0..255 single bytes (GPT-2 order)
  std::vector<std::pair<uint32_t, uint32_t>> merges;  // by rank, as token ids
  std::vector<uint32_t> merge_results;                // id each merge produces
  std::vector<std::string> special_tokens;            // id tokens.size() + i
  bool stopped_early = false;                         // no pair reached min_frequency before vocab_size

  uint64_t vocab_size() const { return tokens.size() + special_tokens.size(); }
};

// Learns merges until vocab_size or until no pair occurs min_frequency times. Each step merges the most
// frequent adjacent pair; ties go to the pair whose (left, right) bytes are lexicographically smallest.
// Pair counts are updated incrementally (only the words holding the merged pair are touched); the result
// does not depend on threads or on the order of `words`.
BpeModel train_bpe(const WordCounts& words, const BpeTrainOptions& options);

// GPT-2's byte-to-unicode mapping of raw bytes (what tokenizer.json vocab/merges hold).
std::string byte_level_string(std::string_view bytes);

// The tokenizer.json text, formatted as `tokenizers` 0.23 saves it (so a load + save round-trips it).
std::string tokenizer_json(const BpeModel& model);

struct TrainTokenizerStats {
  CountStats count;
  uint64_t distinct_words = 0, vocab_size = 0, merges = 0;
  double train_seconds = 0;
  bool stopped_early = false;
};
// Count + train + write `output` atomically (temporary file, fsync, rename). Validates everything
// (options, inputs, output path) before the long work.
TrainTokenizerStats train_tokenizer(const std::vector<std::string>& inputs, const std::string& output,
                                    const BpeTrainOptions& options);

}  // namespace anvil::data
