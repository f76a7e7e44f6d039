// anvil generate: continue prompts with a causal LM (gpt2, llama, qwen2, mistral) from a checkpoint or a
// Hugging Face model directory, with a KV cache; several prompts decode together (docs/generation.md).
// stdout holds only the results (text, or with --prompt_ids one line of ids per prompt); the speed line and
// notes go to stderr. Text prompts take the special tokens the model's tokenizer puts before a text
// (Tokenizer::encode_prompt: <s> for Llama 2), and the new tokens are decoded after the prompt's
// (decode_continuation), so that SentencePiece's leading spaces come out right.
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <limits>
#include <memory>
#include <string_view>

#include "anvil/rng.hpp"
#include "cli/command.hpp"
#include "cli/help.hpp"
#include "data/tokenizer.hpp"
#include "io/checkpoint.hpp"
#include "train/sampler.hpp"

namespace anvil::cli {
namespace {

struct GenerateArgs {
  std::string checkpoint, adapter, device = "auto", tokenizer, precision = "fp32", quantization = "none";
  std::vector<std::string> prompts, prompt_ids;
  int max_new_tokens = 200, top_k = 40;
  double temperature = 0.8, top_p = 1.0;
  uint64_t seed = 42;
};

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::FP32;
  if (name == "bf16") return Precision::BF16;
  if (name == "fp16") return Precision::FP16;
  ANVIL_THROW("--precision must be fp32, bf16 or fp16, got '{}'", name);
}

// "15496 11 995": ids separated by white space, each in the model's vocabulary.
std::vector<int32_t> parse_prompt_ids(const std::string& text, const TransformerConfig& cfg,
                                      const std::string& checkpoint) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (true) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i == text.size()) break;
    size_t end = i;
    while (end < text.size() && !std::isspace(static_cast<unsigned char>(text[end]))) ++end;
    const std::string_view word(text.data() + i, end - i);
    int64_t id = 0;
    const auto [p, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    ANVIL_REQUIRE(
        ec == std::errc() && p == word.data() + word.size(),
        "--prompt_ids '{}': '{}' is not a token id (give ids separated by spaces, e.g. \"15496 11\")", text,
        word);
    ANVIL_REQUIRE(id >= 0 && id < cfg.vocab_size,
                  "--prompt_ids '{}': token id {} is outside the vocabulary of the model in {} (0 to {})",
                  text, id, checkpoint, cfg.vocab_size - 1);
    ids.push_back(int32_t(id));
    i = end;
  }
  ANVIL_REQUIRE(!ids.empty(), "--prompt_ids '{}': no token ids (give at least one)", text);
  return ids;
}

