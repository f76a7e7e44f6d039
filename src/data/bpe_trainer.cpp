#include "data/bpe_trainer.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fcntl.h>
#include <fmt/format.h>
#include <omp.h>
#include <pcre2.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>
#include <unordered_set>

#include "anvil/error.hpp"
#include "data/text_sources.hpp"
#include "io/atomic_dir.hpp"

namespace anvil::data {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// GPT-2's pre-tokenizer pattern, as the `tokenizers` ByteLevel pre-tokenizer uses it.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---- GPT-2 byte <-> unicode mapping -------------------------------------------------------------

// Printable Latin-1 bytes stand for themselves; the other 68 bytes map to U+0100.. in byte order. Token
// ids of the single bytes follow the mapped code points, which is GPT-2's vocab.json order.
struct ByteLevelTable {
  std::array<std::string, 256> byte_char;  // UTF-8 of the mapped code point
  std::array<uint8_t, 256> id_byte{};      // token id -> byte
  ByteLevelTable() {
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    std::array<uint32_t, 256> code{};
    int id = 0, extra = 0;
    for (int b = 0; b < 256; ++b)
      if (printable(b)) code[b] = uint32_t(b), id_byte[id++] = uint8_t(b);
    for (int b = 0; b < 256; ++b)
      if (!printable(b)) code[b] = 0x100 + uint32_t(extra++), id_byte[id++] = uint8_t(b);
    for (int b = 0; b < 256; ++b) {
      const uint32_t c = code[b];  // < 0x800: one or two UTF-8 bytes
      byte_char[b] =
          c < 0x80 ? std::string(1, char(c)) : std::string{char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
    }
  }
};

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table;
  return table;
}

// ---- UTF-8 ---------------------------------------------------------------------------------------

// Length of the longest valid UTF-8 prefix (RFC 3629: no overlongs, surrogates or code points above
// U+10FFFF), exactly what PCRE2 accepts, so the regex can run with PCRE2_NO_UTF_CHECK.
size_t valid_utf8_prefix(const unsigned char* p, size_t n) {
  size_t i = 0;
  while (i < n) {
    while (i + 8 <= n) {  // ASCII fast path
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return i;
    i += len;
  }
  return i;
}

bool is_valid_utf8(std::string_view s) {
  return valid_utf8_prefix(reinterpret_cast<const unsigned char*>(s.data()), s.size()) == s.size();
}

// ---- GPT-2 pre-tokenizer regex -------------------------------------------------------------------

struct Gpt2Regex {
  pcre2_code* code = nullptr;
  Gpt2Regex() {
    int err = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      ANVIL_THROW("pre-tokenizer: PCRE2 cannot compile the GPT-2 pattern at offset {}: {}", offset,
                  reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT (unsupported CPU) matching is only slower
  }
  ~Gpt2Regex() { pcre2_code_free(code); }
  Gpt2Regex(const Gpt2Regex&) = delete;
  Gpt2Regex& operator=(const Gpt2Regex&) = delete;
};

// Per-thread match state (the compiled pattern is shared).
struct MatchData {
  pcre2_match_data* md;
  explicit MatchData(const Gpt2Regex& re) : md(pcre2_match_data_create_from_pattern(re.code, nullptr)) {
    ANVIL_ASSERT(md, "pcre2_match_data_create_from_pattern failed");
  }
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};

// Pre-tokens of valid UTF-8 text (so PCRE2 can skip its own check).
template <class F>
void pretokenize(const Gpt2Regex& re, MatchData& m, std::string_view text, F&& emit) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(re.code, bytes, text.size(), pos, PCRE2_NO_UTF_CHECK, m.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      ANVIL_THROW("pre-tokenizer: PCRE2 match failed at byte {}: {}", pos,
                  reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
    if (ov[0] > pos) emit(text.substr(pos, ov[0] - pos));  // cannot happen: every character matches
    ANVIL_ASSERT(ov[1] > ov[0], "empty pre-token at byte {}", ov[0]);
    emit(text.substr(ov[0], ov[1] - ov[0]));
    pos = ov[1];
  }
  if (pos < text.size()) emit(text.substr(pos));
}

// `text`, or (when it is not valid UTF-8) a copy in `storage` with each ill-formed sequence replaced by
// U+FFFD: what prepare-data and the BPE encoder do, so training sees the text they will encode.
std::string_view valid_utf8_view(std::string_view text, std::string& storage) {
  if (is_valid_utf8(text)) return text;
  storage.assign(text);
  repair_utf8(storage);
  return storage;
}

// ---- special tokens ------------------------------------------------------------------------------

// Cuts the text at special-token occurrences (leftmost-longest, like `tokenizers`' added vocabulary)
// and hands the pieces between them to `plain`.
template <class F>
void for_each_plain_segment(std::string_view text, const std::vector<std::string>& specials, F&& plain) {
  if (specials.empty()) {
    plain(text);
    return;
  }
  std::vector<size_t> next(specials.size(), 0);
  for (size_t i = 0; i < specials.size(); ++i) next[i] = text.find(specials[i]);
  size_t pos = 0;
  for (;;) {
    size_t best = std::string_view::npos, best_len = 0;
    for (size_t i = 0; i < specials.size(); ++i) {
      if (next[i] != std::string_view::npos && next[i] < pos) next[i] = text.find(specials[i], pos);
      if (next[i] < best ||
          (next[i] == best && next[i] != std::string_view::npos && specials[i].size() > best_len))
        best = next[i], best_len = specials[i].size();
    }
    if (best == std::string_view::npos) {
      plain(text.substr(pos));
      return;
    }
    plain(text.substr(pos, best - pos));
    pos = best + best_len;
  }
}

// ---- cut points for streaming --------------------------------------------------------------------

bool ascii_space(unsigned char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}
bool ascii_graphic(unsigned char c) {
  return c > ' ' && c < 0x7F;
}

// A cut before position p changes no pre-token when text[p-1] is a non-space ASCII character and
// text[p] ASCII whitespace: no alternative of the regex matches both a non-space and a following space
// character, the only lookahead (\s+(?!\S)) cannot reach back over text[p-1], and neither UTF-8
// validation nor a multi-byte character straddles ASCII bytes. It must also not fall inside a special
// token (only those containing whitespace can straddle it). Returns the largest such p in (lo, hi], or 0.
size_t find_cut(std::string_view t, size_t lo, size_t hi, const std::vector<std::string>& ws_specials) {
  hi = std::min(hi, t.empty() ? 0 : t.size() - 1);
  for (size_t p = hi; p > lo; --p) {
    if (!ascii_space(uint8_t(t[p])) || !ascii_graphic(uint8_t(t[p - 1]))) continue;
    bool inside = false;
    for (const std::string& s : ws_specials) {
      for (size_t start = p >= s.size() - 1 ? p - (s.size() - 1) : 0; start < p && !inside; ++start)
        inside = t.compare(start, s.size(), s) == 0;
      if (inside) break;
    }
    if (!inside) return p;
  }
  return 0;
}

// Word -> count for the counting hot loop: open addressing over one array and the words in one arena
// (std::unordered_map's node chasing and hashing cost more than the regex itself). Also the shards of
// the running total, so merging a round's counts runs in parallel (one shard per task).
class WordTable {
 public:
  static constexpr int kShardBits = 6;  // the running total is split into 64 shards by hash
  static constexpr size_t kShards = size_t{1} << kShardBits;
  struct Slot {
    uint64_t hash = 0, count = 0;  // count 0: empty
    size_t offset = 0, len = 0;
  };

  WordTable() : slots_(size_t{1} << 10) {}

  static uint64_t hash(std::string_view w) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ w.size();
    size_t i = 0;
    for (; i + 8 <= w.size(); i += 8) {
      uint64_t k;
      std::memcpy(&k, w.data() + i, 8);
      h = mix(h ^ k);
    }
    uint64_t k = 0;
    std::memcpy(&k, w.data() + i, w.size() - i);
    return mix(h ^ k);
  }
  static size_t shard_of(uint64_t hash) { return size_t(hash >> (64 - kShardBits)); }

  void add(std::string_view w, uint64_t h, uint64_t count) {
    for (size_t i = h & (slots_.size() - 1);; i = (i + 1) & (slots_.size() - 1)) {
      Slot& s = slots_[i];
      if (s.count == 0) {
        s = {h, count, arena_.size(), w.size()};
        arena_.append(w);
        if (++used_ * 2 > slots_.size()) grow();
        return;
      }
      if (s.hash == h && s.len == w.size() &&
          std::memcmp(arena_.data() + s.offset, w.data(), w.size()) == 0) {
        s.count += count;
        return;
      }
    }
  }
  void add(std::string_view w) { add(w, hash(w), 1); }

  std::string_view word(const Slot& s) const { return {arena_.data() + s.offset, s.len}; }
  const std::vector<Slot>& slots() const { return slots_; }
  size_t size() const { return used_; }
  void clear() {
    if (used_ == 0) return;
    for (Slot& s : slots_) s.count = 0;
    arena_.clear();
    used_ = 0;
  }

 private:
  static uint64_t mix(uint64_t x) {  // murmur3's finaliser
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old) {
      if (s.count == 0) continue;
      size_t i = s.hash & (slots_.size() - 1);
      while (slots_[i].count != 0) i = (i + 1) & (slots_.size() - 1);
      slots_[i] = s;
    }
  }

  std::vector<Slot> slots_;
  std::string arena_;
  size_t used_ = 0;
};

// Adds the per-thread tables into the sharded total and empties them, in parallel: each table's slots
// are grouped by shard, then each shard takes its groups from every table. Counts are sums, so the
// total does not depend on which thread counted what.
void merge_into_shards(std::vector<WordTable>& local, std::vector<WordTable>& shards, int threads) {
  const size_t nt = local.size();
  std::vector<std::vector<size_t>> order(nt);                         // slot indices by shard
  std::vector<std::array<size_t, WordTable::kShards + 1>> start(nt);  // shard s: order[start[s], start[s+1])
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (size_t t = 0; t < nt; ++t) {
    const std::vector<WordTable::Slot>& slots = local[t].slots();
    std::array<size_t, WordTable::kShards + 1>& st = start[t];
    st.fill(0);
    for (const WordTable::Slot& s : slots)
      if (s.count) ++st[WordTable::shard_of(s.hash) + 1];
    for (size_t k = 0; k < WordTable::kShards; ++k) st[k + 1] += st[k];
    std::array<size_t, WordTable::kShards> fill{};
    order[t].resize(local[t].size());
    for (size_t i = 0; i < slots.size(); ++i) {
      if (!slots[i].count) continue;
      const size_t k = WordTable::shard_of(slots[i].hash);
      order[t][st[k] + fill[k]++] = i;
    }
  }
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
  for (size_t k = 0; k < WordTable::kShards; ++k) {
    for (size_t t = 0; t < nt; ++t) {
      const std::vector<WordTable::Slot>& slots = local[t].slots();
      for (size_t j = start[t][k]; j < start[t][k + 1]; ++j) {
        const WordTable::Slot& s = slots[order[t][j]];
        shards[k].add(local[t].word(s), s.hash, s.count);
      }
    }
  }
#pragma omp parallel for num_threads(threads) schedule(static, 1)
  for (size_t t = 0; t < nt; ++t) local[t].clear();
}

WordCounts to_word_counts(const std::vector<WordTable>& shards) {
  size_t n = 0;
  for (const WordTable& t : shards) n += t.size();
  WordCounts counts;
  counts.reserve(n);
  for (const WordTable& t : shards)
    for (const WordTable::Slot& s : t.slots())
      if (s.count) counts.emplace(std::string(t.word(s)), s.count);
  return counts;
}

// Counts the words of one piece of text (one thread); returns how many there were.
uint64_t count_piece(std::string_view text, const std::vector<std::string>& specials, const Gpt2Regex& re,
                     WordTable& table) {
  MatchData md(re);
  std::string repaired;
  text = valid_utf8_view(text, repaired);
  uint64_t words = 0;
  for_each_plain_segment(text, specials, [&](std::string_view seg) {
    pretokenize(re, md, seg, [&](std::string_view w) {
      ++words;
      table.add(w);
    });
  });
  return words;
}
struct InputFile {
  fs::path path;
  uint64_t bytes;
};

// Files and directories (regular files under them, recursively, sorted by path so the corpus order
// does not depend on the filesystem).
std::vector<InputFile> collect_inputs(const std::vector<std::string>& inputs) {
  ANVIL_REQUIRE(!inputs.empty(), "train-tokenizer: no --input given");
  std::vector<InputFile> files;
  try {
    for (const std::string& input : inputs) {
      std::error_code ec;
      const fs::file_status st = fs::status(input, ec);
      ANVIL_REQUIRE(!ec && fs::exists(st), "train-tokenizer: input '{}' does not exist", input);
      if (fs::is_regular_file(st)) {
        files.push_back({input, fs::file_size(input)});
      } else if (fs::is_directory(st)) {
        std::vector<InputFile> found;
        for (const fs::directory_entry& e : fs::recursive_directory_iterator(input))
          if (e.is_regular_file()) found.push_back({e.path(), e.file_size()});
        std::sort(found.begin(), found.end(), [](const InputFile& a, const InputFile& b) {
          return a.path.generic_string() < b.path.generic_string();
        });
        files.insert(files.end(), found.begin(), found.end());
      } else {
        ANVIL_THROW("train-tokenizer: input '{}' is neither a regular file nor a directory", input);
      }
    }
  } catch (const fs::filesystem_error& e) {
    ANVIL_THROW("train-tokenizer: cannot list inputs: {}", e.what());
  }
  uint64_t total = 0;
  for (const InputFile& f : files) total += f.bytes;
  if (total == 0) {
    std::string names;
    for (const std::string& input : inputs) names += (names.empty() ? "'" : ", '") + input + "'";
    ANVIL_THROW("train-tokenizer: empty corpus: the input(s) {} contain no text", names);
  }
  return files;
}

class CountProgress {
 public:
  CountProgress(bool enabled, uint64_t total) : enabled_(enabled), total_(total) {}
  void update(uint64_t bytes, uint64_t words, bool last = false) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (!last && now - last_ < std::chrono::seconds(1)) return;
    last_ = now;
    const double s = seconds_since(start_);
    fmt::print(stderr, "train-tokenizer: {} {:.1f}/{:.1f} MB, {:.2f}M words ({:.1f} MB/s)\n",
               last ? "counted" : "counting", bytes / 1e6, total_ / 1e6, words / 1e6,
               s > 0 ? bytes / 1e6 / s : 0.0);
  }

