// anvil train-tokenizer: learn a byte-level BPE from text files and write a Hugging Face tokenizer.json.
#include <memory>

#include "cli/command.hpp"
#include "cli/help.hpp"
#include "data/bpe_trainer.hpp"

namespace anvil::cli {
namespace {

struct TrainTokenizerArgs {
  std::vector<std::string> inputs;
  std::string output;
  data::BpeTrainOptions options;
};

Command make_train_tokenizer(CLI::App& parent) {
  auto a = std::make_shared<TrainTokenizerArgs>();
  // For the list options, allow_extra_args(false) stops CLI11 from reading "[PAD]" as a list ("[a,b]"
  // syntax) and stripping its brackets; expected(1, N) still takes several values after one flag.
  CLI::App* app = parent.add_subcommand(
      "train-tokenizer", "train a byte-level BPE (GPT-2 style) on text files and write a tokenizer.json");
  app->add_option("--input", a->inputs, "text file(s) or directories (read recursively, in path order)")
      ->required()
      ->allow_extra_args(false)
      ->expected(1, 1 << 20);
  // Signs checked before conversion: CLI11 would wrap "-5" into a huge unsigned value.
  app->add_option("--vocab_size", a->options.vocab_size, "256 byte tokens + merges + special tokens")
      ->required()
      ->check(non_negative_integer(UINT32_MAX));
  app->add_option("--output", a->output, "the tokenizer.json to write")->required();
  app->add_option("--special_tokens", a->options.special_tokens,
                  "special tokens, e.g. \"<|endoftext|>\" (ids after the BPE tokens, in this order)")
      ->allow_extra_args(false)
      ->expected(1, 4096);
  app->add_option("--min_frequency", a->options.min_frequency, "stop when no pair occurs this many times")
      ->check(non_negative_integer());
  app->add_option("--threads", a->options.threads, "threads for counting and merging (0 = all cores)")
      ->check(integer_between(0, 4096));
  return {app, [a] {
            const data::TrainTokenizerStats s = data::train_tokenizer(a->inputs, a->output, a->options);
            fmt::print(
                "trained byte-level BPE: {} tokens (256 bytes + {} merges + {} special) from {:.1f} MB "
                "({} words, {} distinct); counting {:.2f}s, merging {:.2f}s -> {}\n",
                s.vocab_size, s.merges, a->options.special_tokens.size(), s.count.bytes / 1e6, s.count.words,
                s.distinct_words, s.count.seconds, s.train_seconds, a->output);
            if (s.stopped_early)
              fmt::print(
                  "note: stopped below --vocab_size {}: no pair of tokens occurs --min_frequency {} times\n",
                  a->options.vocab_size, a->options.min_frequency);
            return 0;
          }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(35, make_train_tokenizer);

}  // namespace anvil::cli
