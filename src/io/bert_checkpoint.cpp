#include "io/bert_checkpoint.hpp"

#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <vector>

#include "io/atomic_dir.hpp"
#include "io/hf_weights.hpp"
#include "io/safetensors.hpp"

namespace anvil::io {
namespace {

std::vector<int64_t> dims(const Shape& s) {
  return {s.dims.begin(), s.dims.begin() + s.ndim};
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

// The names a layout tensor may have in a checkpoint, preferred first: its own, the BertModel spelling (no
// "bert." prefix), and each with LayerNorm's TensorFlow-era gamma / beta.
std::vector<std::string> candidate_names(const std::string& name) {
  std::vector<std::string> base = {name};
  if (starts_with(name, "bert.")) base.push_back(name.substr(5));
  std::vector<std::string> out = base;
  for (const std::string& n : base) {
    if (n.ends_with(".LayerNorm.weight")) out.push_back(n.substr(0, n.size() - 6) + "gamma");
    if (n.ends_with(".LayerNorm.bias")) out.push_back(n.substr(0, n.size() - 4) + "beta");
  }
  return out;
}

// Parameters a checkpoint may lack: BertModel checkpoints have no classifier, and
// BertModel(add_pooling_layer= False) ones no pooler either.
bool optional_head(const std::string& name) {
  return starts_with(name, "classifier.") || starts_with(name, "bert.pooler.");
}

// Checkpoint tensors that belong to other BERT heads or are buffers, not parameters.
bool ignorable(const std::string& name) {
  return starts_with(name, "cls.") || name.ends_with("position_ids") || name.ends_with("token_type_ids");
}

}  // namespace

void save_bert_model(const std::string& dir, const BertModel& model, Device& dev) {
  const ParamLayout& layout = model.layout();
  std::vector<float> host(layout.total_numel());
  model.download_weights(dev, host.data());
  SafeTensorsWriter w;
  w.set_metadata("format", "pt");
  for (const ParamTensor& t : layout.tensors())
    w.add(t.name, DType::F32, dims(t.shape), host.data() + t.offset);
  w.write(dir + "/model.safetensors");
  write_text_file_synced(dir + "/config.json", model.config().to_hf_json().dump(2) + "\n");
}

BertLoadReport load_bert_weights(const std::string& dir, BertModel& model, Device& dev) {
  require_not_interrupted_save(dir);
  const WeightFiles files(dir);
  const ParamLayout& layout = model.layout();
  // Start from the model's current values: head tensors the checkpoint lacks keep them.
  std::vector<float> host(layout.total_numel());
  model.download_weights(dev, host.data());
  BertLoadReport report;
  std::set<std::string> used;
  for (const ParamTensor& t : layout.tensors()) {
    const SafeTensorsReader* reader = nullptr;
    const SafeTensorInfo* info = nullptr;
    for (const std::string& n : candidate_names(t.name)) {
      std::tie(reader, info) = files.find(n);
      if (info) break;
    }
    if (!info) {
      ANVIL_REQUIRE(optional_head(t.name), "{}: tensor '{}' is missing from the model weights", dir, t.name);
      report.kept.push_back(t.name);
      continue;
    }
    used.insert(info->name);
    const std::vector<int64_t> want = dims(t.shape);
    ANVIL_REQUIRE(info->shape == want,
                  "{}: tensor '{}' has shape {} but the model config (config.json) needs {}", reader->path(),
                  info->name, shape_string(info->shape), shape_string(want));
    tensor_to_f32(*info, reader->data(*info), host.data() + t.offset, reader->path());
  }
  for (const auto& [n, _] : files.names()) {
    if (used.contains(n)) continue;
    ANVIL_REQUIRE(ignorable(n), "{}: unexpected tensor '{}' (not part of a BERT model with this config)",
                  files.path_of(n), n);
    report.ignored.push_back(n);
  }
  model.upload_weights(dev, host.data());
  return report;
}

}  // namespace anvil::io
