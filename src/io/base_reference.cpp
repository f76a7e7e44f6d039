#include "io/base_reference.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "anvil/error.hpp"
#include "io/atomic_dir.hpp"

namespace anvil::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

uint64_t fnv1a(const char* p, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ uint8_t(p[i])) * 1099511628211ull;
  return h;
}

// The hash of a safetensors file's header (8 bytes of length, then the JSON), or of the whole file when it is
// no safetensors file (the index JSON).
uint64_t header_hash(const fs::path& path, uint64_t bytes) {
  std::ifstream in(path, std::ios::binary);
  ANVIL_REQUIRE(in, "{}: cannot read it", path.string());
  uint64_t n = bytes;
  if (path.extension() == ".safetensors") {
    uint64_t len = 0;
    in.read(reinterpret_cast<char*>(&len), 8);
    ANVIL_REQUIRE(in && len <= bytes - 8, "{}: not a safetensors file (header length {} in {} bytes)",
                  path.string(), len, bytes);
    n = 8 + len;
    in.seekg(0);
  }
  std::vector<char> head(n);
  in.read(head.data(), std::streamsize(n));
  ANVIL_REQUIRE(in, "{}: cannot read its first {} bytes", path.string(), n);
  return fnv1a(head.data(), head.size());
}

std::vector<std::string> weight_file_names(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "model.safetensors")) return {"model.safetensors"};
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  ANVIL_REQUIRE(fs::exists(index), "{}: no model.safetensors or model.safetensors.index.json", dir);
  std::vector<std::string> names{index.filename().string()};
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("model-", 0) == 0 && e.path().extension() == ".safetensors") names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

BaseReference describe_base(const std::string& dir) {
  BaseReference r;
  r.dir = fs::absolute(dir).lexically_normal().string();
  for (const std::string& name : weight_file_names(r.dir)) {
    const fs::path p = fs::path(r.dir) / name;
    const uint64_t bytes = fs::file_size(p);
    r.files.push_back({name, bytes, header_hash(p, bytes)});
  }
  return r;
}

void write_base_reference(const std::string& checkpoint_dir, const BaseReference& ref) {
  json files = json::array();
  for (const BaseReference::File& f : ref.files)
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"header_fnv1a64", f.header_hash}});
  const json j = {{"base_model", ref.dir}, {"files", files}};
  write_text_file_synced((fs::path(checkpoint_dir) / kBaseReferenceFile).string(), j.dump(2) + "\n");
}

bool refers_to_base(const std::string& dir) {
  return fs::exists(fs::path(dir) / kBaseReferenceFile);
}

std::optional<std::string> referenced_base(const std::string& dir) {
  const std::string path = (fs::path(dir) / kBaseReferenceFile).string();
  if (!fs::exists(path)) return std::nullopt;
  BaseReference want;
  try {
    const json j = json::parse(read_text_file(path));
    want.dir = j.at("base_model").get<std::string>();
    for (const json& f : j.at("files"))
      want.files.push_back({f.at("name").get<std::string>(), f.at("bytes").get<uint64_t>(),
                            f.at("header_fnv1a64").get<uint64_t>()});
  } catch (const json::exception& e) {
    ANVIL_THROW("{}: not a base model reference ({})", path, e.what());
  }
  ANVIL_REQUIRE(
      fs::is_directory(want.dir),
      "{}: the base model '{}' this checkpoint's adapter was trained on is gone: put it back there, "
      "or give its directory as the model and this checkpoint as the adapter (--adapter {})",
      path, want.dir, dir);
  BaseReference have;
  try {
    have = describe_base(want.dir);
  } catch (const Error& e) {
    ANVIL_THROW("{}: the base model '{}' has no readable weights any more ({})", path, want.dir, e.what());
  }
  ANVIL_REQUIRE(have.files == want.files,
                "{}: the base model '{}' is not the one this checkpoint's adapter was trained on (its weight "
                "files' names, sizes or headers differ from those recorded); restore that model there, or "
                "give the right base as the model and this checkpoint as the adapter (--adapter {})",
                path, want.dir, dir);
  return want.dir;
}

}  // namespace anvil::io
