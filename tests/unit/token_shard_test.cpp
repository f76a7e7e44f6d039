#include "data/token_shard.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include "anvil/error.hpp"
#include "anvil/rng.hpp"
#include "test_util.hpp"

namespace anvil::data {
namespace {

namespace fs = std::filesystem;

using test::expect_error;
using test::write_file;

// A fresh directory per test, removed afterwards.
class TokenShardTest : public ::testing::Test {
 protected:
  std::string file(const std::string& name) const { return dir_ / name; }

  test::TempDir dir_;
};

std::vector<uint32_t> random_tokens(size_t n, uint64_t vocab_size, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint32_t> tokens(n);
  for (auto& t : tokens) t = static_cast<uint32_t>(rng.below(vocab_size));
  return tokens;
}

// Raw header bytes, so malformed files can be built field by field.
std::string header_bytes(const char (&magic)[9], uint32_t version, uint32_t dtype, uint64_t count,
                         uint64_t vocab) {
  std::string h(kTokenShardHeaderBytes, '\0');
  std::memcpy(h.data(), magic, 8);
  std::memcpy(h.data() + 8, &version, 4);
  std::memcpy(h.data() + 12, &dtype, 4);
  std::memcpy(h.data() + 16, &count, 8);
  std::memcpy(h.data() + 24, &vocab, 8);
  return h;
}

std::string u16_body(std::initializer_list<uint16_t> tokens) {
  std::string body(tokens.size() * 2, '\0');
  size_t i = 0;
  for (uint16_t t : tokens) std::memcpy(body.data() + 2 * i++, &t, 2);
  return body;
}

void expect_open_error(const std::string& path, std::initializer_list<std::string> needles) {
  std::vector<std::string> all{path};
  all.insert(all.end(), needles.begin(), needles.end());
  try {
    TokenShard shard(path);
    ADD_FAILURE() << "expected anvil::Error opening " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& needle : all) EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

TEST_F(TokenShardTest, RoundTripUint16) {
  const std::string path = file("u16.bin");
  const auto tokens = random_tokens(10007, 50257, 1);
  write_token_shard(path, tokens, 50257);
  EXPECT_EQ(fs::file_size(path), kTokenShardHeaderBytes + 2 * tokens.size());
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  TokenShard shard(path);
  EXPECT_EQ(shard.path(), path);
  EXPECT_EQ(shard.size(), tokens.size());
  EXPECT_EQ(shard.vocab_size(), 50257u);
  EXPECT_EQ(shard.dtype(), TokenDType::U16);
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(shard.at(i), tokens[i]) << i;
  std::vector<int32_t> out(100);
  shard.read(5000, out.size(), out.data());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], static_cast<int32_t>(tokens[5000 + i]));
}

TEST_F(TokenShardTest, RoundTripUint32) {
  const std::string path = file("u32.bin");
  auto tokens = random_tokens(4099, 100000, 2);
  tokens[17] = 99999;  // the largest valid id
  write_token_shard(path, tokens, 100000);
  EXPECT_EQ(fs::file_size(path), kTokenShardHeaderBytes + 4 * tokens.size());

  TokenShard shard(path);
  EXPECT_EQ(shard.size(), tokens.size());
  EXPECT_EQ(shard.vocab_size(), 100000u);
  EXPECT_EQ(shard.dtype(), TokenDType::U32);
  std::vector<int32_t> out(tokens.size());
  shard.read(0, out.size(), out.data());
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(out[i], static_cast<int32_t>(tokens[i])) << i;
  EXPECT_EQ(shard.at(17), 99999u);
}

TEST_F(TokenShardTest, DtypeBoundaryAndEmptyShard) {
  EXPECT_EQ(token_dtype_for_vocab(65536), TokenDType::U16);
  EXPECT_EQ(token_dtype_for_vocab(65537), TokenDType::U32);

  const std::vector<uint32_t> edge{0, 65535, 1};
  write_token_shard(file("edge.bin"), edge, 65536);
  TokenShard edge_shard(file("edge.bin"));
  EXPECT_EQ(edge_shard.dtype(), TokenDType::U16);
  EXPECT_EQ(edge_shard.at(1), 65535u);

  write_token_shard(file("empty.bin"), {}, 256);
  TokenShard empty(file("empty.bin"));
  EXPECT_EQ(empty.size(), 0u);
  empty.read(0, 0, nullptr);
}

TEST_F(TokenShardTest, MoveKeepsTheMapping) {
  write_token_shard(file("m.bin"), std::vector<uint32_t>{3, 1, 4}, 10);
  TokenShard a(file("m.bin"));
  TokenShard b(std::move(a));
  EXPECT_EQ(b.size(), 3u);
  EXPECT_EQ(b.at(2), 4u);
}

TEST_F(TokenShardTest, ReadAndAtAreBoundsChecked) {
  const std::string path = file("b.bin");
  write_token_shard(path, std::vector<uint32_t>{1, 2, 3, 4}, 10);
  TokenShard shard(path);
  std::vector<int32_t> out(8);
  expect_error([&] { shard.read(2, 3, out.data()); }, {path, "out of range"});
  expect_error([&] { shard.read(5, 0, out.data()); }, {path});
  expect_error([&] { shard.read(1, UINT64_MAX, out.data()); }, {path});
  expect_error([&] { (void)shard.at(4); }, {path, "4"});
  shard.read(0, 4, out.data());
  EXPECT_EQ(out[3], 4);
}

TEST_F(TokenShardTest, WriterRejectsOutOfVocabTokensAndLeavesNoFile) {
  const std::string path = file("bad.bin");
  expect_error(
      [&] {
        write_token_shard(path, std::vector<uint32_t>{1, 2, 300, 4}, 256);
      },
      {path, "300", "2"});
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  expect_error([&] { write_token_shard(path, std::vector<uint32_t>{}, 0); }, {path, "vocab_size"});
}

TEST_F(TokenShardTest, WriterNamesPathWhenDirectoryIsMissing) {
  const std::string path = file("no_such_dir/x.bin");
  expect_error([&] { write_token_shard(path, std::vector<uint32_t>{1}, 2); }, {path});
}

TEST_F(TokenShardTest, MissingFile) {
  expect_open_error(file("missing.bin"), {"not found"});
}

TEST_F(TokenShardTest, ShorterThanHeader) {
  write_file(file("short.bin"), "ANVILTOK\x01");
  expect_open_error(file("short.bin"), {"9 bytes", "header"});
}

TEST_F(TokenShardTest, BadMagic) {
  write_file(file("magic.bin"), header_bytes("NOTASHRD", 1, 1, 2, 10) + u16_body({1, 2}));
  expect_open_error(file("magic.bin"), {"magic", "NOTASHRD"});
}

TEST_F(TokenShardTest, UnsupportedVersion) {
  write_file(file("v.bin"), header_bytes("ANVILTOK", 7, 1, 2, 10) + u16_body({1, 2}));
  expect_open_error(file("v.bin"), {"version 7"});
}

TEST_F(TokenShardTest, UnknownDtype) {
  write_file(file("d.bin"), header_bytes("ANVILTOK", 1, 3, 2, 10) + u16_body({1, 2}));
  expect_open_error(file("d.bin"), {"dtype code 3"});
}

TEST_F(TokenShardTest, TruncatedBody) {
  write_file(file("t.bin"), header_bytes("ANVILTOK", 1, 1, 10, 100) + u16_body({1, 2, 3, 4, 5, 6, 7, 8, 9}));
  expect_open_error(file("t.bin"), {"10 tokens", "18 bytes", "truncated"});
}

TEST_F(TokenShardTest, TrailingBytes) {
  write_file(file("x.bin"), header_bytes("ANVILTOK", 1, 1, 2, 100) + u16_body({1, 2}) + "z");
  expect_open_error(file("x.bin"), {"2 tokens", "5 bytes", "trailing"});
}

TEST_F(TokenShardTest, TokenOutOfVocab) {
  write_file(file("o.bin"), header_bytes("ANVILTOK", 1, 1, 9, 100) + u16_body({1, 2, 3, 4, 5, 6, 7, 150, 9}));
  expect_open_error(file("o.bin"), {"token 150", "position 7", "vocab_size 100"});
}

TEST_F(TokenShardTest, TokenOutOfVocabFarIntoALargeShard) {
  auto tokens = random_tokens(100000, 1000, 3);
  write_token_shard(file("big.bin"), tokens, 1000);
  // Patch one token past the first scan block in place, behind the writer's back.
  {
    std::fstream f(file("big.bin"), std::ios::binary | std::ios::in | std::ios::out);
    const uint16_t bad = 1000;
    f.seekp(static_cast<std::streamoff>(kTokenShardHeaderBytes + 2 * 54321));
    f.write(reinterpret_cast<const char*>(&bad), 2);
  }
  expect_open_error(file("big.bin"), {"token 1000", "position 54321"});
}

}  // namespace
}  // namespace anvil::data
