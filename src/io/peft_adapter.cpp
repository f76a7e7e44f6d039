#include "io/peft_adapter.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "anvil/error.hpp"
#include "io/atomic_dir.hpp"
#include "io/hf_weights.hpp"
#include "io/safetensors.hpp"

namespace anvil::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kPrefix = "base_model.model.";

LoraConfig read_adapter_config(const std::string& dir) {
  const std::string path = dir + "/" + kAdapterConfigFile;
  json j;
  try {
    j = json::parse(read_text_file(path));
  } catch (const json::parse_error& e) {
    ANVIL_THROW("{}: not valid JSON: {}", path, e.what());
  }
  return lora_config_from_peft(j, path);
}

// The module of an adapter tensor name ("base_model.model.<module>.lora_A.weight"), and which factor it is;
// false for any other name.
bool split_adapter_name(const std::string& name, std::string& module, bool& is_a) {
  for (const char* factor : {".lora_A.weight", ".lora_B.weight"}) {
    const std::string f = factor;
    if (name.starts_with(kPrefix) && name.ends_with(f) && name.size() > f.size() + 17) {
      module = name.substr(17, name.size() - 17 - f.size());
      is_a = f == ".lora_A.weight";
      return true;
    }
  }
  return false;
}

}  // namespace

bool has_peft_adapter(const std::string& dir) {
  return fs::exists(dir + "/" + kAdapterConfigFile);
}

