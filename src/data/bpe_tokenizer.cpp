// BPE: added tokens -> normalizer -> pre-tokenizer -> merges by rank over the symbols of each piece
// (cached per piece) -> ids. Two pipelines share the model (vocabulary, merges, unk, merge loop, cache):
//
// Byte-level: the ByteLevel step maps every byte to a printable character and the vocabulary is written in
// those characters; this implementation maps the vocabulary back to bytes once at load time, so encoding
// works on the input bytes directly and never builds the mapped strings.
//
// SentencePiece-style: spaces become "▁" (a Prepend + Replace normalizer, or the Metaspace pre-tokenizer)
// and the symbols are characters; one missing from the vocabulary becomes <0xNN> byte tokens
// (byte_fallback) or unk. The decoder is a chain of string steps run over the token strings, as the
// reference runs it.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/bpe_tokenizer.hpp"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "anvil/error.hpp"
#include "data/unicode.hpp"

namespace anvil::data {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

using nlohmann::json;

// ---- Regexes

// Hugging Face tokenizers runs its patterns with Oniguruma, whose \s is the White_Space property and \w is
// letters, marks, numbers and connector punctuation. PCRE2's \s (with UCP) also takes U+180E and its \w
// no marks, so these escapes are spelled out as explicit classes before compiling.
constexpr const char* kWhiteSpaceClass =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr const char* kWordClass = R"(\p{L}\p{M}\p{N}\p{Pc})";

std::string translate_pattern(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 'Q') {  // \Q...\E is literal: copy it untouched
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
        out.append(p.substr(i, stop - i));
        i = stop - 1;
        continue;
      }
      const char* cls = e == 's' || e == 'S' ? kWhiteSpaceClass : e == 'w' || e == 'W' ? kWordClass : nullptr;
      const bool negated = e == 'S' || e == 'W';
      if (cls && !in_class) {
        out += negated ? "[^" : "[";
        out += cls;
        out += ']';
      } else if (cls && !negated) {
        out += cls;  // inside a class the union is written inline
      } else {
        out += c;  // other escapes (and \S, \W inside a class) keep PCRE2's meaning
        out += e;
      }
      ++i;
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
    } else if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i + 1, end + 2 - (i + 1)));
        i = end + 1;
      }
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Span {
  uint32_t begin, end;
};

class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::function<void(const std::string&)>& fail) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    const std::string compiled = literal ? pattern : translate_pattern(pattern);
    // LITERAL refuses other options. \C (one code unit) could match inside a character and hand later
    // steps ill-formed UTF-8, which they match with the UTF check off: refused.
    const uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), opts, &err, &offset,
                          nullptr);
    if (!code_) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      fail(fmt::format("pattern does not compile at offset {}: {}", offset,
                       reinterpret_cast<const char*>(msg.data())));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The non-overlapping matches of the pattern in `s` (valid UTF-8), left to right. After an empty match
  // the search moves on by one character.
  template <class F>
  void for_each_match(std::string_view s, pcre2_match_data* md, F&& on_match) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    size_t pos = 0;
    while (pos <= s.size()) {
      int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), pos, 0, md, nullptr)
                    : pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter keeps its backtracking state on the heap
        rc = pcre2_match(code_, subject, s.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(rc, msg.data(), msg.size());
        ANVIL_THROW("tokenizer: pre-tokenizer regex failed on the input: {}",
                    reinterpret_cast<const char*>(msg.data()));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      on_match(b, e);
      if (e > b) {
        pos = e;
      } else {
        if (b >= s.size()) return;
        pos = b + unicode::decode_utf8(s, b).len;
      }
    }
  }

  // Splits `s` into spans as Hugging Face's Split pre-tokenizer does (empty spans dropped).
  void split(std::string_view s, Behavior behavior, bool invert, pcre2_match_data* md, std::vector<Span>& out,
             std::vector<std::pair<Span, bool>>& parts) const {
    parts.clear();
    uint32_t prev = 0;
    for_each_match(s, md, [&](size_t b, size_t e) {
      if (prev != b) parts.push_back({{prev, uint32_t(b)}, false});
      parts.push_back({{uint32_t(b), uint32_t(e)}, true});
      prev = uint32_t(e);
    });
    if (prev != s.size()) parts.push_back({{prev, uint32_t(s.size())}, false});
    if (invert)
      for (auto& p : parts) p.second = !p.second;
    out.clear();
    bool previous_match = false;
    switch (behavior) {
      case Behavior::kIsolated:
        for (const auto& p : parts) out.push_back(p.first);
        break;
      case Behavior::kRemoved:
        for (const auto& p : parts)
          if (!p.second) out.push_back(p.first);
        break;
      case Behavior::kMergedWithPrevious:  // a match joins the piece before it
        for (const auto& [span, is_match] : parts) {
          if (is_match && !previous_match && !out.empty())
            out.back().end = span.end;
          else
            out.push_back(span);
          previous_match = is_match;
        }
        break;
      case Behavior::kMergedWithNext:  // a match joins the piece after it
        for (size_t k = parts.size(); k-- > 0;) {
          const auto& [span, is_match] = parts[k];
          if (is_match && !previous_match && !out.empty())
            out.back().begin = span.begin;
          else
            out.push_back(span);
          previous_match = is_match;
        }
        std::reverse(out.begin(), out.end());
        break;
      case Behavior::kContiguous:  // runs of matches (and of non-matches) become one piece
        for (const auto& [span, is_match] : parts) {
          if (is_match == previous_match && !out.empty())
            out.back().end = span.end;
          else
            out.push_back(span);
          previous_match = is_match;
        }
        break;
    }
    std::erase_if(out, [](const Span& sp) { return sp.begin == sp.end; });
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// ---- The byte-level alphabet: bytes that are printable Latin-1 map to themselves, the other 68 bytes to
// U+0100.. in byte order (so the vocabulary never contains spaces or control characters).

std::array<char32_t, 256> byte_to_char() {
  std::array<char32_t, 256> m{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    m[b] = printable ? char32_t(b) : next++;
  }
  return m;
}

// Maps a vocabulary string back to bytes; false if it has a character outside the byte-level alphabet.
bool byte_level_to_bytes(std::string_view token, const std::unordered_map<char32_t, uint8_t>& char_to_byte,
                         std::string& out) {
  out.clear();
  for (size_t i = 0; i < token.size();) {
    const unicode::Decoded d = unicode::decode_utf8(token, i);
    auto it = char_to_byte.find(d.cp);
    if (!d.valid || it == char_to_byte.end()) return false;
    out.push_back(static_cast<char>(it->second));
    i += d.len;
  }
  return true;
}

// ---- Merges: (left id, right id) -> (rank, merged id) in an open-addressing table.

class MergeTable {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, 0);
    mask_ = cap - 1;
  }
  // A repeated pair takes the later rank, as a map built from the list in order would.
  void insert(uint32_t a, uint32_t b, uint32_t rank, uint32_t id) {
    const uint64_t key = (uint64_t(a) << 32) | b;
    size_t i = hash(key) & mask_;
    while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
    keys_[i] = key;
    vals_[i] = (uint64_t(rank) << 32) | id;
  }
  bool find(uint32_t a, uint32_t b, uint32_t& rank, uint32_t& id) const {
    if (keys_.empty()) return false;
    const uint64_t key = (uint64_t(a) << 32) | b;
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (keys_[i] == key) {
        rank = uint32_t(vals_[i] >> 32), id = uint32_t(vals_[i]);
        return true;
      }
      if (keys_[i] == kEmpty) return false;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;  // ids are < 2^31, so no real key has every bit set
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return size_t(k);
  }
  std::vector<uint64_t> keys_, vals_;
  size_t mask_ = 0;
};

