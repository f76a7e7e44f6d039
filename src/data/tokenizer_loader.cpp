// load_tokenizer: picks the implementation from the spec ("bytes", a tokenizer.json, a vocab.txt).
#include <filesystem>

#include "anvil/error.hpp"
#include "data/tokenizer.hpp"

namespace anvil::data {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "bytes") return make_byte_tokenizer();
  ANVIL_REQUIRE(std::filesystem::exists(spec), "tokenizer '{}': no such file (give a tokenizer.json, a vocab.txt, or \"bytes\")",
                spec);
  ANVIL_THROW("tokenizer '{}': tokenizer.json and vocab.txt files are not supported yet", spec);
}

}  // namespace anvil::data
