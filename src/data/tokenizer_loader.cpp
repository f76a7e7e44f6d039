// load_tokenizer: picks the implementation from the spec ("bytes", a tokenizer.json, a vocab.txt, or a
// directory holding one of them), and the special tokens the model's tokenizer adds around a text: from
// the add_bos_token / add_eos_token of a tokenizer_config.json beside the tokenizer.json, as transformers
// applies them, else from the tokenizer.json's post_processor.
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

using nlohmann::json;

namespace {

// Checks that `id` (from `where`) is a token of `tok`, so that encode_with_special() never gives an id
// decode() refuses.
uint32_t template_id(const TokenizerJson& tj, const std::string& where, const json& id,
                     const Tokenizer& tok) {
  if (!id.is_number_unsigned() || id.get<uint64_t>() >= tok.vocab_size())
    tj.fail(where, fmt::format("{} is not a token id (vocabulary size {})", id.dump(), tok.vocab_size()));
  const uint32_t i = id.get<uint32_t>();
  try {
    tok.decode(std::span<const uint32_t>(&i, 1));
  } catch (const Error&) {
    tj.fail(where, fmt::format("{} is not a token id (a hole in the vocabulary)", i));
  }
  return i;
}

// Adds what one post-processor puts around the text to `t`. A Sequence runs its processors in order,
// each around the output of the previous one.
void add_post_processor(const TokenizerJson& tj, const json& j, const std::string& where,
                        const Tokenizer& tok, SpecialTokenTemplate& t) {
  if (!j.is_object()) tj.fail(where, "expected an object");
  const std::string type = tj.str(j, where, "type");
  SpecialTokenTemplate step;
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) tj.fail(where + ".processors", "expected an array");
    for (size_t i = 0; i < it->size(); ++i)
      add_post_processor(tj, (*it)[i], fmt::format("{}.processors[{}]", where, i), tok, t);
    return;
  } else if (type == "ByteLevel") {
    return;  // it only trims offsets
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    // [CLS] $A [SEP] / <s> $A </s>; each of cls and sep is [token, id].
    for (const char* key : {"cls", "sep"}) {
      auto it = j.find(key);
      if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[0].is_string())
        tj.fail(where + "." + key, "expected [token, id]");
      (key[0] == 'c' ? step.prefix : step.suffix)
          .push_back(template_id(tj, where + "." + key, (*it)[1], tok));
    }
  } else if (type == "TemplateProcessing") {
    // The "single" template: SpecialToken items around the one Sequence A.
    auto single = j.find("single");
    if (single == j.end() || !single->is_array()) tj.fail(where + ".single", "expected an array");
    auto specials = j.find("special_tokens");
    if (specials == j.end() || !specials->is_object())
      tj.fail(where + ".special_tokens", "expected an object");
    bool seen_a = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& item = (*single)[i];
      const std::string w = fmt::format("{}.single[{}]", where, i);
      if (item.contains("Sequence") && item.size() == 1) {
        const std::string id = tj.str(item["Sequence"], w + ".Sequence", "id");
        if (id != "A" || seen_a)
          tj.fail(w, "the single template must hold the sequence $A once (got $" + id + ")");
        seen_a = true;
      } else if (item.contains("SpecialToken") && item.size() == 1) {
        const std::string name = tj.str(item["SpecialToken"], w + ".SpecialToken", "id");
        auto sp = specials->find(name);
        if (sp == specials->end() || !sp->is_object() || !sp->contains("ids") || !(*sp)["ids"].is_array())
          tj.fail(w, "special token '" + name + "' has no ids in " + where + ".special_tokens");
        for (const json& id : (*sp)["ids"])
          (seen_a ? step.suffix : step.prefix)
              .push_back(template_id(tj, where + ".special_tokens[\"" + name + "\"].ids", id, tok));
      } else {
        tj.fail(w, "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}, got " + item.dump());
      }
    }
    if (!seen_a) tj.fail(where + ".single", "the template has no $A");
  } else {
    tj.unsupported(where, type,
                   "TemplateProcessing, BertProcessing, RobertaProcessing, ByteLevel and a Sequence of them");
  }
  t.prefix.insert(t.prefix.begin(), step.prefix.begin(), step.prefix.end());
  t.suffix.insert(t.suffix.end(), step.suffix.begin(), step.suffix.end());
}

// The classes of transformers whose tokenizer always rebuilds the post-processor from add_bos_token
// (default true) and add_eos_token (default false).
bool llama_family(const std::string& cls) {
  for (const char* c : {"LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer"})
    if (cls == c || cls == std::string(c) + "Fast") return true;
  return false;
}

// A special token of tokenizer_config.json / special_tokens_map.json: a string or {"content": ...}.
std::optional<std::string> config_token(const TokenizerJson& cfg, const char* key) {
  auto it = cfg.root.find(key);
  if (it == cfg.root.end() || it->is_null()) return std::nullopt;
  if (it->is_object()) return cfg.str(*it, key, "content");
  if (!it->is_string()) cfg.fail(key, "expected a token string or {\"content\": ...}");
  return it->get<std::string>();
}

