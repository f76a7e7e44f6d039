// Tokenizers: text <-> token ids. Implementations: bytes (each UTF-8 byte is a token, vocab 256),
// byte-level BPE and WordPiece loaded from a Hugging Face tokenizer.json (or a BERT vocab.txt).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace anvil::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // "bytes", "bpe", "wordpiece"
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
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Loads a tokenizer: "bytes" gives the byte tokenizer; a path to a Hugging Face tokenizer.json (BPE or
// WordPiece model) or a BERT vocab.txt. Errors name the file and, for unsupported models, the model type.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

}  // namespace anvil::data
