// libFuzzer target: encode / decode arbitrary bytes (invalid UTF-8 included) with fixed, valid tokenizers
// (tests/fuzz/fixtures/, written by make_fixtures.py; $ANVIL_FUZZ_FIXTURES overrides the directory).
//
// Input: byte 0 picks the tokenizer (its value mod 6) and the mode (its value / 6 mod 4); the rest is the
// text, or for the decode mode the ids (little-endian uint16). Checks: ids < vocab_size, encode is
// deterministic (the BPE word cache must not change results), ids from encode decode, the lossless
// byte-level tokenizers give back the text (ill-formed UTF-8 replaced by U+FFFD), and the two UTF-8 repair
// implementations (tokenizers, prepare-data) agree.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "data/text_sources.hpp"
#include "data/tokenizer.hpp"
#include "data/unicode.hpp"
#include "data/wordpiece_tokenizer.hpp"
#include "fuzz_common.hpp"

namespace {

using anvil::data::Tokenizer;
namespace unicode = anvil::data::unicode;

struct Fixture {
  std::unique_ptr<Tokenizer> tokenizer;
  bool lossless = false;  // decode(encode(text)) == text for valid UTF-8
};

std::vector<Fixture>& fixtures() {
  static std::vector<Fixture> f;
  return f;
}

void check_encode(const Fixture& fx, std::string_view text) {
  const Tokenizer& t = *fx.tokenizer;
  const std::vector<uint32_t> ids = t.encode(text);
  for (uint32_t id : ids) anvil::fuzz::check(id < t.vocab_size(), "encode produced an id >= vocab_size");
  anvil::fuzz::check(t.encode(text) == ids, "encoding the same text twice gave different ids");
  std::string decoded;
  try {
    decoded = t.decode(ids);
    t.decode(ids, /*skip_special=*/true);
  } catch (const anvil::Error& e) {
    anvil::fuzz::fail(std::string("decode rejected ids from encode: ") + e.what());
  }
  if (fx.lossless) {
    // The byte tokenizer gives back any bytes; the others see ill-formed UTF-8 replaced.
    std::string expected;
    if (t.kind() == "bytes" || unicode::to_valid_utf8(text, expected) == 0) expected = text;
    anvil::fuzz::check(decoded == expected, t.kind() + ": decode(encode(text)) != text");
  }
  if (t.kind() != "bytes") anvil::fuzz::check(unicode::is_valid_utf8(decoded), "decode gave invalid UTF-8");
}

void check_decode(const Tokenizer& t, std::string_view bytes) {
  std::vector<uint32_t> ids;
  for (size_t i = 0; i + 1 < bytes.size(); i += 2)
    ids.push_back(static_cast<unsigned char>(bytes[i]) | (static_cast<unsigned char>(bytes[i + 1]) << 8));
  bool in_vocab = true;
  for (uint32_t id : ids) in_vocab = in_vocab && id < t.vocab_size();
  const bool ok = anvil::fuzz::succeeds([&] { t.decode(ids, (bytes.size() & 1) != 0); });
  // The byte tokenizer has no holes: its ids below vocab_size always decode.
  if (t.kind() == "bytes") anvil::fuzz::check(ok == in_vocab, "byte tokenizer decode accepted a bad id");
}

void check_text_helpers(const Tokenizer& t, std::string_view text) {
  std::string repaired;
  const size_t n = unicode::to_valid_utf8(text, repaired);
  std::string other(text);
  const uint64_t m = anvil::data::repair_utf8(other);
  anvil::fuzz::check(n == m, "unicode::to_valid_utf8 and repair_utf8 count different replacements");
  anvil::fuzz::check((n == 0) == unicode::is_valid_utf8(text), "is_valid_utf8 disagrees with the repair");
  if (n > 0) anvil::fuzz::check(repaired == other, "unicode::to_valid_utf8 and repair_utf8 disagree");
  anvil::fuzz::check(unicode::is_valid_utf8(repaired), "repaired text is not valid UTF-8");
  if (const auto* wp = dynamic_cast<const anvil::data::WordPieceTokenizer*>(&t)) {
    anvil::fuzz::check(unicode::is_valid_utf8(wp->normalize(repaired)), "normalize gave invalid UTF-8");
    const size_t max_length = 2 + (text.empty() ? 0 : static_cast<unsigned char>(text[0]) % 16);
    const std::vector<uint32_t> ids = wp->encode_for_classification(text, max_length);
    anvil::fuzz::check(ids.size() >= 2 && ids.size() <= max_length, "classification input has a bad length");
  } else {
    t.token_to_id(text);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("ANVIL_FUZZ_FIXTURES");
  const std::string dir = env && *env ? env : ANVIL_FUZZ_FIXTURES;
  const std::pair<const char*, bool> files[] = {
      {"bytes", true},           {"bpe_gpt2.json", true},
      {"bpe_llama3.json", true}, {"bpe_variants.json", false},
      {"wordpiece.json", false}, {"vocab.txt", false},
  };
  for (const auto& [name, lossless] : files) {
    const std::string spec = std::string(name) == "bytes" ? "bytes" : dir + "/" + name;
    try {
      fixtures().push_back({anvil::data::load_tokenizer(spec), lossless});
    } catch (const std::exception& e) {
      anvil::fuzz::fail(std::string("cannot load fixture (set ANVIL_FUZZ_FIXTURES?): ") + e.what());
    }
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Fixture& fx = fixtures()[data[0] % fixtures().size()];
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch ((data[0] / fixtures().size()) % 4) {
    case 0:
    case 1:
      check_encode(fx, rest);  // any exception escapes: libFuzzer reports it as a crash
      break;
    case 2:
      check_decode(*fx.tokenizer, rest);
      break;
    default:
      check_text_helpers(*fx.tokenizer, rest);
      break;
  }
  return 0;
}
