// `anvil train-tokenizer` and data/bpe_trainer: streaming word counts equal whole-text counts, the
// incremental trainer equals a naive one, the tokenizer.json is exact (vocab size, valid merges,
// byte-identical to what `tokenizers` saves), deterministic across thread counts, and gives the same
// ids in the Python `tokenizers` package and in Anvil's own BPE encoder.
#include "data/bpe_trainer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "data/tokenizer.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using data::BpeTrainOptions;
using data::WordCounts;

// Zipf-distributed pseudo-words (ASCII and multi-byte syllables), punctuation, contractions, numbers
// and assorted whitespace: enough distinct pairs to learn a few hundred merges.
std::string rich_corpus(size_t approx_bytes, uint32_t seed = 1) {
  const char* syllables[] = {"th", "e",  "an", "re", "st", "o",    "ing", "qu", "ll", "ou",  "a",  "i",
                             "er", "sc", "ß",  "é",  "ü",  "日本", "語",  "ка", "ть", "ton", "mi", "ka"};
  std::mt19937 rng(seed);
  std::vector<std::string> words(300);
  for (std::string& w : words) {
    const int n = 1 + int(rng() % 4);
    for (int i = 0; i < n; ++i) w += syllables[rng() % std::size(syllables)];
  }
  const char* seps[] = {" ", " ", " ", " ", " ", ", ", ". ", "\n", "  ", "\t", "! ", "'s ", "\n\n", " - "};
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::string s;
  while (s.size() < approx_bytes) {
    std::string w = words[size_t(std::pow(u(rng), 2.5) * double(words.size()))];
    if (rng() % 7 == 0 && w[0] >= 'a' && w[0] <= 'z') w[0] = char(w[0] - 'a' + 'A');
    if (rng() % 29 == 0) w = std::to_string(rng() % 20000);
    if (rng() % 97 == 0) w += "🙂";
    s += w;
    s += seps[rng() % std::size(seps)];
  }
  return s;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const size_t end = nl == std::string::npos ? text.size() : nl;
    lines.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return lines;
}

// Lines that exercise the pre-tokenizer and special tokens, some with characters never trained on.
std::vector<std::string> tricky_lines() {
  return {"", " ", "   leading spaces and trailing   ", "tabs\tand\r\nCRLF\r\n",
          "don't we'll THEY'RE it's I'm you've he'd", "1234567890 3.14159 1,000,000",
          "emoji 🙂🙃 mixed with 日本語 and кать", "unseen: 你好，世界 مرحبا Ωμέγα",
          "<|endoftext|>", "before<|endoftext|>after <|endoftext|> spaced <|endoftext|><|endoftext|>",
          "punctuation!!! ??? ... --- (((x)))", "multiple\n\n\nnewlines\n  \n indented",
          "ĠĊ literal byte-level characters",
          // Unicode whitespace and look-alikes: \\s must agree with `tokenizers`' regex engine.
          "a\u0085b\u00A0c\u1680d\u2000e\u200Af\u2028g\u2029h\u202Fi\u205Fj\u3000k\u200Bl\uFEFFm\u180En",
          "x \u00A0 y\u3000\u3000z \u2003"};
}

bool python_tokenizers_available() {
  static const bool ok = std::system("python3 -c 'import tokenizers' >/dev/null 2>&1") == 0;
  return ok;
}

const std::string kHelper = std::string(ANVIL_SOURCE_DIR) + "/tests/tokenizers/check_trained_tokenizer.py";

void write_json_strings(const std::string& path, const std::vector<std::string>& strings) {
  test::write_file(path, nlohmann::json(strings).dump());
}

// Runs the Python helper; fails the test on a non-zero exit.
void run_helper(const std::string& args) {
  const std::string cmd = "python3 " + kHelper + " " + args + " 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd << "\n" << out;
}

std::string shq(const std::string& s) {
  return "'" + s + "'";
}