struct TransparentHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// ---- SentencePiece-style pipeline steps

// A literal pattern -> content replacement (Replace with a String pattern, as normalizer or decoder).
struct Replacement {
  std::string pattern, content;
};

// Non-overlapping occurrences, left to right (the pattern is not empty).
void replace_all(std::string_view in, const Replacement& r, std::string& out) {
  out.clear();
  size_t pos = 0;
  for (size_t hit; (hit = in.find(r.pattern, pos)) != std::string_view::npos; pos = hit + r.pattern.size()) {
    out.append(in.substr(pos, hit - pos));
    out += r.content;
  }
  out.append(in.substr(pos));
}

struct NormalizerStep {
  bool prepend = false;  // Prepend(text), else Replace
  std::string text;
  Replacement replace;
};

enum class PrependScheme { kFirst, kAlways, kNever };

struct Metaspace {
  std::string replacement;  // one character
  PrependScheme scheme = PrependScheme::kAlways;
  bool split = true;
};

struct DecoderStep {
  enum Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  Replacement replace;           // kReplace
  std::string content;           // kStrip: the character; kMetaspace: the replacement
  uint64_t start = 0, stop = 0;  // kStrip: at most this many from each end
  bool prepend = false;          // kMetaspace: prepend_scheme is not "never"
};

// The byte a ByteFallback decoder reads from a token: "<0xHH>" with HH read as Rust's
// u8::from_str_radix(HH, 16) does (either case, an optional leading '+').
std::optional<uint8_t> byte_token_value(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return std::nullopt;
  std::string_view hex = t.substr(3, 2);
  if (hex[0] == '+') hex.remove_prefix(1);
  unsigned v = 0;
  for (const char c : hex) {
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return std::nullopt;
    v = v * 16 + unsigned(d);
  }
  return static_cast<uint8_t>(v);
}

// The token byte fallback uses for `b`, spelled as the reference spells it ("<0x0A>").
std::string byte_token(uint8_t b) {
  return fmt::format("<0x{:02X}>", b);
}

bool is_one_char(std::string_view s) {
  if (s.empty()) return false;
  const unicode::Decoded d = unicode::decode_utf8(s, 0);
  return d.valid && d.len == s.size();
}