 private:
  bool enabled_;
  uint64_t total_;
  Clock::time_point start_ = Clock::now(), last_ = start_;
};

std::string errno_text(int err) {
  return std::generic_category().message(err);
}

// temp file + fsync + rename + fsync of the directory: `path` is either the old file or the complete new one.
void write_file_atomically(const std::string& path, std::string_view text) {
  const fs::path parent = fs::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    ANVIL_REQUIRE(!ec, "train-tokenizer: cannot create directory '{}' for --output '{}' ({})",
                  parent.string(), path, ec.message());
  }
  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  io::write_text_file_synced(tmp, text);  // removes its partial file on failure
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    fs::remove(tmp, ec);
    ANVIL_THROW("train-tokenizer: cannot rename '{}' to '{}' ({})", tmp, path, errno_text(err));
  }
  const std::string dir = parent.empty() ? "." : parent.string();
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ANVIL_REQUIRE(fd >= 0, "train-tokenizer: cannot open '{}' to fsync it ({})", dir, errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  ANVIL_REQUIRE(rc == 0, "train-tokenizer: fsync of '{}' failed ({})", dir, errno_text(err));
}

}  // namespace

// ---- options -------------------------------------------------------------------------------------

void validate_bpe_options(const BpeTrainOptions& o) {
  const uint64_t min_vocab = 256 + o.special_tokens.size();
  ANVIL_REQUIRE(o.vocab_size >= min_vocab,
                "train-tokenizer: --vocab_size {} is too small: it must be at least {} (256 byte tokens + {} "
                "special tokens)",
                o.vocab_size, min_vocab, o.special_tokens.size());
  ANVIL_REQUIRE(o.vocab_size <= std::numeric_limits<uint32_t>::max(),
                "train-tokenizer: --vocab_size {} is too large (ids are 32-bit)", o.vocab_size);
  ANVIL_REQUIRE(o.chunk_bytes > 0, "train-tokenizer: chunk_bytes must be positive");
  std::unordered_set<std::string> seen;
  const ByteLevelTable& bl = byte_level_table();
  for (const std::string& s : o.special_tokens) {
    ANVIL_REQUIRE(!s.empty(), "train-tokenizer: --special_tokens: empty token");
    ANVIL_REQUIRE(is_valid_utf8(s), "train-tokenizer: --special_tokens: '{}' is not valid UTF-8", s);
    ANVIL_REQUIRE(seen.insert(s).second, "train-tokenizer: --special_tokens: '{}' is given twice", s);
    // A vocab key can name one id only.
    for (const std::string& c : bl.byte_char)
      ANVIL_REQUIRE(s != c, "train-tokenizer: --special_tokens: '{}' is the text of a byte token", s);
  }
}

