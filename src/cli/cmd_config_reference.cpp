// anvil config-reference: the key tables of docs/config.md, made from the key table that --help also reads
// (src/train/config_keys.hpp). Hidden from the command list: a tool for keeping the docs in step.
//   anvil config-reference                      every section, as markdown
//   anvil config-reference --section 'Run'      one section's table
//   anvil config-reference --update docs/config.md   rewrite the generated blocks of that file in place
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "anvil/error.hpp"
#include "cli/command.hpp"
#include "train/config_keys.hpp"

namespace anvil::cli {
namespace {

struct ReferenceArgs {
  std::string section, update;
};

int run_config_reference(const ReferenceArgs& a) {
  if (!a.update.empty()) {
    std::ifstream in(a.update);
    ANVIL_REQUIRE(in.good(), "--update {}: cannot be read", a.update);
    std::stringstream text;
    text << in.rdbuf();
    const std::string updated = regenerate_config_reference(text.str());
    if (updated == text.str()) {
      fmt::print("{}: up to date\n", a.update);
      return 0;
    }
    // A temporary file renamed over the original: an interrupted write leaves the old text.
    const std::string tmp = a.update + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary);
      out << updated;
      ANVIL_REQUIRE(out.good(), "{}: cannot be written", tmp);
    }
    std::filesystem::rename(tmp, a.update);
    fmt::print("{}: generated tables rewritten\n", a.update);
    return 0;
  }
  if (!a.section.empty()) {
    fmt::print("{}", config_key_table_markdown(a.section));
    return 0;
  }
  for (const std::string& section : config_key_sections())
    fmt::print("## {}\n\n{}\n", section, config_key_table_markdown(section));
  return 0;
}

Command make_config_reference(CLI::App& parent) {
  auto a = std::make_shared<ReferenceArgs>();
  CLI::App* app =
      parent.add_subcommand("config-reference", "print the training keys' reference tables (docs/config.md)");
  app->group("");  // hidden from `anvil --help`
  app->add_option("--section", a->section, "one section's table, e.g. 'Batch and length'");
  app->add_option("--update", a->update, "rewrite the generated blocks of this markdown file in place");
  return {app, [a] { return run_config_reference(*a); }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(90, make_config_reference);

}  // namespace anvil::cli