class BpeTrainer : public ::testing::Test {
 protected:
  // Trains through the CLI; returns the tokenizer.json path.
  std::string train_cli(const std::string& corpus_path, uint64_t vocab, const std::string& extra = "",
                        const std::string& name = "tokenizer.json") {
    const std::string out = dir / name;
    const test::CommandResult r =
        test::run_anvil("train-tokenizer --input " + shq(corpus_path) + " --vocab_size " +
                        std::to_string(vocab) + " --output " + shq(out) + " " + extra);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    last_output = r.output;
    return out;
  }
  void expect_cli_error(const std::string& args, const std::string& needle) {
    const test::CommandResult r = test::run_anvil("train-tokenizer " + args);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << "expected '" << needle << "' in:\n" << r.output;
    EXPECT_FALSE(fs::exists(dir / "out")) << "output left behind for: " << args;
    for (const auto& e : fs::directory_iterator(dir.path()))
      EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
  test::TempDir dir;
  std::string last_output;
};

TEST_F(BpeTrainer, PreTokenizerSplitsLikeGpt2) {
  const data::GptPreTokenizer pre;
  using V = std::vector<std::string>;
  EXPECT_EQ(pre.split("Hello world's  test\n\n123 !!ok"),
            (V{"Hello", " world", "'s", " ", " test", "\n", "\n", "123", " !!", "ok"}));
  EXPECT_EQ(pre.split("a  \nb"), (V{"a", "  ", "\n", "b"}));
  EXPECT_EQ(pre.split("x   "), (V{"x", "   "}));
  // Ill-formed UTF-8 becomes U+FFFD (a symbol, so it joins neighbouring punctuation), as the encoder does.
  EXPECT_EQ(pre.split("ab\xff\xfe cd"), (V{"ab", "\uFFFD\uFFFD", " cd"}));
  EXPECT_EQ(pre.split("x\xc3(y"), (V{"x", "\uFFFD(", "y"}));
  EXPECT_EQ(pre.split(std::string(200000, ' ') + "x").size(), 2u);  // no PCRE2 stack trouble
}

TEST_F(BpeTrainer, PreTokenizerMatchesTokenizersPackage) {
  if (!python_tokenizers_available()) GTEST_SKIP() << "python3 with `tokenizers` not available";
  std::vector<std::string> texts = tricky_lines();
  for (const std::string& line : split_lines(rich_corpus(4000, 5))) texts.push_back(line);
  texts.push_back(rich_corpus(3000, 6));  // whole paragraphs: multi-line whitespace runs
  write_json_strings(dir / "in.json", texts);
  run_helper("pretokenize " + shq(dir / "in.json") + " " + shq(dir / "out.json"));
  const auto expected = nlohmann::json::parse(test::read_file(dir / "out.json"));
  ASSERT_EQ(expected.size(), texts.size());
  const data::GptPreTokenizer pre;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<std::string> got;
    for (const std::string& w : pre.split(texts[i])) got.push_back(data::byte_level_string(w));
    EXPECT_EQ(got, expected[i].get<std::vector<std::string>>()) << "text: " << texts[i];
  }
}

TEST_F(BpeTrainer, StreamingCountsEqualWholeTextCounts) {
  // Special tokens (one with whitespace inside, which a cut must not split), invalid UTF-8, long lines.
  const std::vector<std::string> specials = {"<|endoftext|>", "<|end of text|>", "<s>"};
  std::string text = rich_corpus(20000, 2);
  for (size_t pos = 1000; pos < text.size(); pos += 3777)
    text.insert(pos, pos % 2 ? "<|end of text|>" : "<|endoftext|>");
  text += "tail\xff\xc3(bad) utf-8 " + std::string(5000, 'z') + "<s> end";
  test::write_file(dir / "c.txt", text);
  const WordCounts expected = data::count_words_in_text(text, specials);
  EXPECT_EQ(expected.count("<|endoftext|>"), 0u);
  EXPECT_EQ(expected.count("\uFFFD\uFFFD("), 1u);  // "\xff\xc3(": two ill-formed sequences
  for (size_t chunk : {size_t{7}, size_t{64}, size_t{1000}, size_t{1} << 20}) {
    for (int threads : {1, 2, 3}) {
      BpeTrainOptions o;
      o.vocab_size = 1000;
      o.special_tokens = specials;
      o.threads = threads;
      o.chunk_bytes = chunk;
      o.progress = false;
      data::CountStats stats;
      const WordCounts got = data::count_words({dir / "c.txt"}, o, &stats);
      EXPECT_TRUE(got == expected) << "chunk " << chunk << ", threads " << threads;
      EXPECT_EQ(stats.bytes, text.size());
    }
  }
}