int run_generate(const GenerateArgs& a) {
  ANVIL_REQUIRE(a.prompts.empty() || a.prompt_ids.empty(),
                "--prompt and --prompt_ids both given: give text prompts or token ids, not both");
  ANVIL_REQUIRE(a.top_p > 0 && a.top_p <= 1, "--top_p must be in (0, 1], got {}", a.top_p);
  const Precision precision = parse_precision(a.precision);
  const TransformerConfig cfg = io::read_model_config(a.checkpoint);
  ANVIL_REQUIRE(
      !cfg.is_bert(),
      "{}: a BERT sequence classifier generates no text (anvil generate needs a causal language model: "
      "gpt2, llama, qwen2 or mistral); classify texts with `anvil predict --model {}`",
      a.checkpoint, a.checkpoint);

  // The prompts as ids; text needs the tokenizer (and decodes the results with it), ids do not.
  const bool ids_mode = !a.prompt_ids.empty();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> texts;
  std::unique_ptr<data::Tokenizer> tok;
  if (ids_mode) {
    for (const std::string& p : a.prompt_ids) prompts.push_back(parse_prompt_ids(p, cfg, a.checkpoint));
  } else {
    const std::string spec = a.tokenizer.empty() ? io::find_tokenizer_file(a.checkpoint) : a.tokenizer;
    tok = data::load_tokenizer(spec.empty() ? "bytes" : spec);
    // Ids of another vocabulary decode to other text (or fail half-way): the model's vocabulary is the
    // tokenizer's, as training makes it.
    ANVIL_REQUIRE(
        tok->vocab_size() == uint64_t(cfg.vocab_size),
        "the tokenizer '{}' has {} tokens but the model in {} has a vocabulary of {}: its ids would "
        "decode to other text; give the tokenizer the model was trained with (--tokenizer)",
        spec.empty() ? "bytes" : spec, tok->vocab_size(), a.checkpoint, cfg.vocab_size);
    texts = a.prompts.empty() ? std::vector<std::string>{"\n"} : a.prompts;
    for (const std::string& text : texts) {
      // As transformers' tokenizer(text) gives them (<s> first for Llama 2), but never an EOS after the
      // prompt: the model is to continue it.
      std::vector<int32_t> ids;
      for (uint32_t id : tok->encode_prompt(text)) ids.push_back(int32_t(id));
      ANVIL_REQUIRE(!ids.empty(), "--prompt '{}' is empty: it encodes to no tokens (give some text)", text);
      prompts.push_back(std::move(ids));
    }
  }
  const char* flag = ids_mode ? "--prompt_ids" : "--prompt";
  size_t longest = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    ANVIL_REQUIRE(
        prompts[b].size() <= size_t(cfg.block_size),
        "{} {} of {}: {} tokens, more than the model's block_size {} (the longest sequence it takes, "
        "{}/config.json); shorten it",
        flag, b + 1, prompts.size(), prompts[b].size(), cfg.block_size, a.checkpoint);
    longest = std::max(longest, prompts[b].size());
  }

  // The cache holds each prompt and its new tokens but the last one, up to block_size positions.
  GeneratorOptions o;
  o.device = resolve_device(a.device);
  o.precision = precision;
  o.weight_storage = parse_weight_storage(a.quantization, "--quantization");
  o.max_batch = int(prompts.size());
  o.max_len = int(std::min<int64_t>(cfg.block_size, int64_t(longest) + std::max(a.max_new_tokens - 1, 0)));
  Generator gen(cfg, o);
  io::load_model_weights(a.checkpoint, gen.decoder(), gen.device(), a.adapter);
  if (const QuantizedWeights* q = gen.decoder().param_store().quantized())
    fmt::print(stderr, "weights: {} block matrices in {} ({}), {} other parameters in {} ({})\n",
               q->matrices(), weight_storage_name(q->storage()), format_bytes(q->quantized_bytes()),
               q->dense_numel(), a.precision,
               format_bytes(dtype_bytes(precision_dtype(precision), q->dense_numel())));

  Rng rng(a.seed);
  const SampleOptions so{a.max_new_tokens, float(a.temperature), a.top_k, float(a.top_p)};
  GenerationStats st;
  const std::vector<std::vector<int32_t>> out = gen.generate(prompts, so, rng, &st);

  // stdout is flushed before each stderr line, so a terminal shows them in order.
  for (size_t b = 0; b < out.size(); ++b) {
    if (ids_mode) {
      fmt::print("{}\n", fmt::join(out[b], " "));
    } else {
      if (out.size() > 1) fmt::print("--- {} of {} ---\n", b + 1, out.size());
      // Decoded after the prompt's ids: a SentencePiece decoder drops a leading space only at the start.
      const std::vector<uint32_t> context(prompts[b].begin(), prompts[b].end()),
          ids(out[b].begin(), out[b].end());
      fmt::print("{}{}\n", texts[b], tok->decode_continuation(context, ids));
    }
    std::fflush(stdout);
    if (st.cache_full[b] && o.max_len == cfg.block_size)
      fmt::print(stderr, "note: sequence {} stopped at the model's block_size ({} positions)\n", b + 1,
                 cfg.block_size);
  }
  // Decode steps per second is the tokens/s of each sequence while they decode.
  const double seconds = st.prefill_seconds + st.decode_seconds;
  fmt::print(
      stderr,
      "generated {} tokens in {:.3f} s: {:.1f} tokens/s ({} sequences; prefill of {} prompt tokens {:.3f} "
      "s; {} decode steps {:.3f} s: {:.1f} steps/s) on {}, {}\n",
      st.new_tokens, seconds, seconds > 0 ? double(st.new_tokens) / seconds : 0.0, out.size(),
      st.prompt_tokens, st.prefill_seconds, st.decode_steps, st.decode_seconds,
      st.decode_seconds > 0 ? st.decode_steps / st.decode_seconds : 0.0, gen.device().name(), a.precision);
  return 0;
}

Command make_generate(CLI::App& parent) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* app = parent.add_subcommand(
      "generate",
      "continue prompts with a causal LM (gpt2, llama, qwen2, mistral): checkpoint or HF directory");
  app->add_option("--checkpoint", a->checkpoint, "checkpoint or HF model directory")->required();
  app->add_option("--adapter", a->adapter,
                  "a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) kept apart "
                  "from --checkpoint, its base: merged into the base's weights");
  // allow_extra_args(false): each flag takes one prompt, repeat the flag for a batch.
  app->add_option("--prompt", a->prompts, "text to continue; repeat for a batch decoded together")
      ->allow_extra_args(false)
      ->default_str("\n");
  app->add_option(
         "--prompt_ids", a->prompt_ids,
         "token ids to continue, e.g. \"15496 11\" (repeat for a batch); prints the new ids, one line "
         "per prompt, instead of text")
      ->allow_extra_args(false);
  app->add_option("--max_new_tokens", a->max_new_tokens, "tokens to generate per prompt")
      ->check(non_negative_integer(std::numeric_limits<int>::max()));
  app->add_option("--temperature", a->temperature, "sampling temperature (0 = greedy)")
      ->check(non_negative_number());
  app->add_option("--top_k", a->top_k, "sample among the k most likely tokens (0 = all)")
      ->check(non_negative_integer(std::numeric_limits<int>::max()));
  app->add_option("--top_p", a->top_p,
                  "nucleus: sample among the most likely tokens whose probabilities sum "
                  "to top_p, in (0, 1] (1 = all)");
  app->add_option("--seed", a->seed, "sampling seed");
  app->add_option("--device", a->device, "auto | cpu | cuda");
  app->add_option("--precision", a->precision, "fp32 | bf16 | fp16 (weights, activations and the KV cache)");
  app->add_option("--quantization", a->quantization,
                  "none | int8 | nf4 | nf4-dq: keep the block Linear weights quantized (bitsandbytes' "
                  "load_in_8bit / load_in_4bit nf4; nf4-dq with bnb_4bit_use_double_quant), dequantized to "
                  "--precision before each matmul");
  app->add_option("--tokenizer", a->tokenizer,
                  "bytes, or a tokenizer.json / vocab.txt (default: the one in the checkpoint, else bytes)");
  return {app, [a] { return run_generate(*a); }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(40, make_generate);

}  // namespace anvil::cli