// Runs one decoder step over the token strings.
void run_decoder_step(const DecoderStep& step, std::vector<std::string>& tokens) {
  std::string tmp;
  switch (step.kind) {
    case DecoderStep::kReplace:
      for (std::string& t : tokens) {
        replace_all(t, step.replace, tmp);
        t.swap(tmp);
      }
      break;
    case DecoderStep::kByteFallback: {
      // Runs of byte tokens become their bytes when those are valid UTF-8, else one U+FFFD per byte.
      std::vector<std::string> out;
      out.reserve(tokens.size());
      std::string bytes;
      const auto flush = [&] {
        if (bytes.empty()) return;
        if (unicode::is_valid_utf8(bytes))
          out.push_back(bytes);
        else
          out.insert(out.end(), bytes.size(), "\xEF\xBF\xBD");
        bytes.clear();
      };
      for (std::string& t : tokens) {
        if (const auto b = byte_token_value(t)) {
          bytes.push_back(static_cast<char>(*b));
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      tokens.swap(out);
      break;
    }
    case DecoderStep::kFuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      tokens.assign(1, std::move(all));
      break;
    }
    case DecoderStep::kStrip:
      // The reference panics when `stop` reaches past the start of a token or past what `start` took;
      // that token is empty here.
      for (std::string& t : tokens) {
        size_t begin = 0, end = t.size();
        for (uint64_t n = 0; n < step.start && std::string_view(t).substr(begin).starts_with(step.content);
             ++n)
          begin += step.content.size();
        for (uint64_t n = 0; n < step.stop && std::string_view(t).substr(0, end).ends_with(step.content); ++n)
          end -= step.content.size();
        t = end > begin ? t.substr(begin, end - begin) : std::string();
      }
      break;
    case DecoderStep::kMetaspace:
      // Replacements become spaces, except in the first token, where all of them go (unless "never").
      for (size_t i = 0; i < tokens.size(); ++i) {
        replace_all(tokens[i], {step.content, i == 0 && step.prepend ? "" : " "}, tmp);
        tokens[i].swap(tmp);
      }
      break;
  }
}

// {"String": "..."} of a Replace step (a Regex pattern is refused).
Replacement parse_replacement(const TokenizerJson& tj, const json& j, const std::string& where) {
  Replacement r;
  auto it = j.find("pattern");
  if (it == j.end() || !it->is_object() || it->size() != 1)
    tj.fail(where + ".pattern", "expected {\"String\": ...}");
  if (it->contains("Regex"))
    tj.fail(where + ".pattern",
            "Regex '" + (*it)["Regex"].dump() + "' is not supported (only String patterns)");
  const auto str = it->find("String");
  if (str == it->end() || !str->is_string()) tj.fail(where + ".pattern", "expected {\"String\": ...}");
  r.pattern = str->get<std::string>();
  if (r.pattern.empty()) tj.fail(where + ".pattern", "an empty String pattern is not supported");
  r.content = tj.str(j, where, "content");
  return r;
}

// A Metaspace pre-tokenizer or decoder. The reference reads prepend_scheme (default "always") and, from
// older files, add_prefix_space, which must agree with it: false only goes with "never".
Metaspace parse_metaspace(const TokenizerJson& tj, const json& j, const std::string& where) {
  Metaspace m;
  m.replacement = tj.str(j, where, "replacement");
  if (!is_one_char(m.replacement))
    tj.fail(where + ".replacement", "'" + m.replacement + "' is not a single character");
  const std::optional<std::string> scheme = tj.opt_str(j, where, "prepend_scheme");
  if (!scheme || *scheme == "always")
    m.scheme = PrependScheme::kAlways;
  else if (*scheme == "first")
    m.scheme = PrependScheme::kFirst;
  else if (*scheme == "never")
    m.scheme = PrependScheme::kNever;
  else
    tj.fail(where + ".prepend_scheme", "'" + *scheme + "' is not one of first, always, never");
  if (!tj.flag(j, where, "add_prefix_space", true) && m.scheme != PrependScheme::kNever)
    tj.fail(where + ".add_prefix_space",
            fmt::format("false contradicts prepend_scheme '{}'", scheme.value_or("always")));
  m.split = tj.flag(j, where, "split", true);
  return m;
}

// One pre-tokenizer step.
struct Step {
  bool byte_level = false;       // else a Split
  std::unique_ptr<Regex> regex;  // the Split pattern, or GPT-2's for ByteLevel with use_regex
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;
};

// Scratch space for one encode() call.
struct EncodeScratch {
  pcre2_match_data* md = nullptr;
  std::vector<std::vector<Span>> spans;  // per step depth
  std::vector<std::string> prefixed;     // per step depth: " " + piece for add_prefix_space
  std::string normalized, metaspaced;    // SentencePiece style: normalizer scratch, Metaspace output
  std::vector<std::pair<Span, bool>> parts;
  // Merge state for one word.
  struct Symbol {
    uint32_t id;
    int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  struct Candidate {
    uint32_t rank, pos, id;
    // Reversed, so the std heap functions (a max-heap) pop the lowest rank, then the leftmost position.
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Candidate> heap;
  std::vector<uint32_t> word_ids;
  ~EncodeScratch() { pcre2_match_data_free(md); }
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(const TokenizerJson& tj);

  std::string kind() const override { return byte_level_ ? "bpe" : "sentencepiece_bpe"; }
  uint64_t vocab_size() const override { return id_to_token_.size(); }
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const uint32_t> ids, bool skip_special) const override;
  std::optional<uint32_t> eos_id() const override {
    for (const char* t : {"<|endoftext|>", "</s>", "<|end_of_text|>"})
      if (auto id = token_to_id(t)) return id;
    return std::nullopt;
  }
  std::optional<uint32_t> token_to_id(std::string_view token) const override {
    if (auto id = added_.find(token)) return id;
    auto it = vocab_.find(token);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }

 private:
  void parse_pre_tokenizer(const TokenizerJson& tj, const json& j, const std::string& where);
  void setup_byte_level(const TokenizerJson& tj, const std::unordered_map<std::string, uint32_t>& vocab,
                        const std::vector<AddedToken>& added);
  void setup_sentencepiece(const TokenizerJson& tj, const std::unordered_map<std::string, uint32_t>& vocab,
                           const std::vector<AddedToken>& added);
  void parse_sp_normalizer(const TokenizerJson& tj, const json& j, const std::string& where);
  void parse_sp_decoder(const TokenizerJson& tj, const json& j, const std::string& where);
  std::string_view sp_normalize(std::string_view in, std::string& out, std::string& tmp) const;
  void pre_tokenize(std::string_view piece, size_t depth, EncodeScratch& s, std::vector<uint32_t>& ids) const;
  void metaspace_piece(std::string_view piece, bool at_start, EncodeScratch& s,
                       std::vector<uint32_t>& ids) const;
  void encode_word(std::string_view word, EncodeScratch& s, std::vector<uint32_t>& ids) const;
  void merge_word(std::string_view word, EncodeScratch& s) const;
  void char_symbols(std::string_view word, EncodeScratch& s) const;
  std::string decode_sentencepiece(std::span<const uint32_t> ids, bool skip_special) const;

  std::unordered_map<std::string, uint32_t, TransparentHash, std::equal_to<>>
      vocab_;  // as written in the file
  std::unordered_map<std::string, uint32_t, TransparentHash, std::equal_to<>>
      byte_vocab_;                        // as bytes (ignore_merges)
  std::vector<std::string> id_to_token_;  // the token text per id (added tokens included)
  std::vector<std::string> id_to_bytes_;  // what decode() emits per id
  std::vector<bool> has_id_, special_;
  // Byte-level: the id of each byte's token. SentencePiece style: the id of each ASCII character's token
  // (-1 for bytes >= 0x80). -1 where the vocabulary lacks it.
  std::array<int64_t, 256> byte_id_{};
  MergeTable merges_;
  std::optional<uint32_t> unk_;
  bool fuse_unk_ = false, ignore_merges_ = false, byte_level_decoder_ = true;
  bool byte_level_ = true;  // else the SentencePiece-style pipeline
  std::vector<Step> steps_;
  AddedVocabulary added_;

  // SentencePiece style.
  bool byte_fallback_ = false;
  std::array<uint32_t, 256> byte_token_id_{};  // <0xNN> (all present when byte_fallback_)
  std::vector<NormalizerStep> normalizer_;
  std::optional<Metaspace> metaspace_;
  bool sp_decoder_ = false;  // else tokens are joined with spaces
  std::vector<DecoderStep> decoder_;
  std::string style_;  // how the pipeline was recognised, for errors

  // Word cache: piece bytes -> (offset, count) into cache_ids_.
  static constexpr size_t kCacheMaxEntries = 1 << 18, kCacheMaxWord = 128;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, TransparentHash, std::equal_to<>>
      cache_;
  mutable std::vector<uint32_t> cache_ids_;
};

// Whether a pre-tokenizer (possibly a Sequence) has a ByteLevel step: that makes the pipeline byte-level.
bool has_byte_level_step(const json& j) {
  if (!j.is_object()) return false;
  const auto type = j.find("type");
  if (type == j.end() || !type->is_string()) return false;
  if (*type == "ByteLevel") return true;
  const auto steps = j.find("pretokenizers");
  if (*type != "Sequence" || steps == j.end() || !steps->is_array()) return false;
  return std::any_of(steps->begin(), steps->end(), [](const json& e) { return has_byte_level_step(e); });
}

BpeTokenizer::BpeTokenizer(const TokenizerJson& tj) {
  const json& m = tj.model();
  const json* pre = tj.section("pre_tokenizer");
  byte_level_ = pre && has_byte_level_step(*pre);
  style_ = "byte-level BPE";
  if (!byte_level_)
    style_ = pre ? fmt::format("SentencePiece-style BPE (pre_tokenizer '{}', no ByteLevel step)",
                               tj.str(*pre, "pre_tokenizer", "type"))
                 : "SentencePiece-style BPE (pre_tokenizer null)";
  // Model options this implementation does not reproduce are refused rather than ignored.
  byte_fallback_ = tj.flag(m, "model", "byte_fallback", false);
  if (byte_level_ && byte_fallback_)
    tj.fail("model.byte_fallback", "true is not supported (byte-level BPE needs no byte fallback)");
  if (m.contains("dropout") && !m["dropout"].is_null() &&
      !(m["dropout"].is_number() && m["dropout"].get<double>() == 0))
    tj.fail("model.dropout", "BPE dropout is not supported (it makes encoding random)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto v = tj.opt_str(m, "model", k); v && !v->empty())
      tj.fail(std::string("model.") + k, "'" + *v + "' is not supported for " + style_);
  fuse_unk_ = tj.flag(m, "model", "fuse_unk", false);
  ignore_merges_ = tj.flag(m, "model", "ignore_merges", false);

  // Vocabulary and ids.
  auto vocab = tj.vocab();
  const std::vector<AddedToken> added = parse_added_tokens(tj);
  const uint32_t max_id = tj.id_space(vocab, added);
  // The reference gives an added token that is also in model.vocab the vocabulary's id, whatever the
  // file says: a file that disagrees is refused rather than read with other ids.
  for (size_t i = 0; i < added.size(); ++i)
    if (auto it = vocab.find(added[i].content); it != vocab.end() && it->second != added[i].id)
      tj.fail(fmt::format("added_tokens[{}]", i),
              fmt::format("'{}' has id {} but model.vocab gives it {}, which the reference uses",
                          added[i].content, added[i].id, it->second));
  id_to_token_.resize(max_id);
  has_id_.assign(max_id, false);
  special_.assign(max_id, false);
  for (const auto& [t, id] : vocab) id_to_token_[id] = t, has_id_[id] = true;
  for (const AddedToken& a : added)
    id_to_token_[a.id] = a.content, has_id_[a.id] = true, special_[a.id] = a.special;
  vocab_.reserve(vocab.size());
  for (auto& [t, id] : vocab) vocab_.emplace(t, id);

  if (auto unk = tj.opt_str(m, "model", "unk_token")) {
    auto it = vocab.find(*unk);
    if (it == vocab.end()) tj.fail("model.unk_token", "'" + *unk + "' is not in model.vocab");
    unk_ = it->second;
  }

  // Merges, validated like the reference: both sides and their concatenation must be in the vocabulary.
  auto mit = m.find("merges");
  if (mit == m.end() || !mit->is_array()) tj.fail("model.merges", "expected an array");
  merges_.reserve(mit->size());
  for (size_t i = 0; i < mit->size(); ++i) {
    const json& e = (*mit)[i];
    std::string a, b;
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        tj.fail(fmt::format("model.merges[{}]", i), "'" + s + "' is not two tokens separated by one space");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>(), b = e[1].get<std::string>();
    } else {
      tj.fail(fmt::format("model.merges[{}]", i), "expected \"a b\" or [\"a\", \"b\"]");
    }
    const auto find = [&](const std::string& t) {
      auto it = vocab.find(t);
      if (it == vocab.end())
        tj.fail(fmt::format("model.merges[{}]", i),
                "('" + a + "', '" + b + "') refers to '" + t + "', not in model.vocab");
      return it->second;
    };
    const uint32_t ia = find(a), ib = find(b), iab = find(a + b);
    merges_.insert(ia, ib, static_cast<uint32_t>(i), iab);
  }

  if (byte_level_)
    setup_byte_level(tj, vocab, added);
  else
    setup_sentencepiece(tj, vocab, added);
}

void BpeTokenizer::setup_byte_level(const TokenizerJson& tj,
                                    const std::unordered_map<std::string, uint32_t>& vocab,
                                    const std::vector<AddedToken>& added) {
  // Pre-tokenizer: a chain of Split steps that ends in ByteLevel.
  parse_pre_tokenizer(tj, *tj.section("pre_tokenizer"), "pre_tokenizer");
  if (steps_.empty() || !steps_.back().byte_level)
    tj.fail("pre_tokenizer", "must end with a ByteLevel step (only byte-level BPE is supported)");
  if (std::count_if(steps_.begin(), steps_.end(), [](const Step& s) { return s.byte_level; }) > 1)
    tj.fail("pre_tokenizer", "more than one ByteLevel step is not supported");

  if (const json* n = tj.section("normalizer")) {
    const std::string type = tj.str(*n, "normalizer", "type");
    const bool empty_sequence = type == "Sequence" && n->contains("normalizers") &&
                                (*n)["normalizers"].is_array() && (*n)["normalizers"].empty();
    if (!empty_sequence) tj.unsupported("normalizer", type, "none (null) for byte-level BPE");
  }
  if (const json* d = tj.section("decoder")) {
    const std::string type = tj.str(*d, "decoder", "type");
    if (type != "ByteLevel") tj.unsupported("decoder", type, "ByteLevel or null");
  } else {
    byte_level_decoder_ = false;  // tokens are joined with spaces, as the reference does without a decoder
  }

  // Byte-level mapping of the vocabulary.
  const std::array<char32_t, 256> b2c = byte_to_char();
  std::unordered_map<char32_t, uint8_t> c2b;
  for (int b = 0; b < 256; ++b) c2b[b2c[b]] = static_cast<uint8_t>(b);
  std::string enc;
  for (int b = 0; b < 256; ++b) {
    enc.clear();
    unicode::append_utf8(enc, b2c[b]);
    auto it = vocab.find(enc);
    byte_id_[b] = it == vocab.end() ? -1 : int64_t(it->second);
  }
  const uint32_t max_id = static_cast<uint32_t>(id_to_token_.size());
  id_to_bytes_.resize(max_id);
  std::string bytes;
  for (uint32_t id = 0; id < max_id; ++id) {
    if (!has_id_[id]) continue;
    const std::string& t = id_to_token_[id];
    // The ByteLevel decoder keeps a token's text as is when it is not all byte-level characters.
    id_to_bytes_[id] = byte_level_decoder_ && byte_level_to_bytes(t, c2b, bytes) ? bytes : t;
  }
  if (ignore_merges_)
    for (const auto& [t, id] : vocab)
      if (byte_level_to_bytes(t, c2b, bytes)) byte_vocab_.emplace(bytes, id);

  added_ = AddedVocabulary(added, [](const std::string& s) { return s; });
}

void BpeTokenizer::setup_sentencepiece(const TokenizerJson& tj,
                                       const std::unordered_map<std::string, uint32_t>& vocab,
                                       const std::vector<AddedToken>& added) {
  // Single ASCII characters take the fast path of encode_word; others are looked up as strings.
  for (int b = 0; b < 256; ++b) {
    auto it = b < 0x80 ? vocab.find(std::string(1, static_cast<char>(b))) : vocab.end();
    byte_id_[b] = it == vocab.end() ? -1 : int64_t(it->second);
  }
  // Byte tokens. The reference falls back to unk for a character whose bytes are not all in the
  // vocabulary; a SentencePiece byte_fallback model always has all 256, so a missing one is a broken file.
  // A token the ByteFallback decoder would read as a byte but that is not spelled as encoding spells it
  // ("<0x0a>", "<0x+A>") would decode to a byte it never encodes: also refused.
  if (byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      const std::string t = byte_token(static_cast<uint8_t>(b));
      auto it = vocab.find(t);
      if (it == vocab.end())
        tj.fail("model.vocab", "byte_fallback is true but the byte token '" + t +
                                   "' is missing (all 256 of <0x00>..<0xFF> are needed)");
      byte_token_id_[b] = it->second;
    }
    for (const auto& [t, id] : vocab)
      if (const auto b = byte_token_value(t); b && t != byte_token(*b))
        tj.fail(
            "model.vocab[\"" + t + "\"]",
            fmt::format("looks like a byte token but is not spelled '{}' (bad byte token)", byte_token(*b)));
  }

  if (const json* n = tj.section("normalizer")) parse_sp_normalizer(tj, *n, "normalizer");
  if (const json* p = tj.section("pre_tokenizer")) {
    const std::string type = tj.str(*p, "pre_tokenizer", "type");
    if (type != "Metaspace")
      tj.unsupported("pre_tokenizer", type,
                     "a ByteLevel step (after Split steps) for byte-level BPE, Metaspace or null for "
                     "SentencePiece-style BPE");
    metaspace_ = parse_metaspace(tj, *p, "pre_tokenizer");
  }
  if (const json* d = tj.section("decoder")) {
    sp_decoder_ = true;
    parse_sp_decoder(tj, *d, "decoder");
  }

  // normalized=true added tokens are matched in the normalized text, as their normalized content.
  added_ = AddedVocabulary(added, [&](const std::string& content) {
    std::string out, tmp;
    return std::string(sp_normalize(content, out, tmp));
  });
}

void BpeTokenizer::parse_sp_normalizer(const TokenizerJson& tj, const json& j, const std::string& where) {
  if (!j.is_object()) tj.fail(where, "expected an object");
  const std::string type = tj.str(j, where, "type");
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) tj.fail(where + ".normalizers", "expected an array");
    for (size_t i = 0; i < it->size(); ++i)
      parse_sp_normalizer(tj, (*it)[i], fmt::format("{}.normalizers[{}]", where, i));
  } else if (type == "Prepend") {
    NormalizerStep step;
    step.prepend = true;
    step.text = tj.str(j, where, "prepend");
    normalizer_.push_back(std::move(step));
  } else if (type == "Replace") {
    NormalizerStep step;
    step.replace = parse_replacement(tj, j, where);
    normalizer_.push_back(std::move(step));
  } else {
    tj.unsupported(where, type, "Prepend, Replace (String pattern) and a Sequence of them, for " + style_);
  }
}

