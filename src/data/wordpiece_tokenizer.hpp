// WordPiece (BERT) from a Hugging Face tokenizer.json or a plain vocab.txt.
//
// Supported: model WordPiece (vocab, unk_token, continuing_subword_prefix, max_input_chars_per_word);
// normalizer BertNormalizer (clean_text, handle_chinese_chars, strip_accents, lowercase) or null;
// pre_tokenizer BertPreTokenizer; decoder WordPiece (prefix, cleanup) or null; added tokens. A vocab.txt
// (one token per line, id = line number) gets the BERT-uncased defaults: lower-casing, accent stripping,
// [UNK], "##", 100 characters per word, and [PAD] [UNK] [CLS] [SEP] [MASK] as special tokens.
#pragma once
#include <memory>
#include <unordered_map>

#include "data/tokenizer.hpp"
#include "data/tokenizer_json.hpp"

namespace anvil::data {

class WordPieceTokenizer final : public Tokenizer {
 public:
  static std::unique_ptr<WordPieceTokenizer> from_json(const TokenizerJson& tj);
  static std::unique_ptr<WordPieceTokenizer> from_vocab_txt(const std::string& path);

  std::string kind() const override { return "wordpiece"; }
  uint64_t vocab_size() const override { return id_to_token_.size(); }
  std::vector<uint32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const uint32_t> ids, bool skip_special = false) const override;
  std::optional<uint32_t> eos_id() const override { return token_to_id("[SEP]"); }
  std::optional<uint32_t> token_to_id(std::string_view token) const override;

  // [CLS] encode(text) [SEP], the text's tokens truncated so that the whole is at most max_length ids (as
  // the reference's single-sequence template with truncation). max_length must be at least 2.
  std::vector<uint32_t> encode_for_classification(std::string_view text, size_t max_length) const;

  // The normalized text (BertNormalizer), exposed for tests.
  std::string normalize(std::string_view text) const;

 private:
  struct TransparentHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Map = std::unordered_map<std::string, uint32_t, TransparentHash, std::equal_to<>>;

  WordPieceTokenizer() = default;
  void finish(const std::string& where_unk, const std::vector<AddedToken>& added);
  std::string_view normalize_into(std::string_view in, std::string& out) const;
  void encode_word(std::string_view word, std::vector<uint32_t>& ids) const;

  std::string path_;
  Map vocab_;      // token -> id
  Map continued_;  // for tokens starting with the prefix: the rest -> id
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_, special_;
  std::string unk_token_ = "[UNK]", prefix_ = "##";
  uint32_t unk_id_ = 0;
  size_t max_chars_ = 100;
  // BertNormalizer (absent: no normalization).
  bool normalize_ = true, clean_text_ = true, chinese_ = true, strip_accents_ = true, lowercase_ = true;
  // Decoder: WordPiece (prefix, cleanup) or none (tokens joined with spaces).
  bool wordpiece_decoder_ = true, cleanup_ = true;
  std::string decoder_prefix_ = "##";
  AddedVocabulary added_;
};

}  // namespace anvil::data
