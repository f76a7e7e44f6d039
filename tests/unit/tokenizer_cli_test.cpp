// `anvil tokenize`: stdin lines -> ids lines, --decode back, invalid UTF-8 and bad ids.
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace anvil {
namespace {

class TokenizerCli : public ::testing::Test {
 protected:
  test::CommandResult tokenize(const std::string& input, const std::string& args) {
    test::write_file(dir / "in.txt", input);
    return test::run_anvil("tokenize " + args + " < " + (dir / "in.txt"));
  }
  test::TempDir dir;
};

TEST_F(TokenizerCli, EncodesEachLineAndDecodesBack) {
  test::CommandResult r = tokenize("Hi\n\nA b\n", "--tokenizer bytes");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "72 105\n\n65 32 98\n");
  r = tokenize("no newline at the end", "--tokenizer bytes");
  EXPECT_EQ(r.output, "110 111 32 110 101 119 108 105 110 101 32 97 116 32 116 104 101 32 101 110 100\n");
  r = tokenize("72 105\n\n 65  32\t98 \n", "--tokenizer bytes --decode");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "Hi\n\nA b\n");
}

TEST_F(TokenizerCli, InvalidUtf8IsReplacedAndCounted) {
  const test::CommandResult r = tokenize(
      "a\xFF"
      "b\n\xE2\x82\nok\n",
      "--tokenizer bytes");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("97 239 191 189 98\n239 191 189\n111 107\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("replaced 2 invalid UTF-8 sequences with U+FFFD (in 2 lines)"), std::string::npos)
      << r.output;
}

TEST_F(TokenizerCli, BadIdsAndFilesAreClearErrors) {
  test::CommandResult r = tokenize("65\n66 300\n", "--tokenizer bytes --decode");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("error: tokenize --decode: line 2: id 300 is out of range"), std::string::npos)
      << r.output;
  r = tokenize("65 x1\n", "--tokenizer bytes --decode");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("line 1: 'x1' is not a token id"), std::string::npos) << r.output;
  r = tokenize("hi\n", "--tokenizer " + (dir / "nope.json"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("nope.json"), std::string::npos) << r.output;
  test::write_file(dir / "unigram.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  r = tokenize("hi\n", "--tokenizer " + (dir / "unigram.json"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("unigram.json': model type 'Unigram' is not supported"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace anvil