// ---- pre-tokenizer -------------------------------------------------------------------------------

struct GptPreTokenizer::Impl {
  Gpt2Regex regex;
};

GptPreTokenizer::GptPreTokenizer() : impl_(std::make_unique<Impl>()) {}
GptPreTokenizer::~GptPreTokenizer() = default;

void GptPreTokenizer::split(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  MatchData md(impl_->regex);
  std::string repaired;
  pretokenize(impl_->regex, md, valid_utf8_view(text, repaired), emit);
}

std::vector<std::string> GptPreTokenizer::split(std::string_view text) const {
  std::vector<std::string> out;
  split(text, [&](std::string_view w) { out.emplace_back(w); });
  return out;
}

// ---- counting ------------------------------------------------------------------------------------

WordCounts count_words_in_text(std::string_view text, const std::vector<std::string>& special_tokens) {
  const Gpt2Regex re;
  std::vector<WordTable> table(1), shards(WordTable::kShards);
  count_piece(text, special_tokens, re, table[0]);
  merge_into_shards(table, shards, 1);
  return to_word_counts(shards);
}

namespace {

// count_words, leaving the result in the hash-sharded tables (train_tokenizer trains on them directly).
std::vector<WordTable> count_into_shards(const std::vector<std::string>& inputs, const BpeTrainOptions& o,
                                         CountStats* stats_out) {
  ANVIL_REQUIRE(o.chunk_bytes > 0, "train-tokenizer: chunk_bytes must be positive");
  const auto t0 = Clock::now();
  const std::vector<InputFile> files = collect_inputs(inputs);
  uint64_t total = 0;
  for (const InputFile& f : files) total += f.bytes;

  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  const size_t round_bytes = o.chunk_bytes * size_t(threads);
  // A text with no cut point grows the buffer up to this, then is cut at a character boundary.
  const size_t max_buffer = std::max(size_t{256} << 20, 4 * round_bytes);
  std::vector<std::string> ws_specials;  // only these can straddle a cut point
  size_t ws_special_len = 0;
  for (const std::string& s : o.special_tokens) {
    if (std::any_of(s.begin(), s.end(), [](char c) { return ascii_space(uint8_t(c)); })) {
      ws_specials.push_back(s);
      ws_special_len = std::max(ws_special_len, s.size());
    }
  }

  const Gpt2Regex re;
  std::vector<WordTable> local(static_cast<size_t>(threads)), shards(WordTable::kShards);
  CountStats stats;
  stats.files = files.size();
  CountProgress progress(o.progress, total);

  // A round is a list of independent pieces of about chunk_bytes, possibly from several files (so
  // directories of small files are counted in parallel too); threads take pieces dynamically.
  std::vector<std::string> pieces;
  size_t pending = 0;
  auto count_round = [&] {
    const int n = int(pieces.size());
    std::vector<uint64_t> words(pieces.size());
    std::vector<std::exception_ptr> errors(pieces.size());
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (n > 1)
    for (int i = 0; i < n; ++i) {
      try {
        words[size_t(i)] =
            count_piece(pieces[size_t(i)], o.special_tokens, re, local[size_t(omp_get_thread_num())]);
      } catch (...) {
        errors[size_t(i)] = std::current_exception();
      }
    }
    for (int i = 0; i < n; ++i) {
      if (errors[size_t(i)]) std::rethrow_exception(errors[size_t(i)]);
      stats.words += words[size_t(i)];
    }
    merge_into_shards(local, shards, threads);
    pieces.clear();
    pending = 0;
    progress.update(stats.bytes, stats.words);
  };
  // `text` ends at a cut point or at the end of a file.
  auto add_text = [&](std::string_view text) {
    size_t begin = 0;
    while (text.size() - begin > o.chunk_bytes) {
      const size_t cut = find_cut(text, begin, begin + o.chunk_bytes, ws_specials);
      if (cut == 0) break;
      pieces.emplace_back(text.substr(begin, cut - begin));
      begin = cut;
    }
    if (begin < text.size()) pieces.emplace_back(text.substr(begin));
    pending += text.size();
    if (pending >= round_bytes) count_round();
  };

  std::string buf;
  for (const InputFile& file : files) {
    std::ifstream in(file.path, std::ios::binary);
    ANVIL_REQUIRE(in.is_open(), "train-tokenizer: cannot open input '{}'", file.path.string());
    bool eof = false, first = true;
    size_t want = round_bytes;
    uint64_t remaining = file.bytes;  // as listed; a file that grows meanwhile is read to its end
    buf.clear();
    while (!eof || !buf.empty()) {
      if (!eof && buf.size() < want) {
        const size_t old = buf.size();
        // One byte more than is left shows the end without another read, and small files do not
        // allocate (and zero) a whole round's buffer.
        const size_t to_read = size_t(std::min<uint64_t>(want - old, remaining + 1));
        buf.resize(old + to_read);
        in.read(buf.data() + old, std::streamsize(to_read));
        const auto got = size_t(in.gcount());
        buf.resize(old + got);
        ANVIL_REQUIRE(!in.bad(), "train-tokenizer: read error in input '{}'", file.path.string());
        eof = got < to_read;
        remaining -= std::min<uint64_t>(remaining, got);
        stats.bytes += got;
        if (first && buf.compare(0, 3, "\xEF\xBB\xBF") == 0)
          buf.erase(0, 3);  // a byte order mark is not text
        first = false;
      }
      size_t end = buf.size();
      if (!eof) {
        // Leave room for a special token that starts before the cut to be seen whole.
        const size_t hi = buf.size() - std::min(buf.size(), ws_special_len + 1);
        end = find_cut(buf, 0, hi, ws_specials);
        if (end == 0) {
          if (buf.size() < max_buffer) {  // one huge "word": read more before cutting
            want = std::max(buf.size() * 2, round_bytes);
            continue;
          }
          end = hi;  // degenerate input: cut at a character boundary
          while (end > 1 && (uint8_t(buf[end]) & 0xC0) == 0x80) --end;
        }
      }
      add_text(std::string_view(buf).substr(0, end));
      buf.erase(0, end);
      want = std::max(round_bytes, buf.size() + o.chunk_bytes);
    }
  }
  if (!pieces.empty()) count_round();
  stats.seconds = seconds_since(t0);
  progress.update(stats.bytes, stats.words, true);
  if (stats_out) *stats_out = stats;
  return shards;
}

}  // namespace

