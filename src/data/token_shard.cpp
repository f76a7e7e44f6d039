#include "data/token_shard.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "anvil/error.hpp"
#include "data/shard_util.hpp"

namespace anvil::data {

// Header fields and tokens are copied to and from memory as-is, which is the documented little-endian
// layout only on a little-endian host (every platform Anvil targets).
static_assert(std::endian::native == std::endian::little, "token shards assume a little-endian host");

namespace {

constexpr char kMagic[8] = {'A', 'N', 'V', 'I', 'L', 'T', 'O', 'K'};
constexpr size_t kWriteBufferBytes = size_t{1} << 20;
constexpr size_t kAppendChunkTokens = size_t{1} << 16;  // validated and encoded at a time

constexpr size_t token_width(TokenDType t) {
  return t == TokenDType::U16 ? 2 : 4;
}

std::string errno_text() {
  return std::strerror(errno);
}

// The 8 bytes found where the magic should be, printable even when they are binary garbage.
std::string describe_bytes(const unsigned char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    if (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\') {
      s += static_cast<char>(p[i]);
    } else {
      s += fmt::format("\\x{:02x}", p[i]);
    }
  }
  return s;
}

// Throws at the first token id >= vocab_size.
template <class T>
void check_token_ids(const std::string& path, const T* tokens, uint64_t n, uint64_t vocab_size) {
  if (const auto i = first_id_at_least(tokens, n, vocab_size))
    ANVIL_THROW("token shard '{}': token {} at position {} is >= vocab_size {}", path, tokens[*i], *i,
                vocab_size);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Writing

TokenShardWriter::TokenShardWriter(std::string path, uint64_t vocab_size)
    : path_(std::move(path)),
      tmp_path_(path_ + ".tmp"),
      vocab_size_(vocab_size),
      dtype_(token_dtype_for_vocab(vocab_size)) {
  ANVIL_REQUIRE(vocab_size >= 1 && vocab_size <= (uint64_t{1} << 32),
                "token shard '{}': vocab_size {} is outside [1, 2^32]", path_, vocab_size);
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) ANVIL_THROW("token shard '{}': cannot create '{}': {}", path_, tmp_path_, errno_text());
  buffer_.reserve(kWriteBufferBytes + kAppendChunkTokens * sizeof(uint32_t));
}

TokenShardWriter::~TokenShardWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void TokenShardWriter::append(std::span<const uint32_t> tokens) {
  ANVIL_REQUIRE(!committed_, "token shard '{}': append after commit", path_);
  const size_t width = token_width(dtype_);
  for (size_t start = 0; start < tokens.size(); start += kAppendChunkTokens) {
    const std::span<const uint32_t> chunk =
        tokens.subspan(start, std::min(kAppendChunkTokens, tokens.size() - start));
    // Validate with a vectorisable max first; only a chunk with a bad id is searched for it.
    uint32_t chunk_max = 0;
    for (uint32_t id : chunk) chunk_max = std::max(chunk_max, id);
    if (chunk_max >= vocab_size_) {
      for (size_t i = 0; i < chunk.size(); ++i) {
        ANVIL_REQUIRE(chunk[i] < vocab_size_, "token shard '{}': token {} at position {} is >= vocab_size {}",
                      path_, chunk[i], count_ + i, vocab_size_);
      }
    }
    const size_t offset = buffer_.size();
    buffer_.resize(offset + chunk.size() * width);
    unsigned char* out = buffer_.data() + offset;
    if (dtype_ == TokenDType::U16) {
      for (size_t i = 0; i < chunk.size(); ++i) {
        const auto narrow = static_cast<uint16_t>(chunk[i]);
        std::memcpy(out + 2 * i, &narrow, 2);
      }
    } else {
      std::memcpy(out, chunk.data(), chunk.size() * 4);
    }
    count_ += chunk.size();  // per chunk, so a rejected chunk leaves count() matching the buffered tokens
    if (buffer_.size() >= kWriteBufferBytes) flush();
  }
}

void TokenShardWriter::write_all(const void* data, size_t bytes, uint64_t offset) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) ANVIL_THROW("token shard '{}': write to '{}' failed: {}", path_, tmp_path_, errno_text());
    p += n, bytes -= static_cast<size_t>(n), offset += static_cast<uint64_t>(n);
  }
}

void TokenShardWriter::flush() {
  write_all(buffer_.data(), buffer_.size(), file_offset_);
  file_offset_ += buffer_.size();
  buffer_.clear();
}

void TokenShardWriter::commit() {
  ANVIL_REQUIRE(!committed_, "token shard '{}': committed twice", path_);
  flush();
  unsigned char header[kTokenShardHeaderBytes] = {};
  const uint32_t version = kTokenShardVersion, dtype_code = static_cast<uint32_t>(dtype_);
  std::memcpy(header + 0, kMagic, sizeof(kMagic));
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &dtype_code, 4);
  std::memcpy(header + 16, &count_, 8);
  std::memcpy(header + 24, &vocab_size_, 8);
  write_all(header, sizeof(header), 0);
  if (::fsync(fd_) != 0)
    ANVIL_THROW("token shard '{}': fsync of '{}' failed: {}", path_, tmp_path_, errno_text());
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0)
    ANVIL_THROW("token shard '{}': close of '{}' failed: {}", path_, tmp_path_, errno_text());
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0)
    ANVIL_THROW("token shard '{}': rename from '{}' failed: {}", path_, tmp_path_, errno_text());
  committed_ = true;
  // Make the rename itself durable. Best effort: some filesystems refuse fsync on directories.
  const std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  const int dir_fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_token_shard(const std::string& path, std::span<const uint32_t> tokens, uint64_t vocab_size) {
  TokenShardWriter writer(path, vocab_size);
  writer.append(tokens);
  writer.commit();
}

