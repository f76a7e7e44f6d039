// tokenizer.json parsing and the added-token vocabulary.
#include "data/tokenizer_json.hpp"

#include <fstream>
#include <sstream>

#include "anvil/error.hpp"
#include "data/unicode.hpp"

namespace anvil::data {

using nlohmann::json;

json read_tokenizer_json_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ANVIL_REQUIRE(f, "tokenizer '{}': cannot open the file", path);
  std::stringstream ss;
  ss << f.rdbuf();
  json root;
  // Deeper values are dropped while parsing and the file refused: nested pre-tokenizer Sequences are
  // parsed recursively, and so are nlohmann's dump() and copies.
  bool too_deep = false;
  const auto limit_depth = [&](int depth, json::parse_event_t, json&) {
    if (depth <= kMaxJsonDepth) return true;
    too_deep = true;
    return false;
  };
  try {
    root = json::parse(ss.str(), limit_depth);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers such as 1e500
    ANVIL_THROW("tokenizer '{}': not valid JSON ({})", path, e.what());
  }
  ANVIL_REQUIRE(!too_deep, "tokenizer '{}': JSON nested deeper than {} levels", path, kMaxJsonDepth);
  return root;
}

TokenizerJson TokenizerJson::read(const std::string& path) {
  TokenizerJson tj;
  tj.path = path;
  tj.root = read_tokenizer_json_file(path);
  ANVIL_REQUIRE(tj.root.is_object(), "tokenizer '{}': expected a JSON object (a Hugging Face tokenizer.json)",
                path);
  ANVIL_REQUIRE(tj.root.contains("model") && tj.root["model"].is_object(),
                "tokenizer '{}': missing the \"model\" object (not a Hugging Face tokenizer.json?)", path);
  return tj;
}

std::string TokenizerJson::model_type() const {
  const json& m = model();
  if (m.contains("type")) return str(m, "model", "type");
  if (m.contains("merges")) return "BPE";
  if (m.contains("continuing_subword_prefix") && m.contains("max_input_chars_per_word")) return "WordPiece";
  fail("model.type", "missing, and the model is neither a BPE (merges) nor a WordPiece");
}

const json* TokenizerJson::section(const char* name) const {
  auto it = root.find(name);
  if (it == root.end() || it->is_null()) return nullptr;
  if (!it->is_object()) fail(name, "expected an object or null");
  return &*it;
}

std::string TokenizerJson::str(const json& j, const std::string& where, const char* key) const {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) fail(where + "." + key, "expected a string");
  return it->get<std::string>();
}

std::optional<std::string> TokenizerJson::opt_str(const json& j, const std::string& where,
                                                  const char* key) const {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) fail(where + "." + key, "expected a string or null");
  return it->get<std::string>();
}

bool TokenizerJson::flag(const json& j, const std::string& where, const char* key, bool fallback) const {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) fail(where + "." + key, "expected true or false");
  return it->get<bool>();
}

uint64_t TokenizerJson::uint(const json& j, const std::string& where, const char* key,
                             uint64_t fallback) const {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_unsigned()) fail(where + "." + key, "expected a non-negative integer");
  return it->get<uint64_t>();
}

void TokenizerJson::fail(const std::string& where, const std::string& what) const {
  ANVIL_THROW("tokenizer '{}': {}: {}", path, where, what);
}

void TokenizerJson::unsupported(const std::string& where, const std::string& type,
                                const std::string& supported) const {
  ANVIL_THROW("tokenizer '{}': {} type '{}' is not supported (supported: {})", path, where, type, supported);
}

std::unordered_map<std::string, uint32_t> TokenizerJson::vocab() const {
  auto it = model().find("vocab");
  if (it == model().end() || !it->is_object()) fail("model.vocab", "expected an object of token -> id");
  uint64_t space = 0;
  for (auto& [token, id] : it->items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() >= (1ull << 31))
      fail("model.vocab[\"" + token + "\"]", "expected an id (a non-negative integer below 2^31)");
    space = std::max(space, id.get<uint64_t>() + 1);
  }
  if (space > max_id_space(it->size()))  // checked before `seen` is sized by it
    fail("model.vocab",
         fmt::format("the largest id is {} but there are only {} tokens (at most {} ids allowed)", space - 1,
                     it->size(), max_id_space(it->size())));
  std::unordered_map<std::string, uint32_t> v;
  v.reserve(it->size());
  std::vector<bool> seen(space);
  for (auto& [token, id] : it->items()) {
    const uint32_t i = id.get<uint32_t>();
    if (seen[i]) fail("model.vocab[\"" + token + "\"]", fmt::format("id {} is used twice", i));
    seen[i] = true;
    v.emplace(token, i);
  }
  return v;
}

