// anvil logits: a model's logits for given token ids, written as safetensors, so that other frameworks
// (tests/golden/check_hf_export.py) can compare outputs exactly. Every family Anvil runs:
//   decoders (GPT-2, Llama, Qwen2, Mistral): 'logits' F32 [batch, seq, vocab], one row per position;
//   BERT sequence classifiers: 'logits' F32 [batch, num_labels], the class logits before the softmax (what
//   `anvil predict` turns into probabilities; a regression model's single score).
// The input file holds 'input_ids' [batch, seq] (I32 or I64) and optionally 'attention_mask' [batch, seq]
// (I32 or I64, values 0/1) and, for BERT, 'token_type_ids' [batch, seq] (I32 or I64; absent: all 0), as a
// Hugging Face tokenizer returns them. The mask must be right-padded: each row ones, then zeros (at least one
// 1). BERT attends only to each row's unpadded prefix, as transformers does with that mask. A decoder is
// causal, so the logits of a row's real positions do not depend on the padding after them and equal the row
// run alone; the logits of padded positions are written as 0. Ids at padded positions are not read (they may
// be anything, e.g. -100).
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "cli/command.hpp"
#include "io/checkpoint.hpp"
#include "io/hf_weights.hpp"
#include "io/safetensors.hpp"
#include "train/engine.hpp"

