// Tokenizers: text <-> token ids. Implementations: bytes (each UTF-8 byte is a token, vocab 256),
// byte-level BPE, SentencePiece-style BPE (Llama 2, Mistral) and WordPiece loaded from a Hugging Face
// tokenizer.json (or a BERT vocab.txt).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::data {

// The special tokens a model's own tokenizer puts around one text (Hugging Face's
// add_special_tokens=True): <s> before it for Llama 2 / Mistral, [CLS] ... [SEP] for BERT, nothing for
// GPT-2 and "bytes".
struct SpecialTokenTemplate {
  std::vector<uint32_t> prefix;  // BOS, [CLS]
  std::vector<uint32_t> suffix;  // EOS when the model's tokenizer adds it, [SEP]
  bool operator==(const SpecialTokenTemplate&) const = default;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;     // "bytes", "bpe", "sentencepiece_bpe", "wordpiece"
  virtual uint64_t vocab_size() const = 0;  // ids are < vocab_size (added tokens included)

  // Plain encoding of `text` (special tokens written in the text are recognised as such; no template
  // tokens such as [CLS]/[SEP] or BOS are added).
  virtual std::vector<uint32_t> encode(std::string_view text) const = 0;
  // Ids -> text; special tokens are included as their text unless `skip_special`.
  virtual std::string decode(std::span<const uint32_t> ids, bool skip_special = false) const = 0;

  // The id that marks a document boundary in LM training data (e.g. <|endoftext|>, </s>, [SEP]), if any.
  virtual std::optional<uint32_t> eos_id() const = 0;
  // Id of a token string (e.g. "[CLS]"), if the vocabulary has it.
  virtual std::optional<uint32_t> token_to_id(std::string_view token) const = 0;

  // prefix + encode(text) + suffix of special_template(): what the model's tokenizer gives with
  // add_special_tokens=True (Llama 2: <s> first). For a training document; one that is cut into pieces
  // takes the prefix before its first piece and the suffix (or, when that is empty, eos_id()) after its
  // last.
  std::vector<uint32_t> encode_with_special(std::string_view text) const;
  // prefix + encode(text): a prompt the model continues (no EOS after it, even where the model's tokenizer
  // would add one).
  std::vector<uint32_t> encode_prompt(std::string_view text) const;
  // The text `ids` add after `context`: decode(context + ids) past decode(context). Decoders such as
  // Llama 2's drop the first token's leading space, so decoding a continuation alone can lose a space.
  std::string decode_continuation(std::span<const uint32_t> context, std::span<const uint32_t> ids) const;
  // Set by load_tokenizer: from the add_bos_token / add_eos_token of the tokenizer_config.json beside a
  // tokenizer.json (as transformers applies them), else the tokenizer.json's post_processor.
  const SpecialTokenTemplate& special_template() const { return special_template_; }

 private:
  friend std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);
  SpecialTokenTemplate special_template_;
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Loads a tokenizer: "bytes" gives the byte tokenizer; a path to a Hugging Face tokenizer.json (BPE or
// WordPiece model, with the tokenizer_config.json beside it if any) or a BERT vocab.txt, or a directory
// holding one. Errors name the file, the field and, for unsupported parts, the type or value.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

}  // namespace anvil::data
