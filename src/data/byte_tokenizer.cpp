// The byte tokenizer: each byte of the UTF-8 text is one token (vocab 256). No vocabulary file, exact
// round trip of any input; the default for small models.
#include "anvil/error.hpp"
#include "data/tokenizer.hpp"

namespace anvil::data {
namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string kind() const override { return "bytes"; }
  uint64_t vocab_size() const override { return 256; }
  std::vector<uint32_t> encode(std::string_view text) const override {
    std::vector<uint32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(std::span<const uint32_t> ids, bool) const override {
    std::string out;
    out.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      ANVIL_REQUIRE(ids[i] < 256, "byte tokenizer: id {} at position {} is not a byte (vocab 256)", ids[i], i);
      out.push_back(static_cast<char>(ids[i]));
    }
    return out;
  }
  std::optional<uint32_t> eos_id() const override { return std::nullopt; }
  std::optional<uint32_t> token_to_id(std::string_view token) const override {
    if (token.size() == 1) return static_cast<unsigned char>(token[0]);
    return std::nullopt;
  }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace anvil::data
