#include "io/safetensors.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>
#include <utility>

#include "anvil/error.hpp"
#include "io/atomic_dir.hpp"

namespace anvil::io {
namespace {

// ordered_json keeps the header's key order, which breaks ties between empty tensors in tensors().
using Json = nlohmann::ordered_json;

constexpr std::string_view kMetadataKey = "__metadata__";
// Header nesting limit (serde_json's default, which the reference implementation parses with): error
// messages dump() header values, and nlohmann's dump() recurses.
constexpr int kMaxHeaderDepth = 128;
constexpr std::array kSupportedDTypes = {DType::F32, DType::F16, DType::BF16,
                                         DType::I8,  DType::I32, DType::U16};
constexpr std::string_view kSupportedNames = "F32, F16, BF16, I8, I32, U16";

// The other dtypes of the safetensors format, with their sizes in bytes: such tensors are validated like the
// rest (a file holding them is well formed) but cannot be loaded. Hugging Face checkpoints carry a few, e.g.
// BERT's int64 `embeddings.position_ids` buffer, which the model loaders skip by name.
struct OtherDType {
  std::string_view name;
  size_t bytes;
};
constexpr std::array kOtherDTypes = {
    OtherDType{"F64", 8},  OtherDType{"I64", 8},     OtherDType{"U64", 8},
    OtherDType{"U32", 4},  OtherDType{"I16", 2},     OtherDType{"U8", 1},
    OtherDType{"BOOL", 1}, OtherDType{"F8_E4M3", 1}, OtherDType{"F8_E5M2", 1}};

std::optional<DType> dtype_from_safetensors_name(std::string_view name) {
  for (DType t : kSupportedDTypes)
    if (dtype_name(t) == name) return t;
  return std::nullopt;
}

bool has_safetensors_name(DType t) {
  return std::find(kSupportedDTypes.begin(), kSupportedDTypes.end(), t) != kSupportedDTypes.end();
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// numel * dtype size, or nullopt when it does not fit in size_t (a hostile or corrupt header). Every
// partial product must also fit in int64, so SafeTensorInfo::numel() cannot overflow even when a later
// dim is 0 (shape [2^62, 2, 0] holds no bytes).
std::optional<size_t> checked_nbytes(const std::vector<int64_t>& shape, size_t element_bytes) {
  uint64_t numel = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) ||
        numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return std::nullopt;
  if (numel > std::numeric_limits<size_t>::max() / 32) return std::nullopt;
  return static_cast<size_t>(numel) * element_bytes;
}

std::optional<size_t> checked_nbytes(DType dtype, const std::vector<int64_t>& shape) {
  std::optional<size_t> n = checked_nbytes(shape, 1);
  if (!n) return std::nullopt;
  return dtype_bytes(dtype, *n);
}

std::string errno_text(int err) {
  return std::generic_category().message(err);
}

// A non-negative JSON integer that fits in uint64 (rejects floats, negatives, strings).
bool as_unsigned(const Json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

// `other_dtype` is set to the dtype's name for a tensor of one of kOtherDTypes (its `dtype` field is then
// meaningless), and left empty otherwise.
SafeTensorInfo parse_tensor_entry(const std::string& path, const std::string& name, const Json& entry,
                                  size_t buffer_size, std::string* other_dtype) {
  auto fail = [&](const std::string& what) { ANVIL_THROW("{}: tensor '{}': {}", path, name, what); };
  if (!entry.is_object()) fail(fmt::format("entry must be an object, found {}", entry.dump()));

  SafeTensorInfo info;
  info.name = name;

  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end()) fail("missing 'dtype'");
  if (!dtype_it->is_string()) fail(fmt::format("'dtype' must be a string, found {}", dtype_it->dump()));
  const std::string& dtype_text = dtype_it->get_ref<const std::string&>();
  std::optional<DType> dtype = dtype_from_safetensors_name(dtype_text);
  size_t other_bytes = 0;
  for (const OtherDType& o : kOtherDTypes)
    if (o.name == dtype_text) other_bytes = o.bytes;
  if (!dtype && other_bytes == 0)
    fail(fmt::format("dtype '{}' is not supported (supported: {})", dtype_text, kSupportedNames));
  info.dtype = dtype.value_or(DType::F32);
  other_dtype->assign(dtype ? "" : dtype_text);

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end()) fail("missing 'shape'");
  if (!shape_it->is_array()) fail(fmt::format("'shape' must be an array, found {}", shape_it->dump()));
  for (const Json& dim : *shape_it) {
    if (!dim.is_number_integer())
      fail(fmt::format("'shape' {} must hold integers, found {}", shape_it->dump(), dim.dump()));
    if (dim.is_number_unsigned()) {
      if (dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(fmt::format("'shape' {} has a dim too large", shape_it->dump()));
    } else if (dim.get<int64_t>() < 0) {
      fail(fmt::format("'shape' {} has a negative dim", shape_it->dump()));
    }
    info.shape.push_back(dim.get<int64_t>());
  }

  auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end()) fail("missing 'data_offsets'");
  uint64_t begin = 0, end = 0;
  if (!offsets_it->is_array() || offsets_it->size() != 2 || !as_unsigned((*offsets_it)[0], &begin) ||
      !as_unsigned((*offsets_it)[1], &end))
    fail(fmt::format("'data_offsets' must be [begin, end] with non-negative integers, found {}",
                     offsets_it->dump()));
  if (end < begin) fail(fmt::format("'data_offsets' [{}, {}] end before begin", begin, end));

