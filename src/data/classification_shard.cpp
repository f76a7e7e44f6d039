#include "data/classification_shard.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "anvil/error.hpp"
#include "data/shard_util.hpp"

namespace anvil::data {

static_assert(std::endian::native == std::endian::little,
              "classification shards assume a little-endian host");

namespace {

constexpr char kMagic[8] = {'A', 'N', 'V', 'I', 'L', 'C', 'L', 'S'};

constexpr uint64_t pad8(uint64_t n) {
  return (n + 7) / 8 * 8;
}

constexpr uint64_t token_width(TokenDType t) {
  return t == TokenDType::U16 ? 2 : 4;
}

std::string errno_text() {
  return std::strerror(errno);
}

// Buffered writes to <final>.tmp; finish() fsyncs and renames it into place. Unfinished -> deleted.
class AtomicOutFile {
 public:
  explicit AtomicOutFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) ANVIL_THROW("classification shard '{}': cannot create '{}': {}", path_, tmp_, errno_text());
  }
  ~AtomicOutFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!done_) ::unlink(tmp_.c_str());
  }
  void write(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    written_ += n;
    if (buf_.size() + n > kBufferBytes) flush();
    if (n >= kBufferBytes) {
      write_fd(p, n);
    } else {
      buf_.insert(buf_.end(), p, p + n);
    }
  }
  void pad_to_8() {
    static constexpr unsigned char zeros[8] = {};
    write(zeros, pad8(written_) - written_);
  }
  void finish() {
    flush();
    if (::fsync(fd_) != 0) ANVIL_THROW("classification shard '{}': fsync failed: {}", path_, errno_text());
    if (::close(std::exchange(fd_, -1)) != 0)
      ANVIL_THROW("classification shard '{}': close failed: {}", path_, errno_text());
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      ANVIL_THROW("classification shard '{}': rename from '{}' failed: {}", path_, tmp_, errno_text());
    done_ = true;
  }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;
  void flush() {
    write_fd(buf_.data(), buf_.size());
    buf_.clear();
  }
  void write_fd(const unsigned char* p, size_t n) {
    while (n > 0) {
      const ssize_t k = ::write(fd_, p, n);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0)
        ANVIL_THROW("classification shard '{}': write to '{}' failed: {}", path_, tmp_, errno_text());
      p += k, n -= static_cast<size_t>(k);
    }
  }

  std::string path_, tmp_;
  int fd_ = -1;
  std::vector<unsigned char> buf_;
  uint64_t written_ = 0;  // bytes written or buffered
  bool done_ = false;
};

