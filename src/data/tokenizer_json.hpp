// Reading a Hugging Face tokenizer.json: the parsed file with helpers that check fields and name them in
// errors, and the added-token vocabulary (special tokens such as <|endoftext|> or [SEP]) that every
// model type matches in the input before its own tokenization.
#pragma once
#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace anvil::data {

struct AddedToken;

// Nesting limit of a tokenizer.json (serde_json's default, which Hugging Face tokenizers reads it with).
inline constexpr int kMaxJsonDepth = 128;

// Ids index dense tables (id -> token), so they may leave holes but must not be mostly holes: the id space
// (largest id + 1) is at most twice the number of tokens plus 65536. Otherwise one token with id 2^31 - 1 in
// a tiny file would make the loader allocate gigabytes.
constexpr uint64_t max_id_space(uint64_t tokens) {
  return 2 * tokens + 65536;
}

// Reads and parses a JSON file of a tokenizer (tokenizer.json, tokenizer_config.json) with the nesting
// limit; errors name the file.
nlohmann::json read_tokenizer_json_file(const std::string& path);

// A parsed tokenizer.json. Errors from the accessors name the file and the field ("model.vocab").
struct TokenizerJson {
  std::string path;
  nlohmann::json root;

  // Reads and parses `path`; requires a JSON object with a "model" object.
  static TokenizerJson read(const std::string& path);

  const nlohmann::json& model() const { return root.at("model"); }
  // The model type: model.type, or inferred for old files without it (merges -> BPE, else WordPiece).
  std::string model_type() const;
  // A section that may be absent or null (normalizer, pre_tokenizer, decoder): nullptr then.
  const nlohmann::json* section(const char* name) const;

  // Typed field access on an object `j` found at `where` (e.g. "pre_tokenizer.pretokenizers[1]").
  std::string str(const nlohmann::json& j, const std::string& where, const char* key) const;
  std::optional<std::string> opt_str(const nlohmann::json& j, const std::string& where,
                                     const char* key) const;
  bool flag(const nlohmann::json& j, const std::string& where, const char* key, bool fallback) const;
  uint64_t uint(const nlohmann::json& j, const std::string& where, const char* key, uint64_t fallback) const;
  [[noreturn]] void fail(const std::string& where, const std::string& what) const;
  [[noreturn]] void unsupported(const std::string& where, const std::string& type,
                                const std::string& supported) const;

  // model.vocab as token -> id (ids must be unique, below 2^31 and within max_id_space).
  std::unordered_map<std::string, uint32_t> vocab() const;
  // The size of the id tables (largest id + 1) over the vocabulary and the added tokens; fails, naming
  // added_tokens, beyond max_id_space of their count.
  uint32_t id_space(const std::unordered_map<std::string, uint32_t>& vocab,
                    const std::vector<AddedToken>& added) const;
};

struct AddedToken {
  uint32_t id = 0;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

std::vector<AddedToken> parse_added_tokens(const TokenizerJson& tj);

// The added tokens, matched as Hugging Face tokenizers does: first the tokens with normalized=false in
// the raw text, then, in each stretch between them after normalization, the tokens with normalized=true
// (compared with their normalized content). Matching is leftmost-longest; single_word tokens only match
// between non-word characters; lstrip/rstrip tokens swallow the whitespace on that side.
class AddedVocabulary {
 public:
  AddedVocabulary() = default;
  // `normalize` gives the normalized form of a token's content (for normalized=true tokens).
  template <class Normalize>
  AddedVocabulary(std::vector<AddedToken> tokens, Normalize&& normalize) : tokens_(std::move(tokens)) {
    for (uint32_t i = 0; i < tokens_.size(); ++i) {
      const AddedToken& t = tokens_[i];
      if (t.content.empty()) continue;
      if (t.normalized)
        normalized_.insert(normalize(t.content), i);
      else
        raw_.insert(t.content, i);
      by_content_.emplace(t.content, i);
    }
  }

  bool empty() const { return tokens_.empty(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  std::optional<uint32_t> find(std::string_view content) const;

  // Splits `text` (valid UTF-8): calls on_text(piece) for each non-empty normalized stretch between added
  // tokens and on_token(id) for each added token, in order. `normalize(in, buffer)` returns the
  // normalized form of a stretch: `in` itself or a view of `buffer`, which it may overwrite.
  template <class Normalize, class OnText, class OnToken>
  void split(std::string_view text, Normalize&& normalize, OnText&& on_text, OnToken&& on_token) const {
    std::string buffer;
    const auto normalized_pass = [&](std::string_view stretch) {
      const std::string_view norm = normalize(stretch, buffer);
      if (normalized_.empty()) {
        if (!norm.empty()) on_text(norm);
      } else {
        match(normalized_, norm, on_text, on_token);  // `buffer` is not touched until this returns
      }
    };
    if (raw_.empty()) {
      if (!text.empty()) normalized_pass(text);
    } else {
      match(raw_, text, normalized_pass, on_token);
    }
  }

 private:
  // A byte trie of token contents.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, uint32_t>> next;
      int32_t token = -1;
    };
    std::vector<Node> nodes{1};
    bool first_byte[256] = {};
    bool empty() const { return nodes.size() == 1; }
    void insert(std::string_view s, uint32_t token);
    // The longest token starting at text[pos] (its index and length), if any.
    bool longest(std::string_view text, size_t pos, uint32_t& token, size_t& len) const;
  };

  // Finds tokens of `trie` in `text`; calls on_text(stretch) for the text between accepted tokens.
  template <class OnText, class OnToken>
  void match(const Trie& trie, std::string_view text, OnText&& on_text, OnToken&& on_token) const {
    size_t start_offset = 0, pos = 0;
    while (pos < text.size()) {
      uint32_t t;
      size_t len;
      if (!trie.first_byte[static_cast<unsigned char>(text[pos])] || !trie.longest(text, pos, t, len)) {
        ++pos;
        continue;
      }
      const AddedToken& tok = tokens_[t];
      size_t start = pos, stop = pos + len;
      pos = stop;                          // matching resumes after this match, accepted or not
      if (start < start_offset) continue;  // inside whitespace a previous rstrip token took
      if (tok.single_word && (ends_with_word(text.substr(0, start)) || starts_with_word(text.substr(stop))))
        continue;
      if (tok.lstrip) start = std::max(start_offset, start - trailing_space(text.substr(0, start)));
      if (tok.rstrip) stop += leading_space(text.substr(stop));
      if (start_offset < start) on_text(text.substr(start_offset, start - start_offset));
      on_token(tok.id);
      start_offset = stop;
    }
    if (start_offset < text.size()) on_text(text.substr(start_offset));
  }

  static bool ends_with_word(std::string_view s);
  static bool starts_with_word(std::string_view s);
  static size_t trailing_space(std::string_view s);  // bytes of White_Space at the end
  static size_t leading_space(std::string_view s);   // bytes of White_Space at the start

  std::vector<AddedToken> tokens_;
  Trie raw_, normalized_;
  std::unordered_map<std::string, uint32_t> by_content_;
};

}  // namespace anvil::data
