// anvil prepare-data: input kinds, EOS separation, splits, determinism across thread counts, bad input
// (strict and lenient), UTF-8 repair, CSV parsing, classification output and the CLI's error path.
#include "data/prepare.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/error.hpp"
#include "data/classification_shard.hpp"
#include "data/text_sources.hpp"
#include "data/token_shard.hpp"
#include "data/tokenizer.hpp"
#include "test_util.hpp"

namespace anvil::data {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

constexpr uint32_t kEos = 256, kCls = 257, kSep = 258;

// Byte ids plus special tokens: EOS 256, [CLS] 257, [SEP] 258 (vocab 259). Reports "wordpiece" when it
// has [CLS]/[SEP], which makes classification examples [CLS] ... [SEP].
class SpecialBytesTokenizer final : public Tokenizer {
 public:
  SpecialBytesTokenizer(bool eos, bool cls_sep) : eos_(eos), cls_sep_(cls_sep) {}
  std::string kind() const override { return cls_sep_ ? "wordpiece" : "bytes+eos"; }
  uint64_t vocab_size() const override { return 259; }
  std::vector<uint32_t> encode(std::string_view text) const override {
    return {reinterpret_cast<const unsigned char*>(text.data()),
            reinterpret_cast<const unsigned char*>(text.data()) + text.size()};
  }
  std::string decode(std::span<const uint32_t> ids, bool) const override {
    std::string s;
    for (uint32_t id : ids)
      s += id == kEos ? "<eos>" : id == kCls ? "[CLS]" : id == kSep ? "[SEP]" : std::string(1, char(id));
    return s;
  }
  std::optional<uint32_t> eos_id() const override {
    return eos_ ? std::optional<uint32_t>(kEos) : std::nullopt;
  }
  std::optional<uint32_t> token_to_id(std::string_view token) const override {
    if (cls_sep_ && token == "[CLS]") return kCls;
    if (cls_sep_ && token == "[SEP]") return kSep;
    if (token.size() == 1) return static_cast<unsigned char>(token[0]);
    return std::nullopt;
  }

 private:
  bool eos_, cls_sep_;
};

std::string shard_text(const std::string& path) {
  TokenShard shard(path);
  std::vector<uint32_t> ids(shard.size());
  for (uint64_t i = 0; i < shard.size(); ++i) ids[i] = shard.at(i);
  return SpecialBytesTokenizer(true, true).decode(ids, false);
}

nlohmann::json read_summary(const std::string& dir) {
  return nlohmann::json::parse(test::read_file(dir + "/prepare_summary.json"));
}

class PrepareTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) const {
    const std::string p = dir_ / name;
    fs::create_directories(fs::path(p).parent_path());
    test::write_file(p, text);
    return p;
  }
  PrepareOptions options(std::vector<std::string> inputs, const std::string& out = "out") const {
    PrepareOptions o;
    o.inputs = std::move(inputs);
    o.output_dir = dir_ / out;
    o.threads = 2;
    return o;
  }
  std::string out(const std::string& name = "out") const { return dir_ / name; }

  test::TempDir dir_;
  SpecialBytesTokenizer bytes_eos_{true, false};
  SpecialBytesTokenizer wordpiece_{false, true};
};

// A text with multi-byte characters and paragraphs, larger than a segment so cuts are exercised.
std::string big_text(size_t bytes) {
  std::string s;
  for (size_t i = 0; s.size() < bytes; ++i)
    s += fmt::format("{}line {} caf\xc3\xa9 \xe2\x82\xac{}\n", i % 37 == 0 ? "\n" : "", i,
                     i % 5 == 0 ? "  " : "");
  return s;
}

// ---------------------------------------------------------------------------------------------------
// Text

