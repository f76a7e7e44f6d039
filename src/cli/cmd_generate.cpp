// anvil generate: sample text from a checkpoint or a Hugging Face GPT-2 directory.
#include <limits>
#include <memory>

#include "anvil/rng.hpp"
#include "cli/command.hpp"
#include "cli/help.hpp"
#include "data/tokenizer.hpp"
#include "io/checkpoint.hpp"
#include "train/engine.hpp"
#include "train/sampler.hpp"

namespace anvil::cli {
namespace {

struct GenerateArgs {
  std::string checkpoint, prompt = "\n", device = "auto", tokenizer;
  int max_new_tokens = 200, top_k = 40;
  double temperature = 0.8;
  uint64_t seed = 42;
};

int run_generate(const GenerateArgs& a) {
  const TransformerConfig cfg = io::read_model_config(a.checkpoint);
  ANVIL_REQUIRE(
      !cfg.is_bert(),
      "{}: a BERT sequence classifier generates no text (anvil generate needs a GPT-2 model); classify "
      "texts with `anvil predict --model {}`",
      a.checkpoint, a.checkpoint);
  EngineOptions o;
  o.device = resolve_device(a.device);
  o.batch_size = 1;
  o.seq_len = cfg.block_size;
  Engine engine(cfg, o);
  io::load_model_weights(a.checkpoint, engine.gpt(), engine.device());
  std::string spec = a.tokenizer.empty() ? io::find_tokenizer_file(a.checkpoint) : a.tokenizer;
  const auto tok = data::load_tokenizer(spec.empty() ? "bytes" : spec);
  // Ids of another vocabulary decode to other text (or fail half-way): the model's vocabulary is the
  // tokenizer's, as training makes it.
  ANVIL_REQUIRE(tok->vocab_size() == uint64_t(cfg.vocab_size),
                "the tokenizer '{}' has {} tokens but the model in {} has a vocabulary of {}: its ids would "
                "decode to other text; give the tokenizer the model was trained with (--tokenizer)",
                spec.empty() ? "bytes" : spec, tok->vocab_size(), a.checkpoint, cfg.vocab_size);
  std::vector<int32_t> prompt;
  for (uint32_t id : tok->encode(a.prompt)) prompt.push_back(int32_t(id));
  ANVIL_REQUIRE(!prompt.empty(), "--prompt must not be empty");
  Rng rng(a.seed);
  const SampleOptions so{a.max_new_tokens, float(a.temperature), a.top_k};
  const std::vector<int32_t> ids = generate(engine, prompt, so, rng);
  fmt::print("{}{}\n", a.prompt, decode_ids(*tok, ids));
  return 0;
}

Command make_generate(CLI::App& parent) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* app =
      parent.add_subcommand("generate", "sample text from a checkpoint or Hugging Face GPT-2 directory");
  app->add_option("--checkpoint", a->checkpoint, "checkpoint or HF model directory")->required();
  app->add_option("--prompt", a->prompt, "text to continue");
  app->add_option("--max_new_tokens", a->max_new_tokens, "tokens to generate")
      ->check(non_negative_integer(std::numeric_limits<int>::max()));
  app->add_option("--temperature", a->temperature, "sampling temperature (0 = greedy)")
      ->check(non_negative_number());
  app->add_option("--top_k", a->top_k, "sample among the k most likely tokens (0 = all)")
      ->check(non_negative_integer(std::numeric_limits<int>::max()));
  app->add_option("--seed", a->seed, "sampling seed");
  app->add_option("--device", a->device, "auto | cpu | cuda");
  app->add_option("--tokenizer", a->tokenizer,
                  "bytes, or a tokenizer.json / vocab.txt (default: the one in the checkpoint, else bytes)");
  return {app, [a] { return run_generate(*a); }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(40, make_generate);

}  // namespace anvil::cli
