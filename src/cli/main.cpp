// The `anvil` command: train, estimate, prepare-data, generate.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <map>

#include "anvil/error.hpp"
#include "anvil/rng.hpp"
#include "anvil/trainer.hpp"
#include "data/byte_corpus.hpp"
#include "io/checkpoint.hpp"
#include "train/engine.hpp"
#include "train/sampler.hpp"

namespace {

using namespace anvil;
using json = nlohmann::json;

// Every TrainConfig key is also a flag (--learning_rate 3e-4, --tf32 true, ...), named like Hugging Face
// TrainingArguments; flags override the config file.
struct ConfigFlags {
  std::string config_path;
  std::map<std::string, std::string> values;

  void add_to(CLI::App* cmd) {
    cmd->add_option("--config", config_path, "JSON training config (see docs/config.md)");
    for (const std::string& key : TrainConfig::keys())
      cmd->add_option("--" + key, values[key], "override config key '" + key + "'");
  }
  TrainConfig resolve() {
    json j = json::object();
    std::string source = "command line";
    if (!config_path.empty()) {
      std::ifstream f(config_path);
      ANVIL_REQUIRE(f.good(), "config file '{}' not found or not readable", config_path);
      try {
        j = json::parse(f);
      } catch (const json::parse_error& e) {
        ANVIL_THROW("{}: not valid JSON: {}", config_path, e.what());
      }
      ANVIL_REQUIRE(j.is_object(), "{}: the config must be a JSON object", config_path);
      source = config_path;
    }
    for (const auto& [key, value] : values)
      if (!value.empty()) set_config_override(j, key, value);
    if (!values["model"].empty() && j["model"].is_string() && values["model"].front() == '{')
      j["model"] = json::parse(values["model"]);
    return TrainConfig::from_json(j, source);
  }
};

void print_summary(const TrainSummary& s) {
  fmt::print("\n***** train metrics *****\n");
  fmt::print("  Time: {:.2f}\n", s.train_runtime);
  fmt::print("  Samples/second: {:.2f}\n", s.train_samples_per_second);
  fmt::print("  Tokens/second: {:.0f}\n", s.train_tokens_per_second);
  fmt::print("  train_loss: {:.4f}\n", s.train_loss);
  if (s.eval_loss >= 0) fmt::print("  eval_loss: {:.4f}\n", s.eval_loss);
  fmt::print("  {} memory occupied: {} MB.\n", s.device.rfind("cpu", 0) == 0 ? "CPU arena" : "GPU",
             s.peak_memory_bytes >> 20);
  if (!s.last_checkpoint.empty()) fmt::print("  checkpoint: {}\n", s.last_checkpoint);
  if (!s.sample.empty()) fmt::print("\n***** sample *****\n{}\n", s.sample);
}

int run_train(ConfigFlags& flags) {
  const TrainConfig cfg = flags.resolve();
  print_summary(train(cfg));
  return 0;
}

int run_estimate(ConfigFlags& flags) {
  const TrainConfig cfg = flags.resolve();
  TransformerConfig model = cfg.model;
  if (!cfg.init_from.empty()) model = io::read_model_config(cfg.init_from);
  EngineOptions o;
  o.device = resolve_device(cfg.device);
  o.batch_size = cfg.per_device_train_batch_size;
  o.seq_len = cfg.seq_len();
  o.training = true;
  const MemoryPlan plan = plan_engine_memory(model, o);
  fmt::print("Memory plan for training gpt2 ({:.2f}M parameters), batch {} x {} tokens, fp32 AdamW, on {}:\n",
             model.num_parameters() / 1e6, o.batch_size, o.seq_len, device_name(o.device));
  fmt::print("{}", plan.report(true));
  return 0;
}

int run_prepare(const std::vector<std::string>& inputs, const std::string& out, double val_fraction) {
  const data::PrepareStats s = data::prepare_byte_corpus(inputs, out, val_fraction);
  fmt::print("prepared {} bytes: {} train tokens -> {}, {} validation tokens -> {}\n", s.bytes_read,
             s.train_tokens, s.train_path, s.val_tokens, s.val_path);
  return 0;
}

struct GenerateArgs {
  std::string checkpoint, prompt = "\n", device = "auto";
  int max_new_tokens = 200, top_k = 40;
  double temperature = 0.8;
  uint64_t seed = 42;
};

int run_generate(const GenerateArgs& a) {
  const TransformerConfig cfg = io::read_model_config(a.checkpoint);
  EngineOptions o;
  o.device = resolve_device(a.device);
  o.batch_size = 1;
  o.seq_len = cfg.block_size;
  Engine engine(cfg, o);
  io::load_model_weights(a.checkpoint, engine.model(), engine.device());
  std::vector<int32_t> prompt;
  for (uint32_t id : data::byte_encode(a.prompt)) prompt.push_back(int32_t(id));
  ANVIL_REQUIRE(!prompt.empty(), "--prompt must not be empty");
  Rng rng(a.seed);
  SampleOptions so{a.max_new_tokens, float(a.temperature), a.top_k};
  const std::vector<int32_t> ids = generate(engine, prompt, so, rng);
  std::string text = a.prompt;
  for (int32_t id : ids) text += id < 256 ? std::string(1, char(id)) : fmt::format("<|{}|>", id);
  fmt::print("{}\n", text);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"anvil: train and fine-tune transformer language models on CPU and CUDA"};
  app.require_subcommand(1);

  ConfigFlags train_flags;
  CLI::App* train_cmd = app.add_subcommand("train", "train a model (config file + flag overrides)");
  train_flags.add_to(train_cmd);

  ConfigFlags est_flags;
  CLI::App* est_cmd =
      app.add_subcommand("estimate", "print the memory plan of a training config without running it");
  est_flags.add_to(est_cmd);

  std::vector<std::string> prep_inputs;
  std::string prep_out;
  double prep_val = 0.1;
  CLI::App* prep_cmd =
      app.add_subcommand("prepare-data", "byte-level tokenise text files into train/val token shards");
  prep_cmd->add_option("--input", prep_inputs, "text file(s) or directories")->required();
  prep_cmd->add_option("--output", prep_out, "output directory (train.bin, val.bin)")->required();
  prep_cmd->add_option("--val_fraction", prep_val, "fraction of the corpus (its end) kept for validation");

  GenerateArgs gen;
  CLI::App* gen_cmd =
      app.add_subcommand("generate", "sample text from a checkpoint or Hugging Face GPT-2 directory");
  gen_cmd->add_option("--checkpoint", gen.checkpoint, "checkpoint or HF model directory")->required();
  gen_cmd->add_option("--prompt", gen.prompt, "text to continue");
  gen_cmd->add_option("--max_new_tokens", gen.max_new_tokens, "tokens to generate")
      ->check(CLI::NonNegativeNumber);
  gen_cmd->add_option("--temperature", gen.temperature, "sampling temperature (0 = greedy)")
      ->check(CLI::NonNegativeNumber);
  gen_cmd->add_option("--top_k", gen.top_k, "sample among the k most likely tokens (0 = all)")
      ->check(CLI::NonNegativeNumber);
  gen_cmd->add_option("--seed", gen.seed, "sampling seed");
  gen_cmd->add_option("--device", gen.device, "auto | cpu | cuda");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*train_cmd) return run_train(train_flags);
    if (*est_cmd) return run_estimate(est_flags);
    if (*prep_cmd) return run_prepare(prep_inputs, prep_out, prep_val);
    if (*gen_cmd) return run_generate(gen);
  } catch (const anvil::Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 1;
}
