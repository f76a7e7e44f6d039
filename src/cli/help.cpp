#include "cli/help.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string_view>
#include <vector>

#include "anvil/train_config.hpp"

namespace anvil::cli {
namespace {

constexpr size_t kHelpWidth = 100;
constexpr size_t kDescriptionColumn = 38;

// `text` split into lines of at most `width` characters at spaces (a longer word gets a line of its own).
std::vector<std::string> wrap(const std::string& text, size_t width) {
  std::vector<std::string> lines;
  std::istringstream words(text);
  std::string line, word;
  while (words >> word) {
    if (!line.empty() && line.size() + 1 + word.size() > width)
      lines.push_back(std::move(line)), line.clear();
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) lines.push_back(line);
  return lines;
}

// "  left      text..." with the text wrapped in its own column; a long left side puts the text below.
std::string two_columns(const std::string& left, const std::string& text) {
  std::string out = "  " + left;
  const std::vector<std::string> lines = wrap(text, kHelpWidth - kDescriptionColumn);
  if (lines.empty()) return out + "\n";
  if (out.size() + 1 > kDescriptionColumn)
    out += "\n", out += std::string(kDescriptionColumn, ' ');
  else
    out += std::string(kDescriptionColumn - out.size(), ' ');
  for (size_t i = 0; i < lines.size(); ++i)
    out += (i ? std::string(kDescriptionColumn, ' ') : "") + lines[i] + "\n";
  return out;
}

// The user's arguments are echoed in messages: their control characters (a newline inside a quoted
// argument, say) are written as escapes, so that the message stays one line and shows what was typed.
std::string escape_control_characters(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
      out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    else
      out += c;
  }
  return out;
}

// A default as the user would type it: control characters escaped ("\n").
std::string printable(const std::string& value) {
  return escape_control_characters(value);
}

std::optional<int64_t> parse_integer(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_number(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s.front()))) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// Validators return "" for a good value, else "must be ..., got X"; parse_error_message puts the flag first.
CLI::Validator integer_check(const std::string& what, int64_t lo, int64_t hi) {
  return CLI::Validator(
      [what, lo, hi](std::string& value) -> std::string {
        const std::optional<int64_t> v = parse_integer(value);
        if (v && *v >= lo && *v <= hi) return "";
        if (v && *v > hi) return fmt::format("must be at most {}, got {}", hi, value);
        return fmt::format("must be {}, got {}", what, value.empty() ? "\"\"" : value);
      },
      "");
}

CLI::Validator number_check(const std::string& what, double lo, double hi) {
  return CLI::Validator(
      [what, lo, hi](std::string& value) -> std::string {
        const std::optional<double> v = parse_number(value);
        if (v && *v >= lo && *v <= hi) return "";
        return fmt::format("must be {}, got {}", what, value.empty() ? "\"\"" : value);
      },
      "");
}

std::string command_path(const CLI::App* app) {
  std::string path = app->get_name();
  for (const CLI::App* p = app->get_parent(); p; p = p->get_parent()) path = p->get_name() + " " + path;
  return path;
}

// The innermost subcommand on the command line (the root when there is none).
CLI::App* chosen_command(CLI::App& root) {
  CLI::App* app = &root;
  while (!app->get_subcommands().empty()) app = app->get_subcommands().front();
  return app;
}

bool looks_like_flag(const std::string& arg) {
  return arg.size() > 1 && arg.front() == '-' && !parse_number(arg);
}

std::string unknown_flag_message(const std::string& arg, CLI::App* cmd) {
  const std::string flag = arg.substr(0, arg.find('='));
  if (cmd->get_parent() == nullptr)
    return fmt::format(
        "unknown flag {}: flags go after a command (anvil COMMAND --flags); run 'anvil --help' "
        "for the commands",
        flag);
  std::vector<std::string> names;
  for (const CLI::Option* opt : cmd->get_options())
    for (const std::string& name : opt->get_lnames())
      if (name != "help") names.push_back(name);
  // The name without its dashes; "--=x" has none (found by fuzz_train_flags: substr threw).
  const size_t name_start = flag.find_first_not_of('-');
  const std::string bare = name_start == std::string::npos ? "" : flag.substr(name_start);
  const std::string near = bare.empty() ? "" : nearest_key(bare, names);
  if (!near.empty()) return fmt::format("unknown flag {} (did you mean --{}?)", flag, near);
  return fmt::format("unknown flag {}; run '{} --help' for the flags", flag, command_path(cmd));
}

std::string unknown_command_message(const std::string& arg, CLI::App& root) {
  std::vector<std::string> names;
  for (const CLI::App* sub : root.get_subcommands([](CLI::App* s) { return !s->get_group().empty(); }))
    names.push_back(sub->get_name());
  const std::string near = nearest_key(arg, names);
  if (!near.empty()) return fmt::format("unknown command '{}' (did you mean '{}'?)", arg, near);
  return fmt::format("unknown command '{}'; run 'anvil --help' for the commands", arg);
}

// "--x: rest" -> {"--x", "rest"} when the message starts with a flag name.
std::optional<std::pair<std::string, std::string>> flag_and_rest(const std::string& msg) {
  if (msg.empty() || msg.front() != '-') return std::nullopt;
  const size_t colon = msg.find(": ");
  if (colon == std::string::npos || msg.substr(0, colon).find(' ') != std::string::npos) return std::nullopt;
  return std::make_pair(msg.substr(0, colon), msg.substr(colon + 2));
}

