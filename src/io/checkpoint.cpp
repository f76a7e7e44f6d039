#include "io/checkpoint.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <tuple>
#include <vector>

#include "core/half.hpp"
#include "io/atomic_dir.hpp"
#include "io/base_reference.hpp"
#include "io/hf_weights.hpp"
#include "io/optimizer_state.hpp"
#include "io/peft_adapter.hpp"
#include "io/quantized_base.hpp"
#include "io/safetensors.hpp"

namespace anvil::io {
namespace fs = std::filesystem;
using json = nlohmann::json;

TransformerConfig read_model_config(const std::string& dir) {
  require_not_interrupted_save(dir);
  const std::string path = dir + "/config.json";
  if (!fs::exists(path) && has_peft_adapter(dir))
    ANVIL_THROW(
        "{}: holds a PEFT adapter only (adapter_config.json; its base: {}): give the base model's directory "
        "as the model and this one as the adapter (--adapter {}; training: lora_adapter)",
        dir, adapter_base_model(dir), dir);
  ANVIL_REQUIRE(fs::exists(path), "{}: no config.json (is '{}' a model or checkpoint directory?)", path, dir);
  json j;
  try {
    j = json::parse(read_text_file(path));
  } catch (const json::parse_error& e) {
    ANVIL_THROW("{}: not valid JSON: {}", path, e.what());
  }
  return TransformerConfig::from_hf_json(j, path);
}

namespace {

// The Hugging Face name of a weight dtype, as config.json's "dtype" spells it.
const char* hf_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "float32";
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
    default:
      ANVIL_THROW("save_model: weights can be written as F32, BF16 or F16, not {}", dtype_name(dtype));
  }
}

// Adds `src` (fp32, `shape`) to `w` as `dtype`, rounded to nearest, ties to even. A finite value that becomes
// infinite (beyond fp16's 65504, or the last bf16 step below FLT_MAX) is an error naming the tensor, so that
// a conversion never silently writes inf; NaN and infinities are kept as they are.
void add_weight(SafeTensorsWriter& w, const std::string& path, const std::string& name,
                std::vector<int64_t> shape, const float* src, DType dtype) {
  if (dtype == DType::F32) return w.add(name, DType::F32, std::move(shape), src);  // (a copy: see add_view)
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  std::vector<uint16_t> half(n);
  const bool bf16 = dtype == DType::BF16;
  for (size_t i = 0; i < n; ++i) {
    half[i] = bf16 ? float_to_bf16(src[i]) : float_to_fp16(src[i]);
    const float back = bf16 ? bf16_to_float(half[i]) : fp16_to_float(half[i]);
    ANVIL_REQUIRE(
        !std::isinf(back) || !std::isfinite(src[i]),
        "{}: tensor '{}' element {} = {} overflows {} (largest finite value {}); write the model as {}", path,
        name, i, src[i], bf16 ? "bf16" : "fp16", bf16 ? "3.39e38" : "65504",
        bf16 ? "fp32 (--dtype fp32)" : "bf16 or fp32 (--dtype bf16 | fp32)");
  }
  w.add(name, dtype, std::move(shape), half.data());
}

// config.json, its "dtype" field saying `dtype_field` (as transformers 5 writes it; transformers 4's
// "torch_dtype" is dropped).
void write_hf_config(const std::string& dir, const Model& model, const char* dtype_field) {
  json config = model.config().to_hf_json();
  config.erase("torch_dtype");
  config["dtype"] = dtype_field;
  write_text_file_synced(dir + "/config.json", config.dump(2) + "\n");
}

// model.safetensors (every tensor of the layout, Hugging Face names and shapes, as `dtype`) and config.json
// (its "dtype" field saying `dtype`, as transformers 5 writes it; transformers 4's "torch_dtype" is dropped).
void write_hf_model(const std::string& dir, const Model& model, Device& dev, DType dtype) {
  const char* dtype_field = hf_dtype_name(dtype);  // checks dtype before anything is written
  const ParamLayout& layout = model.layout();
  std::vector<float> host(layout.total_numel());
  model.download_weights(dev, host.data());
  const std::string path = dir + "/model.safetensors";
  SafeTensorsWriter w;
  w.set_metadata("format", "pt");
  std::vector<float> transposed;
  for (const ParamTensor& t : layout.tensors()) {
    if (t.is_adapter()) continue;               // adapter_model.safetensors (below)
    const float* src = host.data() + t.offset;  // the first hf_rows rows of a padded tensor
    if (t.hf_transposed) {
      const int64_t rows = t.shape[0], cols = t.shape[1];
      transposed.resize(size_t(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) transposed[size_t(c * rows + r)] = src[r * cols + c];
      src = transposed.data();
    }
    if (dtype == DType::F32 && !t.hf_transposed)  // (no copy of the model beside `host`, valid until write)
      w.add_view(t.name, DType::F32, t.hf_shape(), src);
    else
      add_weight(w, path, t.name, t.hf_shape(), src, dtype);  // add() copies: `transposed` may be reused
  }
  w.write(path);
  write_peft_adapter(dir, layout, host.data());
  write_hf_config(dir, model, dtype_field);
}

}  // namespace

