#include "data/text_sources.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "anvil/error.hpp"

namespace anvil::data {

namespace fs = std::filesystem;

namespace {

constexpr size_t kReadBlockBytes = size_t{1} << 20;
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

bool is_continuation(unsigned char c) {
  return (c & 0xC0) == 0x80;
}

// Length of the UTF-8 sequence at p[0, n): the whole sequence when well-formed (returns true), else
// its maximal subpart, the longest prefix that could start a well-formed sequence (at least 1).
bool utf8_sequence(const unsigned char* p, size_t n, size_t& len) {
  const unsigned char c = p[0];
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte (Unicode table 3-7)
  if (c < 0x80) {
    len = 1;
    return true;
  } else if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;  // no overlong forms
    if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    len = 1;
    return false;
  }
  for (size_t i = 1; i <= need; ++i) {
    const bool ok = i < n && (i == 1 ? p[i] >= lo && p[i] <= hi : is_continuation(p[i]));
    if (!ok) {
      len = i;
      return false;
    }
  }
  len = need + 1;
  return true;
}

// Offset of the first ill-formed sequence, or n.
size_t first_invalid_utf8(const unsigned char* p, size_t n) {
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    size_t len;
    if (!utf8_sequence(p + i, n - i, len)) return i;
    i += len;
  }
  return n;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

bool is_alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Formats and file lists

InputFormat parse_input_format(std::string_view name) {
  if (name == "auto") return InputFormat::Auto;
  if (name == "text") return InputFormat::Text;
  if (name == "jsonl") return InputFormat::Jsonl;
  if (name == "csv") return InputFormat::Csv;
  ANVIL_THROW("prepare: unknown --format '{}' (expected auto, text, jsonl or csv)", name);
}

std::string_view input_format_name(InputFormat format) {
  switch (format) {
    case InputFormat::Auto:
      return "auto";
    case InputFormat::Text:
      return "text";
    case InputFormat::Jsonl:
      return "jsonl";
    case InputFormat::Csv:
      return "csv";
  }
  return "?";
}

InputFormat input_format_for_path(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (ext == ".jsonl" || ext == ".json") return InputFormat::Jsonl;
  if (ext == ".csv") return InputFormat::Csv;
  return InputFormat::Text;
}

std::vector<SourceFile> collect_sources(const std::vector<std::string>& inputs, InputFormat format) {
  std::vector<SourceFile> files;
  auto add = [&](const fs::path& p, uint64_t bytes) {
    const std::string s = p.string();
    files.push_back({s, bytes, format == InputFormat::Auto ? input_format_for_path(s) : format});
  };
  try {
    for (const std::string& input : inputs) {
      std::error_code ec;
      const fs::file_status status = fs::status(input, ec);
      if (ec || !fs::exists(status)) ANVIL_THROW("prepare: input '{}' does not exist", input);
      if (fs::is_regular_file(status)) {
        add(input, fs::file_size(input));
      } else if (fs::is_directory(status)) {
        std::vector<fs::path> dir_files;
        for (const fs::directory_entry& entry : fs::recursive_directory_iterator(input)) {
          if (entry.is_regular_file()) dir_files.push_back(entry.path());
        }
        std::sort(dir_files.begin(), dir_files.end(), [](const fs::path& a, const fs::path& b) {
          return a.generic_string() < b.generic_string();
        });
        for (const fs::path& p : dir_files) add(p, fs::file_size(p));
      } else {
        ANVIL_THROW("prepare: input '{}' is neither a regular file nor a directory", input);
      }
    }
  } catch (const fs::filesystem_error& e) {
    ANVIL_THROW("prepare: cannot list inputs: {}", e.what());  // e.g. an unreadable directory
  }
  return files;
}

// ---------------------------------------------------------------------------------------------------
// UTF-8

uint64_t repair_utf8(std::string& text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = first_invalid_utf8(p, n);
  if (i == n) return 0;
  std::string out;
  out.reserve(n + n / 8 + 16);
  out.append(text, 0, i);
  uint64_t replacements = 0;
  while (i < n) {
    const size_t valid_end = i + first_invalid_utf8(p + i, n - i);
    out.append(text, i, valid_end - i);
    i = valid_end;
    if (i == n) break;
    size_t len;
    utf8_sequence(p + i, n - i, len);
    out += kReplacement;
    ++replacements;
    i += len;
  }
  text.swap(out);
  return replacements;
}

// ---------------------------------------------------------------------------------------------------
// BufferedFile

BufferedFile::BufferedFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) ANVIL_THROW("prepare: cannot open input '{}': {}", path_, std::strerror(errno));
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);  // a hint: read ahead aggressively
}