// What transformers' update_post_processor() builds from tokenizer_config.json: [bos] $A [eos] as
// add_bos_token / add_eos_token say; none when the file does not decide (no such keys, a class that
// keeps the tokenizer.json's post-processor).
std::optional<SpecialTokenTemplate> template_from_config(const std::string& tokenizer_path,
                                                         const Tokenizer& tok) {
  const fs::path path = fs::path(tokenizer_path).parent_path() / "tokenizer_config.json";
  if (!fs::is_regular_file(path)) return std::nullopt;
  TokenizerJson cfg;
  cfg.path = path.string();
  cfg.root = read_tokenizer_json_file(cfg.path);
  if (!cfg.root.is_object()) cfg.fail("(top level)", "expected a JSON object");
  std::string cls;
  if (auto it = cfg.root.find("tokenizer_class"); it != cfg.root.end() && !it->is_null()) {
    if (!it->is_string()) cfg.fail("tokenizer_class", "expected a string, got " + it->dump());
    cls = it->get<std::string>();
  }
  const bool llama = llama_family(cls);
  // These classes rebuild the whole tokenizer from tokenizer.model when add_prefix_space is set.
  if (llama && cfg.root.contains("add_prefix_space") && !cfg.root["add_prefix_space"].is_null())
    cfg.fail("add_prefix_space",
             fmt::format("{} with tokenizer_class '{}' is not supported (transformers then converts the "
                         "SentencePiece tokenizer.model instead of reading tokenizer.json)",
                         cfg.root["add_prefix_space"].dump(), cls));
  const auto key = [&](const char* k) -> std::optional<bool> {
    auto it = cfg.root.find(k);
    if (it == cfg.root.end() || it->is_null()) return std::nullopt;
    if (!it->is_boolean()) cfg.fail(k, "expected true or false, got " + it->dump());
    return it->get<bool>();
  };
  const std::optional<bool> add_bos = key("add_bos_token"), add_eos = key("add_eos_token");
  if (!llama && !add_bos && !add_eos) return std::nullopt;

  // The token: tokenizer_config.json, else special_tokens_map.json, else the Llama classes' default.
  const fs::path map_path = path.parent_path() / "special_tokens_map.json";
  const auto token_id = [&](const char* name, const char* flag, const char* fallback) {
    std::optional<std::string> t = config_token(cfg, name);
    if (!t && fs::is_regular_file(map_path)) {
      TokenizerJson map;
      map.path = map_path.string();
      map.root = read_tokenizer_json_file(map.path);
      if (map.root.is_object()) t = config_token(map, name);
    }
    if (!t && llama) t = fallback;
    if (!t)
      cfg.fail(flag, fmt::format("true, but no {} is given (here or in special_tokens_map.json)", name));
    const std::optional<uint32_t> id = tok.token_to_id(*t);
    if (!id) cfg.fail(name, fmt::format("'{}' is not a token of '{}'", *t, tokenizer_path));
    return *id;
  };
  SpecialTokenTemplate t;
  if (add_bos.value_or(llama)) t.prefix.push_back(token_id("bos_token", "add_bos_token", "<s>"));
  if (add_eos.value_or(false)) t.suffix.push_back(token_id("eos_token", "add_eos_token", "</s>"));
  return t;
}

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
  if (ext == ".txt") {
    std::unique_ptr<Tokenizer> tok = WordPieceTokenizer::from_vocab_txt(path);
    const auto cls = tok->token_to_id("[CLS]"), sep = tok->token_to_id("[SEP]");
    if (cls && sep) tok->special_template_ = {{*cls}, {*sep}};  // BERT's single-sequence template
    return tok;
  }
  ANVIL_REQUIRE(
      ext == ".json" || looks_like_json(path),
      "tokenizer '{}': not a Hugging Face tokenizer.json or a WordPiece vocab.txt (SentencePiece .model "
      "files and other formats are not supported)",
      path);
  const TokenizerJson tj = TokenizerJson::read(path);
  const std::string type = tj.model_type();
  std::unique_ptr<Tokenizer> tok;
  if (type == "BPE")
    tok = make_bpe_tokenizer(tj);
  else if (type == "WordPiece")
    tok = WordPieceTokenizer::from_json(tj);
  else
    tj.unsupported("model", type, "BPE (byte-level or SentencePiece-style) and WordPiece");
  // The post_processor is read even when tokenizer_config.json replaces it: a file with a part Anvil
  // cannot read is refused either way.
  SpecialTokenTemplate from_file;
  if (const json* p = tj.section("post_processor"))
    add_post_processor(tj, *p, "post_processor", *tok, from_file);
  tok->special_template_ = template_from_config(path, *tok).value_or(std::move(from_file));
  return tok;
}

std::vector<uint32_t> Tokenizer::encode_with_special(std::string_view text) const {
  std::vector<uint32_t> ids = encode_prompt(text);
  ids.insert(ids.end(), special_template_.suffix.begin(), special_template_.suffix.end());
  return ids;
}

std::vector<uint32_t> Tokenizer::encode_prompt(std::string_view text) const {
  std::vector<uint32_t> ids = special_template_.prefix;
  const std::vector<uint32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::string Tokenizer::decode_continuation(std::span<const uint32_t> context,
                                           std::span<const uint32_t> ids) const {
  std::vector<uint32_t> all(context.begin(), context.end());
  all.insert(all.end(), ids.begin(), ids.end());
  const std::string head = decode(context), full = decode(all);
  // Not a prefix when the two meet inside a character (byte tokens): then the continuation alone.
  return full.starts_with(head) ? full.substr(head.size()) : decode(ids);
}

}  // namespace anvil::data