void save_model(const std::string& dir, const Decoder& model, Device& dev, DType dtype) {
  write_hf_model(dir, model, dev, dtype);
}

void load_model_weights(const std::string& dir, Decoder& model, Device& dev, const std::string& adapter_dir) {
  require_not_interrupted_save(dir);
  if (!adapter_dir.empty()) {
    ANVIL_REQUIRE(has_peft_adapter(adapter_dir), "{}: no {} (a PEFT adapter directory holds it and {})",
                  adapter_dir, kAdapterConfigFile, kAdapterWeightsFile);
    ANVIL_REQUIRE(!has_peft_adapter(dir),
                  "{} holds an adapter of its own ({}) and {} was given too: give one of them", dir,
                  kAdapterConfigFile, adapter_dir);
  }
  const std::string adapter = !adapter_dir.empty() ? adapter_dir : has_peft_adapter(dir) ? dir : "";
  // A LoRA checkpoint that refers to its base (base_model.json): the base's weights from there.
  const std::optional<std::string> base = referenced_base(dir);
  const WeightFiles files(base.value_or(dir));
  const ParamLayout& layout = model.layout();
  const TransformerConfig& cfg = model.config();
  const bool adapters = layout.lora().enabled();
  // ZeRO-3 keeps each rank's shard of the weights: a rank reads its window of the model only (a 70B base is
  // 283 GB in fp32). (A merged adapter and a quantized base need the whole model.)
  const ParamStore& store = model.param_store();
  const bool windowed =
      store.weights_sharded() && !store.quantized() && (adapters ? store.trainable_only() : adapter.empty());
  const ParamRange window = windowed ? store.weight_range() : layout.all();
  std::vector<float> host(window.numel(), 0.0f);
  // The adapter tensors' part of the window (fp32 values in the flat layout from `values_of(t)`).
  const auto put_adapters = [&](const std::function<const float*(const ParamTensor&)>& values_of) {
    for (const ParamTensor& t : layout.tensors()) {
      if (!t.is_adapter()) continue;
      const size_t lo = std::max(t.offset, window.begin), hi = std::min(t.offset + t.numel(), window.end);
      if (lo < hi) std::copy_n(values_of(t) + (lo - t.offset), hi - lo, host.data() + (lo - window.begin));
    }
  };
  // With adapters, those the directory lacks keep the values they have (a fresh LoRA on a base model).
  std::vector<float> packed;  // (windowed: the trainable tensors, in the optimizer layout)
  if (adapters && windowed) {
    packed.resize(store.optimizer_layout().total_numel());
    store.download_trainable(dev, packed.data());  // (a collective)
    put_adapters([&](const ParamTensor& t) { return packed.data() + store.optimizer_index(t.offset); });
  } else if (adapters) {
    model.download_weights(dev, host.data());
  }
  std::vector<const ParamTensor*> found(layout.tensors().size(), nullptr);
  std::vector<float> tmp, transposed;
  for (const auto& [name, _] : files.names()) {
    const ParamTensor* t = layout.find_hf(name);
    if (!t) {
      ANVIL_REQUIRE(layout.hf_ignored(name),
                    "{}: unexpected tensor '{}' (not part of a {} model with this config.json)",
                    files.path_of(name), name, cfg.family);
      continue;
    }
    ANVIL_REQUIRE(!t->is_adapter(), "{}: tensor '{}' is a LoRA factor: it belongs in {}", files.path_of(name),
                  name, kAdapterWeightsFile);
    const size_t index = size_t(t - layout.tensors().data());
    ANVIL_REQUIRE(!found[index], "{}: tensor '{}' is stored twice (as '{}' and '{}')", dir, t->name,
                  found[index]->name, name);
    auto [reader, info] = files.find(name);
    const std::string& path = reader->path();
    const std::vector<int64_t> want = t->hf_shape();
    ANVIL_REQUIRE(info->shape == want,
                  "{}: tensor '{}' has shape {} but the model config (config.json) needs {}", path, name,
                  shape_string(info->shape), shape_string(want));
    found[index] = t;
    // The file's elements (the first hf rows of a padded tensor) that fall in the window.
    const size_t n = size_t(info->numel());
    const size_t lo = std::max(t->offset, window.begin), hi = std::min(t->offset + n, window.end);
    if (lo >= hi) continue;
    float* dst = host.data() + (lo - window.begin);
    if (t->hf_transposed) {
      tmp.resize(n);
      transposed.resize(n);
      tensor_to_f32(*info, reader->data(*info), tmp.data(), path);
      const int64_t rows = t->shape[0], cols = t->shape[1];  // Anvil [out, in]; file [in, out]
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) transposed[size_t(r * cols + c)] = tmp[size_t(c * rows + r)];
      std::copy_n(transposed.data() + (lo - t->offset), hi - lo, dst);
    } else {
      tensor_to_f32(*info, reader->data(*info), dst, path, lo - t->offset, hi - lo);
    }
  }
  for (size_t i = 0; i < found.size(); ++i)
    ANVIL_REQUIRE(found[i] || layout.tensors()[i].is_adapter(),
                  "{}: tensor '{}' is missing from the model weights", dir, layout.tensors()[i].name);
  if (!adapter.empty() && adapters && windowed) {
    read_peft_adapter(adapter, layout,
                      [&](const ParamTensor& t) { return packed.data() + store.optimizer_index(t.offset); });
    put_adapters([&](const ParamTensor& t) { return packed.data() + store.optimizer_index(t.offset); });
  } else if (!adapter.empty()) {
    if (adapters)
      read_peft_adapter(adapter, layout, host.data());
    else
      merge_peft_adapter(adapter, layout, host.data());
  }
  if (windowed) {
    store.upload_own(dev, host.data());
    return;
  }
  model.upload_weights(dev, host.data());
  // A QLoRA base whose dequantized values do not restore its codes (nf4-dq): as the checkpoint held it.
  load_quantized_base(dir, model, dev);
}

