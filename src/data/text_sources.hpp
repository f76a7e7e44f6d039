// Inputs of `anvil prepare-data`: which files a set of paths names, and streaming readers for them.
// Plain text is cut into ~1 MiB segments at line boundaries, JSON Lines is read a line at a time and
// CSV (RFC 4180) a record at a time, so no reader ever holds more than a few MiB plus one record.
// Also: UTF-8 repair (ill-formed sequences -> U+FFFD).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::data {

enum class InputFormat { Auto, Text, Jsonl, Csv };

// "auto", "text", "jsonl", "csv"; throws naming the value otherwise.
InputFormat parse_input_format(std::string_view name);
std::string_view input_format_name(InputFormat format);
// By extension: .jsonl/.json -> Jsonl (JSON Lines), .csv -> Csv, anything else -> Text.
InputFormat input_format_for_path(const std::string& path);

struct SourceFile {
  std::string path;
  uint64_t bytes = 0;
  InputFormat format = InputFormat::Text;  // resolved: never Auto
};

// Expands `inputs` (files, or directories: every regular file under them, recursively, in sorted
// path order so the result does not depend on the filesystem's listing order) and resolves each
// file's format (`format`, or by extension when Auto). Throws naming an input that does not exist.
std::vector<SourceFile> collect_sources(const std::vector<std::string>& inputs, InputFormat format);

// Replaces each ill-formed UTF-8 sequence in `text` by U+FFFD, one per maximal subpart (the
// Unicode/WHATWG practice, e.g. "\xE2\x82" -> one U+FFFD, "\xFF\xFF" -> two). Returns the number of
// replacements; well-formed text is only scanned (8 bytes at a time through ASCII), never copied.
uint64_t repair_utf8(std::string& text);

// Sequential, buffered reading of one file: the common base of the readers below.
class BufferedFile {
 public:
  explicit BufferedFile(std::string path);
  ~BufferedFile();
  BufferedFile(const BufferedFile&) = delete;
  BufferedFile& operator=(const BufferedFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t consumed() const { return consumed_; }  // bytes handed out so far (the file position)

 protected:
  // Ensures at least `want` unconsumed bytes are buffered, or the whole rest of the file; returns
  // the number buffered. Throws naming the file on a read error.
  size_t fill(size_t want);
  size_t available() const { return buf_.size() - pos_; }
  const char* data() const { return buf_.data() + pos_; }
  void consume(size_t n) { pos_ += n, consumed_ += n; }
  bool at_eof() const { return eof_; }
  void skip_bom();  // a leading UTF-8 byte order mark is not content

 private:
  std::string path_;
  int fd_ = -1;
  std::string buf_;
  size_t pos_ = 0;  // first unconsumed byte of buf_
  uint64_t consumed_ = 0;
  bool eof_ = false;
};

// Cuts a text file into segments (units of tokenisation work; not documents), content-defined and
// placed where tokenisers see a word boundary (before whitespace that follows an ASCII letter or
// digit), so the ids of the segments are the ids of the whole text: preferably before the first
// such newline at or past 1 MiB into the segment, else before any such whitespace, else (text with
// no ASCII word end, e.g. unspaced CJK) at the last UTF-8 character start at or before 2 MiB. Cuts
// never depend on how reads happened to fall. An empty file gives one empty segment.
class TextSegmenter : public BufferedFile {
 public:
  static constexpr size_t kTargetBytes = size_t{1} << 20;
  static constexpr size_t kMaxBytes = size_t{2} << 20;

  // `forced_cut`: a file offset where an extra cut goes (the train/validation boundary), moved
  // forward past UTF-8 continuation bytes so no character is split.
  TextSegmenter(std::string path, std::optional<uint64_t> forced_cut);

  struct Segment {
    std::string text;
    bool before_cut = true;    // starts before the forced cut (or there is none)
    bool ends_at_cut = false;  // ends exactly at the forced cut
    bool last = false;         // the file's last segment
  };
  bool next(Segment& segment);  // false after the last segment

 private:
  std::optional<uint64_t> cut_;
  bool cut_resolved_ = false;
  bool started_ = false;
};

// JSON Lines: one line at a time ('\n' or "\r\n" endings; the last line may lack one).
class LineReader : public BufferedFile {
 public:
  explicit LineReader(std::string path);
  bool next(std::string& line);                   // false at the end of the file
  uint64_t line_number() const { return line_; }  // 1-based number of the last line returned

 private:
  uint64_t line_ = 0;
};

// CSV per RFC 4180: fields separated by commas, records by LF or CRLF; a field in double quotes may
// hold commas, line breaks and doubled quotes (""). Leniencies: blank lines are skipped, a quote
// inside an unquoted field and text after a closing quote are kept literally. An unclosed quote
// (or any record over 64 MiB) is an error naming the file and the line where the record starts.
class CsvReader : public BufferedFile {
 public:
  static constexpr size_t kMaxRecordBytes = size_t{64} << 20;

  explicit CsvReader(std::string path);
  bool next(std::vector<std::string>& fields);           // false at the end of the file
  uint64_t record_line() const { return record_line_; }  // 1-based line where the last record started

 private:
  int peek();
  int get();

  uint64_t line_ = 1;  // line of the next unread byte
  uint64_t record_line_ = 0;
};

}  // namespace anvil::data
