// Byte-level BPE from tokenizer.json: merges by rank, pre-tokenization, added tokens, decoding, errors.
// The tokenizer files here are written by the test (no Python needed); exactness against Hugging Face
// tokenizers on real and trained files is in tokenizer_exactness_test.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "data/bpe_tokenizer.hpp"
#include "data/tokenizer.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using nlohmann::json;

// The byte-level alphabet (printable Latin-1 bytes as themselves, the rest from U+0100 on), UTF-8.
std::string byte_char(int b) {
  int next = 256, cp = -1;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
    const int c = printable ? x : next++;
    if (x == b) cp = c;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// Byte-level text of a string: each byte as its alphabet character.
std::string bl(std::string_view s) {
  std::string out;
  for (unsigned char c : s) out += byte_char(c);
  return out;
}

// A tokenizer.json: ids 0..255 are the bytes, then one token per merge, then the added tokens.
json make_bpe(const std::vector<std::pair<std::string, std::string>>& merges, json added = json::array()) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json m = json::array();
  for (const auto& [a, b] : merges) {
    m.push_back(json::array({bl(a), bl(b)}));
    if (!vocab.contains(bl(a + b))) vocab[bl(a + b)] = vocab.size();
  }
  return {{"version", "1.0"},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}, {"unk_token", nullptr}}}};
}

