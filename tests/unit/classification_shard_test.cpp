// Classification shards: round trips (uint16 and uint32 ids), writer checks, malformed files, and the
// padded batch assembler.
#include "data/classification_shard.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "anvil/error.hpp"
#include "test_util.hpp"

namespace anvil::data {
namespace {

namespace fs = std::filesystem;
using test::expect_error;

class ClassificationShardTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_ / name; }
  // Three examples of lengths 3, 0 and 10; labels 1, 0, 2.
  std::string write_sample(const std::string& name = "s.cls", uint64_t vocab = 300,
                           uint32_t max_length = 12) {
    write_classification_shard(path(name), vocab, max_length, names_, examples_, labels_);
    return path(name);
  }
  // Overwrites `bytes` at `offset` of a copy of the sample and returns the copy's path.
  std::string corrupt(const std::string& name, size_t offset, const void* bytes, size_t n) {
    std::string data = test::read_file(write_sample());
    std::memcpy(data.data() + offset, bytes, n);
    test::write_file(path(name), data);
    return path(name);
  }

  test::TempDir dir_;
  std::vector<std::string> names_{"negative", "neutral", "positive \"quoted\" \xc3\xa9"};
  std::vector<std::vector<uint32_t>> examples_{{5, 299, 7}, {}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}};
  std::vector<int32_t> labels_{1, 0, 2};
};

TEST_F(ClassificationShardTest, RoundTripUint16) {
  const ClassificationShard s(write_sample());
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s.vocab_size(), 300u);
  EXPECT_EQ(s.max_length(), 12u);
  EXPECT_EQ(s.num_tokens(), 13u);
  EXPECT_EQ(s.dtype(), TokenDType::U16);
  EXPECT_EQ(s.label_names(), names_);
  EXPECT_EQ(s.num_labels(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(s.tokens(i), examples_[i]);
    EXPECT_EQ(s.length(i), examples_[i].size());
    EXPECT_EQ(s.label(i), labels_[i]);
  }
  EXPECT_EQ(fs::file_size(path("s.cls")) % 8, 0u);
  EXPECT_FALSE(fs::exists(path("s.cls.tmp")));
  EXPECT_FALSE(fs::exists(path("s.cls.tokens")));
  expect_error([&] { s.label(3); }, {"s.cls", "example 3 out of range"});
}

TEST_F(ClassificationShardTest, RoundTripUint32AndEmpty) {
  write_classification_shard(path("big.cls"), 70000, 4, {"a", "b"}, {{69999, 0}, {65536}}, {0, 1});
  const ClassificationShard big(path("big.cls"));
  EXPECT_EQ(big.dtype(), TokenDType::U32);
  EXPECT_EQ(big.tokens(0), (std::vector<uint32_t>{69999, 0}));
  EXPECT_EQ(big.tokens(1), (std::vector<uint32_t>{65536}));
  write_classification_shard(path("empty.cls"), 10, 4, {"only"}, {}, {});
  const ClassificationShard empty(path("empty.cls"));
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.label_names(), std::vector<std::string>{"only"});
}

TEST_F(ClassificationShardTest, WriterChecksAndRemap) {
  {
    ClassificationShardWriter w(path("w.cls"), 300, 4);
    expect_error(
        [&] {
          w.append(std::vector<uint32_t>{1, 2, 3, 4, 5}, 0);
        },
        {"w.cls", "5 tokens", "max_length 4"});
    expect_error([&] { w.append(std::vector<uint32_t>{300}, 0); }, {"w.cls", "token 300", "vocab_size 300"});
    expect_error([&] { w.append(std::vector<uint32_t>{1}, -1); }, {"negative label"});
    w.append(std::vector<uint32_t>{1}, 2);
    expect_error([&] { w.commit({"a", "b"}); }, {"label 2", "2 label names"});
    expect_error([&] { w.commit({"a", "a", "b"}); }, {"not distinct"});
  }
  EXPECT_FALSE(fs::exists(path("w.cls")));
  EXPECT_FALSE(fs::exists(path("w.cls.tmp")));
  EXPECT_FALSE(fs::exists(path("w.cls.tokens")));
  EXPECT_FALSE(fs::exists(path("w.cls.tokens.tmp")));

  ClassificationShardWriter w(path("r.cls"), 300, 4);
  w.append(std::vector<uint32_t>{1}, 0);
  w.append(std::vector<uint32_t>{2}, 1);
  w.remap_labels(std::vector<int32_t>{1, 0});
  w.commit({"x", "y"});
  const ClassificationShard s(path("r.cls"));
  EXPECT_EQ(s.label(0), 1);
  EXPECT_EQ(s.label(1), 0);
}

