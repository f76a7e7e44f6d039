// SentencePiece-style BPE (Llama 2, Mistral, TinyLlama) from tokenizer.json: exact ids, decoding and the
// BOS/EOS template against the committed fixtures of tests/data/sp_tokenizers/ (reference ids from Hugging
// Face tokenizers, written by tests/tokenizers/make_sp_tokenizers.py; no Python needed here), the
// tokenizer_config.json rules, byte fallback and unk details, and errors for what is not supported.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "data/tokenizer.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

const std::string kFixtures = std::string(ANVIL_SOURCE_DIR) + "/tests/data/sp_tokenizers";

json read_json(const std::string& path) {
  return json::parse(test::read_file(path));
}

std::vector<uint32_t> ids_of(const json& j) {
  return j.get<std::vector<uint32_t>>();
}

class TokenizerSentencePiece : public ::testing::Test {
 protected:
  // Checks every reference of one fixture directory; returns the tokenizer.
  static std::unique_ptr<data::Tokenizer> check_fixture(const std::string& name) {
    const json texts_file = read_json(kFixtures + "/texts.json");
    const std::vector<std::string> texts = texts_file["texts"].get<std::vector<std::string>>();
    const size_t hand_written = texts_file["hand_written"].get<size_t>();
    const json ref = read_json(kFixtures + "/" + name + "/reference.json");
    std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(kFixtures + "/" + name);
    EXPECT_EQ(tok->kind(), "sentencepiece_bpe");

    size_t mismatched = 0, decode_mismatched = 0, ids = 0;
    const size_t n = ref["ids"].size();
    EXPECT_TRUE(n == texts.size() || n == hand_written) << n;
    for (size_t i = 0; i < n && i < texts.size(); ++i) {
      const std::vector<uint32_t> want = ids_of(ref["ids"][i]);
      const std::vector<uint32_t> got = tok->encode(texts[i]);
      ids += want.size();
      if (got != want && ++mismatched <= 5)
        ADD_FAILURE() << name << " text " << i << ": '" << texts[i]
                      << "'\n  tokenizers: " << ::testing::PrintToString(want)
                      << "\n  anvil:      " << ::testing::PrintToString(got);
      const std::string want_text =
          ref["decoded"][i].is_null() ? texts[i] : ref["decoded"][i].get<std::string>();
      const std::string decoded = tok->decode(want);
      if (decoded != want_text && ++decode_mismatched <= 5)
        ADD_FAILURE() << name << " text " << i << " decodes to '" << decoded << "', tokenizers gives '"
                      << want_text << "'";
    }
    EXPECT_EQ(mismatched, 0u);
    EXPECT_EQ(decode_mismatched, 0u);

    // With the template (add_special_tokens=True as transformers sets it up).
    for (size_t i = 0; i < ref["special"].size(); ++i)
      EXPECT_EQ(tok->encode_with_special(texts[i]), ids_of(ref["special"][i])) << name << " text " << i;

    // Decoding arbitrary id sequences: byte-token runs (valid UTF-8 or not), pieces, special tokens.
    for (const json& c : ref["decode_cases"]) {
      const std::vector<uint32_t> case_ids = ids_of(c["ids"]);
      EXPECT_EQ(tok->decode(case_ids), c["decoded"].get<std::string>()) << name << " " << c["ids"].dump();
      EXPECT_EQ(tok->decode(case_ids, /*skip_special=*/true), c["decoded_skip_special"].get<std::string>())
          << name << " " << c["ids"].dump();
    }
    std::printf("[ exact    ] %s: %zu texts, %zu ids, %zu decode cases, tokenizers %s\n", name.c_str(), n,
                ids, ref["decode_cases"].size(), ref["tokenizers_version"].get<std::string>().c_str());
    return tok;
  }

  // The llama2 fixture's tokenizer.json, parsed, for variants written by the tests.
  static json llama2() { return read_json(kFixtures + "/llama2/tokenizer.json"); }

  std::string write(const json& j, const std::string& name = "tokenizer.json") {
    const std::string path = dir / name;
    test::write_file(path, j.dump());
    return path;
  }