TEST_F(BpeTrainer, DirectoriesAreReadRecursivelyAndFilesAreSeparate) {
  fs::create_directories(dir / "corpus/sub");
  test::write_file(dir / "corpus/b.txt", "hello world");
  test::write_file(dir / "corpus/sub/a.txt", "hello there");
  test::write_file(dir / "one.txt", "\xEF\xBB\xBFhello");  // the byte order mark is not text
  BpeTrainOptions o;
  o.vocab_size = 300;
  o.progress = false;
  const WordCounts got = data::count_words({dir / "corpus", dir / "one.txt"}, o);
  // A file boundary is a word boundary: "world" + "hello" (next file) do not join.
  EXPECT_EQ(got, (WordCounts{{"hello", 3}, {" world", 1}, {" there", 1}}));
}

TEST_F(BpeTrainer, ManySmallFilesCountLikeEachFileAlone) {
  // Pieces of several files share a counting round; each file is still counted on its own.
  fs::create_directories(dir / "many");
  WordCounts expected;
  for (int i = 0; i < 40; ++i) {
    const std::string text = rich_corpus(500 + size_t(i) * 37, uint32_t(100 + i));
    test::write_file(dir / fmt::format("many/{:03d}.txt", i), text);
    for (const auto& [w, c] : data::count_words_in_text(text, {})) expected[w] += c;
  }
  for (size_t chunk : {size_t{64}, size_t{1} << 20}) {
    for (int threads : {1, 3}) {
      BpeTrainOptions o;
      o.vocab_size = 300;
      o.threads = threads;
      o.chunk_bytes = chunk;
      o.progress = false;
      EXPECT_TRUE(data::count_words({dir / "many"}, o) == expected)
          << "chunk " << chunk << ", threads " << threads;
    }
  }
}

// The straightforward algorithm: recount every pair before each merge.
std::vector<std::pair<std::string, std::string>> naive_bpe(const WordCounts& counts, size_t merges_wanted,
                                                           uint64_t min_frequency) {
  std::vector<std::pair<std::vector<std::string>, uint64_t>> words;
  for (const auto& [w, c] : counts) {
    std::vector<std::string> syms;
    for (char ch : w) syms.emplace_back(1, ch);
    words.push_back({syms, c});
  }
  std::set<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.insert(std::string(1, char(b)));
  std::vector<std::pair<std::string, std::string>> merges;
  while (vocab.size() < 256 + merges_wanted) {
    std::map<std::pair<std::string, std::string>, uint64_t> pairs;  // ordered: ties -> smallest first
    for (const auto& [syms, c] : words)
      for (size_t i = 0; i + 1 < syms.size(); ++i) pairs[{syms[i], syms[i + 1]}] += c;
    const std::pair<std::string, std::string>* best = nullptr;
    uint64_t best_count = 0;
    for (const auto& [p, c] : pairs)
      if (c > best_count) best = &p, best_count = c;
    if (!best || best_count < min_frequency) break;
    const auto [a, b] = *best;
    merges.push_back({a, b});
    vocab.insert(a + b);
    for (auto& [syms, c] : words) {
      std::vector<std::string> out;
      for (size_t i = 0; i < syms.size();) {
        if (i + 1 < syms.size() && syms[i] == a && syms[i + 1] == b) {
          out.push_back(a + b);
          i += 2;
        } else {
          out.push_back(syms[i++]);
        }
      }
      syms = out;
    }
  }
  return merges;
}

TEST_F(BpeTrainer, IncrementalTrainingEqualsNaiveRecount) {
  // Repeated letters ("aaaa", "abab") exercise overlapping and adjacent occurrences of a pair.
  const WordCounts counts =
      data::count_words_in_text(rich_corpus(20000, 3) + " aaaa aaaaa abab ababab aaaa aaaaa abab ababab", {});
  const auto expected = naive_bpe(counts, 300, 2);
  for (int threads : {1, 3}) {  // 3: every merge's words split across threads
    BpeTrainOptions o;
    o.vocab_size = 256 + 300;
    o.min_frequency = 2;
    o.progress = false;
    o.threads = threads;
    o.parallel_merge_min_words = threads == 1 ? 8192 : 1;
    const data::BpeModel m = data::train_bpe(counts, o);
    ASSERT_EQ(m.merges.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(m.tokens[m.merges[i].first], expected[i].first) << "merge " << i;
      EXPECT_EQ(m.tokens[m.merges[i].second], expected[i].second) << "merge " << i;
    }
  }
}