template <class T>
void check_ids(const std::string& path, const T* ids, uint64_t n, uint64_t vocab_size) {
  if (const auto i = first_id_at_least(ids, n, vocab_size))
    ANVIL_THROW("classification shard '{}': token {} at position {} is >= vocab_size {}", path, ids[*i], *i,
                vocab_size);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Writing

ClassificationShardWriter::ClassificationShardWriter(std::string path, uint64_t vocab_size,
                                                     uint32_t max_length)
    : path_(std::move(path)),
      tokens_path_(path_ + ".tokens"),
      vocab_size_(vocab_size),
      max_length_(max_length) {
  ANVIL_REQUIRE(max_length >= 1, "classification shard '{}': max_length must be >= 1", path_);
  tokens_ = std::make_unique<TokenShardWriter>(tokens_path_, vocab_size);  // checks vocab_size
}

ClassificationShardWriter::~ClassificationShardWriter() {
  tokens_.reset();                 // deletes its temporary file unless committed
  ::unlink(tokens_path_.c_str());  // the committed scratch shard, if commit() got that far
}

void ClassificationShardWriter::append(std::span<const uint32_t> ids, int32_t label) {
  ANVIL_REQUIRE(!committed_, "classification shard '{}': append after commit", path_);
  ANVIL_REQUIRE(ids.size() <= max_length_,
                "classification shard '{}': example {} has {} tokens, more than max_length {}", path_, size(),
                ids.size(), max_length_);
  ANVIL_REQUIRE(label >= 0, "classification shard '{}': example {} has negative label {}", path_, size(),
                label);
  for (size_t i = 0; i < ids.size(); ++i)
    ANVIL_REQUIRE(ids[i] < vocab_size_,
                  "classification shard '{}': example {} token {} at position {} is >= vocab_size {}", path_,
                  size(), ids[i], i, vocab_size_);
  tokens_->append(ids);
  offsets_.push_back(offsets_.back() + ids.size());
  labels_.push_back(label);
}

void ClassificationShardWriter::remap_labels(std::span<const int32_t> mapping) {
  for (int32_t& l : labels_) {
    ANVIL_ASSERT(static_cast<size_t>(l) < mapping.size(), "label {} has no mapping ({} given)", l,
                 mapping.size());
    l = mapping[static_cast<size_t>(l)];
  }
}

void ClassificationShardWriter::commit(const std::vector<std::string>& label_names) {
  ANVIL_REQUIRE(!committed_, "classification shard '{}': committed twice", path_);
  ANVIL_REQUIRE(!label_names.empty() && label_names.size() <= std::numeric_limits<uint32_t>::max(),
                "classification shard '{}': {} label names (need at least 1)", path_, label_names.size());
  ANVIL_REQUIRE(std::set<std::string>(label_names.begin(), label_names.end()).size() == label_names.size(),
                "classification shard '{}': label names are not distinct", path_);
  for (size_t i = 0; i < labels_.size(); ++i)
    ANVIL_REQUIRE(static_cast<size_t>(labels_[i]) < label_names.size(),
                  "classification shard '{}': example {} has label {} but there are {} label names", path_, i,
                  labels_[i], label_names.size());
  std::string names_json;
  try {
    names_json = nlohmann::json(label_names).dump();
  } catch (const nlohmann::json::exception& e) {
    ANVIL_THROW("classification shard '{}': label names are not valid UTF-8: {}", path_, e.what());
  }

  tokens_->commit();
  const TokenDType dtype = token_dtype_for_vocab(vocab_size_);
  const uint64_t num_tokens = offsets_.back();
  unsigned char header[kClassificationHeaderBytes] = {};
  const uint32_t version = kClassificationShardVersion, dtype_code = static_cast<uint32_t>(dtype);
  const uint64_t n = labels_.size(), json_bytes = names_json.size();
  const auto num_labels = static_cast<uint32_t>(label_names.size());
  std::memcpy(header + 0, kMagic, 8);
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &dtype_code, 4);
  std::memcpy(header + 16, &n, 8);
  std::memcpy(header + 24, &vocab_size_, 8);
  std::memcpy(header + 32, &max_length_, 4);
  std::memcpy(header + 36, &num_labels, 4);
  std::memcpy(header + 40, &json_bytes, 8);
  std::memcpy(header + 48, &num_tokens, 8);

  AtomicOutFile out(path_);
  out.write(header, sizeof(header));
  out.write(names_json.data(), names_json.size());
  out.pad_to_8();
  out.write(offsets_.data(), offsets_.size() * sizeof(uint64_t));
  {
    // The token section is the scratch shard's body, copied as-is (same dtype, same encoding).
    const int fd = ::open(tokens_path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      ANVIL_THROW("classification shard '{}': cannot reopen '{}': {}", path_, tokens_path_, errno_text());
    std::vector<unsigned char> chunk(size_t{1} << 20);
    uint64_t left = num_tokens * token_width(dtype), at = kTokenShardHeaderBytes;
    while (left > 0) {
      const ssize_t k =
          ::pread(fd, chunk.data(), std::min<uint64_t>(chunk.size(), left), static_cast<off_t>(at));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        ::close(fd);
        ANVIL_THROW("classification shard '{}': reading back '{}' failed", path_, tokens_path_);
      }
      out.write(chunk.data(), static_cast<size_t>(k));
      left -= static_cast<uint64_t>(k), at += static_cast<uint64_t>(k);
    }
    ::close(fd);
  }
  out.pad_to_8();
  out.write(labels_.data(), labels_.size() * sizeof(int32_t));
  out.pad_to_8();
  out.finish();
  committed_ = true;
  ::unlink(tokens_path_.c_str());
}

