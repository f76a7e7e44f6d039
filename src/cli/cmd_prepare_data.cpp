// anvil prepare-data: text -> train/validation token shards.
#include <memory>

#include "cli/command.hpp"
#include "data/byte_corpus.hpp"

namespace anvil::cli {
namespace {

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string out;
  double val_fraction = 0.1;
};

Command make_prepare_data(CLI::App& parent) {
  auto a = std::make_shared<PrepareArgs>();
  CLI::App* app =
      parent.add_subcommand("prepare-data", "byte-level tokenise text files into train/val token shards");
  app->add_option("--input", a->inputs, "text file(s) or directories")->required();
  app->add_option("--output", a->out, "output directory (train.bin, val.bin)")->required();
  app->add_option("--val_fraction", a->val_fraction, "fraction of the corpus (its end) kept for validation");
  return {app, [a] {
            const data::PrepareStats s = data::prepare_byte_corpus(a->inputs, a->out, a->val_fraction);
            fmt::print("prepared {} bytes: {} train tokens -> {}, {} validation tokens -> {}\n", s.bytes_read,
                       s.train_tokens, s.train_path, s.val_tokens, s.val_path);
            return 0;
          }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(30, make_prepare_data);

}  // namespace anvil::cli
