// libFuzzer target: ClassificationShard on arbitrary bytes. An accepted shard must give examples within
// max_length with ids < vocab_size and labels < num_labels, and batches built from them must be padded
// and masked consistently.
#include <algorithm>
#include <optional>
#include <vector>

#include "data/classification_shard.hpp"
#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const anvil::fuzz::ScratchDir dir;
  const std::string path = dir.write("input.cls", data, size);
  std::optional<anvil::data::ClassificationShard> shard;
  if (!anvil::fuzz::parses(path, [&] { shard.emplace(path); })) return 0;
  const anvil::data::ClassificationShard& s = *shard;

  anvil::fuzz::check(s.num_labels() >= 1 && s.max_length() >= 1 && s.vocab_size() >= 1,
                     "accepted a shard with no labels, max_length 0 or an empty vocabulary");
  uint64_t total = 0;
  std::vector<uint64_t> indices;
  for (uint64_t i = 0; i < s.size(); ++i) {
    const uint32_t n = s.length(i);
    total += n;
    anvil::fuzz::check(n <= s.max_length(), "an example is longer than max_length");
    const int32_t label = s.label(i);
    anvil::fuzz::check(label >= 0 && static_cast<uint32_t>(label) < s.num_labels(),
                       "a label is out of range");
    const std::vector<uint32_t> ids = s.tokens(i);
    anvil::fuzz::check(ids.size() == n, "tokens(i).size() != length(i)");
    for (uint32_t id : ids) anvil::fuzz::check(id < s.vocab_size(), "a token >= vocab_size was accepted");
    if (indices.size() < 16) indices.push_back(s.size() - 1 - i);  // from the end: unusual order
  }
  anvil::fuzz::check(total == s.num_tokens(), "the example lengths do not add up to num_tokens");
  anvil::fuzz::check(!anvil::fuzz::succeeds([&] { s.length(s.size()); }), "length(size()) did not throw");

  for (uint32_t pad_multiple : {1u, 8u, 64u}) {
    anvil::data::ClassificationBatch b;
    // pad id 0 is always in the vocabulary; huge batches (rows of a long max_length) are not built here.
    if (uint64_t{s.max_length()} * indices.size() > (uint64_t{1} << 22)) break;
    b = anvil::data::assemble_classification_batch(s, indices, 0, pad_multiple);
    anvil::fuzz::check(b.batch_size == indices.size() && b.ids.size() == b.batch_size * size_t{b.length} &&
                           b.attention_mask.size() == b.ids.size() && b.labels.size() == b.batch_size,
                       "batch buffers have the wrong sizes");
    for (uint32_t r = 0; r < b.batch_size; ++r) {
      const uint32_t n = s.length(indices[r]);
      anvil::fuzz::check(n <= b.length, "the batch length is shorter than an example");
      const auto mask = b.attention_mask.begin() + size_t{r} * b.length;
      anvil::fuzz::check(std::count(mask, mask + b.length, 1) == n,
                         "the attention mask does not cover the ids");
      anvil::fuzz::check(b.labels[r] == s.label(indices[r]), "a batch label differs from the example's");
    }
  }
  return 0;
}