void save_model(const std::string& dir, const Model& model, Device& dev, DType dtype) {
  // BERT's layout holds Hugging Face names and shapes too (nothing transposed or padded): the same writer as
  // save_bert_model, with the dtype.
  write_hf_model(dir, model, dev, dtype);
}

BertLoadReport load_model_weights(const std::string& dir, Model& model, Device& dev,
                                  const std::string& adapter_dir) {
  if (model.config().is_bert()) {
    ANVIL_REQUIRE(adapter_dir.empty(), "{}: LoRA adapters are for the decoder families; {} is BERT",
                  adapter_dir, dir);
    return load_bert_weights(dir, static_cast<BertModel&>(model), dev);
  }
  load_model_weights(dir, static_cast<Decoder&>(model), dev, adapter_dir);
  return {};
}

void save_optimizer(const std::string& path, const OptimizerStateParts& state, Device& dev) {
  SafeTensorsWriter w;
  w.set_metadata("optimizer", optimizer_name(state.whole().kind()));
  std::vector<std::vector<char>> host;  // kept alive until write()
  add_state_tensors(w, state, dev, host);
  w.write(path);
}

void load_optimizer(const std::string& path, Optimizer& opt, Device& dev) {
  SafeTensorsReader reader(path);
  require_optimizer(reader, opt);
  const std::string wanted = optimizer_name(opt.kind());
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

void save_checkpoint_model(const std::string& dir, const Model& model, Device& dev,
                           const BaseReference* base) {
  if (!base) {
    save_model(dir, model, dev);
    save_quantized_base(dir, model, dev);
    return;
  }
  // The adapter alone: the frozen base is the referenced directory's (a QLoRA base re-quantizes from it to
  // the codes the run started with).
  const ParamStore& store = model.param_store();
  ANVIL_ASSERT(store.trainable_only(),
               "a checkpoint that refers to its base keeps the trainable tensors only");
  std::vector<float> packed(store.optimizer_layout().total_numel());
  store.download_trainable(dev, packed.data());
  write_peft_adapter(
      dir, model.layout(),
      [&](const ParamTensor& t) { return packed.data() + store.optimizer_index(t.offset); }, base->dir);
  write_hf_config(dir, model, hf_dtype_name(DType::F32));
  write_base_reference(dir, *base);
}

void join_checkpoint_model(const Model& model, Device& dev, const BaseReference* base) {
  if (base)
    model.param_store().download_trainable(dev, nullptr);
  else
    model.param_store().join_download(dev);
}

void save_checkpoint(const std::string& dir, const Model& model, const OptimizerStateParts& opt,
                     const json& state, const std::string& tokenizer_file, Device& dev, Device* optimizer_dev,
                     const BaseReference* base) {
  AtomicDirectory out(dir);
  save_checkpoint_model(out.path(), model, dev, base);
  save_optimizer(out.file("optimizer.safetensors"), opt, optimizer_dev ? *optimizer_dev : dev);
  write_text_file_synced(out.file("trainer_state.json"), state.dump(2) + "\n");
  for (const auto& [source, name] : tokenizer_side_files(tokenizer_file))
    write_text_file_synced(out.file(name), read_text_file(source));
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

std::vector<std::pair<std::string, std::string>> tokenizer_side_files(const std::string& tokenizer_file) {
  if (tokenizer_file.empty()) return {};
  std::string file = tokenizer_file;
  if (fs::is_directory(file)) {
    file = find_tokenizer_file(tokenizer_file);
    ANVIL_REQUIRE(!file.empty(),
                  "tokenizer '{}': the directory has neither tokenizer.json nor vocab.txt (give the "
                  "tokenizer file)",
                  tokenizer_file);
  }
  std::vector<std::pair<std::string, std::string>> files = {{file, tokenizer_file_name(file)}};
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path beside = fs::path(file).parent_path() / name;
    if (fs::is_regular_file(beside)) files.emplace_back(beside.string(), name);
  }
  return files;
}

}  // namespace anvil::io
