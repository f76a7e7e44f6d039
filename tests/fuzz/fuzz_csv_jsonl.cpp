// libFuzzer target: the prepare-data input readers (LineReader for JSON Lines, CsvReader, TextSegmenter)
// and a whole prepare_data run on arbitrary bytes.
//
// Input: byte 0 picks the mode (its value mod 4), the rest is the file:
//   0  LineReader: the lines put back together are the file (BOM dropped, one '\r' before each '\n')
//   1  CsvReader: records start on non-decreasing lines, and an error names the file
//   2  TextSegmenter with a forced cut taken from the next 2 bytes: the segments put back together are the
//      file, the cut lands on a character boundary, and the flags are consistent
//   3  prepare_data (bytes tokenizer, one thread) with the format and options from the next byte: output
//      or an anvil::Error, never a crash or another exception
#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "data/prepare.hpp"
#include "data/text_sources.hpp"
#include "data/tokenizer.hpp"
#include "data/unicode.hpp"
#include "fuzz_common.hpp"

namespace {

using namespace anvil::data;
namespace fs = std::filesystem;

std::string_view without_bom(std::string_view s) {
  return s.substr(0, 3) == "\xEF\xBB\xBF" ? s.substr(3) : s;
}

void check_lines(const std::string& path, std::string_view content) {
  std::vector<std::string> expected;
  std::string_view rest = without_bom(content);
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    std::string line(rest.substr(0, nl));
    if (!line.empty() && line.back() == '\r') line.pop_back();
    expected.push_back(std::move(line));
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
  }
  std::vector<std::string> got;
  anvil::fuzz::parses(path, [&] {
    LineReader r(path);
    std::string line;
    while (r.next(line)) {
      got.push_back(line);
      anvil::fuzz::check(r.line_number() == got.size(), "line_number() is not the count of lines");
    }
    anvil::fuzz::check(got == expected, "LineReader's lines are not the file's lines");
  });
}

void check_csv(const std::string& path, std::string_view content) {
  const uint64_t lines = 1 + std::count(content.begin(), content.end(), '\n');
  anvil::fuzz::parses(path, [&] {
    CsvReader r(path);
    std::vector<std::string> fields;
    uint64_t previous = 0;
    while (r.next(fields)) {
      anvil::fuzz::check(!fields.empty(), "a CSV record has no fields");
      anvil::fuzz::check(r.record_line() > previous && r.record_line() <= lines, "CSV record lines go wrong");
      previous = r.record_line();
    }
  });
}

void check_segments(const std::string& path, std::string_view content, std::optional<uint64_t> cut) {
  const std::string_view body = without_bom(content);
  const uint64_t bom = content.size() - body.size();
  std::string joined;
  anvil::fuzz::parses(path, [&] {
    TextSegmenter seg(path, cut);
    TextSegmenter::Segment s;
    bool seen_last = false, after_cut = false;
    int cuts = 0;
    while (seg.next(s)) {
      anvil::fuzz::check(!seen_last, "a segment after the last one");
      anvil::fuzz::check(!(after_cut && s.before_cut), "before_cut went back to true");
      joined += s.text;
      if (s.ends_at_cut) {
        ++cuts;
        const uint64_t at = bom + joined.size();  // file offset of the cut
        anvil::fuzz::check(cut && at >= *cut && at <= *cut + 3, "the cut moved too far");
        // (Ill-formed text may have longer runs of continuation bytes than the 3 the cut skips.)
        anvil::fuzz::check(!unicode::is_valid_utf8(content) || at == content.size() ||
                               (static_cast<unsigned char>(content[at]) & 0xC0) != 0x80,
                           "the cut splits a UTF-8 character");
      }
      after_cut = !s.before_cut;
      seen_last = s.last;
    }
    anvil::fuzz::check(seen_last, "no segment was marked last");
    anvil::fuzz::check(cuts <= 1, "more than one segment ends at the cut");
    anvil::fuzz::check(joined == body, "the segments are not the file");
  });
}

void run_prepare(const anvil::fuzz::ScratchDir& dir, std::string_view content, uint8_t options) {
  static const std::unique_ptr<Tokenizer> bytes = make_byte_tokenizer();
  static const char* const kNames[] = {"input.txt", "input.jsonl", "input.csv"};
  const std::string input = dir.write(kNames[options % 3], content.data(), content.size());
  const std::string out = dir.path("out");
  PrepareOptions o;
  o.inputs = {input};
  o.output_dir = out;
  o.tokenizer = "bytes";
  o.threads = 1;
  o.val_fraction = (options & 8) ? 0.5 : 0.0;
  o.strict = (options & 16) != 0;
  o.max_length = (options & 32) ? 4 : 512;
  if (options & 64) o.labels = {"neg", "pos"};
  if (options & 128) o.text_field = o.text_column = "t";
  anvil::fuzz::succeeds([&] { prepare_data(o, *bytes); });
  std::error_code ec;
  fs::remove_all(out, ec);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const anvil::fuzz::ScratchDir dir;
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      check_lines(dir.write("input.jsonl", rest.data(), rest.size()), rest);
      break;
    case 1:
      check_csv(dir.write("input.csv", rest.data(), rest.size()), rest);
      break;
    case 2: {
      if (rest.size() < 2) return 0;
      const uint64_t c = (static_cast<unsigned char>(rest[0]) | static_cast<unsigned char>(rest[1]) << 8);
      const std::string_view text = rest.substr(2);
      const std::optional<uint64_t> cut =
          c == 0xFFFF ? std::nullopt : std::optional<uint64_t>(c % (text.size() + 2));
      check_segments(dir.write("input.txt", text.data(), text.size()), text, cut);
      break;
    }
    default:
      if (rest.empty()) return 0;
      run_prepare(dir, rest.substr(1), static_cast<uint8_t>(rest[0]));
      break;
  }
  return 0;
}
