// anvil logits: the model's logits for given token ids, written as safetensors, so that other
// frameworks (tests/golden/check_hf_export.py) can compare outputs exactly.
#include <cstring>
#include <memory>

#include "cli/command.hpp"
#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "train/engine.hpp"

namespace anvil::cli {
namespace {

struct LogitsArgs {
  std::string checkpoint, input_ids, output, device = "cpu";
};

int run_logits(const LogitsArgs& a) {
  const TransformerConfig cfg = io::read_model_config(a.checkpoint);
  ANVIL_REQUIRE(
      !cfg.is_bert(),
      "{}: anvil logits writes a language model's per-token logits; this is a BERT sequence classifier "
      "(its class probabilities: `anvil predict --model {}`)",
      a.checkpoint, a.checkpoint);
  const io::SafeTensorsReader in(a.input_ids);
  const io::SafeTensorInfo& t = in.at("input_ids");
  ANVIL_REQUIRE(t.dtype == DType::I32 && t.shape.size() == 2,
                "{}: 'input_ids' must be an I32 tensor [batch, seq], got {} with {} dims", a.input_ids,
                dtype_name(t.dtype), t.shape.size());
  const int B = int(t.shape[0]), T = int(t.shape[1]);
  ANVIL_REQUIRE(B >= 1 && T >= 1 && T <= cfg.block_size, "{}: input_ids shape [{}, {}] (seq must be 1..{})",
                a.input_ids, B, T, cfg.block_size);
  std::vector<int32_t> ids(size_t(B) * T);
  std::memcpy(ids.data(), in.data(t), ids.size() * sizeof(int32_t));
  for (size_t i = 0; i < ids.size(); ++i)
    ANVIL_REQUIRE(ids[i] >= 0 && ids[i] < cfg.vocab_size,
                  "{}: input_ids[{}] = {} is outside the vocabulary (size {})", a.input_ids, i, ids[i],
                  cfg.vocab_size);

  EngineOptions o;
  o.device = resolve_device(a.device);
  o.batch_size = B;
  o.seq_len = T;
  Engine e(cfg, o);
  Decoder& model = e.decoder();
  io::load_model_weights(a.checkpoint, model, e.device());
  e.device().copy_to_device(e.tokens(0), ids.data(), ids.size() * sizeof(int32_t));
  model.forward(e.ops(), e.tokens(0), nullptr, B, T, 0.0f, false);
  const int V = cfg.vocab_size, Vp = cfg.padded_vocab_size();
  std::vector<float> padded(size_t(B) * T * Vp), logits(size_t(B) * T * V);
  model.copy_logits_to_host(e.device(), padded.data(), 0, size_t(B) * T);
  for (size_t r = 0; r < size_t(B) * T; ++r) std::memcpy(&logits[r * V], &padded[r * Vp], V * sizeof(float));
  io::SafeTensorsWriter w;
  w.add("logits", DType::F32, {B, T, V}, logits.data());
  w.write(a.output);
  fmt::print("logits [{}, {}, {}] -> {}\n", B, T, V, a.output);
  return 0;
}

Command make_logits(CLI::App& parent) {
  auto a = std::make_shared<LogitsArgs>();
  CLI::App* app =
      parent.add_subcommand("logits", "write a model's logits for token ids (safetensors in and out)");
  app->add_option("--checkpoint", a->checkpoint, "checkpoint or HF model directory")->required();
  app->add_option("--input_ids", a->input_ids, "safetensors file with an I32 tensor 'input_ids' [batch, seq]")
      ->required();
  app->add_option("--output", a->output, "safetensors file to write ('logits' F32 [batch, seq, vocab])")
      ->required();
  app->add_option("--device", a->device, "auto | cpu | cuda (default cpu)");
  return {app, [a] { return run_logits(*a); }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(60, make_logits);

}  // namespace anvil::cli