void write_classification_shard(const std::string& path, uint64_t vocab_size, uint32_t max_length,
                                const std::vector<std::string>& label_names,
                                const std::vector<std::vector<uint32_t>>& examples,
                                const std::vector<int32_t>& labels) {
  ANVIL_REQUIRE(examples.size() == labels.size(), "classification shard '{}': {} examples but {} labels",
                path, examples.size(), labels.size());
  ClassificationShardWriter writer(path, vocab_size, max_length);
  for (size_t i = 0; i < examples.size(); ++i) writer.append(examples[i], labels[i]);
  writer.commit(label_names);
}

// ---------------------------------------------------------------------------------------------------
// Reading

ClassificationShard::ClassificationShard(const std::string& path) : path_(path) {
  map_ = io::MappedFile(path, [&](io::MappedFile::Step step, int err, size_t) {
    switch (step) {
      case io::MappedFile::Step::Open:
        if (err == ENOENT) ANVIL_THROW("classification shard '{}': file not found", path);
        ANVIL_THROW("classification shard '{}': cannot open: {}", path, std::strerror(err));
      case io::MappedFile::Step::Stat:
      case io::MappedFile::Step::NotRegular:
        ANVIL_THROW("classification shard '{}': not a readable regular file", path);
      case io::MappedFile::Step::Map:
        ANVIL_THROW("classification shard '{}': mmap failed: {}", path, std::strerror(err));
    }
  });
  const uint64_t file_bytes = map_.size();
  if (file_bytes < kClassificationHeaderBytes)
    ANVIL_THROW("classification shard '{}': file is {} bytes, shorter than the {}-byte header", path,
                file_bytes, kClassificationHeaderBytes);

  const auto* bytes = reinterpret_cast<const unsigned char*>(map_.data());
  ANVIL_REQUIRE(std::memcmp(bytes, kMagic, 8) == 0,
                "classification shard '{}': bad magic (expected 'ANVILCLS'); not a classification shard",
                path);
  const auto version = load<uint32_t>(bytes + 8);
  const auto dtype_code = load<uint32_t>(bytes + 12);
  num_examples_ = load<uint64_t>(bytes + 16);
  vocab_size_ = load<uint64_t>(bytes + 24);
  max_length_ = load<uint32_t>(bytes + 32);
  const auto num_labels = load<uint32_t>(bytes + 36);
  const auto json_bytes = load<uint64_t>(bytes + 40);
  num_tokens_ = load<uint64_t>(bytes + 48);
  ANVIL_REQUIRE(version == kClassificationShardVersion,
                "classification shard '{}': unsupported format version {} (expected {})", path, version,
                kClassificationShardVersion);
  ANVIL_REQUIRE(dtype_code == 1 || dtype_code == 2,
                "classification shard '{}': unknown token dtype code {} (expected 1 = uint16 or 2 = uint32)",
                path, dtype_code);
  dtype_ = static_cast<TokenDType>(dtype_code);
  ANVIL_REQUIRE(vocab_size_ >= 1, "classification shard '{}': vocabulary size is 0", path);
  ANVIL_REQUIRE(max_length_ >= 1, "classification shard '{}': max_length is 0", path);
  ANVIL_REQUIRE(num_labels >= 1, "classification shard '{}': number of labels is 0", path);

  // Section sizes in 128 bits: corrupt counts must not wrap around into a plausible total.
  using u128 = unsigned __int128;
  const uint64_t width = token_width(dtype_);
  const u128 json_end =
      u128(kClassificationHeaderBytes) + pad8(std::min<uint64_t>(json_bytes, UINT64_MAX - 8));
  const u128 offsets_end = json_end + (u128(num_examples_) + 1) * 8;
  const u128 tokens_end = offsets_end + (u128(num_tokens_) * width + 7) / 8 * 8;
  const u128 expected = tokens_end + (u128(num_examples_) * 4 + 7) / 8 * 8;
  ANVIL_REQUIRE(
      expected == file_bytes,
      "classification shard '{}': the header says {} examples, {} tokens of {} bytes and {} bytes of "
      "label names, which need {} bytes, but the file has {} ({}); the file is truncated or corrupt",
      path, num_examples_, num_tokens_, width, json_bytes,
      expected > u128(UINT64_MAX) ? std::string("over 2^64") : std::to_string(uint64_t(expected)), file_bytes,
      expected > file_bytes ? "too few" : "too many");

  nlohmann::json names;
  try {
    names = nlohmann::json::parse(std::string_view(reinterpret_cast<const char*>(bytes) + 64, json_bytes));
  } catch (const nlohmann::json::exception& e) {
    ANVIL_THROW("classification shard '{}': label names are not valid JSON: {}", path, e.what());
  }
  ANVIL_REQUIRE(names.is_array() && names.size() == num_labels,
                "classification shard '{}': label names must be a JSON array of {} strings", path,
                num_labels);
  for (const auto& name : names) {
    // An array or object is named by its type: dump() recurses, and the nesting is unbounded.
    ANVIL_REQUIRE(name.is_string(), "classification shard '{}': label name {} is not a string", path,
                  name.is_structured() ? std::string("(an ") + name.type_name() + ")" : name.dump());
    label_names_.push_back(name.get<std::string>());
  }
  ANVIL_REQUIRE(std::set<std::string>(label_names_.begin(), label_names_.end()).size() == label_names_.size(),
                "classification shard '{}': label names are not distinct", path);

  offsets_ = reinterpret_cast<const uint64_t*>(bytes + uint64_t(json_end));
  tokens_ = bytes + uint64_t(offsets_end);
  labels_ = reinterpret_cast<const int32_t*>(bytes + uint64_t(tokens_end));
  ANVIL_REQUIRE(offsets_[0] == 0, "classification shard '{}': offsets[0] is {} (must be 0)", path,
                offsets_[0]);
  for (uint64_t i = 0; i < num_examples_; ++i) {
    ANVIL_REQUIRE(
        offsets_[i + 1] >= offsets_[i] && offsets_[i + 1] - offsets_[i] <= max_length_,
        "classification shard '{}': example {} spans offsets [{}, {}), not 0 to max_length {} tokens", path,
        i, offsets_[i], offsets_[i + 1], max_length_);
  }
  ANVIL_REQUIRE(offsets_[num_examples_] == num_tokens_,
                "classification shard '{}': the offsets end at {} but the header says {} tokens", path,
                offsets_[num_examples_], num_tokens_);
  if (dtype_ == TokenDType::U16) {
    check_ids(path, reinterpret_cast<const uint16_t*>(tokens_), num_tokens_, vocab_size_);
  } else {
    check_ids(path, reinterpret_cast<const uint32_t*>(tokens_), num_tokens_, vocab_size_);
  }
  for (uint64_t i = 0; i < num_examples_; ++i)
    ANVIL_REQUIRE(labels_[i] >= 0 && static_cast<uint32_t>(labels_[i]) < num_labels,
                  "classification shard '{}': example {} has label {}, outside [0, {})", path, i, labels_[i],
                  num_labels);
}