std::string adapter_base_model(const std::string& dir) {
  try {
    const json j = json::parse(read_text_file(dir + "/" + kAdapterConfigFile));
    if (j.is_object() && j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
      return fmt::format("'{}'", j["base_model_name_or_path"].get<std::string>());
  } catch (const json::exception&) {
  }
  return "not named";
}

void write_peft_adapter(const std::string& dir, const ParamLayout& layout, const float* host) {
  write_peft_adapter(
      dir, layout, [host](const ParamTensor& t) { return host + t.offset; }, "");
}

void write_peft_adapter(const std::string& dir, const ParamLayout& layout,
                        const std::function<const float*(const ParamTensor&)>& values_of,
                        const std::string& base_model) {
  if (!layout.lora().enabled()) return;
  SafeTensorsWriter w;
  w.set_metadata("format", "pt");
  for (const ParamTensor& t : layout.tensors())
    if (t.is_adapter()) w.add_view(t.name, DType::F32, t.hf_shape(), values_of(t));
  w.write(dir + "/" + kAdapterWeightsFile);
  nlohmann::json config = peft_adapter_config(layout.lora(), layout.lora_modules(), base_model);
  // GPT-2's Conv1D weights are stored [in, out]: PEFT calls that fan_in_fan_out (it sets it itself, warning,
  // when a config says otherwise). The factors' shapes do not depend on it.
  for (const ParamTensor& t : layout.tensors())
    if (t.role == TensorRole::LoraA && layout.tensors()[size_t(t.adapts)].hf_transposed)
      config["fan_in_fan_out"] = true;
  write_text_file_synced(dir + "/" + kAdapterConfigFile, config.dump(2) + "\n");
}

void read_peft_adapter(const std::string& dir, const ParamLayout& layout, float* host) {
  read_peft_adapter(dir, layout, [host](const ParamTensor& t) { return host + t.offset; });
}

void read_peft_adapter(const std::string& dir, const ParamLayout& layout,
                       const std::function<float*(const ParamTensor&)>& dest_of) {
  const std::string config_path = dir + "/" + kAdapterConfigFile;
  const LoraConfig file = read_adapter_config(dir);
  const LoraConfig& run = layout.lora();
  ANVIL_REQUIRE(
      file.r == run.r && file.alpha == run.alpha && file.rslora == run.rslora,
      "{}: the adapter has r {}, lora_alpha {}, use_rslora {}, but this run has lora_r {}, lora_alpha "
      "{}, use_rslora {}; give the adapter's settings",
      config_path, file.r, file.alpha, file.rslora, run.r, run.alpha, run.rslora);
  const std::string path = dir + "/" + kAdapterWeightsFile;
  ANVIL_REQUIRE(fs::exists(path), "{}: missing beside {}", path, config_path);
  const SafeTensorsReader reader(path);
  std::set<std::string> seen;
  for (const SafeTensorInfo& info : reader.tensors()) {
    const ParamTensor* t = layout.find(info.name);
    ANVIL_REQUIRE(t && t->is_adapter(),
                  "{}: tensor '{}' is not an adapter of this run (its adapted modules follow "
                  "lora_target_modules: {})",
                  path, info.name, fmt::join(layout.lora_modules(), ", "));
    ANVIL_REQUIRE(info.shape == t->hf_shape(), "{}: tensor '{}' has shape {} but this run needs {}", path,
                  info.name, shape_string(info.shape), shape_string(t->hf_shape()));
    tensor_to_f32(info, reader.data(info), dest_of(*t), path);
    seen.insert(info.name);
  }
  for (const ParamTensor& t : layout.tensors())
    ANVIL_REQUIRE(!t.is_adapter() || seen.count(t.name),
                  "{}: tensor '{}' is missing (the adapter adapts other modules than lora_target_modules "
                  "names?)",
                  path, t.name);
}

void merge_peft_adapter(const std::string& dir, const ParamLayout& layout, float* host) {
  const LoraConfig cfg = read_adapter_config(dir);
  const std::string path = dir + "/" + kAdapterWeightsFile;
  ANVIL_REQUIRE(fs::exists(path), "{}: missing beside {}", path, dir + "/" + kAdapterConfigFile);
  const SafeTensorsReader reader(path);
  const float s = cfg.scale();
  std::vector<float> a, b;
  for (const SafeTensorInfo& info : reader.tensors()) {
    std::string module;
    bool is_a = false;
    ANVIL_REQUIRE(split_adapter_name(info.name, module, is_a),
                  "{}: tensor '{}' is not a LoRA factor (base_model.model.<module>.lora_A.weight / "
                  ".lora_B.weight)",
                  path, info.name);
    if (!is_a) continue;  // merged with its A
    const ParamTensor* w = layout.find_hf(module + ".weight");
    ANVIL_REQUIRE(w && w->shape.ndim == 2 && !w->is_adapter(),
                  "{}: tensor '{}' adapts '{}', which this model does not have", path, info.name,
                  module + ".weight");
    const std::string b_name = std::string(kPrefix) + module + ".lora_B.weight";
    const SafeTensorInfo* binfo = reader.find(b_name);
    ANVIL_REQUIRE(binfo, "{}: tensor '{}' has no '{}'", path, info.name, b_name);
    const int64_t out = w->shape[0], in = w->shape[1];
    const std::vector<int64_t> a_shape = {cfg.r, in}, b_shape = {out, cfg.r};
    ANVIL_REQUIRE(info.shape == a_shape,
                  "{}: tensor '{}' has shape {} but r {} and the model's {} need [{}, {}]", path, info.name,
                  shape_string(info.shape), cfg.r, w->name, cfg.r, in);
    ANVIL_REQUIRE(binfo->shape == b_shape,
                  "{}: tensor '{}' has shape {} but r {} and the model's {} need [{}, {}]", path, b_name,
                  shape_string(binfo->shape), cfg.r, w->name, out, cfg.r);
    a.resize(size_t(cfg.r * in)), b.resize(size_t(out * cfg.r));
    tensor_to_f32(info, reader.data(info), a.data(), path);
    tensor_to_f32(*binfo, reader.data(*binfo), b.data(), path);
    float* dst = host + w->offset;  // Anvil's [out, in] (transposed from the file's for GPT-2 already)
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t k = 0; k < cfg.r; ++k) {
        const float bk = s * b[size_t(o * cfg.r + k)];
        const float* ak = a.data() + k * in;
        float* row = dst + o * in;
        for (int64_t i = 0; i < in; ++i) row[i] += bk * ak[i];
      }
  }
}

}  // namespace anvil::io