void BpeTokenizer::parse_sp_decoder(const TokenizerJson& tj, const json& j, const std::string& where) {
  if (!j.is_object()) tj.fail(where, "expected an object");
  const std::string type = tj.str(j, where, "type");
  DecoderStep step{};
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array()) tj.fail(where + ".decoders", "expected an array");
    for (size_t i = 0; i < it->size(); ++i)
      parse_sp_decoder(tj, (*it)[i], fmt::format("{}.decoders[{}]", where, i));
    return;
  } else if (type == "Replace") {
    step.kind = DecoderStep::kReplace;
    step.replace = parse_replacement(tj, j, where);
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderStep::kStrip;
    step.content = tj.str(j, where, "content");
    if (!is_one_char(step.content))
      tj.fail(where + ".content", "'" + step.content + "' is not a single character");
    step.start = tj.uint(j, where, "start", 0);
    step.stop = tj.uint(j, where, "stop", 0);
  } else if (type == "Metaspace") {
    const Metaspace ms = parse_metaspace(tj, j, where);
    step.kind = DecoderStep::kMetaspace;
    step.content = ms.replacement;
    step.prepend = ms.scheme != PrependScheme::kNever;
  } else {
    tj.unsupported(
        where, type,
        "Replace (String pattern), ByteFallback, Fuse, Strip, Metaspace and a Sequence of them, for " +
            style_);
  }
  decoder_.push_back(std::move(step));
}

