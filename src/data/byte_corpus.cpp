#include "data/byte_corpus.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "anvil/error.hpp"
#include "data/token_shard.hpp"

namespace anvil::data {
namespace {

namespace fs = std::filesystem;

constexpr size_t kReadChunkBytes = size_t{4} << 20;
constexpr uint64_t kProgressMinBytes = uint64_t{64} << 20;  // smaller inputs finish too fast to need it

struct InputFile {
  fs::path path;
  uint64_t bytes;
};

// Expands the inputs to a list of regular files. Directory contents are sorted so the corpus (and
// therefore the shards) does not depend on the order the filesystem lists entries in.
std::vector<InputFile> collect_input_files(const std::vector<std::string>& inputs) {
  std::vector<InputFile> files;
  for (const std::string& input : inputs) {
    std::error_code ec;
    const fs::file_status status = fs::status(input, ec);
    if (ec || !fs::exists(status)) ANVIL_THROW("prepare: input '{}' does not exist", input);
    if (fs::is_regular_file(status)) {
      files.push_back({input, fs::file_size(input)});
    } else if (fs::is_directory(status)) {
      std::vector<InputFile> dir_files;
      for (const fs::directory_entry& entry : fs::recursive_directory_iterator(input)) {
        if (entry.is_regular_file()) dir_files.push_back({entry.path(), entry.file_size()});
      }
      std::sort(dir_files.begin(), dir_files.end(), [](const InputFile& a, const InputFile& b) {
        return a.path.generic_string() < b.path.generic_string();
      });
      files.insert(files.end(), dir_files.begin(), dir_files.end());
    } else {
      ANVIL_THROW("prepare: input '{}' is neither a regular file nor a directory", input);
    }
  }
  return files;
}

std::string join_inputs(const std::vector<std::string>& inputs) {
  std::string s;
  for (const std::string& input : inputs) s += (s.empty() ? "'" : ", '") + input + "'";
  return s;
}

class Progress {
 public:
  explicit Progress(uint64_t total_bytes) : total_(total_bytes), enabled_(total_bytes >= kProgressMinBytes) {}

  void update(uint64_t done_bytes) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_print_ < std::chrono::seconds(1)) return;
    last_print_ = now;
    fmt::print(stderr, "prepare: {:.1f} / {:.1f} MB ({:.1f} MB/s)\n", mb(done_bytes), mb(total_),
               rate(done_bytes));
  }
  void finish(uint64_t done_bytes) {
    if (!enabled_) return;
    fmt::print(stderr, "prepare: {:.1f} MB done ({:.1f} MB/s)\n", mb(done_bytes), rate(done_bytes));
  }

 private:
  static double mb(uint64_t bytes) { return static_cast<double>(bytes) / 1e6; }
  double rate(uint64_t done_bytes) const {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    return seconds > 0 ? mb(done_bytes) / seconds : 0.0;
  }

  uint64_t total_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_print_ = start_;
};

}  // namespace

std::vector<uint32_t> byte_encode(std::string_view text) {
  std::vector<uint32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string byte_decode(std::span<const int32_t> ids) {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    ANVIL_REQUIRE(ids[i] >= 0 && ids[i] < static_cast<int32_t>(kByteVocabSize),
                  "byte_decode: id {} at position {} is not a byte token (must be in [0, {}))", ids[i], i,
                  kByteVocabSize);
    text[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
  }
  return text;
}

PrepareStats prepare_byte_corpus(const std::vector<std::string>& inputs, const std::string& out_dir,
                                 double val_fraction) {
  // Written so that NaN fails too.
  ANVIL_REQUIRE(val_fraction >= 0.0 && val_fraction <= 0.5, "prepare: val_fraction {} is outside [0, 0.5]",
                val_fraction);
  ANVIL_REQUIRE(!inputs.empty(), "prepare: no inputs given");
  std::vector<InputFile> files;
  try {
    files = collect_input_files(inputs);
  } catch (const fs::filesystem_error& e) {
    ANVIL_THROW("prepare: cannot list inputs: {}", e.what());  // e.g. an unreadable directory
  }
  uint64_t total_bytes = 0;
  for (const InputFile& f : files) total_bytes += f.bytes;
  ANVIL_REQUIRE(total_bytes > 0, "prepare: empty corpus: the inputs {} contain no bytes",
                join_inputs(inputs));

  const auto val_tokens = static_cast<uint64_t>(static_cast<double>(total_bytes) * val_fraction);
  const uint64_t train_tokens = total_bytes - val_tokens;
  if (val_fraction > 0) {
    ANVIL_REQUIRE(
        val_tokens >= 2 && train_tokens >= 2,
        "prepare: val_fraction {} splits the {}-byte corpus into {} train and {} validation tokens; "
        "each side needs at least 2 (use more text, another val_fraction, or val_fraction 0)",
        val_fraction, total_bytes, train_tokens, val_tokens);
  }

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) ANVIL_THROW("prepare: cannot create output directory '{}': {}", out_dir, ec.message());

  PrepareStats stats;
  stats.train_path = (fs::path(out_dir) / "train.bin").string();
  stats.val_path = (fs::path(out_dir) / "val.bin").string();
  // Both writers go to temporary files that are deleted unless committed, so an error anywhere
  // below leaves no partial shard behind.
  TokenShardWriter train_writer(stats.train_path, kByteVocabSize);
  TokenShardWriter val_writer(stats.val_path, kByteVocabSize);

  std::vector<char> chunk(kReadChunkBytes);
  std::vector<uint32_t> ids(kReadChunkBytes);
  Progress progress(total_bytes);
  for (const InputFile& file : files) {
    std::ifstream in(file.path, std::ios::binary);
    ANVIL_REQUIRE(in.is_open(), "prepare: cannot open input '{}'", file.path.string());
    uint64_t file_bytes_read = 0;
    while (in) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      const auto n = static_cast<size_t>(in.gcount());
      if (n == 0) break;
      for (size_t i = 0; i < n; ++i) ids[i] = static_cast<unsigned char>(chunk[i]);
      // Bytes before the split point go to train, the rest to validation.
      const size_t to_train =
          static_cast<size_t>(std::min<uint64_t>(n, train_tokens - std::min(train_tokens, stats.bytes_read)));
      train_writer.append(std::span<const uint32_t>(ids.data(), to_train));
      val_writer.append(std::span<const uint32_t>(ids.data() + to_train, n - to_train));
      file_bytes_read += n;
      stats.bytes_read += n;
      progress.update(stats.bytes_read);
    }
    ANVIL_REQUIRE(!in.bad(), "prepare: read error in input '{}'", file.path.string());
    // The split point came from the sizes listed up front; a file that changed would move it.
    ANVIL_REQUIRE(file_bytes_read == file.bytes,
                  "prepare: input '{}' changed while being read ({} bytes listed, {} read)",
                  file.path.string(), file.bytes, file_bytes_read);
  }
  progress.finish(stats.bytes_read);

  stats.train_tokens = train_writer.count();
  stats.val_tokens = val_writer.count();
  ANVIL_ASSERT(stats.train_tokens == train_tokens && stats.val_tokens == val_tokens,
               "split {} + {} != planned {} + {}", stats.train_tokens, stats.val_tokens, train_tokens,
               val_tokens);
  train_writer.commit();
  try {
    val_writer.commit();
  } catch (...) {
    fs::remove(stats.train_path, ec);  // keep the all-or-nothing promise
    throw;
  }
  return stats;
}

}  // namespace anvil::data
