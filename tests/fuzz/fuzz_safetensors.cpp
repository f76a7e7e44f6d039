// libFuzzer target: SafeTensorsReader on arbitrary bytes. Beyond "no crash, only anvil::Error naming the
// file", an accepted file must describe tensors that lie inside its data buffer with the bytes the header
// promises, and must survive a round trip through SafeTensorsWriter unchanged.
#include <cstring>
#include <optional>

#include "fuzz_common.hpp"
#include "io/safetensors.hpp"

using anvil::io::SafeTensorInfo;
using anvil::io::SafeTensorsReader;
using anvil::io::SafeTensorsWriter;

namespace {

void round_trip(const SafeTensorsReader& r, const anvil::fuzz::ScratchDir& dir) {
  SafeTensorsWriter w;
  for (const SafeTensorInfo& t : r.tensors()) {
    if (t.name.empty()) return;  // the writer refuses empty names (the reader tolerates them)
    w.add(t.name, t.dtype, t.shape, r.data(t));
  }
  for (const auto& [key, value] : r.metadata()) w.set_metadata(key, value);
  const std::string out = dir.path("round_trip.safetensors");
  w.write(out);
  std::optional<SafeTensorsReader> reread;
  try {
    reread.emplace(out);
  } catch (const anvil::Error& e) {
    anvil::fuzz::fail(std::string("the reader rejects what the writer wrote: ") + e.what());
  }
  const SafeTensorsReader& back = *reread;
  anvil::fuzz::check(back.tensors().size() == r.tensors().size(), "round trip changed the tensor count");
  anvil::fuzz::check(back.metadata() == r.metadata(), "round trip changed the metadata");
  for (const SafeTensorInfo& t : r.tensors()) {
    const SafeTensorInfo* b = back.find(t.name);
    anvil::fuzz::check(b && b->dtype == t.dtype && b->shape == t.shape && b->nbytes == t.nbytes,
                       "round trip changed tensor '" + t.name + "'");
    anvil::fuzz::check(t.nbytes == 0 || std::memcmp(back.data(*b), r.data(t), t.nbytes) == 0,
                       "round trip changed the bytes of '" + t.name + "'");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const anvil::fuzz::ScratchDir dir;
  const std::string path = dir.write("input.safetensors", data, size);
  std::optional<SafeTensorsReader> reader;
  if (!anvil::fuzz::parses(path, [&] { reader.emplace(path); })) return 0;
  const SafeTensorsReader& r = *reader;

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  const uint8_t* buffer = data + 8 + header_len;
  const size_t buffer_size = size - 8 - header_len;  // the reader accepted the file, so this holds
  for (const SafeTensorInfo& t : r.tensors()) {
    anvil::fuzz::check(t.offset <= buffer_size && t.nbytes <= buffer_size - t.offset,
                       "tensor '" + t.name + "' reaches outside the data buffer");
    anvil::fuzz::check(t.nbytes == anvil::dtype_bytes(t.dtype, static_cast<size_t>(t.numel())),
                       "tensor '" + t.name + "' has nbytes != numel * dtype size");
    anvil::fuzz::check(std::memcmp(r.data(t), buffer + t.offset, t.nbytes) == 0,
                       "tensor '" + t.name + "' data is not the file's bytes");
    anvil::fuzz::check(r.find(t.name) == &t && &r.at(t.name) == &t, "lookup of '" + t.name + "' failed");
  }
  anvil::fuzz::succeeds([&] { round_trip(r, dir); });
  return 0;
}
