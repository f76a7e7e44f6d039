// anvil zero-to-fp32 CHECKPOINT OUTPUT: the fp32 Hugging Face model of a training checkpoint, as DeepSpeed's
// zero_to_fp32.py gives one from a ZeRO checkpoint. Anvil's checkpoints (every stage) already hold the whole
// fp32 weights in Hugging Face layout (model.safetensors: the master weights gathered from every rank at
// save time), so nothing has to be re-assembled from the shards: the command checks that the checkpoint is
// complete (every rank's optimizer file of a ZeRO checkpoint, every tensor of the model config with its
// shape and type) and writes OUTPUT (model.safetensors, config.json, the tokenizer files) atomically,
// tensor by tensor from the memory-mapped input, so its memory stays bounded whatever the model's size
// (DeepSpeed's script holds the whole model in host memory).
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "io/atomic_dir.hpp"
#include "io/base_reference.hpp"
#include "io/checkpoint.hpp"
#include "io/hf_weights.hpp"
#include "io/optimizer_state.hpp"
#include "io/safetensors.hpp"
#include "model/param_layout.hpp"

namespace anvil::cli {
namespace {

namespace fs = std::filesystem;

struct ZeroToFp32Args {
  std::string checkpoint, output;
};

// A ZeRO checkpoint is complete when every rank's optimizer file is there (trainer_state.json says how many
// ranks wrote it).
void require_complete(const std::string& dir) {
  const std::string state_path = (fs::path(dir) / "trainer_state.json").string();
  ANVIL_REQUIRE(fs::exists(state_path),
                "zero-to-fp32: {} has no trainer_state.json: not a checkpoint of `anvil train` (to convert a "
                "model directory, use `anvil convert`)",
                dir);
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(io::read_text_file(state_path));
  } catch (const nlohmann::json::exception& e) {
    ANVIL_THROW("zero-to-fp32: {}: not valid JSON ({})", state_path, e.what());
  }
  const int stage = state.value("zero_stage", 0), world = state.value("world_size", 1);
  if (stage == 0) return;
  for (int r = 0; r < world; ++r) {
    const std::string path = io::optimizer_shard_path(dir, r, world);
    ANVIL_REQUIRE(
        fs::exists(path),
        "zero-to-fp32: {} is missing: the checkpoint was written by {} ranks under ZeRO stage {} and "
        "is incomplete; use an earlier checkpoint",
        path, world, stage);
  }
}

int run_zero_to_fp32(const ZeroToFp32Args& a) {
  ANVIL_REQUIRE(fs::absolute(a.checkpoint) != fs::absolute(a.output),
                "zero-to-fp32: OUTPUT must differ from CHECKPOINT ('{}')", a.checkpoint);
  io::require_not_interrupted_save(a.checkpoint);
  require_complete(a.checkpoint);
  const TransformerConfig cfg = io::read_model_config(a.checkpoint);
  const ParamLayout layout = cfg.is_bert() ? ParamLayout::bert(cfg) : ParamLayout::decoder(cfg);
  const std::string weights = (fs::path(a.checkpoint) / "model.safetensors").string();
  ANVIL_REQUIRE(
      !io::refers_to_base(a.checkpoint),
      "zero-to-fp32: {} is a LoRA checkpoint that refers to its base model ({}) instead of holding it: "
      "`anvil convert --input {} --output {}` writes the base with the adapter merged",
      a.checkpoint, io::kBaseReferenceFile, a.checkpoint, a.output);
  ANVIL_REQUIRE(fs::exists(weights), "zero-to-fp32: {} is missing", weights);
  const io::SafeTensorsReader in(weights);
  io::SafeTensorsWriter w;
  w.set_metadata("format", "pt");
  size_t bytes = 0;
  for (const ParamTensor& t : layout.tensors()) {
    const io::SafeTensorInfo* info = in.find(t.name);
    ANVIL_REQUIRE(info, "zero-to-fp32: {}: tensor '{}' of the model config is missing", weights, t.name);
    ANVIL_REQUIRE(info->dtype == DType::F32 && info->shape == t.hf_shape(),
                  "zero-to-fp32: {}: tensor '{}' is {} {}, not the F32 {} a checkpoint holds", weights,
                  t.name, dtype_name(info->dtype), io::shape_string(info->shape),
                  io::shape_string(t.hf_shape()));
    w.add_view(t.name, DType::F32, info->shape, in.data(*info));
    bytes += info->nbytes;
  }
  io::AtomicDirectory out(a.output);
  w.write(out.file("model.safetensors"));
  io::write_text_file_synced(out.file("config.json"),
                             io::read_text_file((fs::path(a.checkpoint) / "config.json").string()));
  for (const auto& [source, name] : io::tokenizer_side_files(io::find_tokenizer_file(a.checkpoint)))
    io::write_text_file_synced(out.file(name), io::read_text_file(source));
  out.commit();
  fmt::print("{} -> {}: {} tensors, {:.2f}M parameters, {:.1f} MiB of fp32 weights (Hugging Face layout)\n",
             a.checkpoint, a.output, layout.tensors().size(), double(bytes) / 4e6, double(bytes) / (1 << 20));
  return 0;
}

Command make_zero_to_fp32(CLI::App& parent) {
  auto a = std::make_shared<ZeroToFp32Args>();
  CLI::App* app = parent.add_subcommand("zero-to-fp32",
                                        "the fp32 Hugging Face model of a training checkpoint (any ZeRO "
                                        "stage), as DeepSpeed's zero_to_fp32.py");
  app->add_option("CHECKPOINT", a->checkpoint, "checkpoint directory of `anvil train` (checkpoint-N)")
      ->required();
  app->add_option("OUTPUT", a->output, "output directory (replaced atomically)")->required();
  return {app, [a] { return run_zero_to_fp32(*a); }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(55, make_zero_to_fp32);

}  // namespace anvil::cli