TEST_F(ClassificationShardTest, MalformedFilesAreRejectedNamingTheFile) {
  expect_error([&] { ClassificationShard(path("none.cls")); }, {"none.cls", "not found"});
  const std::string good = test::read_file(write_sample());
  test::write_file(path("short.cls"), good.substr(0, 40));
  expect_error([&] { ClassificationShard(path("short.cls")); },
               {"short.cls", "shorter than the 64-byte header"});
  test::write_file(path("trunc.cls"), good.substr(0, good.size() - 8));
  expect_error([&] { ClassificationShard(path("trunc.cls")); }, {"trunc.cls", "too few", "truncated"});
  test::write_file(path("trail.cls"), good + std::string(8, '\0'));
  expect_error([&] { ClassificationShard(path("trail.cls")); }, {"trail.cls", "too many"});

  expect_error([&] { ClassificationShard(corrupt("magic.cls", 0, "ANVILTOK", 8)); },
               {"magic.cls", "bad magic"});
  const uint32_t v9 = 9, dtype7 = 7, max_len_5 = 5, one_label = 1;
  expect_error([&] { ClassificationShard(corrupt("ver.cls", 8, &v9, 4)); }, {"ver.cls", "version 9"});
  expect_error([&] { ClassificationShard(corrupt("dt.cls", 12, &dtype7, 4)); }, {"dt.cls", "dtype code 7"});
  expect_error([&] { ClassificationShard(corrupt("len.cls", 32, &max_len_5, 4)); },
               {"len.cls", "example 2", "max_length 5"});
  expect_error([&] { ClassificationShard(corrupt("nl.cls", 36, &one_label, 4)); },
               {"nl.cls", "JSON array of 1"});
  const uint64_t vocab_100 = 100;
  expect_error([&] { ClassificationShard(corrupt("voc.cls", 24, &vocab_100, 8)); },
               {"voc.cls", "token 299", "vocab_size 100"});

  // Sections: label JSON at 64 (padded to 8), offsets (4 x uint64), tokens (13 x 2 bytes, padded), labels.
  const uint64_t json_bytes = [&] {
    uint64_t j;
    std::memcpy(&j, good.data() + 40, 8);
    return j;
  }();
  const size_t offsets_at = 64 + (json_bytes + 7) / 8 * 8;
  const size_t labels_at = offsets_at + 4 * 8 + 32;
  const uint64_t backwards = 1;
  expect_error([&] { ClassificationShard(corrupt("off.cls", offsets_at + 16, &backwards, 8)); },
               {"off.cls", "example 1 spans offsets [3, 1)"});
  const int32_t label_7 = 7;
  expect_error([&] { ClassificationShard(corrupt("lab.cls", labels_at + 4, &label_7, 4)); },
               {"lab.cls", "example 1 has label 7", "[0, 3)"});
  expect_error([&] { ClassificationShard(corrupt("json.cls", 64, "{", 1)); }, {"json.cls", "not valid JSON"});
}