void BpeTokenizer::parse_pre_tokenizer(const TokenizerJson& tj, const json& j, const std::string& where) {
  if (!j.is_object()) tj.fail(where, "expected an object");
  const std::string type = tj.str(j, where, "type");
  const auto regex_fail = [&](const std::string& what) { tj.fail(where + ".pattern", what); };
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array()) tj.fail(where + ".pretokenizers", "expected an array");
    for (size_t i = 0; i < it->size(); ++i)
      parse_pre_tokenizer(tj, (*it)[i], fmt::format("{}.pretokenizers[{}]", where, i));
  } else if (type == "ByteLevel") {
    Step s;
    s.byte_level = true;
    s.add_prefix_space = tj.flag(j, where, "add_prefix_space", true);
    if (tj.flag(j, where, "use_regex", true))
      s.regex = std::make_unique<Regex>(kGpt2Pattern, false, regex_fail);
    steps_.push_back(std::move(s));
  } else if (type == "Split") {
    Step s;
    auto pit = j.find("pattern");
    if (pit == j.end() || !pit->is_object() || pit->size() != 1)
      tj.fail(where + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    const bool literal = pit->contains("String");
    const json& pat = literal ? (*pit)["String"] : pit->value("Regex", json());
    if (!pat.is_string()) tj.fail(where + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    s.regex = std::make_unique<Regex>(pat.get<std::string>(), literal, regex_fail);
    const std::string b = tj.str(j, where, "behavior");
    if (b == "Isolated")
      s.behavior = Behavior::kIsolated;
    else if (b == "Removed")
      s.behavior = Behavior::kRemoved;
    else if (b == "MergedWithPrevious")
      s.behavior = Behavior::kMergedWithPrevious;
    else if (b == "MergedWithNext")
      s.behavior = Behavior::kMergedWithNext;
    else if (b == "Contiguous")
      s.behavior = Behavior::kContiguous;
    else
      tj.fail(where + ".behavior", "unknown behavior '" + b + "'");
    s.invert = tj.flag(j, where, "invert", false);
    steps_.push_back(std::move(s));
  } else {
    tj.unsupported(where, type, "ByteLevel, Split, and a Sequence of them");
  }
}

std::vector<uint32_t> BpeTokenizer::encode(std::string_view text) const {
  std::string valid;
  if (!unicode::is_valid_utf8(text)) {  // the reference only ever sees valid text: replace, as Python would
    unicode::to_valid_utf8(text, valid);
    text = valid;
  }
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  EncodeScratch s;
  if (!byte_level_) {
    // Metaspace's prepend_scheme "first" prepends only to the piece that starts the text.
    bool at_start = true;
    added_.split(
        text,
        [&](std::string_view in, std::string& buffer) { return sp_normalize(in, buffer, s.normalized); },
        [&](std::string_view piece) {
          metaspace_piece(piece, at_start, s, ids);
          at_start = false;
        },
        [&](uint32_t id) {
          ids.push_back(id);
          at_start = false;
        });
    return ids;
  }
  s.md = pcre2_match_data_create(1, nullptr);
  s.spans.resize(steps_.size());
  s.prefixed.resize(steps_.size());
  added_.split(
      text, [](std::string_view in, std::string&) { return in; },
      [&](std::string_view piece) { pre_tokenize(piece, 0, s, ids); },
      [&](uint32_t id) { ids.push_back(id); });
  return ids;
}

// The normalizer steps in order; the result is `in` or a view of `out` (`tmp` is scratch).
std::string_view BpeTokenizer::sp_normalize(std::string_view in, std::string& out, std::string& tmp) const {
  std::string_view cur = in;
  for (const NormalizerStep& step : normalizer_) {
    if (step.prepend) {
      if (cur.empty()) continue;  // Prepend leaves an empty string empty
      tmp.assign(step.text);
      tmp.append(cur);
    } else {
      replace_all(cur, step.replace, tmp);
    }
    out.swap(tmp);
    cur = out;
  }
  return cur;
}

// Metaspace: spaces become the replacement, which is prepended as the scheme says (unless the piece then
// starts with it); with split, each replacement starts a new word (the reference's MergedWithNext).
void BpeTokenizer::metaspace_piece(std::string_view piece, bool at_start, EncodeScratch& s,
                                   std::vector<uint32_t>& ids) const {
  if (!metaspace_) return encode_word(piece, s, ids);
  const Metaspace& m = *metaspace_;
  const std::string& rep = m.replacement;
  std::string& w = s.metaspaced;
  w.clear();
  const bool prepend = m.scheme == PrependScheme::kAlways || (m.scheme == PrependScheme::kFirst && at_start);
  if (prepend && !piece.starts_with(' ') && !piece.starts_with(rep)) w = rep;
  for (const char c : piece) {
    if (c == ' ')
      w += rep;
    else
      w += c;
  }
  if (!m.split) return encode_word(w, s, ids);
  size_t begin = 0;
  // From 1: a leading replacement starts the first word. A match is always at a character start.
  for (size_t pos = w.find(rep, 1); pos != std::string::npos; pos = w.find(rep, pos + rep.size())) {
    encode_word(std::string_view(w).substr(begin, pos - begin), s, ids);
    begin = pos;
  }
  encode_word(std::string_view(w).substr(begin), s, ids);
}

void BpeTokenizer::pre_tokenize(std::string_view piece, size_t depth, EncodeScratch& s,
                                std::vector<uint32_t>& ids) const {
  if (depth == steps_.size()) return encode_word(piece, s, ids);
  const Step& step = steps_[depth];
  std::string_view p = piece;
  if (step.byte_level) {
    if (step.add_prefix_space && p[0] != ' ') {
      s.prefixed[depth].assign(1, ' ');
      s.prefixed[depth] += p;
      p = s.prefixed[depth];
    }
    if (!step.regex) return pre_tokenize(p, depth + 1, s, ids);
  }
  std::vector<Span>& spans = s.spans[depth];
  step.regex->split(p, step.behavior, step.invert, s.md, spans, s.parts);
  for (const Span& sp : spans) pre_tokenize(p.substr(sp.begin, sp.end - sp.begin), depth + 1, s, ids);
}

void BpeTokenizer::encode_word(std::string_view word, EncodeScratch& s, std::vector<uint32_t>& ids) const {
  if (word.size() == 1 && byte_id_[static_cast<unsigned char>(word[0])] >= 0) {
    ids.push_back(uint32_t(byte_id_[static_cast<unsigned char>(word[0])]));
    return;
  }
  const bool cacheable = word.size() <= kCacheMaxWord;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids.insert(ids.end(), cache_ids_.begin() + it->second.first,
                 cache_ids_.begin() + it->second.first + it->second.second);
      return;
    }
  }
  merge_word(word, s);
  ids.insert(ids.end(), s.word_ids.begin(), s.word_ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear(), cache_ids_.clear();
    cache_.emplace(std::string(word),
                   std::make_pair(uint32_t(cache_ids_.size()), uint32_t(s.word_ids.size())));
    cache_ids_.insert(cache_ids_.end(), s.word_ids.begin(), s.word_ids.end());
  }
}

