#include "io/checkpoint.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <tuple>
#include <vector>

#include "io/atomic_dir.hpp"
#include "io/hf_weights.hpp"
#include "io/safetensors.hpp"

namespace anvil::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

TransformerConfig read_model_config(const std::string& dir) {
  require_not_interrupted_save(dir);
  const std::string path = dir + "/config.json";
  ANVIL_REQUIRE(fs::exists(path), "{}: no config.json (is '{}' a model or checkpoint directory?)", path, dir);
  json j;
  try {
    j = json::parse(read_text_file(path));
  } catch (const json::parse_error& e) {
    ANVIL_THROW("{}: not valid JSON: {}", path, e.what());
  }
  return TransformerConfig::from_hf_json(j, path);
}

void save_model(const std::string& dir, const Decoder& model, Device& dev) {
  const ParamLayout& layout = model.layout();
  std::vector<float> host(layout.total_numel());
  dev.copy_to_host(host.data(), model.params(), host.size() * sizeof(float));
  SafeTensorsWriter w;
  w.set_metadata("format", "pt");
  std::vector<std::vector<float>> transposed;  // kept alive until write()
  for (const ParamTensor& t : layout.tensors()) {
    const float* src = host.data() + t.offset;  // the first hf_rows rows of a padded tensor
    if (t.hf_transposed) {
      const int64_t rows = t.shape[0], cols = t.shape[1];
      std::vector<float>& tmp = transposed.emplace_back(size_t(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) tmp[size_t(c * rows + r)] = src[r * cols + c];
      src = tmp.data();
    }
    w.add(t.name, DType::F32, t.hf_shape(), src);
  }
  w.write(dir + "/model.safetensors");
  write_text_file_synced(dir + "/config.json", model.config().to_hf_json().dump(2) + "\n");
}

void load_model_weights(const std::string& dir, Decoder& model, Device& dev) {
  require_not_interrupted_save(dir);
  const WeightFiles files(dir);
  const ParamLayout& layout = model.layout();
  const TransformerConfig& cfg = model.config();
  std::vector<float> host(layout.total_numel(), 0.0f);
  std::vector<const ParamTensor*> found(layout.tensors().size(), nullptr);
  std::vector<float> tmp;
  for (const auto& [name, _] : files.names()) {
    const ParamTensor* t = layout.find_hf(name);
    if (!t) {
      ANVIL_REQUIRE(layout.hf_ignored(name),
                    "{}: unexpected tensor '{}' (not part of a {} model with this config.json)",
                    files.path_of(name), name, cfg.family);
      continue;
    }
    const size_t index = size_t(t - layout.tensors().data());
    ANVIL_REQUIRE(!found[index], "{}: tensor '{}' is stored twice (as '{}' and '{}')", dir, t->name,
                  found[index]->name, name);
    auto [reader, info] = files.find(name);
    const std::string& path = reader->path();
    const std::vector<int64_t> want = t->hf_shape();
    ANVIL_REQUIRE(info->shape == want,
                  "{}: tensor '{}' has shape {} but the model config (config.json) needs {}", path, name,
                  shape_string(info->shape), shape_string(want));
    float* dst = host.data() + t->offset;
    if (t->hf_transposed) {
      tmp.resize(size_t(info->numel()));
      tensor_to_f32(*info, reader->data(*info), tmp.data(), path);
      const int64_t rows = t->shape[0], cols = t->shape[1];  // Anvil [out, in]; file [in, out]
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = tmp[size_t(c * rows + r)];
    } else {
      tensor_to_f32(*info, reader->data(*info), dst, path);
    }
    found[index] = t;
  }
  for (size_t i = 0; i < found.size(); ++i)
    ANVIL_REQUIRE(found[i], "{}: tensor '{}' is missing from the model weights", dir, layout.tensors()[i].name);
  model.upload_weights(dev, host.data());
}

void save_model(const std::string& dir, const Model& model, Device& dev) {
  if (model.config().is_bert()) return save_bert_model(dir, static_cast<const BertModel&>(model), dev);
  save_model(dir, static_cast<const Decoder&>(model), dev);
}

BertLoadReport load_model_weights(const std::string& dir, Model& model, Device& dev) {
  if (model.config().is_bert()) return load_bert_weights(dir, static_cast<BertModel&>(model), dev);
  load_model_weights(dir, static_cast<Decoder&>(model), dev);
  return {};
}

void save_optimizer(const std::string& path, const Optimizer& opt, Device& dev) {
  SafeTensorsWriter w;
  w.set_metadata("optimizer", optimizer_name(opt.kind()));
  std::vector<std::vector<char>> host;  // kept alive until write()
  for (const OptimizerStateTensor& t : opt.state_tensors()) {
    host.emplace_back(dtype_bytes(t.dtype, t.count));
    if (!host.back().empty()) dev.copy_to_host(host.back().data(), t.data, host.back().size());
    w.add(t.name, t.dtype, {int64_t(t.count)}, host.back().data());
  }
  w.write(path);
}

void load_optimizer(const std::string& path, Optimizer& opt, Device& dev) {
  SafeTensorsReader reader(path);
  const auto& meta = reader.metadata();
  const auto it = meta.find("optimizer");
  const std::string saved = it == meta.end() ? "" : it->second;
  const std::string wanted = optimizer_name(opt.kind());
  ANVIL_REQUIRE(saved == wanted,
                "{}: the checkpoint's optimizer state is for '{}' but this run uses optim '{}'; resume with "
                "--optim {} (or start a new run from the weights with --init_from)",
                path, saved.empty() ? "(unnamed)" : saved, wanted, saved.empty() ? wanted : saved);
  for (const OptimizerStateTensor& t : opt.state_tensors()) {
    const SafeTensorInfo* info = reader.find(t.name);
    ANVIL_REQUIRE(info, "{}: tensor '{}' of the {} state is missing", path, t.name, wanted);
    ANVIL_REQUIRE(
        info->dtype == t.dtype && info->shape == std::vector<int64_t>{int64_t(t.count)},
        "{}: tensor '{}' is {} {} but this run needs {} [{}] (a different model or optimizer setting)", path,
        t.name, dtype_name(info->dtype), shape_string(info->shape), dtype_name(t.dtype), t.count);
    const size_t bytes = dtype_bytes(t.dtype, t.count);
    if (bytes) dev.copy_to_device(t.data, reader.data(*info), bytes);
  }
}

void save_checkpoint(const std::string& dir, const Model& model, const Optimizer& opt, const json& state,
                     const std::string& tokenizer_file, Device& dev) {
  AtomicDirectory out(dir);
  save_model(out.path(), model, dev);
  save_optimizer(out.file("optimizer.safetensors"), opt, dev);
  write_text_file_synced(out.file("trainer_state.json"), state.dump(2) + "\n");
  if (!tokenizer_file.empty())
    write_text_file_synced(out.file(tokenizer_file_name(tokenizer_file)), read_text_file(tokenizer_file));
  out.commit();
}

std::string find_tokenizer_file(const std::string& dir) {
  for (const char* name : {"tokenizer.json", "vocab.txt"})
    if (fs::exists(fs::path(dir) / name)) return (fs::path(dir) / name).string();
  return "";
}

std::string tokenizer_file_name(const std::string& path) {
  return fs::path(path).extension() == ".txt" ? "vocab.txt" : "tokenizer.json";
}

}  // namespace anvil::io