TEST_F(ClassificationShardTest, DeeplyNestedLabelNameIsAnErrorNotAStackOverflow) {
  // Found by fuzzing: the error message dumped the offending label name, and dump() recurses.
  const std::string names = "[" + std::string(200000, '[') + std::string(200000, ']') + "]";
  std::string file(64, '\0');
  const uint32_t version = 1, dtype = 1, max_length = 4, num_labels = 1;
  const uint64_t examples = 0, vocab = 10, json_bytes = names.size(), tokens = 0;
  std::memcpy(file.data(), "ANVILCLS", 8);
  std::memcpy(file.data() + 8, &version, 4);
  std::memcpy(file.data() + 12, &dtype, 4);
  std::memcpy(file.data() + 16, &examples, 8);
  std::memcpy(file.data() + 24, &vocab, 8);
  std::memcpy(file.data() + 32, &max_length, 4);
  std::memcpy(file.data() + 36, &num_labels, 4);
  std::memcpy(file.data() + 40, &json_bytes, 8);
  std::memcpy(file.data() + 48, &tokens, 8);
  file += names + std::string((8 - names.size() % 8) % 8, '\0') + std::string(8, '\0');  // offsets[0] = 0
  test::write_file(path("deep.cls"), file);
  expect_error([&] { ClassificationShard(path("deep.cls")); },
               {"deep.cls", "label name (an array) is not a string"});
}

TEST_F(ClassificationShardTest, BatchesArePaddedToAMultipleOf8Or64CappedAtMaxLength) {
  // max_length 100: lengths 3, 0, 10.
  write_classification_shard(path("b.cls"), 300, 100, names_, examples_, labels_);
  const ClassificationShard s(path("b.cls"));
  const std::vector<uint64_t> idx{0, 1, 2};
  const ClassificationBatch b = assemble_classification_batch(s, idx, /*pad_id=*/0);
  EXPECT_EQ(b.batch_size, 3u);
  EXPECT_EQ(b.length, 16u);  // longest 10 -> 16
  ASSERT_EQ(b.ids.size(), 48u);
  const std::vector<int32_t> row0{5, 299, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(std::vector<int32_t>(b.ids.begin(), b.ids.begin() + 16), row0);
  const std::vector<int32_t> mask0{1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(std::vector<int32_t>(b.attention_mask.begin(), b.attention_mask.begin() + 16), mask0);
  EXPECT_EQ(std::vector<int32_t>(b.attention_mask.begin() + 16, b.attention_mask.begin() + 32),
            std::vector<int32_t>(16, 0));  // the empty example
  EXPECT_EQ(b.ids[32 + 9], 10);
  EXPECT_EQ(b.ids[32 + 10], 0);
  EXPECT_EQ(b.labels, (std::vector<int32_t>{1, 0, 2}));

  EXPECT_EQ(classification_batch_length(s, idx, 64), 64u);
  EXPECT_EQ(classification_batch_length(s, std::vector<uint64_t>{0}), 8u);
  EXPECT_EQ(classification_batch_length(s, std::vector<uint64_t>{1}), 8u);  // all empty: still 8 wide
  EXPECT_EQ(classification_batch_length(s, std::vector<uint64_t>{0}, 1), 3u);
  const ClassificationBatch padded = assemble_classification_batch(s, std::vector<uint64_t>{2, 0}, 7, 64);
  EXPECT_EQ(padded.length, 64u);
  EXPECT_EQ(padded.ids[64 + 3], 7);  // pad id

  // Rounding never exceeds max_length (12 here): 10 -> 16 -> capped to 12; 64 -> 12.
  const ClassificationShard capped(write_sample("c.cls", 300, 12));
  EXPECT_EQ(classification_batch_length(capped, idx), 12u);
  EXPECT_EQ(classification_batch_length(capped, idx, 64), 12u);
  EXPECT_EQ(classification_batch_length(capped, std::vector<uint64_t>{0}), 8u);

  expect_error([&] { assemble_classification_batch(s, idx, 300); }, {"pad id 300"});
  expect_error([&] { assemble_classification_batch(s, std::vector<uint64_t>{3}, 0); },
               {"example 3 out of range"});
  std::vector<int32_t> ids(3 * 8), mask(3 * 8), labels(3);
  expect_error([&] { fill_classification_batch(s, idx, 8, 0, ids.data(), mask.data(), labels.data()); },
               {"10 tokens", "length 8"});
}

}  // namespace
}  // namespace anvil::data