// Applies the merges to one piece: always the lowest-ranked adjacent pair first, the leftmost among
// equals; a priority queue of candidate pairs with lazy invalidation keeps this O(n log n).
void BpeTokenizer::merge_word(std::string_view word, EncodeScratch& s) const {
  s.word_ids.clear();
  if (ignore_merges_) {  // a word that is a token is taken whole
    const auto& whole = byte_level_ ? byte_vocab_ : vocab_;
    auto it = whole.find(word);
    if (it != whole.end()) {
      s.word_ids.push_back(it->second);
      return;
    }
  }
  auto& sym = s.symbols;
  sym.clear();
  if (byte_level_) {
    bool last_unk = false;
    for (unsigned char b : word) {
      if (byte_id_[b] >= 0) {
        sym.push_back({uint32_t(byte_id_[b]), 0, 0, true});
        last_unk = false;
      } else if (unk_) {  // bytes the vocabulary lacks become unk (consecutive ones fused if fuse_unk)
        if (!(fuse_unk_ && last_unk)) sym.push_back({*unk_, 0, 0, true});
        last_unk = true;
      }
    }
  } else {
    char_symbols(word, s);
  }
  const int32_t n = static_cast<int32_t>(sym.size());
  for (int32_t i = 0; i < n; ++i) sym[i].prev = i - 1, sym[i].next = i + 1 < n ? i + 1 : -1;
  auto& heap = s.heap;
  heap.clear();
  uint32_t rank, id;
  for (int32_t i = 0; i + 1 < n; ++i)
    if (merges_.find(sym[i].id, sym[i + 1].id, rank, id)) heap.push_back({rank, uint32_t(i), id});
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const EncodeScratch::Candidate c = heap.back();
    heap.pop_back();
    EncodeScratch::Symbol& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    // Stale if either side changed since the candidate was queued.
    const int32_t r = left.next;
    if (!merges_.find(left.id, sym[r].id, rank, id) || id != c.id) continue;
    left.id = c.id;
    sym[r].alive = false;
    left.next = sym[r].next;
    if (left.next >= 0) sym[left.next].prev = int32_t(c.pos);
    if (left.prev >= 0 && merges_.find(sym[left.prev].id, left.id, rank, id)) {
      heap.push_back({rank, uint32_t(left.prev), id});
      std::push_heap(heap.begin(), heap.end());
    }
    if (left.next >= 0 && merges_.find(left.id, sym[left.next].id, rank, id)) {
      heap.push_back({rank, c.pos, id});
      std::push_heap(heap.begin(), heap.end());
    }
  }
  for (int32_t i = 0; i >= 0 && i < n; i = sym[i].next) s.word_ids.push_back(sym[i].id);
}

