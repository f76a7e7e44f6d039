// libFuzzer target: the `anvil train` command line (CLI11 with the config flags of src/cli/config_flags) on
// arbitrary arguments, the input's NUL bytes separating them. Beyond "no crash": a parse error becomes the
// one-line message main() prints, and flags that parse resolve into a TrainConfig or an anvil::Error.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/config_flags.hpp"
#include "cli/help.hpp"
#include "fuzz_common.hpp"

namespace {

std::vector<std::string> split_arguments(const uint8_t* data, size_t size) {
  std::vector<std::string> args(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0)
      args.emplace_back();
    else
      args.back().push_back(char(data[i]));
  }
  return args;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> args = split_arguments(data, size);
  // A value naming an existing path may be read (--config, --model, --deepspeed): this machine's files
  // would decide the outcome, so such inputs are skipped.
  for (const std::string& a : args) {
    std::error_code ec;
    if (!a.empty() && std::filesystem::exists(a, ec)) return 0;
  }
  // The app as main() builds it, with the one command that takes the config flags.
  CLI::App app{"anvil", "anvil"};
  app.formatter(std::make_shared<anvil::cli::HelpFormatter>());
  app.option_defaults()->always_capture_default();
  app.require_subcommand(0, 1);
  anvil::cli::ConfigFlags flags;
  flags.add_to(app.add_subcommand("train", "train a model"));
  anvil::cli::check_numeric_options(app);

  std::vector<const char*> argv{"anvil", "train"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app.parse(int(argv.size()), argv.data());
  } catch (const CLI::Success&) {
    return 0;  // --help
  } catch (const CLI::ParseError& e) {
    const std::string message = anvil::cli::parse_error_message(e, app);
    anvil::fuzz::check(!message.empty() && message.find('\n') == std::string::npos,
                       "a command-line error is not one line: '" + message + "'");
    return 0;
  }
  anvil::fuzz::succeeds([&] { (void)flags.resolve(); });
  return 0;
}
