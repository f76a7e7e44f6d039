#include "io/hf_weights.hpp"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "anvil/error.hpp"
#include "io/atomic_dir.hpp"

namespace anvil::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while (!(m & 0x400));
      bits = sign | uint32_t(127 - 15 - e) << 23 | (m & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

WeightFiles::WeightFiles(const std::string& dir) {
  const std::string single = dir + "/model.safetensors", index = dir + "/model.safetensors.index.json";
  if (fs::exists(single)) {
    readers_.push_back(std::make_unique<SafeTensorsReader>(single));
    for (const SafeTensorInfo& t : readers_[0]->tensors()) where_[t.name] = 0;
    for (const auto& [name, _] : readers_[0]->unsupported()) where_[name] = 0;
    return;
  }
  if (!fs::exists(index)) {
    const bool bin = fs::exists(dir + "/pytorch_model.bin");
    ANVIL_THROW(
        "{}: no model.safetensors or model.safetensors.index.json{}", dir,
        bin ? " (pytorch_model.bin is not supported: save the model with safe_serialization=True)" : "");
  }
  json j;
  try {
    j = json::parse(read_text_file(index));
  } catch (const json::parse_error& e) {
    ANVIL_THROW("{}: not valid JSON: {}", index, e.what());
  }
  ANVIL_REQUIRE(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                "{}: missing the 'weight_map' object", index);
  std::map<std::string, size_t> file_index;
  for (auto& [name, file] : j["weight_map"].items()) {
    ANVIL_REQUIRE(file.is_string(), "{}: weight_map['{}'] must be a file name", index, name);
    const std::string f = file.get<std::string>();
    ANVIL_REQUIRE(f.find('/') == std::string::npos, "{}: weight_map['{}'] = '{}' is not a file in '{}'",
                  index, name, f, dir);
    auto [it, fresh] = file_index.emplace(f, readers_.size());
    if (fresh) readers_.push_back(std::make_unique<SafeTensorsReader>(dir + "/" + f));
    ANVIL_REQUIRE(readers_[it->second]->find(name) || readers_[it->second]->unsupported().contains(name),
                  "{}: tensor '{}' is listed in {} but not stored there", dir + "/" + f, name, index);
    where_[name] = it->second;
  }
}

std::pair<const SafeTensorsReader*, const SafeTensorInfo*> WeightFiles::find(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return {nullptr, nullptr};
  const SafeTensorsReader* r = readers_[it->second].get();
  return {r, &r->at(name)};  // at(): a tensor of a dtype Anvil cannot hold is an error naming it
}

void tensor_to_f32(const SafeTensorInfo& info, const void* src, float* dst, const std::string& path) {
  tensor_to_f32(info, src, dst, path, 0, size_t(info.numel()));
}

void tensor_to_f32(const SafeTensorInfo& info, const void* src, float* dst, const std::string& path,
                   size_t first, size_t count) {
  ANVIL_ASSERT(first + count <= size_t(info.numel()), "elements [{}, {}) of tensor '{}' of {}", first,
               first + count, info.name, info.numel());
  const size_t n = count;
  switch (info.dtype) {
    case DType::F32:
      std::memcpy(dst, static_cast<const char*>(src) + first * 4, n * 4);
      return;
    case DType::BF16:
      for (size_t i = 0; i < n; ++i) {
        const uint32_t bits = uint32_t(static_cast<const uint16_t*>(src)[first + i]) << 16;
        std::memcpy(dst + i, &bits, 4);
      }
      return;
    case DType::F16:
      for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(static_cast<const uint16_t*>(src)[first + i]);
      return;
    default:
      ANVIL_THROW("{}: tensor '{}' has dtype {}; only F32, F16 and BF16 weights can be loaded", path,
                  info.name, dtype_name(info.dtype));
  }
}

std::string shape_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace anvil::io