// The symbols of a word in characters: a character in the vocabulary is its token; one that is not becomes
// its byte tokens (byte_fallback) or unk. As in the reference, an unk waits until the next known character
// (so byte tokens in between come first) and fuse_unk folds the unknown characters up to then into it.
void BpeTokenizer::char_symbols(std::string_view word, EncodeScratch& s) const {
  auto& sym = s.symbols;
  bool unk_pending = false;
  for (size_t i = 0; i < word.size();) {
    const unsigned char lead = static_cast<unsigned char>(word[i]);
    const size_t len = lead < 0x80 ? 1 : unicode::decode_utf8(word, i).len;  // the word is valid UTF-8
    int64_t id = byte_id_[lead];
    if (len > 1) {
      auto it = vocab_.find(word.substr(i, len));
      id = it == vocab_.end() ? -1 : int64_t(it->second);
    }
    if (id >= 0) {
      if (unk_pending) sym.push_back({*unk_, 0, 0, true});
      unk_pending = false;
      sym.push_back({uint32_t(id), 0, 0, true});
    } else if (byte_fallback_) {  // every byte token is present (checked at load)
      for (size_t k = i; k < i + len; ++k)
        sym.push_back({byte_token_id_[static_cast<unsigned char>(word[k])], 0, 0, true});
    } else if (unk_) {
      if (unk_pending && !fuse_unk_) sym.push_back({*unk_, 0, 0, true});
      unk_pending = true;
    }
    i += len;
  }
  if (unk_pending) sym.push_back({*unk_, 0, 0, true});
}