WordCounts count_words(const std::vector<std::string>& inputs, const BpeTrainOptions& options,
                       CountStats* stats) {
  return to_word_counts(count_into_shards(inputs, options, stats));
}

// ---- training ------------------------------------------------------------------------------------

namespace {

// Pair -> count change during one merge: open addressing whose clear() costs what was used (a merge of
// a rare pair must not pay for the table a frequent one grew), no allocation per key.
class DeltaMap {
 public:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // no pair: token ids stay below 2^32 - 1

  DeltaMap() : keys_(1024, kEmpty), values_(1024) {}
  void add(uint64_t key, int64_t d) {
    for (size_t i = slot(key);; i = (i + 1) & (keys_.size() - 1)) {
      if (keys_[i] == key) {
        values_[i] += d;
        return;
      }
      if (keys_[i] == kEmpty) {
        keys_[i] = key;
        values_[i] = d;
        used_.push_back(i);
        if (used_.size() * 2 > keys_.size()) grow();
        return;
      }
    }
  }
  template <class F>
  void for_each(F&& f) const {
    for (size_t i : used_) f(keys_[i], values_[i]);
  }
  void clear() {
    for (size_t i : used_) keys_[i] = kEmpty;
    used_.clear();
  }

 private:
  size_t slot(uint64_t key) const {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return size_t(key) & (keys_.size() - 1);
  }
  void grow() {
    std::vector<uint64_t> old_keys(keys_.size() * 2, kEmpty);
    std::vector<int64_t> old_values(values_.size() * 2);
    old_keys.swap(keys_);
    old_values.swap(values_);
    const std::vector<size_t> old_used = std::move(used_);
    used_.clear();
    for (size_t i : old_used) {
      size_t j = slot(old_keys[i]);
      while (keys_[j] != kEmpty) j = (j + 1) & (keys_.size() - 1);
      keys_[j] = old_keys[i];
      values_[j] = old_values[i];
      used_.push_back(j);
    }
  }