  std::optional<size_t> nbytes =
      dtype ? checked_nbytes(info.dtype, info.shape) : checked_nbytes(info.shape, other_bytes);
  if (!nbytes) fail(fmt::format("shape {} has too many elements", shape_str(info.shape)));
  if (end - begin != *nbytes)
    fail(fmt::format("'data_offsets' [{}, {}] span {} bytes but {} {} needs {}", begin, end, end - begin,
                     dtype_text, shape_str(info.shape), *nbytes));
  if (end > buffer_size)
    fail(
        fmt::format("'data_offsets' [{}, {}] reach past the end of the {}-byte data buffer (truncated file?)",
                    begin, end, buffer_size));
  info.offset = static_cast<size_t>(begin);
  info.nbytes = *nbytes;
  return info;
}

}  // namespace

int64_t SafeTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafeTensorsReader::SafeTensorsReader(const std::string& path) : path_(path) {
  auto mapping = std::make_shared<const MappedFile>(path, [&](MappedFile::Step step, int err, size_t) {
    switch (step) {
      case MappedFile::Step::Open:
        ANVIL_THROW("{}: cannot open safetensors file ({})", path, errno_text(err));
      case MappedFile::Step::Stat:
        ANVIL_THROW("{}: cannot stat ({})", path, errno_text(err));
      case MappedFile::Step::NotRegular:
        ANVIL_THROW("{}: not a regular file", path);
      case MappedFile::Step::Map:
        ANVIL_THROW("{}: cannot mmap ({})", path, errno_text(err));
    }
  });
  file_size_ = mapping->size();
  ANVIL_REQUIRE(file_size_ >= 8, "{}: file is {} bytes, too short for the 8-byte header length", path,
                file_size_);
  mapping_ = std::move(mapping);
  const std::byte* bytes = mapping_->data();

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<uint64_t>(bytes[i]);
  ANVIL_REQUIRE(header_len <= file_size_ - 8,
                "{}: header length {} is larger than the {} bytes that follow it (truncated, or not a "
                "safetensors file)",
                path, header_len, file_size_ - 8);
  buffer_ = bytes + 8 + header_len;
  buffer_size_ = file_size_ - 8 - static_cast<size_t>(header_len);

  // nlohmann keeps the last of duplicate keys silently, so duplicates are caught while parsing.
  // Values nested too deep are dropped while parsing (and the file refused below).
  std::string duplicate_name;
  std::set<std::string, std::less<>> top_level_keys;
  bool too_deep = false;
  auto find_duplicates = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (depth > kMaxHeaderDepth) {
      too_deep = true;
      return false;
    }
    if (event == Json::parse_event_t::key && depth == 1 && duplicate_name.empty() &&
        !top_level_keys.insert(parsed.get<std::string>()).second)
      duplicate_name = parsed.get<std::string>();
    return true;
  };
  const char* header_begin = reinterpret_cast<const char*>(bytes + 8);
  Json header;
  try {
    header = Json::parse(header_begin, header_begin + header_len, find_duplicates);
  } catch (const Json::exception& e) {
    ANVIL_THROW("{}: header is not valid JSON ({})", path, e.what());
  }
  ANVIL_REQUIRE(!too_deep, "{}: header nests JSON deeper than {} levels", path, kMaxHeaderDepth);
  ANVIL_REQUIRE(header.is_object(), "{}: header must be a JSON object, found {}", path, header.type_name());
  ANVIL_REQUIRE(duplicate_name.empty(), "{}: '{}' appears more than once in the header", path,
                duplicate_name);

  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      ANVIL_REQUIRE(entry.is_object(), "{}: '__metadata__' must be an object of strings, found {}", path,
                    entry.dump());
      for (const auto& [key, value] : entry.items()) {
        ANVIL_REQUIRE(value.is_string(), "{}: '__metadata__' value for '{}' must be a string, found {}", path,
                      key, value.dump());
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    std::string other_dtype;
    tensors_.push_back(parse_tensor_entry(path, name, entry, buffer_size_, &other_dtype));
    if (!other_dtype.empty()) unsupported_.emplace(name, std::move(other_dtype));
  }

  // File order; empty tensors first at a shared offset so they never look like overlaps.
  std::stable_sort(tensors_.begin(), tensors_.end(), [](const SafeTensorInfo& a, const SafeTensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  const SafeTensorInfo* furthest = nullptr;  // the non-empty tensor reaching furthest so far
  for (const SafeTensorInfo& t : tensors_) {
    if (t.nbytes == 0) continue;  // occupies no bytes, so cannot overlap anything
    if (furthest && t.offset < furthest->offset + furthest->nbytes)
      ANVIL_THROW("{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap in the data buffer", path,
                  furthest->name, furthest->offset, furthest->offset + furthest->nbytes, t.name, t.offset,
                  t.offset + t.nbytes);
    if (!furthest || t.offset + t.nbytes > furthest->offset + furthest->nbytes) furthest = &t;
  }
  // Tensors of dtypes Anvil cannot hold took part in the checks above; they are not listed.
  std::erase_if(tensors_, [&](const SafeTensorInfo& t) { return unsupported_.contains(t.name); });
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

const SafeTensorInfo* SafeTensorsReader::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafeTensorInfo& SafeTensorsReader::at(std::string_view name) const {
  const SafeTensorInfo* info = find(name);
  if (info == nullptr) {
    auto other = unsupported_.find(name);
    if (other != unsupported_.end())
      ANVIL_THROW("{}: tensor '{}' has dtype {}, which cannot be loaded (supported: {})", path_, name,
                  other->second, kSupportedNames);
    ANVIL_THROW("{}: tensor '{}' not found", path_, name);
  }
  return *info;
}

const void* SafeTensorsReader::data(const SafeTensorInfo& t) const {
  ANVIL_ASSERT(t.offset <= buffer_size_ && t.nbytes <= buffer_size_ - t.offset,
               "{}: tensor '{}' [{}, +{}] is not inside this file's {}-byte buffer", path_, t.name, t.offset,
               t.nbytes, buffer_size_);
  return buffer_ + t.offset;
}

SafeTensorsWriter::Entry SafeTensorsWriter::checked_entry(std::string name, DType dtype,
                                                          std::vector<int64_t> shape,
                                                          const void* data) const {
  ANVIL_REQUIRE(!name.empty(), "safetensors: tensor name must not be empty");
  ANVIL_REQUIRE(name != kMetadataKey, "safetensors: '{}' is reserved and cannot name a tensor", name);
  ANVIL_REQUIRE(has_safetensors_name(dtype),
                "safetensors: tensor '{}' has dtype {}, which safetensors cannot store", name,
                dtype_name(dtype));
  for (int64_t d : shape)
    ANVIL_REQUIRE(d >= 0, "safetensors: tensor '{}' has a negative dim in shape {}", name, shape_str(shape));
  std::optional<size_t> nbytes = checked_nbytes(dtype, shape);
  ANVIL_REQUIRE(nbytes.has_value(), "safetensors: tensor '{}' shape {} has too many elements", name,
                shape_str(shape));
  ANVIL_REQUIRE(data != nullptr || *nbytes == 0, "safetensors: tensor '{}' has no data", name);
  ANVIL_REQUIRE(!names_.contains(name), "safetensors: tensor '{}' added twice", name);
  return Entry{std::move(name), dtype, std::move(shape), {}, {}, *nbytes};
}

void SafeTensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape, const void* data) {
  Entry entry = checked_entry(std::move(name), dtype, std::move(shape), data);
  entry.bytes.resize(entry.nbytes);
  if (entry.nbytes > 0) std::memcpy(entry.bytes.data(), data, entry.nbytes);
  names_.insert(entry.name);
  entries_.push_back(std::move(entry));
}

void SafeTensorsWriter::add_view(std::string name, DType dtype, std::vector<int64_t> shape,
                                 const void* data) {
  Entry entry = checked_entry(std::move(name), dtype, std::move(shape), data);
  if (entry.nbytes > 0) entry.views.emplace_back(data, entry.nbytes);
  names_.insert(entry.name);
  entries_.push_back(std::move(entry));
}

void SafeTensorsWriter::add_pieces(std::string name, DType dtype, std::vector<int64_t> shape,
                                   std::vector<Piece> pieces) {
  size_t total = 0;
  for (const auto& [data, bytes] : pieces) {
    ANVIL_REQUIRE(data != nullptr || bytes == 0, "safetensors: tensor '{}' has a piece without data", name);
    total += bytes;
  }
  Entry entry =
      checked_entry(std::move(name), dtype, std::move(shape), pieces.empty() ? nullptr : pieces[0].first);
  ANVIL_REQUIRE(total == entry.nbytes, "safetensors: tensor '{}' has pieces of {} bytes for its {} bytes",
                entry.name, total, entry.nbytes);
  for (const Piece& p : pieces)
    if (p.second > 0) entry.views.push_back(p);
  names_.insert(entry.name);
  entries_.push_back(std::move(entry));
}

void SafeTensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

void SafeTensorsWriter::write(const std::string& path) const {
  Json header = Json::object();
  if (!metadata_.empty()) {
    Json metadata = Json::object();
    for (const auto& [key, value] : metadata_) metadata[key] = value;
    header[std::string(kMetadataKey)] = std::move(metadata);
  }
  size_t offset = 0;
  for (const Entry& e : entries_) {
    header[e.name] = {{"dtype", std::string(dtype_name(e.dtype))},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.nbytes}}};
    offset += e.nbytes;
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const Json::exception& e) {  // names or metadata that are not valid UTF-8
    ANVIL_THROW("{}: cannot encode the safetensors header ({})", path, e.what());
  }
  // Spaces are valid trailing JSON whitespace; padding keeps the data buffer 8-byte aligned.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  std::array<unsigned char, 8> length_bytes{};
  for (size_t i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>(header_text.size() >> (8 * i));

  SyncedFileWriter out(path);
  out.write(length_bytes.data(), length_bytes.size());
  out.write(header_text);
  for (const Entry& e : entries_) {
    if (e.views.empty()) out.write(e.bytes.data(), e.nbytes);
    for (const auto& [data, bytes] : e.views) out.write(data, bytes);
  }
  out.finish();
}

}  // namespace anvil::io
