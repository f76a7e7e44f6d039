// libFuzzer target: load_tokenizer on an arbitrary tokenizer.json (and, for inputs that are not JSON
// objects, the same bytes as a BERT vocab.txt). A tokenizer that loads must then encode and decode
// without crashing: its ids stay below vocab_size and every id it produces decodes.
#include <memory>
#include <string_view>
#include <vector>

#include "data/tokenizer.hpp"
#include "fuzz_common.hpp"

namespace {

constexpr std::string_view kSamples[] = {
    "Hello world! It's 2024, isn't it?",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n",
    "Déjà vu — naïve café, 日本語のテキスト, emoji 🙂",
    "<|endoftext|>[CLS] [SEP]<s></s><unk>",
    "",
};

void exercise(const anvil::data::Tokenizer& t, std::string_view input) {
  const uint64_t vocab = t.vocab_size();
  std::vector<std::string_view> texts(std::begin(kSamples), std::end(kSamples));
  texts.push_back(input.substr(0, 512));  // the input itself as text: odd bytes, invalid UTF-8
  for (std::string_view text : texts) {
    std::vector<uint32_t> ids;
    // encode() may only fail with anvil::Error (e.g. a pre-tokenizer regex hitting its match limit).
    if (!anvil::fuzz::succeeds([&] { ids = t.encode(text); })) continue;
    for (uint32_t id : ids) anvil::fuzz::check(id < vocab, "encode produced an id >= vocab_size");
    // Ids the tokenizer produced itself must decode.
    try {
      t.decode(ids);
      t.decode(ids, /*skip_special=*/true);
    } catch (const anvil::Error& e) {
      anvil::fuzz::fail(std::string("decode rejected ids from encode: ") + e.what());
    }
  }
  // Arbitrary ids, some outside the vocabulary: anvil::Error is fine.
  std::vector<uint32_t> ids;
  for (uint64_t id = 0; id < vocab && id < 300; ++id) ids.push_back(static_cast<uint32_t>(id));
  ids.push_back(static_cast<uint32_t>(vocab));
  for (size_t i = 0; i < ids.size(); ++i)
    anvil::fuzz::succeeds([&] { t.decode(std::span<const uint32_t>(&ids[i], 1)); });
  anvil::fuzz::succeeds([&] { t.decode(ids); });
  t.eos_id();
  t.token_to_id("[UNK]");
  t.token_to_id(input.substr(0, 16));
}

void load_and_exercise(const std::string& path, std::string_view input) {
  std::unique_ptr<anvil::data::Tokenizer> t;
  if (anvil::fuzz::parses(path, [&] { t = anvil::data::load_tokenizer(path); })) exercise(*t, input);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const anvil::fuzz::ScratchDir dir;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  load_and_exercise(dir.write("tokenizer.json", data, size), input);
  if (input.find('{') == std::string_view::npos) load_and_exercise(dir.write("vocab.txt", data, size), input);
  return 0;
}