  std::vector<uint64_t> keys_;
  std::vector<int64_t> values_;
  std::vector<size_t> used_;
};

// What merging one pair changes in a range of words.
struct MergeDelta {
  DeltaMap delta;
  std::vector<std::pair<uint64_t, uint32_t>> gained;  // (pair, word) where the pair appeared
};

// BPE on the words `for_each_word(f)` hands to f(word bytes, count); see train_bpe.
template <class ForEachWord>
BpeModel train_words(ForEachWord&& for_each_word, size_t n_words, const BpeTrainOptions& o) {
  validate_bpe_options(o);
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  const auto t0 = Clock::now();
  const ByteLevelTable& bl = byte_level_table();
  BpeModel m;
  m.special_tokens = o.special_tokens;
  std::array<uint32_t, 256> byte_id{};
  for (uint32_t id = 0; id < 256; ++id) {
    m.tokens.emplace_back(1, char(bl.id_byte[id]));
    byte_id[bl.id_byte[id]] = id;
  }
  std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>> token_id;
  for (uint32_t id = 0; id < 256; ++id) token_id.emplace(m.tokens[id], id);
  const std::unordered_set<std::string> specials(o.special_tokens.begin(), o.special_tokens.end());
  const uint64_t bpe_target = o.vocab_size - o.special_tokens.size();

  // Symbols of all words stored flat; merging shrinks a word in place. The word order does not matter:
  // every step picks the maximum of a total order (count, then bytes), whatever order pairs are seen in.
  struct Word {  // one cache line fetch per word touched
    uint32_t start, len;
    int64_t count;
  };
  std::vector<uint32_t> syms;
  std::vector<Word> word_recs;
  word_recs.reserve(n_words);
  for_each_word([&](std::string_view word, uint64_t c) {
    word_recs.push_back({uint32_t(syms.size()), uint32_t(word.size()), int64_t(c)});
    for (char ch : word) syms.push_back(byte_id[uint8_t(ch)]);
  });
  ANVIL_ASSERT(syms.size() < std::numeric_limits<uint32_t>::max(), "too many symbols: {}", syms.size());

  auto key = [](uint32_t a, uint32_t b) { return (uint64_t(a) << 32) | b; };
  // Where each pair occurs: a superset of the words holding it (stale entries are harmless no-ops).
  struct PairInfo {
    int64_t count = 0;
    std::vector<uint32_t> words;
  };
  std::unordered_map<uint64_t, PairInfo> pairs;
  for (uint32_t w = 0; w < uint32_t(word_recs.size()); ++w) {
    const Word& wd = word_recs[w];
    for (uint32_t i = 0; i + 1 < wd.len; ++i) {
      PairInfo& p = pairs[key(syms[wd.start + i], syms[wd.start + i + 1])];
      p.count += wd.count;
      if (p.words.empty() || p.words.back() != w) p.words.push_back(w);
    }
  }

  // Max-heap with lazy updates: counts of existing pairs only fall, so a popped entry whose count is
  // stale is pushed back with the current one; pairs that gain get a fresh entry.
  struct Entry {
    int64_t count;
    uint32_t a, b;
  };
  const auto lower = [&m](const Entry& x, const Entry& y) {
    if (x.count != y.count) return x.count < y.count;
    const int ca = m.tokens[x.a].compare(m.tokens[y.a]);
    if (ca != 0) return ca > 0;
    return m.tokens[x.b].compare(m.tokens[y.b]) > 0;
  };
  std::vector<Entry> heap;
  heap.reserve(pairs.size());
  for (const auto& [k, p] : pairs) heap.push_back({p.count, uint32_t(k >> 32), uint32_t(k)});
  std::make_heap(heap.begin(), heap.end(), lower);

  std::vector<MergeDelta> parts(static_cast<size_t>(threads));
  // Merges (a, b) -> nid in words[lo, hi). Words are disjoint, so ranges can run in parallel.
  auto merge_words = [&](const std::vector<uint32_t>& words, size_t lo, size_t hi, uint32_t a, uint32_t b,
                         uint32_t nid, MergeDelta& md) {
    auto change = [&md](uint64_t k, int64_t d, uint32_t w) {
      md.delta.add(k, d);
      if (d > 0) md.gained.emplace_back(k, w);
    };
    for (size_t i = lo; i < hi; ++i) {
      // The words are scattered: fetch ahead (the record, then its symbols once the record is in).
      if (i + 16 < hi) __builtin_prefetch(&word_recs[words[i + 16]]);
      if (i + 8 < hi) __builtin_prefetch(syms.data() + word_recs[words[i + 8]].start);
      const uint32_t w = words[i];
      uint32_t* s = syms.data() + word_recs[w].start;
      const uint32_t n = word_recs[w].len;
      const int64_t c = word_recs[w].count;
      uint32_t out = 0;
      // Left to right, non-overlapping (as the encoder applies a merge); s[r + 2] is still unwritten.
      for (uint32_t r = 0; r < n;) {
        if (r + 1 < n && s[r] == a && s[r + 1] == b) {
          if (out > 0) change(key(s[out - 1], a), -c, w), change(key(s[out - 1], nid), c, w);
          if (r + 2 < n) change(key(b, s[r + 2]), -c, w), change(key(nid, s[r + 2]), c, w);
          s[out++] = nid;
          r += 2;
        } else {
          s[out++] = s[r++];
        }
      }
      word_recs[w].len = out;
    }
  };
  const uint64_t total_merges = bpe_target - 256;
  uint64_t next_report = o.progress_every_merges;

  while (m.tokens.size() < bpe_target) {
    if (heap.empty()) {
      m.stopped_early = true;
      break;
    }
    std::pop_heap(heap.begin(), heap.end(), lower);
    const Entry top = heap.back();
    heap.pop_back();
    const uint64_t k = key(top.a, top.b);
    auto it = pairs.find(k);
    const int64_t actual = it == pairs.end() ? 0 : it->second.count;
    if (actual != top.count) {
      if (actual > 0) {
        heap.push_back({actual, top.a, top.b});
        std::push_heap(heap.begin(), heap.end(), lower);
      }
      continue;
    }
    if (uint64_t(actual) < o.min_frequency) {
      m.stopped_early = true;
      break;
    }
    std::string merged = m.tokens[top.a] + m.tokens[top.b];
    if (!specials.empty() && specials.count(byte_level_string(merged))) {
      pairs.erase(it);  // its vocab key would collide with a special token's
      continue;
    }
    uint32_t nid;
    if (auto found = token_id.find(merged); found != token_id.end()) {
      nid = found->second;  // another merge already made these bytes: same token, as `tokenizers` does
    } else {
      nid = uint32_t(m.tokens.size());
      token_id.emplace(merged, nid);
      m.tokens.push_back(std::move(merged));
    }
    m.merges.emplace_back(top.a, top.b);
    m.merge_results.push_back(nid);

    std::vector<uint32_t> words = std::move(it->second.words);
    pairs.erase(it);
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    // Frequent pairs touch many words scattered in memory: split those across threads (the result is
    // the same: changes are summed, and each pair's word list is sorted before use).
    const size_t nparts = words.size() >= std::max<size_t>(o.parallel_merge_min_words, 1) ? parts.size() : 1;
#pragma omp parallel for num_threads(threads) schedule(static, 1) if (nparts > 1)
    for (size_t t = 0; t < nparts; ++t)
      merge_words(words, words.size() * t / nparts, words.size() * (t + 1) / nparts, top.a, top.b, nid,
                  parts[t]);
    MergeDelta& md = parts[0];
    for (size_t t = 1; t < nparts; ++t) {
      parts[t].delta.for_each([&](uint64_t pk, int64_t d) { md.delta.add(pk, d); });
      md.gained.insert(md.gained.end(), parts[t].gained.begin(), parts[t].gained.end());
      parts[t].delta.clear();
      parts[t].gained.clear();
    }
    md.delta.for_each([&](uint64_t pk, int64_t d) {
      if (pk == k || d == 0) return;  // the merged pair is gone from every word
      PairInfo& p = pairs[pk];
      p.count += d;
      ANVIL_ASSERT(p.count >= 0, "negative pair count {}", p.count);
      if (d > 0) {
        heap.push_back({p.count, uint32_t(pk >> 32), uint32_t(pk)});
        std::push_heap(heap.begin(), heap.end(), lower);
      }
    });
    for (const auto& [pk, w] : md.gained) {
      auto p = pairs.find(pk);
      if (p != pairs.end() && p->second.count > 0 && (p->second.words.empty() || p->second.words.back() != w))
        p->second.words.push_back(w);
    }
    md.delta.for_each([&](uint64_t pk, int64_t d) {  // drop emptied pairs (their heap entries die lazily)
      if (d >= 0) return;
      auto p = pairs.find(pk);
      if (p != pairs.end() && p->second.count == 0) pairs.erase(p);
    });
    md.delta.clear();
    md.gained.clear();

    if (o.progress && m.merges.size() >= next_report) {
      next_report += o.progress_every_merges;
      fmt::print(stderr, "train-tokenizer: merge {}: {}/{} new tokens, last '{}' (count {}), {:.1f}s\n",
                 m.merges.size(), m.tokens.size() - 256, total_merges, byte_level_string(m.tokens[nid]),
                 actual, seconds_since(t0));
    }
  }
  if (o.progress) {
    fmt::print(stderr, "train-tokenizer: {} merges, {} BPE tokens in {:.2f}s{}\n", m.merges.size(),
               m.tokens.size(), seconds_since(t0),
               m.stopped_early ? fmt::format(" (stopped before vocab_size {}: no pair occurs {} times)",
                                             o.vocab_size, o.min_frequency)
                               : "");
  }
  return m;
}

}  // namespace

