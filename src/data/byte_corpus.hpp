// Byte-level tokenisation helpers and the byte-corpus preparation entry point (kept for existing
// callers; data/prepare.hpp is the general one). Every byte of the UTF-8 text is one token (vocab 256).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::data {

inline constexpr uint64_t kByteVocabSize = 256;

struct PrepareStats {
  uint64_t bytes_read = 0;
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
  std::string train_path, val_path;
};

// Byte-level preparation of text files/directories into <out_dir>/train.bin and val.bin (plus
// prepare_summary.json): prepare_data() with the byte tokenizer and every input read as text (whatever
// its extension). Files are concatenated in order (directories recursively, sorted); the last
// val_fraction of the bytes is validation (an empty shard when val_fraction is 0). Invalid UTF-8 is
// replaced by U+FFFD. Throws anvil::Error on a missing input, an empty corpus, val_fraction outside
// [0, 0.5], or (when val_fraction > 0) a split leaving either side with fewer than 2 tokens; either
// both shards are written or neither.
PrepareStats prepare_byte_corpus(const std::vector<std::string>& inputs, const std::string& out_dir,
                                 double val_fraction);

std::vector<uint32_t> byte_encode(std::string_view text);
// Ids must be in [0, 256); throws naming the first bad id and its position.
std::string byte_decode(std::span<const int32_t> ids);

}  // namespace anvil::data
