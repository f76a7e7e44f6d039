#include "data/byte_corpus.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <initializer_list>
#include <string>
#include <vector>

#include "anvil/error.hpp"
#include "data/token_shard.hpp"
#include "test_util.hpp"

namespace anvil::data {
namespace {

namespace fs = std::filesystem;

using test::expect_error;

class ByteCorpusTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_ / name; }
  std::string write_text(const std::string& name, const std::string& text) const {
    const std::string p = path(name);
    fs::create_directories(fs::path(p).parent_path());
    test::write_file(p, text);
    return p;
  }
  // Every output the preparation could have left behind, complete or temporary.
  bool any_output(const std::string& out_dir) const {
    for (const char* name : {"train.bin", "val.bin", "train.bin.tmp", "val.bin.tmp"})
      if (fs::exists(fs::path(out_dir) / name)) return true;
    return false;
  }

  test::TempDir dir_;
};

std::string shard_text(const std::string& shard_path) {
  TokenShard shard(shard_path);
  EXPECT_EQ(shard.vocab_size(), 256u);
  std::vector<int32_t> ids(shard.size());
  shard.read(0, ids.size(), ids.data());
  return byte_decode(ids);
}

std::string test_text(size_t n) {
  std::string s;
  for (size_t i = 0; s.size() < n; ++i) s += fmt::format("line {} of the corpus\n", i);
  s.resize(n);
  return s;
}

TEST(ByteCorpusCodec, RoundTripIncludingNonAscii) {
  using namespace std::string_literals;
  const std::string with_nul =
      "plain ASCII, caf\xc3\xa9, \xe4\xb8\x96\xe7\x95\x8c, \xf0\x9f\x9a\x80 and \x00 nul"s;
  ASSERT_NE(with_nul.find('\0'), std::string::npos);
  const auto ids = byte_encode(with_nul);
  ASSERT_EQ(ids.size(), with_nul.size());  // one token per UTF-8 byte
  EXPECT_EQ(ids[0], static_cast<uint32_t>('p'));
  EXPECT_EQ(ids[16], 0xc3u);  // first byte of the two-byte 'é'
  EXPECT_EQ(ids[17], 0xa9u);
  const std::vector<int32_t> as_int32(ids.begin(), ids.end());
  EXPECT_EQ(byte_decode(as_int32), with_nul);

  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  const auto all_ids = byte_encode(all_bytes);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(all_ids[b], static_cast<uint32_t>(b));
  EXPECT_EQ(byte_decode(std::vector<int32_t>(all_ids.begin(), all_ids.end())), all_bytes);
}

TEST(ByteCorpusCodec, DecodeRejectsNonByteIds) {
  expect_error([] { byte_decode(std::vector<int32_t>{65, 256}); }, {"id 256", "position 1"});
  expect_error([] { byte_decode(std::vector<int32_t>{-1}); }, {"id -1", "position 0"});
}

TEST_F(ByteCorpusTest, PrepareSplitsASingleFile) {
  const std::string text = test_text(1000);
  const std::string input = write_text("corpus.txt", text);
  const std::string out = path("out");
  const PrepareStats stats = prepare_byte_corpus({input}, out, 0.1);
  EXPECT_EQ(stats.bytes_read, 1000u);
  EXPECT_EQ(stats.train_tokens, 900u);
  EXPECT_EQ(stats.val_tokens, 100u);
  EXPECT_EQ(stats.train_path, (fs::path(out) / "train.bin").string());
  EXPECT_EQ(stats.val_path, (fs::path(out) / "val.bin").string());
  EXPECT_EQ(shard_text(stats.train_path), text.substr(0, 900));
  EXPECT_EQ(shard_text(stats.val_path), text.substr(900));
  EXPECT_EQ(TokenShard(stats.train_path).dtype(), TokenDType::U16);
  EXPECT_FALSE(fs::exists(stats.train_path + ".tmp"));
}

TEST_F(ByteCorpusTest, PrepareReadsDirectoriesRecursivelyInSortedOrder) {
  write_text("in/b.txt", "BBBB");
  write_text("in/a.txt", "AAAA");
  write_text("in/sub/c.txt", "CCCC");
  write_text("in/sub/deeper/d.txt", "DDDD");
  const std::string extra = write_text("extra.txt", "\xe2\x82\xac!");  // "€!": multi-byte UTF-8
  const PrepareStats stats = prepare_byte_corpus({path("in"), extra}, path("out"), 0.25);
  EXPECT_EQ(stats.bytes_read, 20u);
  EXPECT_EQ(stats.val_tokens, 5u);
  EXPECT_EQ(shard_text(stats.train_path) + shard_text(stats.val_path), "AAAABBBBCCCCDDDD\xe2\x82\xac!");
  EXPECT_EQ(shard_text(stats.val_path), "D\xe2\x82\xac!");
}

TEST_F(ByteCorpusTest, ZeroValFractionWritesAnEmptyValidationShard) {
  const std::string input = write_text("c.txt", "xyz");
  const PrepareStats stats = prepare_byte_corpus({input}, path("out"), 0.0);
  EXPECT_EQ(stats.train_tokens, 3u);
  EXPECT_EQ(stats.val_tokens, 0u);
  EXPECT_EQ(shard_text(stats.train_path), "xyz");
  EXPECT_EQ(TokenShard(stats.val_path).size(), 0u);
}

TEST_F(ByteCorpusTest, EveryInputIsReadAsTextAndASummaryIsWritten) {
  // Byte-level preparation ignores extensions: a .csv or .jsonl file is just more text.
  const std::string csv = write_text("in/a.csv", "text,label\n");
  const std::string jsonl = write_text("in/b.jsonl", "{not json}\n");
  const PrepareStats stats = prepare_byte_corpus({path("in")}, path("out"), 0.0);
  EXPECT_EQ(shard_text(stats.train_path), "text,label\n{not json}\n");
  EXPECT_TRUE(fs::exists(path("out/prepare_summary.json")));
}

TEST_F(ByteCorpusTest, MissingInputIsNamed) {
  const std::string missing = path("nope.txt");
  expect_error([&] { prepare_byte_corpus({missing}, path("out"), 0.1); }, {missing, "does not exist"});
  EXPECT_FALSE(any_output(path("out")));
}

TEST_F(ByteCorpusTest, EmptyCorpus) {
  const std::string empty = write_text("empty.txt", "");
  fs::create_directories(path("empty_dir"));
  expect_error(
      [&] {
        prepare_byte_corpus({empty, path("empty_dir")}, path("out"), 0.1);
      },
      {"empty corpus", empty});
  EXPECT_FALSE(any_output(path("out")));
}

TEST_F(ByteCorpusTest, ValFractionOutOfRange) {
  const std::string input = write_text("c.txt", test_text(100));
  expect_error([&] { prepare_byte_corpus({input}, path("out"), 0.6); }, {"val_fraction 0.6"});
  expect_error([&] { prepare_byte_corpus({input}, path("out"), -0.1); }, {"val_fraction -0.1"});
  EXPECT_FALSE(any_output(path("out")));
}

TEST_F(ByteCorpusTest, SplitTooSmallForEitherSide) {
  const std::string input = write_text("c.txt", "abcde");
  expect_error([&] { prepare_byte_corpus({input}, path("out"), 0.1); },
               {"5-byte", "0 validation", "at least 2"});
  const std::string three = write_text("three.txt", "abc");
  expect_error([&] { prepare_byte_corpus({three}, path("out"), 0.5); }, {"at least 2"});
  EXPECT_FALSE(any_output(path("out")));
}

}  // namespace
}  // namespace anvil::data
