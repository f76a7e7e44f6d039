// The Hugging Face safetensors format: an 8-byte little-endian header length N, N bytes of UTF-8 JSON
// ({"__metadata__": {str: str}, "<name>": {"dtype", "shape", "data_offsets": [begin, end]}}), then the
// byte buffer the offsets are relative to.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "anvil/dtype.hpp"
#include "io/mapped_file.hpp"

namespace anvil::io {

struct SafeTensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;  // empty for a 0-d scalar
  size_t offset = 0;           // from the start of the data buffer
  size_t nbytes = 0;
  int64_t numel() const;
};

// Maps the file read-only and validates the whole header up front, so a bad file fails at open with a
// message naming it rather than later in the middle of a load. Copies share the mapping. The file must
// not be truncated in place while a reader is alive (checkpoints are replaced by rename, which is safe).
class SafeTensorsReader {
 public:
  explicit SafeTensorsReader(const std::string& path);

  const std::string& path() const { return path_; }
  // In file order: by position in the data buffer (ties, i.e. empty tensors, in header order).
  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }
  const SafeTensorInfo* find(std::string_view name) const;  // nullptr if absent
  const SafeTensorInfo& at(std::string_view name) const;    // throws "<path>: tensor '<name>' not found"
  // Points into the mapping. Tensors are packed back to back (the format allows no gaps), so the data
  // may be unaligned for its dtype: copy it out with memcpy rather than casting the pointer.
  const void* data(const SafeTensorInfo& t) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensors of a valid safetensors dtype that Anvil cannot hold (F64, I64, U64, U32, I16, U8, BOOL, F8_E4M3,
  // F8_E5M2; e.g. the int64 `position_ids` buffer of Hugging Face BERT checkpoints): name -> dtype name.
  // They are validated like the others (sizes, offsets, overlaps) but are not in tensors() and find() does
  // not return them; at() names their dtype. A dtype the format does not define is an error at open.
  const std::map<std::string, std::string, std::less<>>& unsupported() const { return unsupported_; }

 private:
  std::string path_;
  std::shared_ptr<const MappedFile> mapping_;  // whole file; unmapped when the last copy goes
  size_t file_size_ = 0;
  const std::byte* buffer_ = nullptr;  // start of the data buffer inside the mapping
  size_t buffer_size_ = 0;
  std::vector<SafeTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
  std::map<std::string, std::string, std::less<>> unsupported_;  // name -> dtype name
};

// Dtypes: F32, F16, BF16, I8, I32, U16 (the safetensors names match dtype_name()). NF4 has no
// safetensors name, so quantised weights must be stored in one of these.
class SafeTensorsWriter {
 public:
  // `data` (numel * dtype size bytes) is copied at add() time, so callers may pass temporary buffers.
  // Throws on a duplicate or reserved name, a negative dim, or a dtype safetensors cannot name.
  void add(std::string name, DType dtype, std::vector<int64_t> shape, const void* data);
  // The same without the copy: `data` must stay valid until write() (a memory-mapped input, so that writing
  // a large file holds no copy of it).
  void add_view(std::string name, DType dtype, std::vector<int64_t> shape, const void* data);
  // A tensor whose bytes are the concatenation of `pieces` (pointer, bytes), in order, each valid until
  // write(): a tensor held in parts (NVMe-offloaded optimizer state) written without one copy of it whole.
  // The pieces' bytes must add up to the shape's.
  using Piece = std::pair<const void*, size_t>;
  void add_pieces(std::string name, DType dtype, std::vector<int64_t> shape, std::vector<Piece> pieces);
  void set_metadata(std::string key, std::string value);
  // Writes the file (tensors in the order added) and fsyncs it; throws on I/O errors naming the path.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> bytes;  // add(): the copy
    std::vector<Piece> views;      // add_view(), add_pieces(): the caller's data
    size_t nbytes = 0;
  };
  Entry checked_entry(std::string name, DType dtype, std::vector<int64_t> shape, const void* data) const;
  std::vector<Entry> entries_;
  std::set<std::string, std::less<>> names_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace anvil::io
