// Exactness against Hugging Face `tokenizers`: for each tokenizer.json, the ids (and decoded text) of
// every line of tests/data/tokenizer_corpus.txt must be identical to what tests/tokenizers/reference_ids.py
// gets from the Python package. The byte-level BPEs are trained at test time by the package itself
// (tests/tokenizers/make_test_tokenizers.py); the real WordPiece (all-MiniLM-L6-v2) and Llama 3.2 files
// come from tests/tokenizers/fetch_tokenizers.py. Skipped, with the reason, when python3 with
// `tokenizers` or a fetched file is absent.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "data/tokenizer.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;

const std::string kSource = ANVIL_SOURCE_DIR;
const std::string kCorpus = kSource + "/tests/data/tokenizer_corpus.txt";

std::string quote(const std::string& s) {
  return "'" + s + "'";
}

bool python_tokenizers_available() {
  static const bool ok = std::system("python3 -c 'import tokenizers' >/dev/null 2>&1") == 0;
  return ok;
}

// The corpus split as reference_ids.py splits it: on '\n', a final newline ending the last line.
std::vector<std::string> corpus_lines() {
  const std::string text = test::read_file(kCorpus);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
    lines.push_back(text.substr(start, nl - start));
  if (start < text.size()) lines.push_back(text.substr(start));
  return lines;
}

// Runs a command and returns its stdout; fails the test on a non-zero exit.
std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    ADD_FAILURE() << "popen failed: " << cmd;
    return out;
  }
  std::array<char, 1 << 16> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "command failed: " << cmd;
  return out;
}

class TokenizerExactness : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!python_tokenizers_available()) return;
    dir_ = new test::TempDir();
    run("python3 " + quote(kSource + "/tests/tokenizers/make_test_tokenizers.py") + " " + quote(dir_->str()) +
        " " + quote(kCorpus));
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // Checks the Anvil tokenizer loaded from `anvil_spec` against the reference for `reference_json`.
  static void check(const std::string& anvil_spec, const std::string& reference_json,
                    const std::string& label) {
    const nlohmann::json ref =
        nlohmann::json::parse(run("python3 " + quote(kSource + "/tests/tokenizers/reference_ids.py") + " " +
                                  quote(reference_json) + " " + quote(kCorpus)));
    const std::vector<std::string> lines = corpus_lines();
    ASSERT_EQ(ref["ids"].size(), lines.size());
    const std::unique_ptr<data::Tokenizer> tok = data::load_tokenizer(anvil_spec);
    size_t ids = 0, mismatched = 0, decode_mismatched = 0;
    for (size_t i = 0; i < lines.size(); ++i) {
      const std::vector<uint32_t> want = ref["ids"][i].get<std::vector<uint32_t>>();
      const std::vector<uint32_t> got = tok->encode(lines[i]);
      ids += want.size();
      if (got != want && ++mismatched <= 5)
        ADD_FAILURE() << anvil_spec << " line " << i + 1 << ": " << lines[i]
                      << "\n  tokenizers: " << ::testing::PrintToString(want)
                      << "\n  anvil:      " << ::testing::PrintToString(got);
      const std::string decoded = tok->decode(want);
      if (decoded != ref["decoded"][i].get<std::string>() && ++decode_mismatched <= 5)
        ADD_FAILURE() << anvil_spec << " line " << i + 1 << " decodes to '" << decoded
                      << "', tokenizers gives '" << ref["decoded"][i].get<std::string>() << "'";
    }
    EXPECT_EQ(mismatched, 0u);
    EXPECT_EQ(decode_mismatched, 0u);
    std::printf("[ exact    ] %s: %zu lines, %zu ids, tokenizers %s: %zu lines differ, %zu decodes differ\n",
                label.c_str(), lines.size(), ids, ref["version"].get<std::string>().c_str(), mismatched,
                decode_mismatched);
  }

  static void check_trained(const std::string& name) {
    if (!python_tokenizers_available())
      GTEST_SKIP() << "python3 with the `tokenizers` package is not available (scripts/setup.sh installs it)";
    check(*dir_ / name, *dir_ / name, name + " (trained on the corpus)");
  }

  static void check_fetched(const std::string& anvil_file, const std::string& reference_file) {
    if (!python_tokenizers_available())
      GTEST_SKIP() << "python3 with the `tokenizers` package is not available (scripts/setup.sh installs it)";
    for (const std::string& f : {anvil_file, reference_file})
      if (!fs::exists(kSource + "/" + f))
        GTEST_SKIP() << f << " is absent: run python3 tests/tokenizers/fetch_tokenizers.py";
    check(kSource + "/" + anvil_file, kSource + "/" + reference_file, anvil_file);
  }

  static test::TempDir* dir_;
};

test::TempDir* TokenizerExactness::dir_ = nullptr;

TEST_F(TokenizerExactness, Gpt2StyleByteLevelWithAddedTokens) {
  check_trained("gpt2_style.json");
}
TEST_F(TokenizerExactness, ByteLevelWithPrefixSpace) {
  check_trained("prefix_space.json");
}
TEST_F(TokenizerExactness, Llama3StyleSplitThenByteLevel) {
  check_trained("llama3_style.json");
}
TEST_F(TokenizerExactness, SplitBehaviors) {
  check_trained("split_variants.json");
}

TEST_F(TokenizerExactness, Llama32Tokenizer) {
  check_fetched("data/tokenizers/llama3/tokenizer.json", "data/tokenizers/llama3/tokenizer.json");
}
TEST_F(TokenizerExactness, MiniLmWordPieceJson) {
  check_fetched("data/tokenizers/minilm/tokenizer.json", "data/tokenizers/minilm/tokenizer.json");
}
// The plain vocab.txt with BERT-uncased defaults must give what the model's tokenizer.json gives.
TEST_F(TokenizerExactness, MiniLmWordPieceVocabTxt) {
  check_fetched("data/tokenizers/minilm/vocab.txt", "data/tokenizers/minilm/tokenizer.json");
}

// The CLI path: `anvil tokenize` over the whole corpus prints the reference ids line by line.
TEST_F(TokenizerExactness, CliPrintsReferenceIds) {
  if (!python_tokenizers_available())
    GTEST_SKIP() << "python3 with the `tokenizers` package is not available (scripts/setup.sh installs it)";
  const std::string tok = *dir_ / "llama3_style.json";
  const nlohmann::json ref =
      nlohmann::json::parse(run("python3 " + quote(kSource + "/tests/tokenizers/reference_ids.py") + " " +
                                quote(tok) + " " + quote(kCorpus)));
  std::string want;
  for (const auto& line : ref["ids"]) {
    for (size_t i = 0; i < line.size(); ++i) {
      if (i) want += ' ';
      want += std::to_string(line[i].get<uint32_t>());
    }
    want += '\n';
  }
  EXPECT_EQ(run(std::string(ANVIL_BINARY) + " tokenize --tokenizer " + quote(tok) + " < " + quote(kCorpus)),
            want);
}

}  // namespace
}  // namespace anvil