json added_token(uint32_t id, const std::string& content, bool special = true) {
  return {{"id", id},        {"content", content},     {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", !special}, {"special", special}};
}

class TokenizerBpe : public ::testing::Test {
 protected:
  std::unique_ptr<data::Tokenizer> load(const json& j, const std::string& name = "tokenizer.json") {
    test::write_file(dir / name, j.dump());
    return data::load_tokenizer(dir / name);
  }
  std::vector<uint32_t> ids_of(const data::Tokenizer& t, std::initializer_list<std::string> tokens) {
    std::vector<uint32_t> ids;
    for (const std::string& s : tokens) {
      auto id = t.token_to_id(bl(s));
      EXPECT_TRUE(id.has_value()) << s;
      ids.push_back(id.value_or(0));
    }
    return ids;
  }
  test::TempDir dir;
};

TEST_F(TokenizerBpe, MergesApplyLowestRankFirst) {
  // ab before bc: "abc" -> ab + c -> abc. With bc ranked first: a + bc, which has no merge.
  auto t = load(make_bpe({{"a", "b"}, {"b", "c"}, {"ab", "c"}}));
  EXPECT_EQ(t->kind(), "bpe");
  EXPECT_EQ(t->encode("abc"), ids_of(*t, {"abc"}));
  auto u = load(make_bpe({{"b", "c"}, {"a", "b"}, {"ab", "c"}}), "u.json");
  EXPECT_EQ(u->encode("abc"), ids_of(*u, {"a", "bc"}));
  // Equal pairs merge leftmost first: "aaa" -> aa + a.
  auto v = load(make_bpe({{"a", "a"}}), "v.json");
  EXPECT_EQ(v->encode("aaa"), ids_of(*v, {"aa", "a"}));
  EXPECT_EQ(v->encode("aaaa"), ids_of(*v, {"aa", "aa"}));
}

TEST_F(TokenizerBpe, ByteLevelRegexSplitsWordsBeforeMerging) {
  // " t" + "he" merge inside " the", but never across the pieces "the" | " the" | "'s".
  auto t = load(make_bpe({{" ", "t"}, {"h", "e"}, {" t", "he"}, {"t", "he"}, {"'", "s"}, {"e", " "}}));
  EXPECT_EQ(t->encode("the the's"), ids_of(*t, {"the", " the", "'s"}));
  // "e " never forms: the space starts the next piece.
  EXPECT_EQ(t->encode("e e"), ids_of(*t, {"e", " ", "e"}));
  // Unicode letters stay one piece and fall back to their bytes.
  EXPECT_EQ(t->encode("é"), (std::vector<uint32_t>{0xC3, 0xA9}));
}

TEST_F(TokenizerBpe, EmptyInputGivesNoIds) {
  auto t = load(make_bpe({{"a", "b"}}));
  EXPECT_TRUE(t->encode("").empty());
  EXPECT_EQ(t->decode(std::vector<uint32_t>{}), "");
}

TEST_F(TokenizerBpe, RoundTripsTheCorpusAndArbitraryBytes) {
  auto t = load(make_bpe({{" ", "t"}, {"h", "e"}, {" t", "he"}, {"i", "n"}, {"e", "r"}, {" ", "a"}}));
  const std::string corpus =
      test::read_file(std::string(ANVIL_SOURCE_DIR) + "/tests/data/tokenizer_corpus.txt");
  ASSERT_GT(corpus.size(), 10000u);
  size_t start = 0, lines = 0;
  for (size_t nl; (nl = corpus.find('\n', start)) != std::string::npos; start = nl + 1, ++lines) {
    const std::string line = corpus.substr(start, nl - start);
    ASSERT_EQ(t->decode(t->encode(line)), line) << "line " << lines + 1;
  }
  EXPECT_EQ(t->decode(t->encode(corpus)), corpus);  // newlines included
  EXPECT_GT(lines, 200u);
}

// encode() is const and shares the word cache between threads: concurrent calls give the same ids.
TEST_F(TokenizerBpe, ConcurrentEncodeIsConsistent) {
  auto t = load(make_bpe({{" ", "t"}, {"h", "e"}, {" t", "he"}, {"i", "n"}, {"e", "r"}, {" ", "a"}}));
  const std::string corpus =
      test::read_file(std::string(ANVIL_SOURCE_DIR) + "/tests/data/tokenizer_corpus.txt");
  const std::vector<uint32_t> want = t->encode(corpus);
  std::vector<std::vector<uint32_t>> got(4);
  std::vector<std::thread> threads;
  for (auto& g : got)
    threads.emplace_back([&] {
      for (int rep = 0; rep < 3; ++rep) g = t->encode(corpus);
    });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

TEST_F(TokenizerBpe, InvalidUtf8IsReplacedNotFatal) {
  auto t = load(make_bpe({{"a", "b"}}));
  const std::string bad = "ab\xFF\xC3(\xE2\x82";  // stray byte, truncated 2-byte and 3-byte sequences
  std::vector<uint32_t> ids;
  ASSERT_NO_THROW(ids = t->encode(bad));
  EXPECT_EQ(t->decode(ids), "ab\xEF\xBF\xBD\xEF\xBF\xBD(\xEF\xBF\xBD");  // one U+FFFD per maximal subpart
  // Decoding ids that end inside a character is lossy the same way.
  EXPECT_EQ(t->decode(std::vector<uint32_t>{'a', 0xE2, 0x82}), "a\xEF\xBF\xBD");
}

TEST_F(TokenizerBpe, SpecialTokensAreMatchedFirstLongestWins) {
  json added =
      json::array({added_token(300, "<|endoftext|>"), added_token(301, "<|end"), added_token(302, "<|x|>")});
  auto t = load(make_bpe({{"a", "b"}}, added));
  EXPECT_EQ(t->vocab_size(), 303u);
  EXPECT_EQ(t->encode("ab<|endoftext|>ab"), (std::vector<uint32_t>{256, 300, 256}));
  EXPECT_EQ(t->encode("<|end|><|endoftext|>"), (std::vector<uint32_t>{301, '|', '>', 300}));
  // A special token splits the text: no merge, and no regex piece, spans it.
  EXPECT_EQ(t->encode("a<|x|>b"), (std::vector<uint32_t>{'a', 302, 'b'}));
  EXPECT_EQ(t->decode(t->encode("x <|endoftext|> y")), "x <|endoftext|> y");
  EXPECT_EQ(t->decode(t->encode("x <|endoftext|> y"), /*skip_special=*/true), "x  y");
  EXPECT_EQ(t->eos_id(), 300u);
  EXPECT_EQ(t->token_to_id("<|x|>"), 302u);
}

TEST_F(TokenizerBpe, AddedTokenOptions) {
  json l = added_token(300, "<L>"), r = added_token(301, "<R>"), w = added_token(302, "<W>");
  l["lstrip"] = true, r["rstrip"] = true, w["single_word"] = true;
  auto t = load(make_bpe({}, json::array({l, r, w})));
  const uint32_t sp = ' ';
  // lstrip swallows the whitespace before, rstrip the whitespace after (tabs and NBSP included).
  EXPECT_EQ(t->encode("x  <L> y"), (std::vector<uint32_t>{'x', 300, sp, 'y'}));
  EXPECT_EQ(t->encode("x\t<R> \ty"), (std::vector<uint32_t>{'x', '\t', 301, 'y'}));
  EXPECT_EQ(t->encode("x\xC2\xA0<L>"), (std::vector<uint32_t>{'x', 300}));
  // single_word: only between non-word characters.
  EXPECT_EQ(t->encode("a <W> b"), (std::vector<uint32_t>{'a', sp, 302, sp, 'b'}));
  EXPECT_EQ(t->encode("(<W>)"), (std::vector<uint32_t>{'(', 302, ')'}));
  EXPECT_EQ(t->encode("a<W>"), (std::vector<uint32_t>{'a', '<', 'W', '>'}));
  EXPECT_EQ(t->encode("<W>_"), (std::vector<uint32_t>{'<', 'W', '>', '_'}));
}

TEST_F(TokenizerBpe, PrefixSpaceAndLlama3StyleSplit) {
  json j = make_bpe({{" ", "h"}, {" h", "i"}});
  j["pre_tokenizer"]["add_prefix_space"] = true;
  auto t = load(j);
  EXPECT_EQ(t->encode("hi"), ids_of(*t, {" hi"}));
  EXPECT_EQ(t->encode(" hi"), ids_of(*t, {" hi"}));
  // Llama 3: Split(regex, Isolated) then ByteLevel without its own regex; digits go in groups of three.
  json k = make_bpe({{"1", "2"}, {"12", "3"}});
  k["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"},
                     {"pattern", {{"Regex", "\\p{N}{1,3}|\\p{L}+|\\s+|[^\\s\\p{L}\\p{N}]+"}}},
                     {"behavior", "Isolated"},
                     {"invert", false}},
                    {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  auto u = load(k, "llama.json");
  EXPECT_EQ(u->encode("1231234"), ids_of(*u, {"123", "123", "4"}));
}

TEST_F(TokenizerBpe, MergesAsStringsAndIgnoreMerges) {
  json j = make_bpe({{"a", "b"}});
  j["model"]["merges"] = json::array({bl("a") + " " + bl("b")});
  j["model"]["vocab"][bl("xyz")] = 400;  // reachable only through ignore_merges
  j["model"]["ignore_merges"] = true;
  auto t = load(j);
  EXPECT_EQ(t->encode("ab"), ids_of(*t, {"ab"}));
  EXPECT_EQ(t->encode("xyz"), (std::vector<uint32_t>{400}));
}

TEST_F(TokenizerBpe, DecodeRejectsUnknownIds) {
  auto t = load(make_bpe({{"a", "b"}}));
  test::expect_error([&] { t->decode(std::vector<uint32_t>{'a', 9999}); }, {"9999", "position 1"});
}

TEST_F(TokenizerBpe, ErrorsNameTheFileAndTheProblem) {
  const std::string path = dir / "bad.json";
  const auto expect_load_error = [&](const std::string& text, std::initializer_list<std::string> needles) {
    test::write_file(path, text);
    std::vector<std::string> all(needles);
    all.push_back("bad.json");
    try {
      data::load_tokenizer(path);
      ADD_FAILURE() << "expected an error for: " << text.substr(0, 200);
    } catch (const Error& e) {
      for (const std::string& n : all)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  expect_load_error("{ not json", {"not valid JSON"});
  expect_load_error("[1, 2]", {"JSON object"});
  expect_load_error(R"({"version": "1.0", "added_tokens": []})", {"\"model\""});
  json unigram = make_bpe({});
  unigram["model"] = {{"type", "Unigram"}, {"vocab", json::array()}};
  expect_load_error(unigram.dump(), {"Unigram", "not supported"});
  json wordlevel = make_bpe({});
  wordlevel["model"]["type"] = "WordLevel";
  expect_load_error(wordlevel.dump(), {"WordLevel", "not supported"});
  json unknown = make_bpe({{"a", "b"}});
  unknown["model"]["merges"].push_back(json::array({bl("a"), "qq"}));
  expect_load_error(unknown.dump(), {"model.merges[1]", "qq", "not in model.vocab"});
  json bad_merge = make_bpe({});
  bad_merge["model"]["merges"] = json::array({"a b c"});
  expect_load_error(bad_merge.dump(), {"model.merges[0]"});
  json nfc = make_bpe({});
  nfc["normalizer"] = {{"type", "NFC"}};
  expect_load_error(nfc.dump(), {"normalizer", "NFC", "not supported"});
  json meta = make_bpe({});
  meta["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
  expect_load_error(meta.dump(), {"pre_tokenizer", "Metaspace", "not supported"});
  json no_byte_level = make_bpe({});
  no_byte_level["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Removed"}, {"invert", false}};
  expect_load_error(no_byte_level.dump(), {"ByteLevel"});
  json bad_regex = make_bpe({});
  bad_regex["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
                    {{"type", "ByteLevel"}}})}};
  expect_load_error(bad_regex.dump(), {"pretokenizers[0].pattern", "does not compile"});
  json fallback = make_bpe({});
  fallback["model"]["byte_fallback"] = true;
  expect_load_error(fallback.dump(), {"byte_fallback"});
  json decoder = make_bpe({});
  decoder["decoder"] = {{"type", "Metaspace"}};
  expect_load_error(decoder.dump(), {"decoder", "Metaspace"});
  json bad_vocab = make_bpe({});
  bad_vocab["model"]["vocab"]["x"] = -1;
  expect_load_error(bad_vocab.dump(), {"model.vocab[\"x\"]"});
  test::expect_error([&] { data::load_tokenizer(dir / "missing.json"); }, {"missing.json", "no such file"});
  test::write_file(dir / "spm.model", "\x0a\x0b binary");
  test::expect_error([&] { data::load_tokenizer(dir / "spm.model"); }, {"spm.model", "not supported"});
}

// Inputs found by fuzzing (tests/fuzz/): each must be an anvil::Error naming the file, not a crash, an
// out-of-memory or another exception type.
TEST_F(TokenizerBpe, FuzzFindingsAreCleanErrors) {
  const auto expect_load_error = [&](const std::string& name, const std::string& text,
                                     std::initializer_list<std::string> needles) {
    test::write_file(dir / name, text);
    std::vector<std::string> all(needles);
    all.push_back(name);
    try {
      data::load_tokenizer(dir / name);
      ADD_FAILURE() << "expected an error for " << name;
    } catch (const Error& e) {
      for (const std::string& n : all)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  // A number out of double range: nlohmann throws out_of_range, not parse_error.
  expect_load_error("overflow.json",
                    R"({"model": {"type": "BPE", "vocab": {}, "merges": [], "dropout": 1e500}})",
                    {"not valid JSON", "1e500"});
  // Nested Sequences are parsed recursively: 100000 levels overflowed the stack.
  std::string deep = R"({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": )";
  for (int i = 0; i < 100000; ++i) deep += R"({"type": "Sequence", "pretokenizers": [)";
  deep += R"({"type": "ByteLevel"})";
  for (int i = 0; i < 100000; ++i) deep += "]}";
  expect_load_error("deep.json", deep + "}", {"nested deeper than 128 levels"});
  // One huge id made the loader allocate tables of 2^31 entries (64 GiB).
  json sparse = make_bpe({});
  sparse["model"]["vocab"]["zz"] = 2147483647;
  expect_load_error("sparse.json", sparse.dump(), {"model.vocab", "largest id is 2147483647"});
  json sparse_added = make_bpe({}, json::array({added_token(2147483647, "<big>")}));
  expect_load_error("sparse_added.json", sparse_added.dump(), {"added_tokens", "largest id is 2147483647"});
  // \C matches one byte of a character, leaving ill-formed UTF-8 for the next (unchecked) regex.
  json backslash_c = make_bpe({});
  backslash_c["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"Regex", "\\C"}}}, {"behavior", "Isolated"}},
                    {{"type", "ByteLevel"}}})}};
  expect_load_error("backslash_c.json", backslash_c.dump(), {"pretokenizers[0].pattern", "does not compile"});
  // Holes in the ids are still fine within the allowed space.
  json holes = make_bpe({}, json::array({added_token(5000, "<late>")}));
  EXPECT_EQ(load(holes, "holes.json")->vocab_size(), 5001u);
}

}  // namespace
}  // namespace anvil