TEST_F(PrepareTest, TextFileTailSplitAndSummary) {
  std::string text;
  for (int i = 0; text.size() < 1000; ++i) text += fmt::format("line {}\n", i);
  text.resize(1000);
  PrepareOptions o = options({write("c.txt", text)});
  const PrepareReport r = prepare_data(o);  // the byte tokenizer, loaded by name
  EXPECT_EQ(r.task, "lm");
  EXPECT_EQ(r.bytes, 1000u);
  EXPECT_EQ(shard_text(out() + "/train.bin"), text.substr(0, 900));
  EXPECT_EQ(shard_text(out() + "/val.bin"), text.substr(900));
  const nlohmann::json s = read_summary(out());
  EXPECT_EQ(s["task"], "lm");
  EXPECT_EQ(s["tokenizer"]["kind"], "bytes");
  EXPECT_TRUE(s["tokenizer"]["eos_id"].is_null());
  EXPECT_EQ(s["train"]["tokens"], 900);
  EXPECT_EQ(s["val"]["tokens"], 100);
  EXPECT_EQ(s["bytes"], 1000);
  EXPECT_EQ(s["files"], 1);
  EXPECT_TRUE(s.contains("seconds"));
  for (const char* tmp : {"train.bin.tmp", "val.bin.tmp", "prepare_summary.json.tmp"})
    EXPECT_FALSE(fs::exists(out() + "/" + tmp)) << tmp;
}

TEST_F(PrepareTest, DirectoriesRecursiveSortedDocumentsSeparatedByEos) {
  write("in/b.txt", "BBBB");
  write("in/a.txt", "AAAA");
  write("in/sub/c.txt", "CCCC");
  write("in/empty.txt", "");
  write("in/sub/deeper/d.md", "DD\xe2\x82\xac");
  PrepareOptions o = options({dir_ / "in"});
  o.val_fraction = 0;
  const PrepareReport r = prepare_data(o, bytes_eos_);
  // Sorted by path: a, b, empty, sub/c, sub/deeper/d. An empty document adds no EOS.
  EXPECT_EQ(shard_text(out() + "/train.bin"), "AAAA<eos>BBBB<eos>CCCC<eos>DD\xe2\x82\xac<eos>");
  EXPECT_EQ(TokenShard(out() + "/val.bin").size(), 0u);
  EXPECT_EQ(r.files, 5u);
  EXPECT_EQ(r.empty_files, 1u);
  EXPECT_EQ(r.documents, 5u);
  EXPECT_EQ(r.empty_documents, 1u);
  EXPECT_EQ(r.train.tokens, 3u * 5 + 6);
}

TEST_F(PrepareTest, TextSplitCutsADocumentIntoTwoEachEndingWithEos) {
  write("a.txt", "0123456789");
  write("b.txt", "abcdefghij");
  PrepareOptions o = options({dir_ / "a.txt", dir_ / "b.txt"});
  o.val_fraction = 0.25;  // 5 of 20 text bytes
  prepare_data(o, bytes_eos_);
  EXPECT_EQ(shard_text(out() + "/train.bin"), "0123456789<eos>abcde<eos>");
  EXPECT_EQ(shard_text(out() + "/val.bin"), "fghij<eos>");
}

TEST_F(PrepareTest, TextCutMovesOffContinuationBytes) {
  // 8 bytes, val_fraction 0.5 -> cut at byte 4, inside the euro sign at [2, 5): moved forward to 5.
  PrepareOptions o = options({write("e.txt", "ab\xe2\x82\xacxyz")});
  o.val_fraction = 0.5;
  prepare_data(o);
  EXPECT_EQ(shard_text(out() + "/train.bin"), "ab\xe2\x82\xac");
  EXPECT_EQ(shard_text(out() + "/val.bin"), "xyz");
}