  // Loading `j` must fail with an error naming the file and every needle.
  void expect_load_error(const json& j, std::initializer_list<std::string> needles) {
    const std::string path = write(j, "bad.json");
    std::vector<std::string> all(needles);
    all.push_back(path);
    try {
      data::load_tokenizer(path);
      ADD_FAILURE() << "expected an error for " << j.dump().substr(0, 200);
    } catch (const Error& e) {
      for (const std::string& n : all)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  }

  test::TempDir dir;
};

TEST_F(TokenizerSentencePiece, Llama2LegacyNormalizerExact) {
  const auto tok = check_fixture("llama2");
  EXPECT_EQ(tok->special_template(), (data::SpecialTokenTemplate{{1}, {}}));
  EXPECT_EQ(tok->eos_id(), 2u);
  // Decode round trip: text without special-token strings or a literal "▁" comes back exactly.
  const json texts = read_json(kFixtures + "/texts.json")["texts"];
  size_t round_trips = 0;
  for (const json& t : texts) {
    const std::string s = t.get<std::string>();
    if (s.find("<s>") != std::string::npos || s.find("</s>") != std::string::npos ||
        s.find("<unk>") != std::string::npos || s.find("\xE2\x96\x81") != std::string::npos)
      continue;
    EXPECT_EQ(tok->decode(tok->encode(s)), s);
    ++round_trips;
  }
  EXPECT_GT(round_trips, 300u);
}

TEST_F(TokenizerSentencePiece, MetaspacePrependFirstExact) {
  const auto tok = check_fixture("metaspace_first");
  // tokenizer_config.json's add_eos_token: true wins over the file's "<s> $A".
  EXPECT_EQ(tok->special_template(), (data::SpecialTokenTemplate{{1}, {2}}));
  EXPECT_EQ(tok->token_to_id("[INST]"), 956u);
  EXPECT_EQ(tok->token_to_id("<mask>"), 808u);  // an added token that is also a piece of the vocabulary
}

TEST_F(TokenizerSentencePiece, MetaspaceAlwaysSplitUnkExact) {
  const auto tok = check_fixture("metaspace_always");
  EXPECT_EQ(tok->special_template(), (data::SpecialTokenTemplate{{1}, {2}}));
}

TEST_F(TokenizerSentencePiece, MetaspaceNeverNoUnkExact) {
  const auto tok = check_fixture("metaspace_never");
  EXPECT_EQ(tok->special_template(), (data::SpecialTokenTemplate{{}, {2}}));
}

TEST_F(TokenizerSentencePiece, ByteFallbackEncodesAndDecodes) {
  const auto tok = data::load_tokenizer(kFixtures + "/llama2/tokenizer.json");
  const auto byte = [](int b) { return uint32_t(3 + b); };
  // "😀" is not in the vocabulary: "▁" then its four UTF-8 bytes.
  const std::vector<uint32_t> smile = tok->encode("\xF0\x9F\x98\x80");
  ASSERT_EQ(smile.size(), 5u);
  EXPECT_EQ(std::vector<uint32_t>(smile.begin() + 1, smile.end()),
            (std::vector<uint32_t>{byte(0xF0), byte(0x9F), byte(0x98), byte(0x80)}));
  EXPECT_EQ(tok->decode(smile), "\xF0\x9F\x98\x80");
  // An incomplete sequence gives one U+FFFD per byte, as the reference's ByteFallback decoder does.
  const std::vector<uint32_t> partial{byte(0xF0), byte(0x9F)};
  EXPECT_EQ(tok->decode(partial), "\xEF\xBF\xBD\xEF\xBF\xBD");
  // Invalid UTF-8 input is replaced by U+FFFD first (as the reference only sees valid text).
  EXPECT_EQ(tok->encode("a\xFF"), tok->encode("a\xEF\xBF\xBD"));
}

// A tiny SentencePiece-style file written by the test: characters a, b, c, ▁, the merge "a b", and "abc",
// which no merge makes.
json tiny(bool byte_fallback, bool fuse_unk, bool ignore_merges = false) {
  json vocab = {{"<unk>", 0},        {"<s>", 1}, {"</s>", 2}, {"a", 3},  {"b", 4},
                {"\xE2\x96\x81", 5}, {"ab", 6},  {"c", 7},    {"abc", 8}};
  if (byte_fallback)
    for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 9 + b;
  return {{"version", "1.0"},
          {"added_tokens", json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "never"}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "never"}}},
          {"model",
           {{"type", "BPE"},
            {"vocab", vocab},
            {"merges", json::array({"a b"})},
            {"unk_token", "<unk>"},
            {"fuse_unk", fuse_unk},
            {"byte_fallback", byte_fallback},
            {"ignore_merges", ignore_merges}}}};
}

