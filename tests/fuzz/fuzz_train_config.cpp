// libFuzzer target: TrainConfig::from_json on arbitrary bytes read as JSON (the `--config` file and the
// object a DeepSpeed import edits). Beyond "no crash, only anvil::Error naming the source", an accepted
// config must read back from its own to_json() (what train_config.json and checkpoints store) unchanged.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "anvil/train_config.hpp"
#include "fuzz_common.hpp"

using json = nlohmann::json;

namespace {

// Whether any string in `j` names an existing path: the config would read it (a model's config.json, a
// DeepSpeed file), so the input's meaning depends on this machine's files. Such inputs are skipped.
bool names_a_path(const json& j) {
  if (j.is_string()) {
    std::error_code ec;
    const std::string& s = j.get_ref<const std::string&>();
    return !s.empty() && std::filesystem::exists(s, ec);
  }
  if (j.is_structured())
    for (const json& v : j)
      if (names_a_path(v)) return true;
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const json j = json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || names_a_path(j)) return 0;
  const std::string source = "fuzz_config.json";
  std::optional<anvil::TrainConfig> config;
  if (!anvil::fuzz::parses(source, [&] { config.emplace(anvil::TrainConfig::from_json(j, source)); }))
    return 0;
  const json written = config->to_json();
  std::optional<anvil::TrainConfig> back;
  try {
    back.emplace(anvil::TrainConfig::from_json(written, "written"));
  } catch (const anvil::Error& e) {
    anvil::fuzz::fail(std::string("an accepted config does not read back from its to_json(): ") + e.what() +
                      "\n" + written.dump());
  }
  anvil::fuzz::check(back->to_json() == written, "to_json() -> from_json() changed the config:\n" +
                                                     written.dump() + "\n" + back->to_json().dump());
  return 0;
}