TEST_F(PrepareTest, LargeTextIsSegmentedByContentAndRoundTrips) {
  const std::string text = big_text(5 << 20);
  const std::string path = write("big.txt", text);
  std::string previous;
  for (unsigned threads : {1u, 3u}) {
    PrepareOptions o = options({path}, "out" + std::to_string(threads));
    o.threads = threads;
    o.val_fraction = 0.1;
    prepare_data(o);
    const std::string train = shard_text(o.output_dir + "/train.bin"),
                      val = shard_text(o.output_dir + "/val.bin");
    EXPECT_EQ(train + val, text);
    EXPECT_NE(static_cast<unsigned char>(val[0]) & 0xC0, 0x80u) << "the cut split a character";
    const std::string bytes =
        test::read_file(o.output_dir + "/train.bin") + test::read_file(o.output_dir + "/val.bin");
    if (!previous.empty()) {
      EXPECT_EQ(bytes, previous) << "output depends on the thread count";
    }
    previous = bytes;
  }
}

TEST(PrepareSegmenter, CutsBeforeANewlineAfterALetterPastOneMiB) {
  test::TempDir dir;
  // 100-byte lines ending in '.': not cut points. One line past 1 MiB ends in a letter: the cut goes
  // before its newline, which starts the next segment.
  std::string text;
  while (text.size() < (size_t{5} << 19)) text += std::string(98, 'x') + ".\n";
  text[1048700 + 98] = 'z';
  test::write_file(dir / "t.txt", text);
  TextSegmenter seg(dir / "t.txt", std::nullopt);
  TextSegmenter::Segment s;
  std::string all;
  std::vector<size_t> sizes;
  while (seg.next(s)) {
    sizes.push_back(s.text.size());
    all += s.text;
  }
  EXPECT_EQ(all, text);
  EXPECT_EQ(sizes, (std::vector<size_t>{1048799, text.size() - 1048799}));

  // No newline at all: cut at 2 MiB moved back to a character start (3-byte euro signs).
  std::string euros;
  while (euros.size() < (size_t{5} << 20) / 2) euros += "\xe2\x82\xac";
  test::write_file(dir / "e.txt", euros);
  TextSegmenter seg2(dir / "e.txt", std::nullopt);
  ASSERT_TRUE(seg2.next(s));
  EXPECT_EQ(s.text.size(), TextSegmenter::kMaxBytes / 3 * 3);
}

// ---------------------------------------------------------------------------------------------------
// JSONL

std::string jsonl_corpus(int n) {
  std::string s;
  for (int i = 0; i < n; ++i)
    s += nlohmann::json{{"id", i}, {"text", fmt::format("doc {} says hi", i)}}.dump() + "\n";
  return s;
}

TEST_F(PrepareTest, JsonlDocumentsAreSplitByTheSeededHashAndSeparatedByEos) {
  const std::string path = write("d.jsonl", jsonl_corpus(200));
  PrepareOptions o = options({path});
  o.val_fraction = 0.2;
  o.seed = 7;
  const PrepareReport r = prepare_data(o, bytes_eos_);
  std::string train, val;
  uint64_t val_docs = 0;
  for (int i = 0; i < 200; ++i) {
    const bool v = assign_to_validation(7, i, 0.2);
    (v ? val : train) += fmt::format("doc {} says hi<eos>", i);
    val_docs += v;
  }
  EXPECT_EQ(shard_text(out() + "/train.bin"), train);
  EXPECT_EQ(shard_text(out() + "/val.bin"), val);
  EXPECT_EQ(r.val.documents, val_docs);
  EXPECT_GT(val_docs, 20u);
  EXPECT_LT(val_docs, 60u);

  // The same seed reproduces the files; another seed gives another split.
  PrepareOptions again = o;
  again.output_dir = out("again");
  again.threads = 3;
  prepare_data(again, bytes_eos_);
  EXPECT_EQ(test::read_file(out("again") + "/val.bin"), test::read_file(out() + "/val.bin"));
  PrepareOptions other = o;
  other.output_dir = out("other");
  other.seed = 8;
  prepare_data(other, bytes_eos_);
  EXPECT_NE(test::read_file(out("other") + "/val.bin"), test::read_file(out() + "/val.bin"));
}