namespace anvil::cli {
namespace {

struct LogitsArgs {
  std::string checkpoint, adapter, input_ids, output, device = "cpu", quantization = "none";
};

// An integer tensor of the input file, widened to int64.
struct IntTensor {
  std::vector<int64_t> shape;
  std::vector<int64_t> values;
};

// The raw bytes of tensor `name`, of a dtype the reader lists but does not hold (I64): read through the
// file's header, which the reader has already validated (sizes, offsets, overlaps).
std::vector<char> raw_tensor_bytes(const std::string& path, const std::string& name,
                                   std::vector<int64_t>& shape) {
  std::ifstream f(path, std::ios::binary);
  uint64_t header_len = 0;
  f.read(reinterpret_cast<char*>(&header_len), 8);
  std::string header(header_len, '\0');
  f.read(header.data(), std::streamsize(header_len));
  ANVIL_REQUIRE(f.good(), "{}: cannot read the safetensors header", path);
  const nlohmann::json entry = nlohmann::json::parse(header).at(name);
  shape = entry.at("shape").get<std::vector<int64_t>>();
  const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
  std::vector<char> bytes(offsets.at(1) - offsets.at(0));
  f.seekg(std::streamoff(8 + header_len + offsets[0]));
  f.read(bytes.data(), std::streamsize(bytes.size()));
  ANVIL_REQUIRE(f.good(), "{}: cannot read tensor '{}'", path, name);
  return bytes;
}

// Tensor `name` of the input file as int64 values, or nullopt when the file has none (and !required). I32 and
// I64 are accepted; any other dtype is an error naming the file and the tensor.
std::optional<IntTensor> read_int_tensor(const io::SafeTensorsReader& in, const std::string& name,
                                         bool required) {
  const std::string& path = in.path();
  IntTensor t;
  if (const io::SafeTensorInfo* info = in.find(name)) {
    ANVIL_REQUIRE(info->dtype == DType::I32, "{}: '{}' must be an I32 or I64 tensor [batch, seq], got {}",
                  path, name, dtype_name(info->dtype));
    t.shape = info->shape;
    std::vector<int32_t> v(size_t(info->numel()));
    std::memcpy(v.data(), in.data(*info), v.size() * sizeof(int32_t));
    t.values.assign(v.begin(), v.end());
  } else if (const auto other = in.unsupported().find(name); other != in.unsupported().end()) {
    ANVIL_REQUIRE(other->second == "I64", "{}: '{}' must be an I32 or I64 tensor [batch, seq], got {}", path,
                  name, other->second);
    const std::vector<char> bytes = raw_tensor_bytes(path, name, t.shape);
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    ANVIL_REQUIRE(bytes.size() == size_t(numel) * 8, "{}: '{}' holds {} bytes for {} I64 values", path, name,
                  bytes.size(), numel);
    t.values.resize(size_t(numel));
    std::memcpy(t.values.data(), bytes.data(), bytes.size());
  } else {
    ANVIL_REQUIRE(!required, "{}: no tensor '{}' (expected an I32 or I64 tensor [batch, seq])", path, name);
    return std::nullopt;
  }
  ANVIL_REQUIRE(t.shape.size() == 2, "{}: '{}' must have 2 dims [batch, seq], got shape {}", path, name,
                io::shape_string(t.shape));
  return t;
}

// Device memory for the token types, which the engine does not plan (its BERT inputs are single texts).
struct DeviceBuffer {
  Device& dev;
  void* ptr;
  DeviceBuffer(Device& d, size_t bytes) : dev(d), ptr(d.alloc(bytes)) {}
  ~DeviceBuffer() { dev.free(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

int run_logits(const LogitsArgs& a) {
  const TransformerConfig cfg = io::read_model_config(a.checkpoint);
  const io::SafeTensorsReader in(a.input_ids);
  const IntTensor ids = *read_int_tensor(in, "input_ids", true);
  const int B = int(ids.shape[0]), T = int(ids.shape[1]);
  ANVIL_REQUIRE(B >= 1 && T >= 1 && T <= cfg.block_size,
                "{}: input_ids shape [{}, {}] (batch must be >= 1 and seq 1..{}, the model's "
                "max_position_embeddings)",
                a.input_ids, B, T, cfg.block_size);

  // Each row's length: the ones of its right-padded attention mask, or T without a mask.
  std::vector<int32_t> lengths(size_t(B), T);
  if (const std::optional<IntTensor> mask = read_int_tensor(in, "attention_mask", false)) {
    ANVIL_REQUIRE(mask->shape == ids.shape, "{}: attention_mask has shape {} but input_ids has {}",
                  a.input_ids, io::shape_string(mask->shape), io::shape_string(ids.shape));
    for (int b = 0; b < B; ++b) {
      int len = -1;  // the first 0 of the row
      for (int t = 0; t < T; ++t) {
        const int64_t m = mask->values[size_t(b) * T + t];
        ANVIL_REQUIRE(m == 0 || m == 1, "{}: attention_mask[{}, {}] = {}; the mask holds 0 or 1", a.input_ids,
                      b, t, m);
        if (m == 0 && len < 0) len = t;
        ANVIL_REQUIRE(m == 0 || len < 0,
                      "{}: attention_mask row {} has a 1 at position {} after a 0 at position {}: logits "
                      "needs right padding "
                      "(each row's ones first, then zeros); pad on the right (tokenizer "
                      "padding_side='right') or run the row "
                      "alone",
                      a.input_ids, b, t, len);
      }
      lengths[size_t(b)] = len < 0 ? T : len;
      ANVIL_REQUIRE(lengths[size_t(b)] >= 1, "{}: attention_mask row {} is all zeros (no token to attend to)",
                    a.input_ids, b);
    }
  }
  // Ids: checked where the mask is 1; padded positions get the pad id (a valid row of the embedding).
  const int32_t pad = cfg.pad_token_id >= 0 && cfg.pad_token_id < cfg.vocab_size ? cfg.pad_token_id : 0;
  std::vector<int32_t> tokens(size_t(B) * T, pad);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < lengths[size_t(b)]; ++t) {
      const size_t i = size_t(b) * T + t;
      ANVIL_REQUIRE(ids.values[i] >= 0 && ids.values[i] < cfg.vocab_size,
                    "{}: input_ids[{}] = {} (row {}, position {}) is outside the vocabulary (size {})",
                    a.input_ids, i, ids.values[i], b, t, cfg.vocab_size);
      tokens[i] = int32_t(ids.values[i]);
    }
  const std::optional<IntTensor> types = read_int_tensor(in, "token_type_ids", false);
  std::vector<int32_t> type_ids;
  if (types) {
    ANVIL_REQUIRE(cfg.is_bert(),
                  "{}: token_type_ids is read only for BERT models; {} is a {} decoder (drop the tensor)",
                  a.input_ids, a.checkpoint, cfg.family);
    ANVIL_REQUIRE(types->shape == ids.shape, "{}: token_type_ids has shape {} but input_ids has {}",
                  a.input_ids, io::shape_string(types->shape), io::shape_string(ids.shape));
    type_ids.assign(size_t(B) * T, 0);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < lengths[size_t(b)]; ++t) {
        const size_t i = size_t(b) * T + t;
        ANVIL_REQUIRE(types->values[i] >= 0 && types->values[i] < cfg.type_vocab_size,
                      "{}: token_type_ids[{}, {}] = {} is outside 0..{} (the model's type_vocab_size {})",
                      a.input_ids, b, t, types->values[i], cfg.type_vocab_size - 1, cfg.type_vocab_size);
        type_ids[i] = int32_t(types->values[i]);
      }
  }

  EngineOptions o;
  o.device = resolve_device(a.device);
  o.batch_size = B;
  o.seq_len = T;
  o.weight_storage = parse_weight_storage(a.quantization, "--quantization");
  Engine e(cfg, o);
  io::SafeTensorsWriter w;
  if (cfg.is_bert()) {
    BertModel& model = e.bert();
    e.model().init_weights(0, e.device());
    const io::BertLoadReport report = io::load_model_weights(a.checkpoint, e.model(), e.device(), a.adapter);
    ANVIL_REQUIRE(
        report.kept.empty(),
        "{}: the weights have no {} (a BertModel checkpoint, not a trained classifier), so there are no "
        "class logits; fine-tune it first (anvil train --model_name_or_path {})",
        a.checkpoint, report.kept.front(), a.checkpoint);
    e.device().copy_to_device(e.tokens(0), tokens.data(), tokens.size() * sizeof(int32_t));
    e.device().copy_to_device(e.lengths(0), lengths.data(), lengths.size() * sizeof(int32_t));
    std::unique_ptr<DeviceBuffer> type_buffer;
    if (types) {
      type_buffer = std::make_unique<DeviceBuffer>(e.device(), type_ids.size() * sizeof(int32_t));
      e.device().copy_to_device(type_buffer->ptr, type_ids.data(), type_ids.size() * sizeof(int32_t));
    }
    model.forward(e.ops(), e.tokens(0), types ? static_cast<const int32_t*>(type_buffer->ptr) : nullptr,
                  e.lengths(0), nullptr, B, T, 0.0f, false);
    const int NL = cfg.num_labels;
    std::vector<float> logits(size_t(B) * NL);
    model.copy_logits_to_host(e.device(), logits.data(), B);
    w.add("logits", DType::F32, {B, NL}, logits.data());
    w.write(a.output);
    fmt::print("logits [{}, {}] (class logits of {}) -> {}\n", B, NL, cfg.family, a.output);
    return 0;
  }
  Decoder& model = e.decoder();
  io::load_model_weights(a.checkpoint, model, e.device(), a.adapter);
  e.device().copy_to_device(e.tokens(0), tokens.data(), tokens.size() * sizeof(int32_t));
  model.forward(e.ops(), e.tokens(0), nullptr, B, T, 0.0f, false);
  const int V = cfg.vocab_size, Vp = cfg.padded_vocab_size();
  std::vector<float> padded(size_t(B) * T * Vp), logits(size_t(B) * T * V, 0.0f);
  model.copy_logits_to_host(e.device(), padded.data(), 0, size_t(B) * T);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < lengths[size_t(b)]; ++t) {
      const size_t r = size_t(b) * T + t;
      std::memcpy(&logits[r * V], &padded[r * Vp], V * sizeof(float));
    }
  w.add("logits", DType::F32, {B, T, V}, logits.data());
  w.write(a.output);
  fmt::print("logits [{}, {}, {}] -> {}\n", B, T, V, a.output);
  return 0;
}

Command make_logits(CLI::App& parent) {
  auto a = std::make_shared<LogitsArgs>();
  CLI::App* app = parent.add_subcommand(
      "logits",
      "write a model's logits for token ids (safetensors in and out): per-token logits of a GPT-2 / Llama / "
      "Qwen2 / Mistral decoder, class logits of a BERT classifier");
  app->add_option("--checkpoint", a->checkpoint, "checkpoint or HF model directory")->required();
  app->add_option("--adapter", a->adapter,
                  "a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) kept apart "
                  "from --checkpoint, its base: merged into the base's weights (decoders)");
  app->add_option("--input_ids", a->input_ids,
                  "safetensors file with 'input_ids' [batch, seq] (I32 or I64), optionally 'attention_mask' "
                  "[batch, seq] (0/1, right-padded) and, for BERT, 'token_type_ids'")
      ->required();
  app->add_option(
         "--output", a->output,
         "safetensors file to write: 'logits' F32 [batch, seq, vocab] (decoder; padded positions 0) or "
         "[batch, num_labels] (BERT)")
      ->required();
  app->add_option("--device", a->device, "auto | cpu | cuda (default cpu)");
  app->add_option(
      "--quantization", a->quantization,
      "none | int8 | nf4 | nf4-dq: keep a decoder's block Linear weights quantized (bitsandbytes' "
      "load_in_8bit / load_in_4bit nf4; nf4-dq with bnb_4bit_use_double_quant)");
  return {app, [a] { return run_logits(*a); }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(60, make_logits);

}  // namespace anvil::cli
