// libFuzzer target: TokenShard on arbitrary bytes. An accepted shard must hold exactly the tokens its
// header promises, all below vocab_size, readable through at() and read() alike.
#include <optional>
#include <vector>

#include "data/token_shard.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const anvil::fuzz::ScratchDir dir;
  const std::string path = dir.write("input.bin", data, size);
  std::optional<anvil::data::TokenShard> shard;
  if (!anvil::fuzz::parses(path, [&] { shard.emplace(path); })) return 0;
  const anvil::data::TokenShard& s = *shard;

  const size_t width = s.dtype() == anvil::data::TokenDType::U16 ? 2 : 4;
  anvil::fuzz::check(anvil::data::kTokenShardHeaderBytes + s.size() * width == size,
                     "the token count does not match the file size");
  std::vector<int32_t> ids(s.size());
  // read() refuses vocabularies whose ids do not fit int32; that is an anvil::Error, not a finding.
  const bool readable = anvil::fuzz::succeeds([&] { s.read(0, s.size(), ids.data()); });
  for (uint64_t i = 0; i < s.size(); ++i) {
    const uint32_t id = s.at(i);
    anvil::fuzz::check(id < s.vocab_size(), "a token >= vocab_size was accepted");
    if (readable) anvil::fuzz::check(static_cast<uint32_t>(ids[i]) == id, "read() and at() disagree");
  }
  anvil::fuzz::check(!anvil::fuzz::succeeds([&] { s.at(s.size()); }), "at(size()) did not throw");
  anvil::fuzz::check(!anvil::fuzz::succeeds([&] { s.read(s.size(), 1, ids.data()); }),
                     "a read past the end did not throw");
  return 0;
}