BufferedFile::~BufferedFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t BufferedFile::fill(size_t want) {
  if (available() >= want || eof_) return available();
  buf_.erase(0, pos_);  // keep only the unconsumed tail (at most a few MiB are ever buffered)
  pos_ = 0;
  while (buf_.size() < want && !eof_) {
    const size_t old = buf_.size();
    buf_.resize(old + std::max(kReadBlockBytes, want - old));
    ssize_t n;
    do {
      n = ::read(fd_, buf_.data() + old, buf_.size() - old);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      const std::string why = std::strerror(errno);
      buf_.resize(old);
      ANVIL_THROW("prepare: read error in input '{}': {}", path_, why);
    }
    buf_.resize(old + static_cast<size_t>(n));
    if (n == 0) eof_ = true;
  }
  return available();
}

void BufferedFile::skip_bom() {
  if (fill(3) >= 3 && std::memcmp(data(), "\xEF\xBB\xBF", 3) == 0) consume(3);
}

// ---------------------------------------------------------------------------------------------------
// TextSegmenter

TextSegmenter::TextSegmenter(std::string path, std::optional<uint64_t> forced_cut)
    : BufferedFile(std::move(path)), cut_(forced_cut) {}

bool TextSegmenter::next(Segment& segment) {
  if (!started_) {
    started_ = true;
    skip_bom();
    if (fill(1) == 0) {  // an empty file: one empty segment, so it still counts as a document
      segment.text.clear();
      segment.before_cut = !cut_ || *cut_ > consumed();
      segment.ends_at_cut = false;
      segment.last = true;
      return true;
    }
  }
  // kMaxBytes plus the look-ahead of the rules below (one byte after a newline, 3 after a forced cut).
  const size_t avail = fill(kMaxBytes + 4);
  if (avail == 0) return false;
  const char* p = data();
  const uint64_t start = consumed();

  // Cuts go before whitespace that follows an ASCII letter or digit: no pre-tokenizer regex in use
  // (GPT-2's, Llama 3's, BERT's whitespace/punctuation split) forms a pre-token across such a point
  // or looks back over it, so tokenising the segments gives the ids of tokenising the whole text.
  // First choice: before the first such newline at or past kTargetBytes; then before any such
  // whitespace; then (text without ASCII word ends) at a character start. Every byte examined lies
  // within kMaxBytes + 1 of the start or before the end of the file, so the outcome does not depend
  // on how much happens to be buffered.
  const bool rest_fits = at_eof() && avail <= kMaxBytes;
  const size_t limit = rest_fits ? avail - 1 : kMaxBytes;  // the last candidate cut
  size_t end = 0;
  for (size_t j = kTargetBytes; j <= limit && end == 0;) {
    const void* nl = std::memchr(p + j, '\n', limit + 1 - j);
    if (!nl) break;
    j = static_cast<size_t>(static_cast<const char*>(nl) - p);
    if (is_alnum(p[j - 1])) end = j;
    ++j;
  }
  for (size_t j = kTargetBytes; j <= limit && end == 0; ++j)
    if (is_space(p[j]) && is_alnum(p[j - 1])) end = j;
  if (end == 0 && rest_fits) end = avail;
  if (end == 0) {
    end = kMaxBytes;
    for (int k = 0; k < 3 && end > 1 && is_continuation(static_cast<unsigned char>(p[end])); ++k) --end;
  }

  if (cut_ && !cut_resolved_ && (*cut_ <= start + kMaxBytes || at_eof())) {
    // Move the cut off continuation bytes (at most 3, the longest run in well-formed UTF-8).
    uint64_t c = std::max(*cut_, start);
    for (int k = 0; k < 3 && c < start + avail && is_continuation(static_cast<unsigned char>(p[c - start]));
         ++k)
      ++c;
    cut_ = c;
    cut_resolved_ = true;
  }
  segment.before_cut = !cut_ || start < *cut_;
  if (segment.before_cut && cut_ && *cut_ < start + end) end = static_cast<size_t>(*cut_ - start);
  segment.ends_at_cut = segment.before_cut && cut_resolved_ && start + end == *cut_;

  segment.text.assign(p, end);
  consume(end);
  segment.last = at_eof() && available() == 0;
  return true;
}