TEST_F(BpeTrainer, StopsWhenNoPairReachesMinFrequency) {
  const WordCounts counts = data::count_words_in_text("abc abc abd xyz", {});
  BpeTrainOptions o;
  o.vocab_size = 1000;
  o.min_frequency = 2;
  o.progress = false;
  const data::BpeModel m = data::train_bpe(counts, o);
  EXPECT_TRUE(m.stopped_early);
  // "ab" x3, then " ab" x2 (ties with "ab"+"c": " " sorts first); every other pair occurs once.
  ASSERT_EQ(m.merges.size(), 2u);
  EXPECT_EQ(m.tokens[m.merge_results[0]], "ab");
  EXPECT_EQ(m.tokens[m.merge_results[1]], " ab");
  EXPECT_EQ(m.vocab_size(), 258u);
}

TEST_F(BpeTrainer, TokenizerJsonHasExactVocabAndValidMerges) {
  test::write_file(dir / "c.txt", rich_corpus(200000));
  const uint64_t vocab = 700;
  const std::string path =
      train_cli(dir / "c.txt", vocab, "--special_tokens '<|endoftext|>' --special_tokens '[PAD]'");
  EXPECT_NE(last_output.find("train-tokenizer: counted"), std::string::npos) << last_output;  // progress
  const auto j = nlohmann::json::parse(test::read_file(path));
  EXPECT_EQ(j["version"], "1.0");
  EXPECT_TRUE(j["truncation"].is_null() && j["padding"].is_null() && j["normalizer"].is_null());
  EXPECT_EQ(j["pre_tokenizer"], nlohmann::json::parse(R"({"type": "ByteLevel", "add_prefix_space": false,
                                                         "trim_offsets": true, "use_regex": true})"));
  EXPECT_EQ(j["post_processor"]["type"], "ByteLevel");
  EXPECT_EQ(j["decoder"]["type"], "ByteLevel");
  const auto& model = j["model"];
  EXPECT_EQ(model["type"], "BPE");
  EXPECT_TRUE(model["dropout"].is_null() && model["unk_token"].is_null());
  EXPECT_EQ(model["byte_fallback"], false);

  const auto& v = model["vocab"];
  ASSERT_EQ(v.size(), vocab);
  std::set<uint64_t> ids;
  for (const auto& [tok, id] : v.items()) ids.insert(id.get<uint64_t>());
  EXPECT_EQ(ids.size(), vocab);
  EXPECT_EQ(*ids.rbegin(), vocab - 1);  // ids are exactly 0..vocab-1
  // Special tokens come right after the BPE tokens, in the order given.
  ASSERT_EQ(j["added_tokens"].size(), 2u);
  EXPECT_EQ(j["added_tokens"][0]["content"], "<|endoftext|>");
  EXPECT_EQ(j["added_tokens"][0]["id"], vocab - 2);
  EXPECT_EQ(j["added_tokens"][1]["id"], vocab - 1);
  EXPECT_EQ(j["added_tokens"][1]["special"], true);
  EXPECT_EQ(v["<|endoftext|>"], vocab - 2);
  EXPECT_EQ(v["[PAD]"], vocab - 1);  // brackets kept (CLI11 would read "[a,b]" as a list)
  EXPECT_EQ(v["!"], 0);
  EXPECT_EQ(v["Ġ"], 220);  // GPT-2's id for the space byte

  const auto& merges = model["merges"];
  EXPECT_GE(merges.size(), vocab - 256 - 2);
  std::set<std::string> seen;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string a = merges[i][0], b = merges[i][1];
    ASSERT_TRUE(v.contains(a) && v.contains(b) && v.contains(a + b))
        << "merge " << i << ": " << a << " " << b;
    // Parts exist before the merge that uses them (a merged token's id follows its parts').
    EXPECT_LT(v[a].get<uint64_t>(), v[a + b].get<uint64_t>());
    EXPECT_LT(v[b].get<uint64_t>(), v[a + b].get<uint64_t>());
    EXPECT_TRUE(seen.insert(a + " " + b).second) << "duplicate merge " << a << " " << b;
  }
}

TEST_F(BpeTrainer, DeterministicAcrossRunsAndThreadCounts) {
  test::write_file(dir / "c.txt", rich_corpus(300000, 4));
  const std::string first = test::read_file(train_cli(dir / "c.txt", 600, "--threads 1", "t1.json"));
  EXPECT_EQ(test::read_file(train_cli(dir / "c.txt", 600, "--threads 1", "t1b.json")), first);
  EXPECT_EQ(test::read_file(train_cli(dir / "c.txt", 600, "--threads 2", "t2.json")), first);
  EXPECT_EQ(test::read_file(train_cli(dir / "c.txt", 600, "--threads 3", "t3.json")), first);
  EXPECT_FALSE(first.empty());
}

