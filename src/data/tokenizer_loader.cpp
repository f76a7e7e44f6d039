// load_tokenizer: picks the implementation from the spec ("bytes", a tokenizer.json, a vocab.txt, or a
// directory holding one of them).
#include <cctype>
#include <filesystem>
#include <fstream>

#include "anvil/error.hpp"
#include "data/bpe_tokenizer.hpp"
#include "data/tokenizer.hpp"
#include "data/tokenizer_json.hpp"
#include "data/wordpiece_tokenizer.hpp"

namespace anvil::data {

namespace fs = std::filesystem;

namespace {
// A JSON file starts with '{' (after optional whitespace and a UTF-8 byte order mark).
bool looks_like_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char c;
  while (f.get(c))
    if (!std::isspace(static_cast<unsigned char>(c)) && c != '\xEF' && c != '\xBB' && c != '\xBF')
      return c == '{';
  return false;
}
}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "bytes") return make_byte_tokenizer();
  ANVIL_REQUIRE(fs::exists(spec),
                "tokenizer '{}': no such file (give a tokenizer.json, a vocab.txt, or \"bytes\")", spec);
  std::string path = spec;
  if (fs::is_directory(path)) {
    const fs::path dir(spec);
    if (fs::exists(dir / "tokenizer.json"))
      path = (dir / "tokenizer.json").string();
    else if (fs::exists(dir / "vocab.txt"))
      path = (dir / "vocab.txt").string();
    else
      ANVIL_THROW("tokenizer '{}': the directory has neither tokenizer.json nor vocab.txt", spec);
  }
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".txt") return WordPieceTokenizer::from_vocab_txt(path);
  ANVIL_REQUIRE(
      ext == ".json" || looks_like_json(path),
      "tokenizer '{}': not a Hugging Face tokenizer.json or a WordPiece vocab.txt (SentencePiece .model "
      "files and other formats are not supported)",
      path);
  const TokenizerJson tj = TokenizerJson::read(path);
  const std::string type = tj.model_type();
  if (type == "BPE") return make_bpe_tokenizer(tj);
  if (type == "WordPiece") return WordPieceTokenizer::from_json(tj);
  tj.unsupported("model", type, "BPE (byte-level) and WordPiece");
}

}  // namespace anvil::data
