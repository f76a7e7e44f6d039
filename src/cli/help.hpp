// How the `anvil` command talks to a person: its --help layout, and command-line errors as one line that says
// what was wrong and what to do ("unknown flag --learing_rate (did you mean --learning_rate?)"), with
// exit status 1 like every other error.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace anvil::cli {

// --help as "  --flag TYPE   description (default: X)": descriptions wrapped to 100 columns, options in their
// groups (the config keys by section), subcommands as one line each.
class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter();
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override;
  std::string make_option(const CLI::Option* opt, bool is_positional) const override;
  std::string make_option_opts(const CLI::Option* opt) const override;
  std::string make_option_desc(const CLI::Option* opt) const override;
  std::string make_subcommand(const CLI::App* sub) const override;
};

// Validators whose messages name the rule and the value, never a numeric limit of a C++ type:
// "--top_k must be a non-negative integer, got -3".
// `max` is the largest value the option's type holds (an int's for an int option); it appears in the message
// only for a value above it.
CLI::Validator non_negative_integer(int64_t max = INT64_MAX);
CLI::Validator positive_integer(int64_t max = INT64_MAX);
CLI::Validator integer_between(int64_t lo, int64_t hi);
CLI::Validator non_negative_number();
CLI::Validator number_between(double lo, double hi);

// Gives every numeric option of `app` and of its subcommands a check that the value is a number of its
// type (CLI11's own message is "Could not convert"), and unsigned ones a sign check (CLI11 would wrap -5
// around to a huge number).
void check_numeric_options(CLI::App& app);

// The message of the one `error:` line for a command-line error: an unknown flag or command with the nearest
// valid one, a flag without its value, a value a validator refused, ...
std::string parse_error_message(const CLI::ParseError& e, CLI::App& root);

}  // namespace anvil::cli