class BpeTrainerTrained : public BpeTrainer {
 protected:
  void SetUp() override {
    corpus = rich_corpus(150000, 9);
    test::write_file(dir / "c.txt", corpus);
    path = train_cli(dir / "c.txt", 800, "--special_tokens '<|endoftext|>'");
    lines = split_lines(rich_corpus(20000, 10));
    for (const std::string& l : tricky_lines()) lines.push_back(l);
  }
  std::string corpus, path;
  std::vector<std::string> lines;
};

TEST_F(BpeTrainerTrained, TokenizersPackageSavesTheSameFile) {
  if (!python_tokenizers_available()) GTEST_SKIP() << "python3 with `tokenizers` not available";
  run_helper("resave " + shq(path) + " " + shq(dir / "resaved.json"));
  EXPECT_TRUE(test::read_file(dir / "resaved.json") == test::read_file(path))
      << "tokenizers writes a different file after loading ours";
}

TEST_F(BpeTrainerTrained, TokenizersPackageAndAnvilGiveTheSameIds) {
  if (!python_tokenizers_available()) GTEST_SKIP() << "python3 with `tokenizers` not available";
  write_json_strings(dir / "lines.json", lines);
  run_helper("encode " + shq(path) + " " + shq(dir / "lines.json") + " " + shq(dir / "ids.json"));
  const auto expected = nlohmann::json::parse(test::read_file(dir / "ids.json"));
  ASSERT_EQ(expected.size(), lines.size());
  const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(path);
  EXPECT_EQ(tok->vocab_size(), 800u);
  size_t mismatches = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::vector<uint32_t> got = tok->encode(lines[i]);
    const auto want = expected[i].get<std::vector<uint32_t>>();
    if (got != want && ++mismatches <= 5) ADD_FAILURE() << "line " << i << ": '" << lines[i] << "'";
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST_F(BpeTrainerTrained, AnvilDecodeInvertsEncode) {
  const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(path);
  EXPECT_EQ(tok->token_to_id("<|endoftext|>"), std::optional<uint32_t>(799));
  for (const std::string& line : lines) {
    const std::vector<uint32_t> ids = tok->encode(line);
    EXPECT_EQ(tok->decode(ids), line);
    for (uint32_t id : ids) EXPECT_LT(id, 800u);
  }
  const std::string paragraph = corpus.substr(0, 5000);
  EXPECT_EQ(tok->decode(tok->encode(paragraph)), paragraph);
  // The learned merges compress the training text well below one token per byte.
  EXPECT_LT(tok->encode(paragraph).size(), paragraph.size() / 2);
}

TEST_F(BpeTrainer, CliErrorsNameTheValueAndLeaveNoOutput) {
  test::write_file(dir / "c.txt", rich_corpus(5000));
  const std::string in = " --input " + shq(dir / "c.txt");
  const std::string out = " --output " + shq(dir / "out");
  expect_cli_error(in + out + " --vocab_size 100", "--vocab_size 100 is too small");
  expect_cli_error(in + out + " --vocab_size 256 --special_tokens '<|endoftext|>'", "at least 257");
  expect_cli_error(" --input " + shq(dir / "missing.txt") + out + " --vocab_size 300", "missing.txt");
  test::write_file(dir / "empty.txt", "");
  expect_cli_error(" --input " + shq(dir / "empty.txt") + out + " --vocab_size 300", "empty.txt");
  fs::create_directories(dir / "empty_dir");
  expect_cli_error(" --input " + shq(dir / "empty_dir") + out + " --vocab_size 300", "empty_dir");
  expect_cli_error(in + out + " --vocab_size 300 --special_tokens '<s>' '<s>'", "'<s>' is given twice");
  expect_cli_error(in + out + " --vocab_size 300 --special_tokens '!'", "byte token");
  const test::CommandResult neg = test::run_anvil("train-tokenizer" + in + out + " --vocab_size -5");
  EXPECT_NE(neg.exit_code, 0);
  EXPECT_NE(neg.output.find("--vocab_size must be a non-negative integer, got -5"), std::string::npos)
      << neg.output;
  EXPECT_FALSE(fs::exists(dir / "out"));
  fs::create_directories(dir / "a_dir");
  const test::CommandResult r =
      test::run_anvil("train-tokenizer" + in + " --vocab_size 300 --output " + shq(dir / "a_dir"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("is a directory"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace anvil
