// Token shards: the on-disk format for tokenised training data.
//
// Layout (little-endian):
//   offset  0  char[8]  magic "ANVILTOK"
//   offset  8  uint32   format version (= 1)
//   offset 12  uint32   token dtype code: 1 = uint16, 2 = uint32
//   offset 16  uint64   number of tokens
//   offset 24  uint64   vocabulary size (every token id is < this)
//   offset 32  zero bytes up to offset 64
//   offset 64  the tokens, densely packed in the header's dtype
// Writers pick uint16 whenever vocab_size <= 65536, halving the file size for common vocabularies.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "io/mapped_file.hpp"

namespace anvil::data {

inline constexpr size_t kTokenShardHeaderBytes = 64;
inline constexpr uint32_t kTokenShardVersion = 1;
enum class TokenDType : uint32_t { U16 = 1, U32 = 2 };

// The narrowest dtype that holds every id of a vocabulary of `vocab_size` tokens.
constexpr TokenDType token_dtype_for_vocab(uint64_t vocab_size) {
  return vocab_size <= 65536 ? TokenDType::U16 : TokenDType::U32;
}

// Writes a whole shard atomically: <path>.tmp is written, fsynced, then renamed over <path>, so a
// crash never leaves a half-written shard under the final name. Throws anvil::Error naming the path.
void write_token_shard(const std::string& path, std::span<const uint32_t> tokens, uint64_t vocab_size);

// Streaming writer for shards too large to hold in memory as uint32 (corpus preparation). Tokens are
// appended to <path>.tmp; commit() fills in the header, fsyncs and renames. Destroying a writer that
// was not committed deletes the temporary file, so failures leave no partial output.
class TokenShardWriter {
 public:
  TokenShardWriter(std::string path, uint64_t vocab_size);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  void append(std::span<const uint32_t> tokens);  // every id must be < vocab_size
  void commit();
  uint64_t count() const { return count_; }
  const std::string& path() const { return path_; }

 private:
  void flush();
  void write_all(const void* data, size_t bytes, uint64_t offset);

  std::string path_, tmp_path_;
  uint64_t vocab_size_;
  TokenDType dtype_;
  int fd_ = -1;
  uint64_t count_ = 0;
  uint64_t file_offset_ = kTokenShardHeaderBytes;  // where the next flushed byte goes
  std::vector<unsigned char> buffer_;              // encoded tokens not yet written
  bool committed_ = false;
};

// A read-only view of a shard file. The file is memory-mapped (pages load on demand, and the OS
// page cache is shared between processes reading the same data) and fully validated on open.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }  // number of tokens
  uint64_t vocab_size() const { return vocab_size_; }
  TokenDType dtype() const { return dtype_; }

  uint32_t at(uint64_t i) const;  // bounds-checked
  // Copies tokens [start, start + count) to `out` as int32 (the dtype of model inputs); bounds-checked.
  void read(uint64_t start, uint64_t count, int32_t* out) const;

 private:
  void unmap();

  std::string path_;
  io::MappedFile map_;                   // the whole file
  const unsigned char* body_ = nullptr;  // first token
  uint64_t size_ = 0;
  uint64_t vocab_size_ = 0;
  TokenDType dtype_ = TokenDType::U16;
};

}  // namespace anvil::data
