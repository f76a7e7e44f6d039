// The `anvil` command. Each subcommand lives in src/cli/cmd_*.cpp and registers itself.
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "anvil/error.hpp"
#include "cli/command.hpp"
#include "cli/help.hpp"

int main(int argc, char** argv) {
  CLI::App app{"anvil: train and fine-tune transformer language models on CPU and CUDA", "anvil"};
  // Set before the subcommands exist: they inherit the formatter and the option defaults.
  app.formatter(std::make_shared<anvil::cli::HelpFormatter>());
  app.option_defaults()->always_capture_default();
  app.require_subcommand(0, 1);
  std::vector<anvil::cli::Command> commands;
  for (anvil::cli::CommandFactory make : anvil::cli::registered_commands()) {
    commands.push_back(make(app));
    // Hidden commands (tools for the docs) set group "" themselves.
    if (!commands.back().app->get_group().empty()) commands.back().app->group("Commands");
  }
  anvil::cli::check_numeric_options(app);
  // After the subcommands were made, so that only `anvil --help` shows it.
  app.footer(
      "\nRun 'anvil COMMAND --help' for a command's flags. README.md is the place to start; docs/config.md "
      "describes every training key.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {  // --help: the help on stdout, exit status 0
    return app.exit(e);
  } catch (const CLI::ParseError& e) {  // one line, exit status 1, as for every other error
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", anvil::cli::parse_error_message(e, app));
    return 1;
  }
  if (app.get_subcommands().empty()) {  // plain `anvil`: the commands
    fmt::print("{}", app.help());
    return 0;
  }
  try {
    for (const anvil::cli::Command& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const std::exception& e) {  // anvil::Error and anything unexpected: one line, exit code 1
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 1;
}