std::string BpeTokenizer::decode(std::span<const uint32_t> ids, bool skip_special) const {
  if (!byte_level_) return decode_sentencepiece(ids, skip_special);
  std::string out;
  bool first = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    ANVIL_REQUIRE(id < has_id_.size() && has_id_[id],
                  "BPE tokenizer: id {} at position {} is not in the vocabulary (size {})", id, i,
                  has_id_.size());
    if (skip_special && special_[id]) continue;
    if (!byte_level_decoder_ && !first) out += ' ';
    out += id_to_bytes_[id];
    first = false;
  }
  if (!byte_level_decoder_) return out;
  std::string valid;
  if (unicode::is_valid_utf8(out)) return out;
  unicode::to_valid_utf8(out, valid);  // byte tokens may split characters: lossy, as the reference
  return valid;
}

// The token strings through the decoder steps, joined (or joined with spaces when there is no decoder).
std::string BpeTokenizer::decode_sentencepiece(std::span<const uint32_t> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    ANVIL_REQUIRE(id < has_id_.size() && has_id_[id],
                  "BPE tokenizer: id {} at position {} is not in the vocabulary (size {})", id, i,
                  has_id_.size());
    if (!(skip_special && special_[id])) tokens.push_back(id_to_token_[id]);
  }
  std::string out;
  if (!sp_decoder_) {
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const DecoderStep& step : decoder_) run_decoder_step(step, tokens);
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(const TokenizerJson& tj) {
  return std::make_unique<BpeTokenizer>(tj);
}

}  // namespace anvil::data