TEST(PrepareSplit, AssignToValidationIsDeterministicAndProportional) {
  int hits = 0;
  for (uint64_t i = 0; i < 20000; ++i) {
    hits += assign_to_validation(1234, i, 0.1);
    EXPECT_EQ(assign_to_validation(1234, i, 0.1), assign_to_validation(1234, i, 0.1));
    EXPECT_FALSE(assign_to_validation(1234, i, 0.0));
  }
  EXPECT_NEAR(hits, 2000, 200);
}

const char* kBadJsonl =
    "{\"text\": \"one\"}\n"
    "{\"text\": \"two\"\n"    // line 2: not valid JSON
    "[1, 2]\n"                // line 3: not an object
    "\r\n"                    // line 4: blank, ignored
    "{\"body\": \"x\"}\n"     // line 5: no text field
    "{\"text\": 5}\n"         // line 6: not a string
    "{\"text\": \"three\"}";  // line 7, no final newline

TEST_F(PrepareTest, JsonlBadRecordsAreSkippedAndCounted) {
  PrepareOptions o = options({write("bad.jsonl", kBadJsonl)});
  o.val_fraction = 0;
  const PrepareReport r = prepare_data(o, bytes_eos_);
  EXPECT_EQ(shard_text(out() + "/train.bin"), "one<eos>three<eos>");
  EXPECT_EQ(r.skipped, 4u);
  const nlohmann::json s = read_summary(out());
  EXPECT_EQ(s["skipped"]["total"], 4);
  EXPECT_EQ(s["skipped"]["by_reason"]["not valid JSON"], 1);
  EXPECT_EQ(s["skipped"]["by_reason"]["not a JSON object"], 1);
  EXPECT_EQ(s["skipped"]["by_reason"]["missing field 'text'"], 1);
  EXPECT_EQ(s["skipped"]["by_reason"]["field 'text' is not a string"], 1);
  const std::string first = s["skipped"]["examples"][0];
  EXPECT_NE(first.find("bad.jsonl:2: not valid JSON"), std::string::npos) << first;
  EXPECT_NE(s["skipped"]["examples"][2].get<std::string>().find("bad.jsonl:5: no field 'text'"),
            std::string::npos);
  EXPECT_NE(s["skipped"]["examples"][3].get<std::string>().find("bad.jsonl:6: field 'text' is a number"),
            std::string::npos);
}

TEST_F(PrepareTest, JsonlStrictNamesFileLineAndProblemAndLeavesNothing) {
  PrepareOptions o = options({write("bad.jsonl", kBadJsonl)}, "nested/out");
  o.strict = true;
  for (unsigned threads : {1u, 3u}) {
    o.threads = threads;
    expect_error([&] { prepare_data(o, bytes_eos_); }, {"bad.jsonl:2", "not valid JSON", "--strict"});
    EXPECT_FALSE(fs::exists(dir_ / "nested")) << "the created output directories must be removed";
  }
  write("missing.jsonl", "{\"text\": \"a\"}\n{\"content\": \"b\"}\n");
  o.inputs = {dir_ / "missing.jsonl"};
  expect_error([&] { prepare_data(o, bytes_eos_); }, {"missing.jsonl:2", "no field 'text'"});
  write("number.jsonl", "{\"text\": [1]}\n");
  o.inputs = {dir_ / "number.jsonl"};
  expect_error([&] { prepare_data(o, bytes_eos_); },
               {"number.jsonl:1", "field 'text' is an array, not a string"});
}

TEST_F(PrepareTest, JsonlTextFieldCrlfAndByteOrderMark) {
  PrepareOptions o =
      options({write("c.json", "\xEF\xBB\xBF{\"content\": \"x\\ny\"}\r\n{\"content\": \"\"}\r\n")});
  o.text_field = "content";
  o.val_fraction = 0;
  const PrepareReport r = prepare_data(o, bytes_eos_);
  EXPECT_EQ(shard_text(out() + "/train.bin"), "x\ny<eos>");
  EXPECT_EQ(r.documents, 2u);
  EXPECT_EQ(r.empty_documents, 1u);
  EXPECT_EQ(r.skipped, 0u);
}

