// anvil convert: a model directory of any family Anvil runs (GPT-2, Llama, Qwen2, Mistral, BERT; Hugging
// Face, possibly sharded or fp16/bf16, or an Anvil checkpoint) -> a Hugging Face directory with one
// model.safetensors (fp32, or bf16 / fp16 with --dtype, rounded to nearest even; config.json's "dtype" says
// which), config.json and the tokenizer files, written atomically. The tensors are the input's, under the
// names transformers itself writes (buffers the layout table ignores, such as rotary inv_freq, and a tied
// lm_head are not written), so the output loads in transformers with no missing or unexpected keys, and in
// Anvil (init_from; generate and logits for a decoder, predict and logits for a BERT classifier). A weight
// that overflows fp16 is an error naming the tensor. A BERT directory without a classifier (a BertModel
// checkpoint) gets a freshly initialised pooler / classifier, as transformers' BertForSequenceClassification
// would, and the command says so.
#include <filesystem>
#include <memory>

#include "cli/command.hpp"
#include "io/atomic_dir.hpp"
#include "io/checkpoint.hpp"
#include "train/engine.hpp"

namespace anvil::cli {
namespace {

namespace fs = std::filesystem;

// Files beside the weights that a Hugging Face directory carries and that convert keeps.
constexpr const char* kSideFiles[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "vocab.txt",      "generation_config.json"};

struct ConvertArgs {
  std::string input, adapter, output, dtype = "fp32";
};

DType parse_weight_dtype(const std::string& name) {
  if (name == "fp32") return DType::F32;
  if (name == "bf16") return DType::BF16;
  if (name == "fp16") return DType::F16;
  ANVIL_THROW("convert: --dtype must be one of fp32, bf16, fp16 (the written weights' type), got '{}'", name);
}

int run_convert(const ConvertArgs& a) {
  ANVIL_REQUIRE(a.input != a.output, "convert: --output must differ from --input ('{}')", a.input);
  const DType dtype = parse_weight_dtype(a.dtype);
  const TransformerConfig cfg = io::read_model_config(a.input);
  EngineOptions o;  // CPU, inference-sized activations: only the weights matter here
  Engine engine(cfg, o);
  // BERT heads a BertModel checkpoint lacks keep the initialisation (seeded: the output is reproducible).
  if (cfg.is_bert()) engine.model().init_weights(42, engine.device());
  const io::BertLoadReport report =
      io::load_model_weights(a.input, engine.model(), engine.device(), a.adapter);
  io::AtomicDirectory out(a.output);
  io::save_model(out.path(), engine.model(), engine.device(), dtype);
  std::vector<std::string> copied;
  for (const char* f : kSideFiles) {
    const fs::path src = fs::path(a.input) / f;
    if (!fs::exists(src)) continue;
    io::write_text_file_synced(out.file(f), io::read_text_file(src.string()));
    copied.push_back(f);
  }
  out.commit();
  fmt::print("converted {}{} ({} {:.2f}M parameters) -> {}/model.safetensors ({}) + config.json{}{}\n",
             a.input, a.adapter.empty() ? "" : " with the adapter " + a.adapter + " merged", cfg.family,
             cfg.num_parameters() / 1e6, a.output, a.dtype, copied.empty() ? "" : " + ",
             fmt::join(copied, ", "));
  if (!report.kept.empty())
    fmt::print("  not in {}, newly initialised (seed 42): {}\n", a.input, fmt::join(report.kept, ", "));
  if (!report.ignored.empty())
    fmt::print("  not converted (no BERT classifier part): {}\n", fmt::join(report.ignored, ", "));
  return 0;
}

Command make_convert(CLI::App& parent) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* app = parent.add_subcommand("convert",
                                        "GPT-2, Llama, Qwen2, Mistral or BERT model directory (HF, "
                                        "sharded/fp16/bf16, or Anvil checkpoint) -> HF "
                                        "directory with one model.safetensors");
  app->add_option("--input", a->input, "model or checkpoint directory")->required();
  app->add_option("--adapter", a->adapter,
                  "a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) kept apart "
                  "from --input, its base: merged into the written weights");
  app->add_option("--output", a->output, "output directory (replaced atomically)")->required();
  app->add_option("--dtype", a->dtype,
                  "fp32 | bf16 | fp16: the written weights' type (round to nearest even)")
      ->capture_default_str();
  return {app, [a] { return run_convert(*a); }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(50, make_convert);

}  // namespace anvil::cli