TEST_F(TokenizerSentencePiece, UnknownCharactersWithoutByteFallback) {
  // Consecutive unknown characters give one <unk> with fuse_unk, one each without.
  const auto fused = data::load_tokenizer(write(tiny(false, true)));
  EXPECT_EQ(fused->encode("a\xC3\xA9\xC3\xA9"
                          "ab"),
            (std::vector<uint32_t>{3, 0, 6}));
  const auto unfused = data::load_tokenizer(write(tiny(false, false), "unfused.json"));
  EXPECT_EQ(unfused->encode("a\xC3\xA9\xC3\xA9"
                            "ab"),
            (std::vector<uint32_t>{3, 0, 0, 6}));
  // No decoder step reads byte tokens here: ids decode to their token text.
  EXPECT_EQ(fused->decode(std::vector<uint32_t>{3, 0, 5, 6}), "a<unk> ab");
  // With byte fallback the same characters become bytes (é = C3 A9).
  const auto bytes = data::load_tokenizer(write(tiny(true, true), "bytes.json"));
  EXPECT_EQ(bytes->encode("a\xC3\xA9"), (std::vector<uint32_t>{3, 9 + 0xC3, 9 + 0xA9}));
}

TEST_F(TokenizerSentencePiece, IgnoreMergesAndNoDecoder) {
  // prepend_scheme "never" with split: "abc ab" is the words "abc" and "▁ab".
  const auto merged = data::load_tokenizer(write(tiny(false, true, false)));
  EXPECT_EQ(merged->encode("abc ab"), (std::vector<uint32_t>{6, 7, 5, 6}));
  // ignore_merges: a word that is a token is taken whole.
  const auto whole = data::load_tokenizer(write(tiny(false, true, true), "whole.json"));
  EXPECT_EQ(whole->encode("abc ab"), (std::vector<uint32_t>{8, 5, 6}));
  // Without a decoder the token strings are joined with spaces, as the reference does.
  json no_decoder = tiny(false, true);
  no_decoder["decoder"] = nullptr;
  EXPECT_EQ(data::load_tokenizer(write(no_decoder, "plain.json"))->decode(std::vector<uint32_t>{8, 5, 6}),
            "abc \xE2\x96\x81 ab");
}

TEST_F(TokenizerSentencePiece, SpecialTokensAreSplitOutFirst) {
  const auto tok = data::load_tokenizer(kFixtures + "/llama2");
  // "<s>" in the text is the special token, and the pieces around it are normalized separately (the
  // Prepend normalizer gives the piece after it a "▁" of its own, as Llama 2's legacy files do).
  const std::vector<uint32_t> ids = tok->encode("hi<s>hi");
  const std::vector<uint32_t> hi = tok->encode("hi");
  std::vector<uint32_t> want = hi;
  want.push_back(1);
  want.insert(want.end(), hi.begin(), hi.end());
  EXPECT_EQ(ids, want);
  EXPECT_EQ(tok->encode(""), std::vector<uint32_t>{});
  EXPECT_EQ(tok->encode_with_special(""), std::vector<uint32_t>{1});
  EXPECT_EQ(tok->decode(std::vector<uint32_t>{1, 2}, /*skip_special=*/true), "");
}

TEST_F(TokenizerSentencePiece, PromptsAndContinuations) {
  const auto tok = data::load_tokenizer(kFixtures + "/metaspace_first");  // template <s> $A </s>
  const std::vector<uint32_t> hello = tok->encode("Hello");
  std::vector<uint32_t> prompt{1};
  prompt.insert(prompt.end(), hello.begin(), hello.end());
  EXPECT_EQ(tok->encode_prompt("Hello"), prompt);  // BOS but no EOS
  prompt.push_back(2);
  EXPECT_EQ(tok->encode_with_special("Hello"), prompt);
  // Decoded alone, " world" loses its space to the Strip decoder; after its context it keeps it.
  const std::vector<uint32_t> context = tok->encode_prompt("Hello");
  const std::vector<uint32_t> all = tok->encode_prompt("Hello world");
  const std::vector<uint32_t> more(all.begin() + context.size(), all.end());
  EXPECT_EQ(tok->decode(more), "world");
  EXPECT_EQ(tok->decode_continuation(context, more), " world");
}