// ---------------------------------------------------------------------------------------------------
// UTF-8, empty inputs, option errors

TEST(PrepareUtf8, RepairReplacesMaximalSubparts) {
  auto repaired = [](std::string s, uint64_t expected_count) {
    EXPECT_EQ(repair_utf8(s), expected_count) << s;
    return s;
  };
  const std::string ok = "plain caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x80";
  EXPECT_EQ(repaired(ok, 0), ok);
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(repaired("a\xFF"
                     "b",
                     1),
            "a" + r + "b");
  EXPECT_EQ(repaired("\xE2\x82", 1), r);  // truncated at the end
  EXPECT_EQ(repaired("\xF0\x9F\x9A"
                     "A",
                     1),
            r + "A");                                         // truncated 4-byte sequence
  EXPECT_EQ(repaired("\xC0\xAF", 2), r + r);                  // overlong: no valid lead
  EXPECT_EQ(repaired("\xED\xA0\x80", 3), r + r + r);          // a surrogate
  EXPECT_EQ(repaired("\xF4\x90\x80\x80", 4), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(repaired(std::string(20, 'x') + "\x80", 1), std::string(20, 'x') + r);
}

TEST_F(PrepareTest, InvalidUtf8IsReplacedAndCountedInTextAndJsonl) {
  write("in/a.txt", "ok \xFF\xFE end");
  write("in/b.jsonl", "{\"text\": \"j\xC3\"}\n");
  PrepareOptions o = options({dir_ / "in"});
  o.val_fraction = 0;
  const PrepareReport r = prepare_data(o, bytes_eos_);
  EXPECT_EQ(r.utf8_replacements, 3u);
  EXPECT_EQ(r.skipped, 0u);
  EXPECT_EQ(shard_text(out() + "/train.bin"), "ok \xEF\xBF\xBD\xEF\xBF\xBD end<eos>j\xEF\xBF\xBD<eos>");
  EXPECT_EQ(read_summary(out())["invalid_utf8_replacements"], 3);
}

TEST_F(PrepareTest, JsonParseMessageEndingInsideACharacterStillGivesASummary) {
  // Found by fuzzing: "\x8d" becomes U+FFFD, nlohmann's parse error quotes only its first bytes, and the
  // summary (which lists the first skipped records) failed to serialise that as JSON.
  PrepareOptions o = options({write("odd.jsonl", "{\"text\": \"ok\"}\n\x8d\n")});
  o.val_fraction = 0;
  const PrepareReport r = prepare_data(o, bytes_eos_);
  EXPECT_EQ(r.skipped, 1u);
  const nlohmann::json s = read_summary(out());
  EXPECT_EQ(s["skipped"]["by_reason"]["not valid JSON"], 1);
  EXPECT_NE(s["skipped"]["examples"][0].get<std::string>().find("odd.jsonl:2: not valid JSON"),
            std::string::npos);
}

TEST_F(PrepareTest, EmptyCorpusIsAnError) {
  write("e/empty.txt", "");
  expect_error([&] { prepare_data(options({dir_ / "e"}), bytes_eos_); },
               {"empty corpus", "contain no bytes"});
  PrepareOptions o = options({write("all_bad.jsonl", "nope\n{\"x\": 1}\n")});
  expect_error([&] { prepare_data(o, bytes_eos_); },
               {"empty corpus", "2 records skipped", "all_bad.jsonl:1: not valid JSON"});
  EXPECT_FALSE(fs::exists(out()));
}

TEST_F(PrepareTest, OptionAndInputErrors) {
  const std::string text = write("t.txt", "some text here");
  const std::string csv = write("c.csv", "text,label\nx,y\n");
  PrepareOptions o = options({text, csv});
  expect_error([&] { prepare_data(o, bytes_eos_); }, {"mix CSV", "c.csv", "t.txt"});
  o.inputs = {text};
  o.labels = {"a"};
  expect_error([&] { prepare_data(o, bytes_eos_); }, {"--labels applies to CSV"});
  o.labels = {};
  o.val_fraction = 0.7;
  expect_error([&] { prepare_data(o, bytes_eos_); }, {"val_fraction 0.7"});
  o.val_fraction = 0.1;
  o.inputs = {dir_ / "nope.txt"};
  expect_error([&] { prepare_data(o, bytes_eos_); }, {"nope.txt", "does not exist"});
  o.inputs = {text};
  o.tokenizer = dir_ / "missing.json";
  expect_error([&] { prepare_data(o); }, {"missing.json"});
  EXPECT_FALSE(fs::exists(out()));
  EXPECT_THROW(parse_input_format("xml"), Error);
}

// ---------------------------------------------------------------------------------------------------
// CSV

TEST(PrepareCsv, QuotingEdgeCases) {
  test::TempDir dir;
  test::write_file(dir / "q.csv",
                   "\xEF\xBB\xBFtext,label\r\n"
                   "\"a, b\",x\r\n"                // line 2: comma inside quotes
                   "\"say \"\"hi\"\"\",y\n"        // line 3: doubled quotes
                   "\"multi\nline\r\nfield\",z\n"  // lines 4-6: newlines inside quotes
                   "\n"                            // line 7: blank, skipped
                   ",\n"                           // line 8: two empty fields
                   "plain,\"\"\n"                  // line 9: empty quoted field
                   "a\"b,tail\"x\n"                // line 10: stray quotes kept literally
                   "last,row");                    // line 11: no final newline
  CsvReader csv(dir / "q.csv");
  std::vector<std::string> f;
  auto next = [&](std::vector<std::string> expected, uint64_t line) {
    ASSERT_TRUE(csv.next(f));
    EXPECT_EQ(f, expected);
    EXPECT_EQ(csv.record_line(), line);
  };
  next({"text", "label"}, 1);
  next({"a, b", "x"}, 2);
  next({"say \"hi\"", "y"}, 3);
  next({"multi\nline\r\nfield", "z"}, 4);
  next({"", ""}, 8);
  next({"plain", ""}, 9);
  next({"a\"b", "tail\"x"}, 10);
  next({"last", "row"}, 11);
  EXPECT_FALSE(csv.next(f));

  test::write_file(dir / "open.csv", "text,label\nok,1\n\"never closed,1\nmore\n");
  CsvReader open(dir / "open.csv");
  ASSERT_TRUE(open.next(f));
  ASSERT_TRUE(open.next(f));
  expect_error([&] { open.next(f); }, {"open.csv", "line 3", "never closed"});
}

TEST_F(PrepareTest, CsvClassificationCollectsSortedLabels) {
  std::string csv = "id,text,label\n";
  for (int i = 0; i < 60; ++i)
    csv += fmt::format("{},\"text {}, ok\",{}\n", i, i, i % 3 == 0 ? "pos" : i % 3 == 1 ? "neg" : "mid");
  PrepareOptions o = options({write("c.csv", csv)});
  o.val_fraction = 0.25;
  const PrepareReport r = prepare_data(o, bytes_eos_);
  EXPECT_EQ(r.task, "classification");
  EXPECT_EQ(r.labels, (std::vector<std::string>{"mid", "neg", "pos"}));
  ClassificationShard train(out() + "/train.cls"), val(out() + "/val.cls");
  EXPECT_EQ(train.label_names(), r.labels);
  EXPECT_EQ(val.label_names(), r.labels);
  EXPECT_EQ(train.size() + val.size(), 60u);
  uint64_t ti = 0, vi = 0;
  for (int i = 0; i < 60; ++i) {
    const bool v = assign_to_validation(o.seed, i, 0.25);
    const ClassificationShard& s = v ? val : train;
    const uint64_t k = v ? vi++ : ti++;
    const std::string text = fmt::format("text {}, ok", i);
    EXPECT_EQ(s.tokens(k), std::vector<uint32_t>(text.begin(), text.end()));
    EXPECT_EQ(s.label(k), i % 3 == 0 ? 2 : i % 3 == 1 ? 1 : 0);
  }
  const nlohmann::json s = read_summary(out());
  EXPECT_EQ(s["labels"], nlohmann::json({"mid", "neg", "pos"}));
  EXPECT_EQ(s["train"]["examples"].get<uint64_t>() + s["val"]["examples"].get<uint64_t>(), 60u);
  EXPECT_EQ(s["train"]["label_counts"]["pos"].get<int>() + s["val"]["label_counts"]["pos"].get<int>(), 20);
}

TEST_F(PrepareTest, CsvGivenLabelsUnknownLabelsAndWrongWidth) {
  const std::string path = write("c.csv", "text,label\na,pos\nb,meh\nc,neg\nd,pos,extra\ne,\n");
  PrepareOptions o = options({path});
  o.labels = {"pos", "neg"};
  o.val_fraction = 0;
  const PrepareReport r = prepare_data(o, bytes_eos_);
  ClassificationShard train(out() + "/train.cls");
  ASSERT_EQ(train.size(), 2u);
  EXPECT_EQ(train.label_names(), (std::vector<std::string>{"pos", "neg"}));  // --labels order is id order
  EXPECT_EQ(train.label(0), 0);
  EXPECT_EQ(train.label(1), 1);
  EXPECT_EQ(ClassificationShard(out() + "/val.cls").size(), 0u);
  EXPECT_EQ(r.skipped_by_reason.at("label not in --labels"), 1u);
  EXPECT_EQ(r.skipped_by_reason.at("empty label"), 1u);
  EXPECT_EQ(r.skipped_by_reason.at("wrong number of fields"), 1u);
  EXPECT_NE(r.skipped_examples[0].find("c.csv:3: label 'meh' is not one of --labels (pos, neg)"),
            std::string::npos)
      << r.skipped_examples[0];

  o.strict = true;
  o.output_dir = out("strict");
  expect_error([&] { prepare_data(o, bytes_eos_); }, {"c.csv:3", "'meh'", "--labels (pos, neg)"});
  EXPECT_FALSE(fs::exists(out("strict")));
}

TEST_F(PrepareTest, CsvMissingColumnNamesFileAndHeader) {
  PrepareOptions o = options({write("c.csv", "sentence,sentiment\nhi,pos\n")});
  expect_error([&] { prepare_data(o, bytes_eos_); }, {"c.csv", "no column 'text'", "sentence, sentiment"});
  o.text_column = "sentence";
  expect_error([&] { prepare_data(o, bytes_eos_); }, {"c.csv", "no column 'label'", "--label_column"});
  EXPECT_FALSE(fs::exists(out()));
}

TEST_F(PrepareTest, CsvWordPieceExamplesCarryClsSepAndAreTruncated) {
  PrepareOptions o = options({write("c.csv", "text,label\nabcdefgh,x\nab,y\n,x\n")});
  o.max_length = 6;
  o.val_fraction = 0;
  const PrepareReport r = prepare_data(o, wordpiece_);
  ClassificationShard train(out() + "/train.cls");
  ASSERT_EQ(train.size(), 3u);
  EXPECT_EQ(train.max_length(), 6u);
  EXPECT_EQ(train.tokens(0), (std::vector<uint32_t>{kCls, 'a', 'b', 'c', 'd', kSep}));
  EXPECT_EQ(train.tokens(1), (std::vector<uint32_t>{kCls, 'a', 'b', kSep}));
  EXPECT_EQ(train.tokens(2), (std::vector<uint32_t>{kCls, kSep}));
  EXPECT_EQ(r.truncated, 1u);
  o.max_length = 2;
  o.output_dir = out("small");
  expect_error([&] { prepare_data(o, wordpiece_); }, {"--max_length 2"});
}

TEST_F(PrepareTest, OutputIsIdenticalForAnyThreadCount) {
  // A mixed LM corpus (text files, one over a segment, and JSONL) and a CSV corpus.
  write("lm/a.txt", big_text(3 << 20));
  write("lm/b.jsonl", jsonl_corpus(3000));
  write("lm/c.txt", "tail document\n");
  std::string csv = "text,label\n";
  for (int i = 0; i < 5000; ++i) csv += fmt::format("\"example, {}\",{}\n", i, i % 4);
  write("cls/d.csv", csv);
  for (const char* corpus : {"lm", "cls"}) {
    std::vector<std::string> outputs;
    for (unsigned threads : {1u, 3u}) {
      PrepareOptions o = options({dir_ / corpus}, fmt::format("{}{}", corpus, threads));
      o.threads = threads;
      o.val_fraction = 0.1;
      prepare_data(o, bytes_eos_);
      std::string all;
      for (const char* f : {"train.bin", "val.bin", "train.cls", "val.cls"})
        if (fs::exists(o.output_dir + "/" + f)) all += test::read_file(o.output_dir + "/" + f);
      outputs.push_back(all);
    }
    EXPECT_GT(outputs[0].size(), 1000u);
    EXPECT_EQ(outputs[0], outputs[1]) << corpus;
  }
}

// ---------------------------------------------------------------------------------------------------
// The command line and a real tokenizer file

TEST_F(PrepareTest, CliStrictErrorExitsNonZeroAndLeavesNoOutput) {
  const std::string bad = write("bad.jsonl", kBadJsonl);
  const test::CommandResult r =
      test::run_anvil("prepare-data --input " + bad + " --output " + out() + " --strict");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bad.jsonl:2: not valid JSON"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out()));

  const std::string csv = write("c.csv", "text,label\na,neg\nb,pos\nc,neg\n");
  const test::CommandResult ok = test::run_anvil("prepare-data --input " + csv + " --output " + out() +
                                                 " --labels pos,neg --val_fraction 0 --threads 1");
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("labels: pos, neg"), std::string::npos) << ok.output;
  EXPECT_EQ(ClassificationShard(out() + "/train.cls").label(0), 1);
}