// ---------------------------------------------------------------------------------------------------
// LineReader

LineReader::LineReader(std::string path) : BufferedFile(std::move(path)) {
  skip_bom();
}

bool LineReader::next(std::string& line) {
  size_t scanned = 0;  // bytes already searched for '\n'
  for (;;) {
    const size_t avail = available();
    const void* nl = avail > scanned ? std::memchr(data() + scanned, '\n', avail - scanned) : nullptr;
    if (nl || (at_eof() && avail > 0)) {
      const size_t len = nl ? static_cast<size_t>(static_cast<const char*>(nl) - data()) : avail;
      line.assign(data(), len);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      consume(nl ? len + 1 : len);
      ++line_;
      return true;
    }
    if (at_eof()) return false;
    scanned = avail;
    fill(avail + (size_t{1} << 20));
  }
}

// ---------------------------------------------------------------------------------------------------
// CsvReader

CsvReader::CsvReader(std::string path) : BufferedFile(std::move(path)) {
  skip_bom();
}

int CsvReader::peek() {
  if (available() == 0 && fill(1) == 0) return -1;
  return static_cast<unsigned char>(*data());
}

int CsvReader::get() {
  const int c = peek();
  if (c >= 0) consume(1);
  if (c == '\n') ++line_;
  return c;
}

bool CsvReader::next(std::vector<std::string>& fields) {
  fields.clear();
  // Blank lines between records are not records.
  for (;;) {
    const int c = peek();
    if (c == '\n') {
      get();
    } else if (c == '\r' && fill(2) >= 2 && data()[1] == '\n') {
      get(), get();
    } else if (c < 0) {
      return false;
    } else {
      break;
    }
  }
  record_line_ = line_;
  enum class State { FieldStart, Unquoted, Quoted, AfterQuote } state = State::FieldStart;
  std::string field;
  size_t record_bytes = 0;
  for (;;) {
    const int c = get();
    if (c < 0) {
      ANVIL_REQUIRE(state != State::Quoted,
                    "prepare: CSV '{}': the quoted field of the record starting at line {} is never closed "
                    "(a missing '\"')",
                    path(), record_line_);
      fields.push_back(std::move(field));
      return true;
    }
    ANVIL_REQUIRE(
        ++record_bytes <= kMaxRecordBytes,
        "prepare: CSV '{}': the record starting at line {} is larger than {} MiB (an unclosed quote?)",
        path(), record_line_, kMaxRecordBytes >> 20);
    const bool crlf = c == '\r' && peek() == '\n';
    if (state == State::Quoted) {
      if (c == '"') {
        state = State::AfterQuote;
      } else {
        field += static_cast<char>(c);
      }
      continue;
    }
    if (state == State::AfterQuote && c == '"') {  // a doubled quote inside a quoted field
      field += '"';
      state = State::Quoted;
      continue;
    }
    if (c == ',') {
      fields.push_back(std::move(field));
      field.clear();
      state = State::FieldStart;
    } else if (c == '\n' || crlf) {
      if (crlf) get();
      fields.push_back(std::move(field));
      return true;
    } else if (c == '"' && state == State::FieldStart) {
      state = State::Quoted;
    } else {
      field += static_cast<char>(c);
      state = State::Unquoted;
    }
  }
}

}  // namespace anvil::data