uint32_t TokenizerJson::id_space(const std::unordered_map<std::string, uint32_t>& vocab,
                                 const std::vector<AddedToken>& added) const {
  uint64_t space = 0;
  for (const auto& [token, id] : vocab) space = std::max<uint64_t>(space, uint64_t{id} + 1);
  for (const AddedToken& a : added) space = std::max<uint64_t>(space, uint64_t{a.id} + 1);
  const uint64_t tokens = vocab.size() + added.size();
  if (space > max_id_space(tokens))
    fail("added_tokens",
         fmt::format("the largest id is {} but there are only {} tokens (at most {} ids allowed)", space - 1,
                     tokens, max_id_space(tokens)));
  return static_cast<uint32_t>(space);
}

std::vector<AddedToken> parse_added_tokens(const TokenizerJson& tj) {
  std::vector<AddedToken> out;
  auto it = tj.root.find("added_tokens");
  if (it == tj.root.end() || it->is_null()) return out;
  if (!it->is_array()) tj.fail("added_tokens", "expected an array");
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string where = fmt::format("added_tokens[{}]", i);
    if (!t.is_object()) tj.fail(where, "expected an object");
    AddedToken a;
    const uint64_t id = tj.uint(t, where, "id", ~0ull);
    if (id >= (1ull << 31)) tj.fail(where + ".id", "missing or not an id below 2^31");
    a.id = static_cast<uint32_t>(id);
    a.content = tj.str(t, where, "content");
    if (!unicode::is_valid_utf8(a.content)) tj.fail(where + ".content", "not valid UTF-8");
    a.single_word = tj.flag(t, where, "single_word", false);
    a.lstrip = tj.flag(t, where, "lstrip", false);
    a.rstrip = tj.flag(t, where, "rstrip", false);
    a.special = tj.flag(t, where, "special", false);
    a.normalized = tj.flag(t, where, "normalized", !a.special);
    out.push_back(std::move(a));
  }
  return out;
}

// ---- AddedVocabulary

void AddedVocabulary::Trie::insert(std::string_view s, uint32_t token) {
  if (s.empty()) return;
  uint32_t n = 0;
  for (unsigned char c : s) {
    uint32_t child = 0;
    for (auto& [b, idx] : nodes[n].next)
      if (b == c) child = idx;
    if (child == 0) {
      child = static_cast<uint32_t>(nodes.size());
      nodes[n].next.emplace_back(c, child);
      nodes.emplace_back();
    }
    n = child;
  }
  // A later token with the same content replaces an earlier one, like a map keyed by content.
  nodes[n].token = static_cast<int32_t>(token);
  first_byte[static_cast<unsigned char>(s[0])] = true;
}

bool AddedVocabulary::Trie::longest(std::string_view text, size_t pos, uint32_t& token, size_t& len) const {
  uint32_t n = 0;
  bool found = false;
  for (size_t i = pos; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    uint32_t child = 0;
    for (const auto& [b, idx] : nodes[n].next)
      if (b == c) child = idx;
    if (child == 0) break;
    n = child;
    if (nodes[n].token >= 0) token = static_cast<uint32_t>(nodes[n].token), len = i + 1 - pos, found = true;
  }
  return found;
}

std::optional<uint32_t> AddedVocabulary::find(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

namespace {
// The code point that ends `s` (valid UTF-8, non-empty).
char32_t last_cp(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return unicode::decode_utf8(s, i).cp;
}
}  // namespace

bool AddedVocabulary::ends_with_word(std::string_view s) {
  return !s.empty() && (unicode::flags(last_cp(s)) & unicode::kWordChar);
}

bool AddedVocabulary::starts_with_word(std::string_view s) {
  return !s.empty() && (unicode::flags(unicode::decode_utf8(s, 0).cp) & unicode::kWordChar);
}

size_t AddedVocabulary::trailing_space(std::string_view s) {
  size_t n = 0;
  while (n < s.size()) {
    std::string_view head = s.substr(0, s.size() - n);
    const char32_t c = last_cp(head);
    if (!unicode::is_white_space(c)) break;
    n += c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
  }
  return n;
}

size_t AddedVocabulary::leading_space(std::string_view s) {
  size_t n = 0;
  while (n < s.size()) {
    const unicode::Decoded d = unicode::decode_utf8(s, n);
    if (!unicode::is_white_space(d.cp)) break;
    n += d.len;
  }
  return n;
}

}  // namespace anvil::data
