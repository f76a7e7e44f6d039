// WordPiece: added tokens -> BertNormalizer -> BertPreTokenizer (whitespace, punctuation) -> greedy
// longest-prefix matching of each word against the vocabulary.
#include "data/wordpiece_tokenizer.hpp"

#include <fstream>

#include "anvil/error.hpp"
#include "data/unicode.hpp"

namespace anvil::data {

using nlohmann::json;

std::unique_ptr<WordPieceTokenizer> WordPieceTokenizer::from_json(const TokenizerJson& tj) {
  std::unique_ptr<WordPieceTokenizer> t(new WordPieceTokenizer());
  t->path_ = tj.path;
  const json& m = tj.model();
  const auto vocab = tj.vocab();
  for (auto& [token, id] : vocab) t->vocab_.emplace(token, id);
  if (auto unk = tj.opt_str(m, "model", "unk_token")) t->unk_token_ = *unk;
  if (auto p = tj.opt_str(m, "model", "continuing_subword_prefix")) t->prefix_ = *p;
  t->max_chars_ = tj.uint(m, "model", "max_input_chars_per_word", 100);

  if (const json* n = tj.section("normalizer")) {
    const std::string type = tj.str(*n, "normalizer", "type");
    if (type != "BertNormalizer") tj.unsupported("normalizer", type, "BertNormalizer or null for WordPiece");
    t->clean_text_ = tj.flag(*n, "normalizer", "clean_text", true);
    t->chinese_ = tj.flag(*n, "normalizer", "handle_chinese_chars", true);
    t->lowercase_ = tj.flag(*n, "normalizer", "lowercase", true);
    t->strip_accents_ = tj.flag(*n, "normalizer", "strip_accents", t->lowercase_);  // null follows lowercase
  } else {
    t->normalize_ = false;
  }
  const json* pre = tj.section("pre_tokenizer");
  if (!pre) tj.fail("pre_tokenizer", "missing; WordPiece needs BertPreTokenizer");
  if (const std::string type = tj.str(*pre, "pre_tokenizer", "type"); type != "BertPreTokenizer")
    tj.unsupported("pre_tokenizer", type, "BertPreTokenizer for WordPiece");
  if (const json* d = tj.section("decoder")) {
    const std::string type = tj.str(*d, "decoder", "type");
    if (type != "WordPiece") tj.unsupported("decoder", type, "WordPiece or null for WordPiece");
    t->decoder_prefix_ = tj.opt_str(*d, "decoder", "prefix").value_or("##");
    t->cleanup_ = tj.flag(*d, "decoder", "cleanup", true);
  } else {
    t->wordpiece_decoder_ = false;
  }
  const std::vector<AddedToken> added = parse_added_tokens(tj);
  tj.id_space(vocab, added);  // bounds the tables finish() allocates
  t->finish("model.unk_token", added);
  return t;
}

std::unique_ptr<WordPieceTokenizer> WordPieceTokenizer::from_vocab_txt(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ANVIL_REQUIRE(f, "tokenizer '{}': cannot open the file", path);
  std::unique_ptr<WordPieceTokenizer> t(new WordPieceTokenizer());
  t->path_ = path;
  std::string line;
  uint32_t id = 0;
  while (std::getline(f, line)) {
    // One token per line, trailing whitespace (a '\r' too) trimmed; a repeated token keeps its last id.
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t'))
      line.pop_back();
    ANVIL_REQUIRE(unicode::is_valid_utf8(line), "tokenizer '{}': line {} is not valid UTF-8", path, id + 1);
    t->vocab_.insert_or_assign(line, id++);
  }
  ANVIL_REQUIRE(!t->vocab_.empty(), "tokenizer '{}': the vocabulary file is empty", path);
  std::vector<AddedToken> added;
  for (const char* s : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    auto it = t->vocab_.find(std::string_view(s));
    if (it != t->vocab_.end()) added.push_back({it->second, s, false, false, false, false, true});
  }
  t->finish("its [UNK] line", added);
  return t;
}

void WordPieceTokenizer::finish(const std::string& where_unk, const std::vector<AddedToken>& added) {
  uint32_t size = 0;
  for (const auto& [token, id] : vocab_) size = std::max(size, id + 1);
  for (const AddedToken& a : added) size = std::max(size, a.id + 1);
  id_to_token_.assign(size, {});
  has_id_.assign(size, false);
  special_.assign(size, false);
  for (const auto& [token, id] : vocab_) {
    id_to_token_[id] = token, has_id_[id] = true;
    if (!prefix_.empty() && token.size() > prefix_.size() && token.starts_with(prefix_))
      continued_.emplace(token.substr(prefix_.size()), id);
  }
  for (const AddedToken& a : added)
    id_to_token_[a.id] = a.content, has_id_[a.id] = true, special_[a.id] = a.special;
  auto unk = vocab_.find(unk_token_);
  ANVIL_REQUIRE(unk != vocab_.end(), "tokenizer '{}': the unknown token '{}' ({}) is not in the vocabulary",
                path_, unk_token_, where_unk);
  unk_id_ = unk->second;
  added_ = AddedVocabulary(added, [this](const std::string& s) { return normalize(s); });
}

std::optional<uint32_t> WordPieceTokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_.find(token)) return id;
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::string WordPieceTokenizer::normalize(std::string_view text) const {
  std::string out;
  return std::string(normalize_into(text, out));
}