ClassificationShard::~ClassificationShard() = default;

bool is_classification_shard(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {};
  return f.read(magic, 8) && std::memcmp(magic, kMagic, 8) == 0;
}

uint32_t ClassificationShard::length(uint64_t i) const {
  ANVIL_REQUIRE(i < num_examples_, "classification shard '{}': example {} out of range (the shard has {})",
                path_, i, num_examples_);
  return static_cast<uint32_t>(offsets_[i + 1] - offsets_[i]);
}

int32_t ClassificationShard::label(uint64_t i) const {
  ANVIL_REQUIRE(i < num_examples_, "classification shard '{}': example {} out of range (the shard has {})",
                path_, i, num_examples_);
  return labels_[i];
}

void ClassificationShard::read(uint64_t i, int32_t* out) const {
  const uint32_t n = length(i);
  const uint64_t start = offsets_[i];
  if (dtype_ == TokenDType::U16) {
    const auto* src = reinterpret_cast<const uint16_t*>(tokens_) + start;
    for (uint32_t k = 0; k < n; ++k) out[k] = static_cast<int32_t>(src[k]);
  } else {
    const auto* src = reinterpret_cast<const uint32_t*>(tokens_) + start;
    for (uint32_t k = 0; k < n; ++k) out[k] = static_cast<int32_t>(src[k]);
  }
}