TEST_F(TokenizerSentencePiece, TokenizerConfigDecidesBosAndEos) {
  const json tj = llama2();
  write(tj);
  const auto template_of = [&](const json& config) {
    if (config.is_null())
      fs::remove(dir / "tokenizer_config.json");
    else
      write(config, "tokenizer_config.json");
    return data::load_tokenizer(dir.str())->special_template();
  };
  using T = data::SpecialTokenTemplate;
  // No config: the file's post_processor ("<s> $A").
  EXPECT_EQ(template_of(nullptr), (T{{1}, {}}));
  // The Llama classes always rebuild it from add_bos_token (default true) / add_eos_token (default false).
  EXPECT_EQ(template_of({{"tokenizer_class", "LlamaTokenizer"}}), (T{{1}, {}}));
  EXPECT_EQ(
      template_of(
          {{"tokenizer_class", "LlamaTokenizerFast"}, {"add_bos_token", false}, {"add_eos_token", true}}),
      (T{{}, {2}}));
  EXPECT_EQ(
      template_of({{"tokenizer_class", "LlamaTokenizer"}, {"add_eos_token", true}, {"eos_token", "<unk>"}}),
      (T{{1}, {0}}));
  // Other classes keep the file's unless a key is given; a missing key is false.
  EXPECT_EQ(template_of({{"tokenizer_class", "PreTrainedTokenizerFast"}}), (T{{1}, {}}));
  EXPECT_EQ(template_of({{"add_eos_token", true}, {"eos_token", {{"content", "</s>"}}}}), (T{{}, {2}}));
  // The token may come from special_tokens_map.json.
  write(json{{"bos_token", "</s>"}}, "special_tokens_map.json");
  EXPECT_EQ(template_of({{"add_bos_token", true}}), (T{{2}, {}}));
  fs::remove(dir / "special_tokens_map.json");

  const std::string config = dir / "tokenizer_config.json";
  write(json{{"add_bos_token", "yes"}}, "tokenizer_config.json");
  test::expect_error([&] { data::load_tokenizer(dir.str()); }, {config, "add_bos_token", "\"yes\""});
  write(json{{"add_bos_token", true}}, "tokenizer_config.json");
  test::expect_error([&] { data::load_tokenizer(dir.str()); }, {config, "add_bos_token", "no bos_token"});
  write(json{{"add_bos_token", true}, {"bos_token", "<bos>"}}, "tokenizer_config.json");
  test::expect_error([&] { data::load_tokenizer(dir.str()); },
                     {config, "bos_token", "'<bos>'", "not a token"});
  write(json{{"tokenizer_class", "LlamaTokenizer"}, {"add_prefix_space", true}}, "tokenizer_config.json");
  test::expect_error([&] { data::load_tokenizer(dir.str()); },
                     {config, "add_prefix_space", "true", "not supported"});
  test::write_file(config, "{ not json");
  test::expect_error([&] { data::load_tokenizer(dir.str()); }, {config, "not valid JSON"});
}

TEST_F(TokenizerSentencePiece, PostProcessorTemplates) {
  json tj = llama2();
  using T = data::SpecialTokenTemplate;
  const auto template_of = [&](const json& post) {
    tj["post_processor"] = post;
    return data::load_tokenizer(write(tj))->special_template();
  };
  EXPECT_EQ(template_of(nullptr), (T{}));
  EXPECT_EQ(template_of({{"type", "ByteLevel"}, {"trim_offsets", true}}), (T{}));
  EXPECT_EQ(template_of({{"type", "RobertaProcessing"},
                         {"sep", json::array({"</s>", 2})},
                         {"cls", json::array({"<s>", 1})}}),
            (T{{1}, {2}}));
  const json bos_eos = {{"type", "TemplateProcessing"},
                        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                                {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})},
                        {"special_tokens",
                         {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}},
                          {"</s>", {{"id", "</s>"}, {"ids", {2}}, {"tokens", {"</s>"}}}}}}};
  EXPECT_EQ(template_of(bos_eos), (T{{1}, {2}}));
  // A Sequence wraps each processor's output in the next one's template.
  EXPECT_EQ(template_of({{"type", "Sequence"}, {"processors", json::array({bos_eos, bos_eos})}}),
            (T{{1, 1}, {2, 2}}));

  json bad = bos_eos;
  bad["single"][1]["Sequence"]["id"] = "B";
  tj["post_processor"] = bad;
  expect_load_error(tj, {"post_processor.single[1]", "$B"});
  bad = bos_eos;
  bad["special_tokens"]["<s>"]["ids"] = {5000};
  tj["post_processor"] = bad;
  expect_load_error(tj, {"post_processor.special_tokens[\"<s>\"].ids", "5000"});
  tj["post_processor"] = {{"type", "BogusProcessing"}};
  expect_load_error(tj, {"post_processor", "BogusProcessing", "not supported"});
}

