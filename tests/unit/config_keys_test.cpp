// The key table (src/train/config_keys.hpp): it names every TrainConfig key and nothing else, docs/config.md
// holds its generated text, `anvil train --help` shows it, and flag values are blamed on their flags.
#include "train/config_keys.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "anvil/train_config.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ConfigKeys, EveryKeyAndAliasHasOneEntry) {
  std::set<std::string> names;
  for (const std::string& key : TrainConfig::keys()) names.insert(key);
  for (const auto& [alias, key] : TrainConfig::key_aliases()) names.insert(alias);
  for (const std::string& name : names)
    EXPECT_NE(find_config_key_doc(name), nullptr) << name << " has no entry";
  std::set<std::string> seen;
  for (const ConfigKeyDoc& d : config_key_docs()) {
    const std::string key(d.key);
    EXPECT_TRUE(names.contains(key)) << "the table documents '" << key << "', which is no TrainConfig key";
    EXPECT_TRUE(seen.insert(key).second) << key << " has two entries";
  }
}

TEST(ConfigKeys, EntriesAreComplete) {
  const json defaults = TrainConfig().to_json();
  const auto& sections = config_key_sections();
  EXPECT_EQ(sections.front(), "Model");
  for (const ConfigKeyDoc& d : config_key_docs()) {
    const std::string key(d.key);
    EXPECT_FALSE(d.type.empty()) << key;
    EXPECT_FALSE(d.meaning.empty()) << key;
    EXPECT_EQ(d.meaning.find('\n'), std::string_view::npos) << key << ": a table cell is one line";
    // An alias has no default of its own; every key has one, plain from to_json or written out.
    const bool alias = TrainConfig::key_aliases().contains(key);
    EXPECT_EQ(d.no_default, alias) << key;
    EXPECT_TRUE(alias || !d.default_text.empty() || defaults.contains(key)) << key;
    // Sections are contiguous, so each is one table and one --help group.
    const auto first = std::find_if(config_key_docs().begin(), config_key_docs().end(),
                                    [&](const ConfigKeyDoc& o) { return o.section == d.section; });
    const auto last = std::find_if(first, config_key_docs().end(),
                                   [&](const ConfigKeyDoc& o) { return o.section != d.section; });
    EXPECT_TRUE(&d >= &*first && (last == config_key_docs().end() || &d < &*last)) << key;
    const std::string summary = config_key_summary(d);
    EXPECT_FALSE(summary.empty()) << key;
    EXPECT_LE(summary.size(), 200u) << key << ": the --help line is too long: " << summary;
    EXPECT_EQ(summary.find('`'), std::string::npos) << key;
    EXPECT_EQ(summary.find('\n'), std::string::npos) << key;
  }
}

TEST(ConfigKeys, DefaultsComeFromTrainConfig) {
  EXPECT_EQ(config_key_default_markdown(*find_config_key_doc("learning_rate")), "5e-5");
  EXPECT_EQ(config_key_default_markdown(*find_config_key_doc("adam_epsilon")), "1e-8");
  EXPECT_EQ(config_key_default_markdown(*find_config_key_doc("per_device_train_batch_size")), "8");
  EXPECT_EQ(config_key_default_markdown(*find_config_key_doc("output_dir")), "`runs/default`");
  EXPECT_EQ(config_key_default_markdown(*find_config_key_doc("val_data")), "`\"\"`");
  EXPECT_EQ(config_key_default_markdown(*find_config_key_doc("cuda_graphs")), "true");
  EXPECT_EQ(config_key_default_markdown(*find_config_key_doc("overwrite_output_dir")), "false");
  EXPECT_EQ(config_key_default_markdown(*find_config_key_doc("max_seq_length")), "0 (= block_size)");
  EXPECT_EQ(config_key_default_plain(*find_config_key_doc("val_data")), "\"\"");
  EXPECT_EQ(config_key_default_plain(*find_config_key_doc("model_name_or_path")), "");
}

