#include "cli/config_flags.hpp"

#include <fstream>

#include "anvil/error.hpp"

namespace anvil::cli {

using json = nlohmann::json;

void ConfigFlags::add_to(CLI::App* cmd) {
  cmd->add_option("--config", config_path, "JSON training config (see docs/config.md)");
  const json defaults = TrainConfig().to_json();
  std::vector<std::string> names = TrainConfig::keys();
  for (const auto& [alias, key] : TrainConfig::key_aliases()) names.push_back(alias);
  for (const std::string& key : names) {
    CLI::Option* opt = cmd->add_option("--" + key, values[key], "override config key '" + key + "'");
    // Boolean keys also work as bare flags: `--fp16` is `--fp16 true`.
    if (defaults.contains(key) && defaults[key].is_boolean()) {
      opt->expected(0, 1);
      bare_flags[key] = opt;
    }
  }
}

TrainConfig ConfigFlags::resolve() {
  json j = json::object();
  std::string source = "command line";
  if (!config_path.empty()) {
    std::ifstream f(config_path);
    ANVIL_REQUIRE(f.good(), "config file '{}' not found or not readable", config_path);
    try {
      j = json::parse(f);
    } catch (const json::parse_error& e) {
      ANVIL_THROW("{}: not valid JSON: {}", config_path, e.what());
    }
    ANVIL_REQUIRE(j.is_object(), "{}: the config must be a JSON object", config_path);
    source = config_path;
  }
  for (const auto& [key, opt] : bare_flags)
    if (opt->count() > 0 && values[key].empty()) values[key] = "true";
  // An alias flag overrides its key like the key's own flag would (a file's value for either is replaced).
  for (const auto& [key, value] : values) {
    if (value.empty()) continue;
    const auto alias = TrainConfig::key_aliases().find(key);
    if (alias != TrainConfig::key_aliases().end()) {
      j.erase(key);
      set_config_override(j, alias->second, value);
    } else {
      set_config_override(j, key, value);
    }
  }
  // --model '{"n_layer": 2, ...}' gives the shape as JSON.
  const std::string& model = values["model"];
  if (!model.empty() && model.front() == '{') {
    try {
      j["model"] = json::parse(model);
    } catch (const json::parse_error& e) {
      ANVIL_THROW("--model: not valid JSON: {}", e.what());
    }
  }
  return TrainConfig::from_json(j, source);
}

}  // namespace anvil::cli