BpeModel train_bpe(const WordCounts& word_counts, const BpeTrainOptions& options) {
  return train_words(
      [&](auto&& f) {
        for (const auto& [word, count] : word_counts) f(word, count);
      },
      word_counts.size(), options);
}

// ---- output --------------------------------------------------------------------------------------

std::string byte_level_string(std::string_view bytes) {
  const ByteLevelTable& bl = byte_level_table();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += bl.byte_char[uint8_t(c)];
  return out;
}

std::string tokenizer_json(const BpeModel& m) {
  // Written by hand to keep the vocab in id order and to match serde_json's pretty printer (2-space
  // indent, one element per line), which is how `tokenizers` saves; strings are escaped by nlohmann.
  auto q = [](std::string_view s) { return nlohmann::json(std::string(s)).dump(); };
  std::string o;
  o.reserve(m.tokens.size() * 40 + 4096);
  o += "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [";
  for (size_t i = 0; i < m.special_tokens.size(); ++i) {
    o += fmt::format(
        "{}\n    {{\n      \"id\": {},\n      \"content\": {},\n      \"single_word\": false,\n"
        "      \"lstrip\": false,\n      \"rstrip\": false,\n      \"normalized\": false,\n"
        "      \"special\": true\n    }}",
        i ? "," : "", m.tokens.size() + i, q(m.special_tokens[i]));
  }
  o += m.special_tokens.empty() ? "],\n" : "\n  ],\n";
  auto byte_level = [](const char* indent, bool prefix, bool trim) {
    return fmt::format(
        "{{\n{0}  \"type\": \"ByteLevel\",\n{0}  \"add_prefix_space\": {1},\n{0}  \"trim_offsets\": {2},\n"
        "{0}  \"use_regex\": true\n{0}}}",
        indent, prefix, trim);
  };
  o += "  \"normalizer\": null,\n";
  // As GPT-2 and `tokenizers`' ByteLevelBPETokenizer: the post-processor and decoder settings only
  // affect offsets and decoding of a prefix space, never the ids.
  o += "  \"pre_tokenizer\": " + byte_level("  ", false, true) + ",\n";
  o += "  \"post_processor\": " + byte_level("  ", true, false) + ",\n";
  o += "  \"decoder\": " + byte_level("  ", true, true) + ",\n";
  o += "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
       "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n    \"fuse_unk\": "
       "false,\n"
       "    \"byte_fallback\": false,\n    \"ignore_merges\": false,\n    \"vocab\": {";
  std::vector<std::string> mapped(m.tokens.size());
  for (size_t id = 0; id < m.tokens.size(); ++id) {
    mapped[id] = byte_level_string(m.tokens[id]);
    o += fmt::format("{}\n      {}: {}", id ? "," : "", q(mapped[id]), id);
  }
  for (size_t i = 0; i < m.special_tokens.size(); ++i)
    o += fmt::format(",\n      {}: {}", q(m.special_tokens[i]), m.tokens.size() + i);
  o += "\n    },\n    \"merges\": [";
  for (size_t i = 0; i < m.merges.size(); ++i) {
    o += fmt::format("{}\n      [\n        {},\n        {}\n      ]", i ? "," : "",
                     q(mapped[m.merges[i].first]), q(mapped[m.merges[i].second]));
  }
  o += m.merges.empty() ? "]\n  }\n}" : "\n    ]\n  }\n}";
  return o;
}

TrainTokenizerStats train_tokenizer(const std::vector<std::string>& inputs, const std::string& output,
                                    const BpeTrainOptions& o) {
  validate_bpe_options(o);
  ANVIL_REQUIRE(!output.empty(), "train-tokenizer: --output is empty");
  std::error_code ec;
  ANVIL_REQUIRE(!fs::is_directory(output, ec),
                "train-tokenizer: --output '{}' is a directory (give a file name)", output);
  TrainTokenizerStats st;
  const std::vector<WordTable> shards = count_into_shards(inputs, o, &st.count);
  for (const WordTable& t : shards) st.distinct_words += t.size();
  const auto t0 = Clock::now();
  const BpeModel model = train_words(
      [&](auto&& f) {
        for (const WordTable& t : shards)
          for (const WordTable::Slot& s : t.slots())
            if (s.count) f(t.word(s), s.count);
      },
      st.distinct_words, o);
  st.train_seconds = seconds_since(t0);
  st.vocab_size = model.vocab_size();
  st.merges = model.merges.size();
  st.stopped_early = model.stopped_early;
  write_file_atomically(output, tokenizer_json(model));
  return st;
}

}  // namespace anvil::data