TEST(ConfigKeys, SummaryIsTheFirstSentenceWithoutMarkdown) {
  EXPECT_EQ(config_key_summary(*find_config_key_doc("learning_rate")), "Peak learning rate.");
  // "1..block_size" and the parenthesis do not end the sentence; the code span loses its backticks.
  EXPECT_EQ(config_key_summary(*find_config_key_doc("max_seq_length")),
            "Tokens per training sequence (1..block_size).");
  EXPECT_EQ(config_key_summary(*find_config_key_doc("max_steps")),
            "Optimizer steps; when > 0 it overrides num_train_epochs.");
  EXPECT_EQ(strip_markdown("**Testing hook.** see [memory.md](memory.md#x) and `a`, in [0, 1)"),
            "Testing hook. see memory.md and a, in [0, 1)");
}

TEST(ConfigKeys, TablesAreMarkdown) {
  const std::string table = config_key_table_markdown("Run");
  EXPECT_EQ(table.rfind("| key | type | default | meaning |\n| --- | --- | --- | --- |\n", 0), 0u);
  EXPECT_NE(table.find("| `save_total_limit` | int | 0 (keep all) | Keep at most this many"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("| `overwrite_output_dir` | bool | false |"), std::string::npos) << table;
  EXPECT_NE(config_key_table_markdown("Model").find("| `model_name_or_path` | path | | "), std::string::npos);
  EXPECT_NE(error_of([] { config_key_table_markdown("Nowhere"); }).find("unknown config section 'Nowhere'"),
            std::string::npos);
}

TEST(ConfigKeys, RegeneratesOnlyBetweenMarkers) {
  const std::string doc =
      "intro\n<!-- BEGIN generated: anvil config-reference --section 'DeepSpeed config' -->\nstale\n"
      "<!-- END generated -->\nprose\n";
  EXPECT_EQ(regenerate_config_reference(doc),
            "intro\n<!-- BEGIN generated: anvil config-reference --section 'DeepSpeed config' -->\n" +
                config_key_table_markdown("DeepSpeed config") + "<!-- END generated -->\nprose\n");
  EXPECT_NE(error_of([] {
              regenerate_config_reference(
                  "<!-- BEGIN generated: anvil config-reference --section 'Run' -->\nno end\n");
            }).find("has no '<!-- END generated -->'"),
            std::string::npos);
}

// docs/config.md holds the generated tables: edit src/train/config_keys.cpp, then run
// `anvil config-reference --update docs/config.md`.
TEST(ConfigKeys, DocsConfigMdIsGenerated) {
  const std::string path = std::string(ANVIL_SOURCE_DIR) + "/docs/config.md";
  const std::string doc = read_text(path);
  ASSERT_FALSE(doc.empty()) << path;
  for (const std::string& section : config_key_sections())
    EXPECT_NE(doc.find("<!-- BEGIN generated: anvil config-reference --section '" + section + "' -->"),
              std::string::npos)
        << "docs/config.md has no generated table for section '" << section << "'";
  EXPECT_TRUE(doc == regenerate_config_reference(doc))
      << "docs/config.md differs from the key table: run `anvil config-reference --update docs/config.md`";
}

TEST(ConfigKeys, FlagValuesAreBlamedOnTheFlag) {
  const std::map<std::string, std::string> flags = {{"learning_rate", "--learning_rate"},
                                                    {"init_from", "--model_name_or_path"}};
  EXPECT_EQ(error_of([&] {
              TrainConfig::from_json({{"learning_rate", "abc"}}, "run.json", flags);
            }),
            "--learning_rate must be a number, got \"abc\"");
  EXPECT_EQ(error_of([&] {
              TrainConfig::from_json({{"learning_rate", -3}}, "run.json", flags);
            }),
            "--learning_rate must be in [0, 10), got -3");
  // The same values from the file keep the file's messages.
  EXPECT_EQ(error_of([] {
              TrainConfig::from_json({{"learning_rate", "abc"}}, "run.json");
            }),
            "run.json: 'learning_rate' must be a number, got a string (\"abc\")");
  EXPECT_EQ(error_of([] {
              TrainConfig::from_json({{"learning_rate", -3}}, "run.json");
            }),
            "run.json: learning_rate must be in [0, 10), got -3");
  // A check of several keys names the flags among them.
  EXPECT_EQ(error_of([] {
              TrainConfig::from_json({{"fp16", true}, {"bf16", true}}, "run.json", {{"bf16", "--bf16"}});
            }).rfind("--bf16: fp16 and bf16 are both true", 0),
            0u);
  const TrainConfig c =
      TrainConfig::from_json({{"learning_rate", 0.001}, {"init_from", ""}, {"seed", 3}}, "run.json", flags);
  EXPECT_EQ(c.origin.at("learning_rate"), "--learning_rate");
  EXPECT_EQ(c.origin.at("init_from"), "--model_name_or_path");
  EXPECT_EQ(c.origin.at("seed"), "run.json");
  EXPECT_FALSE(c.origin.contains("weight_decay"));
}

TEST(ConfigKeys, StringKeysKeepFlagValuesAsStrings) {
  json j = json::object();
  set_config_override(j, "output_dir", "2024");
  set_config_override(j, "sample_prompt", "true");
  set_config_override(j, "max_steps", "12");
  set_config_override(j, "fp16", "true");
  EXPECT_EQ(j["output_dir"], "2024");
  EXPECT_EQ(j["sample_prompt"], "true");
  EXPECT_EQ(j["max_steps"], 12);
  EXPECT_EQ(j["fp16"], true);
}

TEST(ConfigKeysCli, TrainHelpShowsEveryVisibleKeyBySection) {
  const test::CommandResult r = test::run_anvil("train --help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string& section : config_key_sections())
    EXPECT_NE(r.output.find("\n" + section + ":\n"), std::string::npos) << section << "\n" << r.output;
  for (const ConfigKeyDoc& d : config_key_docs()) {
    const std::string flag = "  --" + std::string(d.key) + " ";
    EXPECT_EQ(r.output.find(flag) != std::string::npos, !d.hidden) << flag << "\n" << r.output;
  }
  EXPECT_EQ(r.output.find("override config key"), std::string::npos);
  EXPECT_NE(r.output.find("--learning_rate NUMBER"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Peak learning rate (default: 5e-5)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--fp16 [BOOL]"), std::string::npos) << r.output;
  // Sections in the table's order: a key appears after its section's heading and before the next one.
  const size_t precision = r.output.find("\nPrecision:\n"), run = r.output.find("\nRun:\n");
  const size_t bf16 = r.output.find("  --bf16 ");
  EXPECT_TRUE(run < precision && precision < bf16) << r.output;
}

TEST(ConfigKeysCli, ReferencePrintsTheTables) {
  const test::CommandResult r = test::run_anvil("config-reference --section 'Batch and length'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, config_key_table_markdown("Batch and length"));
  const test::CommandResult all = test::run_anvil("config-reference");
  ASSERT_EQ(all.exit_code, 0) << all.output;
  for (const std::string& section : config_key_sections())
    EXPECT_NE(all.output.find("## " + section + "\n\n" + config_key_table_markdown(section)),
              std::string::npos)
        << section;
  // --update rewrites the generated blocks of a file in place and keeps the prose.
  test::TempDir dir;
  const std::string file = dir / "c.md";
  test::write_file(file,
                   "# x\n<!-- BEGIN generated: anvil config-reference --section 'Run' -->\nold\n<!-- END "
                   "generated -->\nprose\n");
  ASSERT_EQ(test::run_anvil("config-reference --update " + file).exit_code, 0);
  EXPECT_EQ(read_text(file), "# x\n<!-- BEGIN generated: anvil config-reference --section 'Run' -->\n" +
                                 config_key_table_markdown("Run") + "<!-- END generated -->\nprose\n");
}

}  // namespace
}  // namespace anvil