// ---------------------------------------------------------------------------------------------------
// Reading

TokenShard::TokenShard(const std::string& path) : path_(path) {
  map_ = io::MappedFile(path, [&](io::MappedFile::Step step, int err, size_t file_bytes) {
    switch (step) {
      case io::MappedFile::Step::Open:
        if (err == ENOENT) ANVIL_THROW("token shard '{}': file not found", path);
        ANVIL_THROW("token shard '{}': cannot open: {}", path, std::strerror(err));
      case io::MappedFile::Step::Stat:
        ANVIL_THROW("token shard '{}': cannot stat: {}", path, std::strerror(err));
      case io::MappedFile::Step::NotRegular:
        ANVIL_THROW("token shard '{}': not a regular file", path);
      case io::MappedFile::Step::Map:
        ANVIL_THROW("token shard '{}': mmap of {} bytes failed: {}", path, file_bytes, std::strerror(err));
    }
  });
  const uint64_t file_bytes = map_.size();
  if (file_bytes < kTokenShardHeaderBytes) {
    ANVIL_THROW("token shard '{}': file is {} bytes, shorter than the {}-byte header", path, file_bytes,
                kTokenShardHeaderBytes);
  }

  const auto* bytes = reinterpret_cast<const unsigned char*>(map_.data());
  ANVIL_REQUIRE(std::memcmp(bytes, kMagic, sizeof(kMagic)) == 0,
                "token shard '{}': bad magic '{}' (expected 'ANVILTOK'); not a token shard", path,
                describe_bytes(bytes, sizeof(kMagic)));
  const auto version = load<uint32_t>(bytes + 8);
  const auto dtype_code = load<uint32_t>(bytes + 12);
  size_ = load<uint64_t>(bytes + 16);
  vocab_size_ = load<uint64_t>(bytes + 24);
  ANVIL_REQUIRE(version == kTokenShardVersion,
                "token shard '{}': unsupported format version {} (expected {})", path, version,
                kTokenShardVersion);
  ANVIL_REQUIRE(dtype_code == static_cast<uint32_t>(TokenDType::U16) ||
                    dtype_code == static_cast<uint32_t>(TokenDType::U32),
                "token shard '{}': unknown token dtype code {} (expected 1 = uint16 or 2 = uint32)", path,
                dtype_code);
  dtype_ = static_cast<TokenDType>(dtype_code);
  ANVIL_REQUIRE(vocab_size_ >= 1, "token shard '{}': vocabulary size is 0", path);

  const uint64_t width = token_width(dtype_);
  const uint64_t body_bytes = file_bytes - kTokenShardHeaderBytes;
  // Compare without multiplying: a corrupt count could overflow count * width.
  ANVIL_REQUIRE(body_bytes % width == 0 && body_bytes / width == size_,
                "token shard '{}': header says {} tokens of {} bytes each but the body after the header has "
                "{} bytes ({}); the file is truncated or has trailing bytes",
                path, size_, width, body_bytes, body_bytes / width < size_ ? "too few" : "too many");
  body_ = bytes + kTokenShardHeaderBytes;
  // The body starts 64 bytes into a page-aligned mapping, so it is aligned for either dtype.
  if (dtype_ == TokenDType::U16) {
    check_token_ids(path, reinterpret_cast<const uint16_t*>(body_), size_, vocab_size_);
  } else {
    check_token_ids(path, reinterpret_cast<const uint32_t*>(body_), size_, vocab_size_);
  }
}

TokenShard::~TokenShard() {
  unmap();
}

TokenShard::TokenShard(TokenShard&& other) noexcept {
  *this = std::move(other);
}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    map_ = std::move(other.map_);
    body_ = std::exchange(other.body_, nullptr);
    size_ = std::exchange(other.size_, 0);
    vocab_size_ = std::exchange(other.vocab_size_, 0);
    dtype_ = other.dtype_;
  }
  return *this;
}

void TokenShard::unmap() {
  map_ = io::MappedFile();
  body_ = nullptr;
}

uint32_t TokenShard::at(uint64_t i) const {
  ANVIL_REQUIRE(i < size_, "token shard '{}': index {} out of range (the shard has {} tokens)", path_, i,
                size_);
  return dtype_ == TokenDType::U16 ? reinterpret_cast<const uint16_t*>(body_)[i]
                                   : reinterpret_cast<const uint32_t*>(body_)[i];
}

void TokenShard::read(uint64_t start, uint64_t count, int32_t* out) const {
  ANVIL_REQUIRE(start <= size_ && count <= size_ - start,
                "token shard '{}': read of {} tokens at {} is out of range (the shard has {} tokens)", path_,
                count, start, size_);
  // Ids become int32 (what embedding lookups take), so they must fit.
  ANVIL_REQUIRE(vocab_size_ <= (uint64_t{1} << 31),
                "token shard '{}': vocab_size {} does not fit int32 token ids", path_, vocab_size_);
  if (dtype_ == TokenDType::U16) {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(body_) + start;
    for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(src[i]);
  } else {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(body_) + start;
    for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(src[i]);
  }
}

}  // namespace anvil::data