std::vector<uint32_t> ClassificationShard::tokens(uint64_t i) const {
  std::vector<int32_t> ids(length(i));
  read(i, ids.data());
  return {ids.begin(), ids.end()};
}

// ---------------------------------------------------------------------------------------------------
// Batches

uint32_t classification_batch_length(const ClassificationShard& shard, std::span<const uint64_t> indices,
                                     uint32_t pad_multiple) {
  ANVIL_REQUIRE(pad_multiple >= 1, "classification batch: pad_multiple must be >= 1");
  uint32_t longest = 1;
  for (uint64_t i : indices) longest = std::max(longest, shard.length(i));
  const uint64_t rounded = (uint64_t{longest} + pad_multiple - 1) / pad_multiple * pad_multiple;
  return static_cast<uint32_t>(std::min<uint64_t>(rounded, std::max(shard.max_length(), longest)));
}

void fill_classification_batch(const ClassificationShard& shard, std::span<const uint64_t> indices,
                               uint32_t length, int32_t pad_id, int32_t* ids, int32_t* attention_mask,
                               int32_t* labels) {
  ANVIL_REQUIRE(pad_id >= 0 && static_cast<uint64_t>(pad_id) < shard.vocab_size(),
                "classification batch: pad id {} is not in the vocabulary of '{}' (size {})", pad_id,
                shard.path(), shard.vocab_size());
  for (size_t b = 0; b < indices.size(); ++b) {
    const uint32_t n = shard.length(indices[b]);
    ANVIL_REQUIRE(n <= length,
                  "classification batch: example {} of '{}' has {} tokens, more than the length {}",
                  indices[b], shard.path(), n, length);
    int32_t* row = ids + b * length;
    int32_t* mask = attention_mask + b * length;
    shard.read(indices[b], row);
    std::fill(row + n, row + length, pad_id);
    std::fill(mask, mask + n, 1);
    std::fill(mask + n, mask + length, 0);
    labels[b] = shard.label(indices[b]);
  }
}

ClassificationBatch assemble_classification_batch(const ClassificationShard& shard,
                                                  std::span<const uint64_t> indices, int32_t pad_id,
                                                  uint32_t pad_multiple) {
  ClassificationBatch batch;
  batch.batch_size = static_cast<uint32_t>(indices.size());
  batch.length = classification_batch_length(shard, indices, pad_multiple);
  const size_t cells = size_t{batch.batch_size} * batch.length;
  batch.ids.resize(cells);
  batch.attention_mask.resize(cells);
  batch.labels.resize(batch.batch_size);
  fill_classification_batch(shard, indices, batch.length, pad_id, batch.ids.data(),
                            batch.attention_mask.data(), batch.labels.data());
  return batch;
}

}  // namespace anvil::data
