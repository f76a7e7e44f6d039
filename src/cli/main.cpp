// The `anvil` command. Each subcommand lives in src/cli/cmd_*.cpp and registers itself.
#include <fmt/format.h>

#include <cstdio>

#include "anvil/error.hpp"
#include "cli/command.hpp"

int main(int argc, char** argv) {
  CLI::App app{"anvil: train and fine-tune transformer language models on CPU and CUDA"};
  app.require_subcommand(1);
  std::vector<anvil::cli::Command> commands;
  for (anvil::cli::CommandFactory make : anvil::cli::registered_commands()) commands.push_back(make(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
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
