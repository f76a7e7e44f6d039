// Byte-level tokenisation and corpus preparation. Every byte of the UTF-8 text is one token (vocab
// 256): no tokenizer to train or ship, and any input round-trips exactly.
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

// Reads the inputs (each a file, or a directory: all regular files under it, recursively, in sorted
// path order), concatenates their bytes and writes the first (1 - val_fraction) of the stream to
// <out_dir>/train.bin and the rest to <out_dir>/val.bin (an empty shard when val_fraction is 0).
// Streams the data, so inputs larger than memory are fine; prints progress to stderr for large inputs.
// Throws anvil::Error on a missing input, an empty corpus, val_fraction outside [0, 0.5], or (when
// val_fraction > 0) a split leaving either side with fewer than 2 tokens. Either both shards are
// written or neither.
PrepareStats prepare_byte_corpus(const std::vector<std::string>& inputs, const std::string& out_dir,
                                 double val_fraction);

std::vector<uint32_t> byte_encode(std::string_view text);
// Ids must be in [0, 256); throws naming the first bad id and its position.
std::string byte_decode(std::span<const int32_t> ids);

}  // namespace anvil::data