TEST_F(PrepareTest, WordPieceTokenizerJson) {
  const std::string tok = write("tokenizer.json",
                                R"({"version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [
    {"id": 0, "content": "[PAD]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 1, "content": "[UNK]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 2, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
    {"id": 3, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
  "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
  "pre_tokenizer": {"type": "BertPreTokenizer"},
  "post_processor": null,
  "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
  "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
            "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "the": 4, "movie": 5, "was": 6, "good": 7, "bad": 8, "##s": 9}}})");
  std::unique_ptr<Tokenizer> tokenizer;
  try {
    tokenizer = load_tokenizer(tok);
  } catch (const Error& e) {
    GTEST_SKIP() << "load_tokenizer cannot load a WordPiece tokenizer.json yet: " << e.what();
  }
  PrepareOptions o = options({write("c.csv", "text,label\nThe movie was good,pos\nbad movies,neg\n")});
  o.tokenizer = tok;
  o.val_fraction = 0;
  prepare_data(o);
  ClassificationShard train(out() + "/train.cls");
  ASSERT_EQ(train.size(), 2u);
  EXPECT_EQ(train.tokens(0), (std::vector<uint32_t>{2, 4, 5, 6, 7, 3}));
  EXPECT_EQ(train.tokens(1), (std::vector<uint32_t>{2, 8, 5, 9, 3}));
  EXPECT_EQ(read_summary(out())["tokenizer"]["kind"], "wordpiece");
}

}  // namespace
}  // namespace anvil::data