// BertNormalizer, one code point at a time: clean_text (drop controls, whitespace -> ' '), isolate CJK
// ideographs with spaces, strip accents (NFD, drop nonspacing marks), lower-case; in that order.
std::string_view WordPieceTokenizer::normalize_into(std::string_view in, std::string& out) const {
  if (!normalize_) return in;
  out.clear();
  out.reserve(in.size() + in.size() / 4);
  char32_t stripped[3], lower[3];
  for (size_t i = 0; i < in.size();) {
    const unicode::Decoded d = unicode::decode_utf8(in, i);
    i += d.len;
    char32_t cp = d.cp;
    if (cp < 0x80) {  // ASCII fast path
      if (clean_text_ && (cp == 0 || (cp < 0x20 && cp != '\t' && cp != '\n' && cp != '\r') || cp == 0x7F))
        continue;
      if (clean_text_ && (cp == '\t' || cp == '\n' || cp == '\r')) cp = ' ';
      if (lowercase_ && cp >= 'A' && cp <= 'Z') cp += 32;
      out.push_back(static_cast<char>(cp));
      continue;
    }
    const uint8_t f = unicode::flags(cp);
    if (clean_text_) {
      if (f & unicode::kBertControl) continue;
      if (f & unicode::kWhiteSpace) cp = ' ';
    }
    const bool pad = chinese_ && (f & unicode::kCjk);
    if (pad) out.push_back(' ');
    const int ns = strip_accents_ ? unicode::strip_accents(cp, stripped) : (stripped[0] = cp, 1);
    for (int k = 0; k < ns; ++k) {
      const int nl = lowercase_ ? unicode::to_lower(stripped[k], lower) : (lower[0] = stripped[k], 1);
      for (int j = 0; j < nl; ++j) unicode::append_utf8(out, lower[j]);
    }
    if (pad) out.push_back(' ');
  }
  return out;
}

std::vector<uint32_t> WordPieceTokenizer::encode(std::string_view text) const {
  std::string valid;
  if (!unicode::is_valid_utf8(text)) {
    unicode::to_valid_utf8(text, valid);
    text = valid;
  }
  std::vector<uint32_t> ids;
  const auto pre_tokenize = [&](std::string_view s) {
    // BertPreTokenizer: split on whitespace (dropped) and around each punctuation character (kept).
    size_t word = 0;
    for (size_t i = 0; i < s.size();) {
      const unicode::Decoded d = unicode::decode_utf8(s, i);
      const uint8_t f = unicode::flags(d.cp);
      if (f & (unicode::kWhiteSpace | unicode::kBertPunct)) {
        if (i > word) encode_word(s.substr(word, i - word), ids);
        if (f & unicode::kBertPunct) encode_word(s.substr(i, d.len), ids);
        word = i + d.len;
      }
      i += d.len;
    }
    if (s.size() > word) encode_word(s.substr(word), ids);
  };
  added_.split(
      text, [this](std::string_view in, std::string& buf) { return normalize_into(in, buf); }, pre_tokenize,
      [&](uint32_t id) { ids.push_back(id); });
  return ids;
}

// Greedy longest match from the left; a word with any part that matches nothing becomes one [UNK].
void WordPieceTokenizer::encode_word(std::string_view word, std::vector<uint32_t>& ids) const {
  size_t chars = 0;
  for (unsigned char c : word) chars += (c & 0xC0) != 0x80;
  if (chars > max_chars_) {
    ids.push_back(unk_id_);
    return;
  }
  const size_t first = ids.size();
  for (size_t start = 0; start < word.size();) {
    const Map& map = start == 0 ? vocab_ : continued_;
    size_t end = word.size();
    bool found = false;
    while (end > start) {
      auto it = map.find(word.substr(start, end - start));
      if (it != map.end()) {
        ids.push_back(it->second);
        found = true;
        break;
      }
      do --end;  // back to the previous character boundary
      while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80);
    }
    if (!found) {
      ids.resize(first);
      ids.push_back(unk_id_);
      return;
    }
    start = end;
  }
}

namespace {
// The decoder's per-token clean-up of tokenization spaces (applied to each token with its leading space).
void cleanup(std::string& s) {
  static const std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},   {" ?", "?"},           {" !", "!"},   {" ,", ","},     {" ' ", "'"},   {" n't", "n't"},
      {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    size_t pos = 0;
    while ((pos = s.find(from, pos)) != std::string::npos) {
      s.replace(pos, from.size(), to);
      pos += to.size();
    }
  }
}
}  // namespace

std::string WordPieceTokenizer::decode(std::span<const uint32_t> ids, bool skip_special) const {
  std::string out, token;
  bool first = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    ANVIL_REQUIRE(id < has_id_.size() && has_id_[id],
                  "WordPiece tokenizer: id {} at position {} is not in the vocabulary (size {})", id, i,
                  has_id_.size());
    if (skip_special && special_[id]) continue;
    const std::string& t = id_to_token_[id];
    if (!wordpiece_decoder_) {
      if (!first) out += ' ';
      out += t;
    } else {
      if (first)
        token = t;
      else if (t.starts_with(decoder_prefix_))
        token = t.substr(decoder_prefix_.size());
      else
        token = " " + t;
      if (cleanup_) cleanup(token);
      out += token;
    }
    first = false;
  }
  return out;
}

std::vector<uint32_t> WordPieceTokenizer::encode_for_classification(std::string_view text,
                                                                    size_t max_length) const {
  const auto cls = token_to_id("[CLS]"), sep = token_to_id("[SEP]");
  ANVIL_REQUIRE(cls && sep, "tokenizer '{}': has no [CLS] or [SEP] token for classification inputs", path_);
  ANVIL_REQUIRE(max_length >= 2, "max_length {} leaves no room for [CLS] and [SEP]", max_length);
  std::vector<uint32_t> body = encode(text);
  if (body.size() > max_length - 2) body.resize(max_length - 2);
  std::vector<uint32_t> ids;
  ids.reserve(body.size() + 2);
  ids.push_back(*cls);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.push_back(*sep);
  return ids;
}

}  // namespace anvil::data