std::string one_line(std::string msg) {
  for (char& c : msg)
    if (c == '\n') c = ' ';
  while (!msg.empty() && msg.back() == ' ') msg.pop_back();
  return msg;
}

}  // namespace

HelpFormatter::HelpFormatter() {
  column_width(kDescriptionColumn);
}

std::string HelpFormatter::make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const {
  // CLI11 puts two blank lines between groups; one reads better.
  std::string out = CLI::Formatter::make_help(app, std::move(name), mode);
  for (size_t pos; (pos = out.find("\n\n\n")) != std::string::npos;) out.erase(pos, 1);
  return out;
}

std::string HelpFormatter::make_option(const CLI::Option* opt, bool is_positional) const {
  return two_columns(make_option_name(opt, is_positional) + make_option_opts(opt), make_option_desc(opt));
}

std::string HelpFormatter::make_option_opts(const CLI::Option* opt) const {
  if (opt->get_type_size() == 0) return "";  // a flag without a value
  std::string type = opt->get_type_name();
  if (type == "FLOAT") type = "NUMBER";
  if (type == "UINT") type = "INT";
  if (opt->get_expected_max() >= CLI::detail::expected_max_vector_size) type += " ...";
  return type.empty() ? "" : " " + type;
}

std::string HelpFormatter::make_option_desc(const CLI::Option* opt) const {
  std::string desc = opt->get_description();
  if (opt->get_required()) return desc + " (required)";
  // The captured default, unless the description tells it in words or there is none (an empty list).
  const std::string& value = opt->get_default_str();
  if (opt->get_type_size() != 0 && !value.empty() && value != "[]" &&
      desc.find("(default") == std::string::npos)
    desc += fmt::format(" (default: {})", printable(value));
  return desc;
}

std::string HelpFormatter::make_subcommand(const CLI::App* sub) const {
  return two_columns(sub->get_name(), sub->get_description());
}

CLI::Validator non_negative_integer(int64_t max) {
  return integer_check("a non-negative integer", 0, max);
}

CLI::Validator positive_integer(int64_t max) {
  return integer_check("a positive integer", 1, max);
}

CLI::Validator integer_between(int64_t lo, int64_t hi) {
  return integer_check(fmt::format("an integer between {} and {}", lo, hi), lo, hi);
}

CLI::Validator non_negative_number() {
  return number_check("a non-negative number", 0, INFINITY);
}

CLI::Validator number_between(double lo, double hi) {
  return number_check(fmt::format("a number between {} and {}", lo, hi), lo, hi);
}

void check_numeric_options(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_size() == 0) continue;
    const std::string type = opt->get_type_name();
    if (type == "INT") opt->check(integer_check("an integer", INT64_MIN, INT64_MAX));
    if (type == "UINT") opt->check(non_negative_integer());
    if (type == "FLOAT") opt->check(number_check("a number", -INFINITY, INFINITY));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) check_numeric_options(*sub);
}

namespace {

std::string describe_parse_error(const CLI::ParseError& e, CLI::App& root) {
  CLI::App* cmd = chosen_command(root);
  const std::string msg = one_line(e.what());
  if (dynamic_cast<const CLI::ExtrasError*>(&e)) {
    // An unknown flag first (its value, if any, is left over too), then any other argument.
    std::vector<std::string> left = cmd->remaining();
    for (const std::string& arg : root.remaining(true)) left.push_back(arg);
    for (const std::string& arg : left)
      if (looks_like_flag(arg)) return unknown_flag_message(arg, cmd);
    if (!left.empty() && cmd == &root) return unknown_command_message(left.front(), root);
    if (!left.empty())
      return fmt::format("unexpected argument '{}'; run '{} --help' for the flags", left.front(),
                         command_path(cmd));
    return msg;
  }
  if (dynamic_cast<const CLI::ConversionError*>(&e) && msg.starts_with("Could not convert: ")) {
    // "Could not convert: --x = 99999999999": a value the option's type cannot hold.
    const std::string what = msg.substr(19);
    const size_t eq = what.find(" = ");
    if (eq != std::string::npos)
      return fmt::format("{} cannot take the value {} (out of range or of the wrong kind)",
                         what.substr(0, eq), what.substr(eq + 3));
  }
  const auto flag = flag_and_rest(msg);
  if (dynamic_cast<const CLI::ValidationError*>(&e) && flag && flag->second.starts_with("must be "))
    return flag->first + " " + flag->second;  // "--top_k must be a non-negative integer, got -3"
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e)) {
    // "--x: 1 required TEXT missing", "Expected exactly 1 arguments to --x, got 0"
    if (flag && flag->second.ends_with("missing")) return flag->first + " needs a value";
    const size_t to = msg.find(" arguments to ");
    if (msg.starts_with("Expected") && to != std::string::npos && msg.ends_with(", got 0"))
      return msg.substr(to + 14, msg.size() - to - 14 - 7) + " needs a value";
  }
  return msg;
}

}  // namespace

std::string parse_error_message(const CLI::ParseError& e, CLI::App& root) {
  return escape_control_characters(describe_parse_error(e, root));
}

}  // namespace anvil::cli
