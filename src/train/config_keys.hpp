// The reference of every TrainConfig key: one table that `anvil train --help` / `anvil estimate --help` and
// the key tables of docs/config.md are both made from, so the two cannot drift apart. A unit test checks
// that the table names every key of TrainConfig (and nothing else) and that docs/config.md holds the
// generated text (`anvil config-reference --update docs/config.md` rewrites it).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

struct ConfigKeyDoc {
  std::string_view key;      // a TrainConfig key or an alias of one (TrainConfig::key_aliases)
  std::string_view section;  // the heading of docs/config.md it is listed under; the --help group
  std::string_view type;     // as docs/config.md writes it: int, number, bool, string, path, ...
  std::string_view meaning;  // markdown, the docs/config.md text
  // Markdown for the default column when the plain default (from TrainConfig().to_json()) needs words, e.g.
  // "0 (= block_size)"; empty: the plain default. An alias has no default of its own (`no_default`).
  std::string_view default_text = {};
  // One line for --help when the meaning's first sentence is too long or too terse; empty: that sentence.
  std::string_view summary = {};
  bool hidden = false;      // a test hook: accepted as a key and a flag, left out of --help
  bool no_default = false;  // an alias: the default column stays empty
};

// Every key and alias, grouped by section in the order of config_key_sections().
const std::vector<ConfigKeyDoc>& config_key_docs();
// The sections, in the order docs/config.md and --help list them.
const std::vector<std::string>& config_key_sections();
// The entry of `key` (a key or an alias), or nullptr.
const ConfigKeyDoc* find_config_key_doc(std::string_view key);

// The default as docs/config.md shows it (markdown) and as --help shows it (plain; "" when there is none).
std::string config_key_default_markdown(const ConfigKeyDoc& doc);
std::string config_key_default_plain(const ConfigKeyDoc& doc);
// The one-line --help description: `summary`, else the meaning's first sentence, without markdown.
std::string config_key_summary(const ConfigKeyDoc& doc);
// What --help shows after the flag for its value: INT, NUMBER, PATH, ...; "[BOOL]" for a boolean, whose
// value may be left out (a bare `--fp16` is `--fp16 true`).
std::string config_key_value_name(const ConfigKeyDoc& doc);
bool config_key_is_boolean(const ConfigKeyDoc& doc);

// The markdown table of one section (header row included, ending in a newline). Throws anvil::Error for a
// section that does not exist.
std::string config_key_table_markdown(std::string_view section);

// `document` (the text of docs/config.md) with the text between each pair of markers
//   <!-- BEGIN generated: anvil config-reference --section 'NAME' -->
//   <!-- END generated -->
// replaced by config_key_table_markdown(NAME). Throws anvil::Error for an unknown section or a marker
// without its end.
std::string regenerate_config_reference(const std::string& document);

// `text` without inline markdown: backticks and ** dropped, [label](target) -> label.
std::string strip_markdown(std::string_view text);

}  // namespace anvil
