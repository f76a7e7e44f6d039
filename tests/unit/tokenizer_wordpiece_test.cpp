// WordPiece (BERT) from a vocab.txt and a tokenizer.json: normalization, pre-tokenization, greedy
// subwords, [UNK], classification inputs, decoding, errors. Exactness against Hugging Face tokenizers
// on a real model's files is in tokenizer_exactness_test.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/tokenizer.hpp"
#include "data/wordpiece_tokenizer.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

const std::vector<std::string> kVocab = {
    "[PAD]",  "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the",  "quick", "brown", "fox", "un", "##aff",
    "##able", "a",     "cafe",  ",",     ".",      "!",    "'",     "s",     "中",  "国", "hello",
    "##ing",  "go",    "i",     "don",   "t",      "ελλα", "##δα",  "##ς",   "ꜧ",   "ᄀ"};

class TokenizerWordPiece : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string text;
    for (const std::string& t : kVocab) text += t + "\n";
    test::write_file(dir / "vocab.txt", text);
    tok = data::WordPieceTokenizer::from_vocab_txt(dir / "vocab.txt");
  }
  std::vector<uint32_t> ids(std::initializer_list<std::string> tokens) const {
    std::vector<uint32_t> out;
    for (const std::string& t : tokens) out.push_back(tok->token_to_id(t).value());
    return out;
  }
  test::TempDir dir;
  std::unique_ptr<data::WordPieceTokenizer> tok;
};

TEST_F(TokenizerWordPiece, NormalizesAndSplitsLikeBertUncased) {
  EXPECT_EQ(tok->kind(), "wordpiece");
  EXPECT_EQ(tok->vocab_size(), kVocab.size());
  EXPECT_EQ(tok->encode("The QUICK, brown fox!"), ids({"the", "quick", ",", "brown", "fox", "!"}));
  EXPECT_EQ(tok->encode("Café\tcafé  CAFÉ"), ids({"cafe", "cafe", "cafe"}));  // accents stripped, lower-cased
  EXPECT_EQ(tok->encode("ca\xCC\x81"
                        "fe"),
            ids({"cafe"}));  // a decomposed accent too
  EXPECT_EQ(tok->encode("Ελλάδας"),
            ids({"ελλα", "##δα", "##ς"}));  // Greek: tonos stripped, final sigma stays ς
  EXPECT_EQ(tok->encode("go中国go"), ids({"go", "中", "国", "go"}));  // CJK ideographs become words
  EXPECT_EQ(tok->encode("hel\x01lo\xC2\xAD hel\xE2\x80\x8Blo"),
            ids({"hello", "hello"}));  // controls, format chars dropped
  EXPECT_EQ(tok->encode("don't"), ids({"don", "'", "t"}));
  EXPECT_EQ(tok->normalize("İ\xEA\x9C\xA6 각"),
            "i\xEA\x9C\xA7 \xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8");  // Hangul -> jamo
  EXPECT_TRUE(tok->encode("").empty());
  EXPECT_TRUE(tok->encode(" \t\n ").empty());
}

TEST_F(TokenizerWordPiece, GreedyLongestSubwordsAndUnknownWords) {
  EXPECT_EQ(tok->encode("unaffable"), ids({"un", "##aff", "##able"}));
  EXPECT_EQ(tok->encode("goes"), ids({"[UNK]"}));  // "go" matches but "##es" and "##e" do not
  EXPECT_EQ(tok->encode("unaffablex fox"),
            ids({"[UNK]", "fox"}));  // any unmatched part: the whole word is [UNK]
  EXPECT_EQ(tok->encode(std::string(100, 'a')), ids({"[UNK]"}));  // 100 chars: "a" + 99 unmatched "##a"
  EXPECT_EQ(tok->encode(std::string(101, 'a') + " a"), ids({"[UNK]", "a"}));  // over max_input_chars_per_word
}

TEST_F(TokenizerWordPiece, SpecialTokensInTextAndClassificationInputs) {
  EXPECT_EQ(tok->encode("the [MASK] fox[SEP]"), ids({"the", "[MASK]", "fox", "[SEP]"}));
  EXPECT_EQ(tok->encode("[mask]"),
            ids({"[UNK]", "[UNK]", "[UNK]"}));  // special tokens match unnormalized text only
  EXPECT_EQ(tok->eos_id(), tok->token_to_id("[SEP]"));
  EXPECT_EQ(tok->encode_for_classification("the quick brown fox", 64),
            ids({"[CLS]", "the", "quick", "brown", "fox", "[SEP]"}));
  EXPECT_EQ(tok->encode_for_classification("the quick brown fox", 4),
            ids({"[CLS]", "the", "quick", "[SEP]"}));
  EXPECT_EQ(tok->encode_for_classification("", 2), ids({"[CLS]", "[SEP]"}));
  test::expect_error([&] { tok->encode_for_classification("x", 1); }, {"max_length 1"});
}