TEST_F(TokenizerSentencePiece, UnsupportedPartsAreErrors) {
  json tj = llama2();
  tj["normalizer"] = {{"type", "NFKC"}};
  expect_load_error(tj, {"normalizer", "NFKC", "not supported"});
  tj = llama2();
  tj["normalizer"]["normalizers"].push_back({{"type", "Lowercase"}});
  expect_load_error(tj, {"normalizer.normalizers[2]", "Lowercase", "not supported"});
  tj = llama2();
  tj["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", "\\s"}};
  expect_load_error(tj, {"normalizer.normalizers[1].pattern", "Regex", "\\\\s", "not supported"});

  tj = llama2();
  tj["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_load_error(tj, {"pre_tokenizer", "Whitespace", "not supported"});
  tj = llama2();
  tj["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "sometimes"}};
  expect_load_error(tj, {"pre_tokenizer.prepend_scheme", "'sometimes'"});
  tj["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "__"}};
  expect_load_error(tj, {"pre_tokenizer.replacement", "'__'", "single character"});
  tj["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"add_prefix_space", false}};
  expect_load_error(tj, {"pre_tokenizer.add_prefix_space", "false", "'always'"});

  tj = llama2();
  tj["decoder"]["decoders"][2] = {{"type", "WordPiece"}, {"prefix", "##"}};
  expect_load_error(tj, {"decoder.decoders[2]", "WordPiece", "not supported"});
  tj = llama2();
  tj["decoder"]["decoders"][3]["content"] = "ab";
  expect_load_error(tj, {"decoder.decoders[3].content", "'ab'"});
  tj = llama2();
  tj["decoder"] = {{"type", "ByteLevel"}};
  expect_load_error(tj, {"decoder", "ByteLevel", "not supported", "SentencePiece-style"});

  tj = llama2();
  tj["model"]["continuing_subword_prefix"] = "##";
  expect_load_error(tj, {"model.continuing_subword_prefix", "'##'", "not supported"});
  tj = llama2();
  tj["model"]["dropout"] = 0.1;
  expect_load_error(tj, {"model.dropout"});
  tj = llama2();
  tj["added_tokens"][1]["id"] = 5;  // "<s>" is id 1 in model.vocab
  expect_load_error(tj, {"added_tokens[1]", "'<s>'", "id 5", "gives it 1"});
  tj = llama2();
  tj["model"]["type"] = "Unigram";
  expect_load_error(tj, {"model", "Unigram", "not supported"});
}

TEST_F(TokenizerSentencePiece, BadByteTokensAreErrors) {
  // byte_fallback needs all 256 byte tokens.
  json tj = llama2();
  tj["model"]["vocab"].erase("<0x80>");
  expect_load_error(tj, {"model.vocab", "'<0x80>'", "missing"});
  // A token the ByteFallback decoder reads as a byte must be spelled as encoding spells it.
  for (const char* bad : {"<0x4a>", "<0x+A>"}) {
    tj = llama2();
    tj["model"]["vocab"][bad] = 5000;
    expect_load_error(tj, {std::string("model.vocab[\"") + bad + "\"]", "bad byte token"});
  }
  // Without byte_fallback such tokens are ordinary (the reference then never produces byte tokens).
  tj = llama2();
  tj["model"]["byte_fallback"] = false;
  tj["model"]["vocab"].erase("<0x80>");
  const auto tok = data::load_tokenizer(write(tj));
  EXPECT_EQ(tok->encode("\xF0\x9F\x98\x80"),
            (std::vector<uint32_t>{tok->token_to_id("\xE2\x96\x81").value(), 0}));
  // Ids outside the vocabulary are refused when decoding.
  test::expect_error([&] { tok->decode(std::vector<uint32_t>{1, 100000}); }, {"id 100000", "position 1"});
}

TEST_F(TokenizerSentencePiece, OtherTokenizersGetTheirTemplates) {
  const auto bytes = data::load_tokenizer("bytes");
  EXPECT_EQ(bytes->special_template(), data::SpecialTokenTemplate{});
  EXPECT_EQ(bytes->encode_with_special("ab"), (std::vector<uint32_t>{'a', 'b'}));
}

}  // namespace
}  // namespace anvil
