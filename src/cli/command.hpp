// Subcommands of the `anvil` executable. Each lives in its own cmd_*.cpp and registers itself with
// ANVIL_REGISTER_COMMAND; main() builds the CLI11 app from the registry, parses, and runs the chosen one.
#pragma once
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <functional>
#include <vector>

namespace anvil::cli {

struct Command {
  CLI::App* app = nullptr;   // the subcommand, with its options bound to state the runner owns
  std::function<int()> run;  // runs it; throws anvil::Error on bad input; returns the exit code
};

using CommandFactory = Command (*)(CLI::App& parent);

// `order` places the command in the help listing. Returns a dummy so it can initialise a static.
int register_command(int order, CommandFactory factory);
std::vector<CommandFactory> registered_commands();  // in order

}  // namespace anvil::cli

#define ANVIL_REGISTER_COMMAND(order, factory) \
  [[maybe_unused]] static const int anvil_registered_##factory = ::anvil::cli::register_command(order, factory)
