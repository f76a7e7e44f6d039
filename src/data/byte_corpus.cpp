#include "data/byte_corpus.hpp"

#include "anvil/error.hpp"
#include "data/prepare.hpp"

namespace anvil::data {

std::vector<uint32_t> byte_encode(std::string_view text) {
  std::vector<uint32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string byte_decode(std::span<const int32_t> ids) {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    ANVIL_REQUIRE(ids[i] >= 0 && ids[i] < static_cast<int32_t>(kByteVocabSize),
                  "byte_decode: id {} at position {} is not a byte token (must be in [0, {}))", ids[i], i,
                  kByteVocabSize);
    text[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
  }
  return text;
}

PrepareStats prepare_byte_corpus(const std::vector<std::string>& inputs, const std::string& out_dir,
                                 double val_fraction) {
  PrepareOptions options;
  options.inputs = inputs;
  options.output_dir = out_dir;
  options.tokenizer = "bytes";
  options.format = InputFormat::Text;
  options.val_fraction = val_fraction;
  const PrepareReport report = prepare_data(options, *make_byte_tokenizer());
  return {report.bytes, report.train.tokens, report.val.tokens, report.train.path, report.val.path};
}

}  // namespace anvil::data
