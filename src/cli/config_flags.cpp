#include "cli/config_flags.hpp"

#include <filesystem>
#include <fstream>

#include "anvil/error.hpp"
#include "data/unicode.hpp"
#include "train/config_keys.hpp"

namespace anvil::cli {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

json read_config_file(const std::string& path) {
  std::error_code ec;
  ANVIL_REQUIRE(fs::exists(path, ec), "--config {}: no such file", path);
  ANVIL_REQUIRE(!fs::is_directory(path, ec), "--config {}: is a directory; give a JSON config file", path);
  std::ifstream f(path);
  ANVIL_REQUIRE(f.good(), "--config {}: cannot be read", path);
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    ANVIL_THROW("{}: not valid JSON: {}", path, e.what());
  }
  ANVIL_REQUIRE(j.is_object(), "{}: the config must be a JSON object", path);
  return j;
}

}  // namespace

void ConfigFlags::add_to(CLI::App* cmd) {
  cmd->add_option("--config", config_path, "JSON training config; the flags below override its keys")
      ->type_name("FILE");
  for (const ConfigKeyDoc& doc : config_key_docs()) {
    const std::string name(doc.key);
    std::string description = config_key_summary(doc);
    if (const std::string d = config_key_default_plain(doc); !d.empty()) {
      if (description.ends_with('.')) description.pop_back();
      description += d.starts_with('(') ? " " + d : " (default: " + d + ")";  // "(required to train)"
    }
    CLI::Option* opt = cmd->add_option("--" + name, values[name], description);
    opt->type_name(config_key_value_name(doc));
    opt->group(doc.hidden ? "" : std::string(doc.section));  // group "" hides a test hook from --help
    if (config_key_is_boolean(doc)) opt->expected(0, 1);     // `--fp16` alone is `--fp16 true`
    options[name] = opt;
  }
}

TrainConfig ConfigFlags::resolve() {
  json j = json::object();
  std::string source = "command line";
  if (!config_path.empty()) {
    j = read_config_file(config_path);
    source = config_path;
  }
  std::map<std::string, std::string> key_sources;  // key -> the flag that set it
  for (const auto& [name, opt] : options) {
    if (opt->count() == 0) continue;
    std::string value = values[name];
    // Config values become JSON strings (train_config.json, checkpoints), which must be UTF-8; a file's
    // values are checked by the JSON parser, a flag's here (found by fuzz_train_flags).
    ANVIL_REQUIRE(data::unicode::is_valid_utf8(value), "--{}: the value is not valid UTF-8 text", name);
    const ConfigKeyDoc* doc = find_config_key_doc(name);
    if (value.empty() && doc && config_key_is_boolean(*doc)) value = "true";
    const auto alias = TrainConfig::key_aliases().find(name);
    const std::string key = alias != TrainConfig::key_aliases().end() ? alias->second : name;
    ANVIL_REQUIRE(!key_sources.contains(key), "{} and --{} name the same setting; give one", key_sources[key],
                  name);
    key_sources[key] = "--" + name;
    // The flag replaces the file's value, whichever name the file gave it.
    j.erase(key);
    for (const auto& [other, target] : TrainConfig::key_aliases())
      if (target == key) j.erase(other);
    if (key == "model" && !value.empty() && value.front() == '{') {  // --model '{"n_layer": 2, ...}'
      try {
        j["model"] = json::parse(value);
      } catch (const json::parse_error& e) {
        ANVIL_THROW("--model: not valid JSON: {}", e.what());
      }
    } else {
      set_config_override(j, key, value);
    }
  }
  return TrainConfig::from_json(j, source, key_sources);
}

}  // namespace anvil::cli