TEST_F(TokenizerWordPiece, DecodesWithSubwordJoiningAndCleanup) {
  EXPECT_EQ(tok->decode(ids({"the", "quick", ",", "un", "##aff", "##able", "fox", "!"})),
            "the quick, unaffable fox!");
  EXPECT_EQ(tok->decode(ids({"[CLS]", "hello", "[SEP]"})), "[CLS] hello [SEP]");
  EXPECT_EQ(tok->decode(ids({"[CLS]", "hello", "[SEP]"}), /*skip_special=*/true), "hello");
  test::expect_error([&] { tok->decode(std::vector<uint32_t>{5, 777}); }, {"777", "position 1"});
}

TEST_F(TokenizerWordPiece, TokenizerJsonOptions) {
  nlohmann::json vocab = nlohmann::json::object();
  for (size_t i = 0; i < kVocab.size(); ++i) vocab[kVocab[i]] = i;
  nlohmann::json j = {
      {"added_tokens",
       nlohmann::json::array({{{"id", 4}, {"content", "[MASK]"}, {"special", true}, {"normalized", false}}})},
      {"normalizer",
       {{"type", "BertNormalizer"},
        {"clean_text", true},
        {"handle_chinese_chars", true},
        {"strip_accents", false},
        {"lowercase", false}}},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
      {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", false}}},
      {"model",
       {{"type", "WordPiece"},
        {"vocab", vocab},
        {"unk_token", "[UNK]"},
        {"continuing_subword_prefix", "##"},
        {"max_input_chars_per_word", 5}}}};
  test::write_file(dir / "tokenizer.json", j.dump());
  auto t = data::load_tokenizer(dir / "tokenizer.json");
  EXPECT_EQ(t->kind(), "wordpiece");
  // Cased, accents kept: "The" and "café" are unknown; 6 characters is over max_input_chars_per_word 5.
  EXPECT_EQ(t->encode("The the café cafe quick quickk"), (std::vector<uint32_t>{1, 5, 1, 13, 6, 1}));
  EXPECT_EQ(t->decode(std::vector<uint32_t>{5, 14, 8}), "the , fox");  // no cleanup
  // A directory holding a tokenizer.json loads too.
  EXPECT_EQ(data::load_tokenizer(dir.str())->encode("fox"), (std::vector<uint32_t>{8}));
}

TEST_F(TokenizerWordPiece, Errors) {
  test::write_file(dir / "nounk.txt", "the\nfox\n");
  test::expect_error([&] { data::load_tokenizer(dir / "nounk.txt"); }, {"nounk.txt", "[UNK]"});
  test::write_file(dir / "empty.txt", "");
  test::expect_error([&] { data::load_tokenizer(dir / "empty.txt"); }, {"empty.txt", "empty"});
  nlohmann::json j = {{"normalizer", {{"type", "Lowercase"}}},
                      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
                      {"model", {{"type", "WordPiece"}, {"vocab", {{"[UNK]", 0}}}}}};
  test::write_file(dir / "lower.json", j.dump());
  test::expect_error([&] { data::load_tokenizer(dir / "lower.json"); },
                     {"lower.json", "normalizer", "Lowercase"});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  test::write_file(dir / "ws.json", j.dump());
  test::expect_error([&] { data::load_tokenizer(dir / "ws.json"); },
                     {"ws.json", "pre_tokenizer", "Whitespace"});
  // Found by fuzzing: one huge id made finish() allocate tables of 2^31 entries.
  j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  j["model"]["vocab"] = {{"[UNK]", 2147483647}};
  test::write_file(dir / "sparse.json", j.dump());
  test::expect_error([&] { data::load_tokenizer(dir / "sparse.json"); },
                     {"sparse.json", "model.vocab", "largest id is 2147483647"});
  j["model"]["vocab"] = {{"[UNK]", 0}};
  j["added_tokens"] = {{{"id", 2147483647}, {"content", "[BIG]"}, {"special", true}}};
  test::write_file(dir / "sparse_added.json", j.dump());
  test::expect_error([&] { data::load_tokenizer(dir / "sparse_added.json"); },
                     {"sparse_added.json", "added_tokens", "largest id is 2147483647"});
}

}  // namespace
}  // namespace anvil
