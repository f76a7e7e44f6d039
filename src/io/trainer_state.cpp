#include "io/trainer_state.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "anvil/error.hpp"
#include "io/atomic_dir.hpp"

namespace anvil::io {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A short description of a JSON value for an error message (never the whole of a large or deep value).
std::string describe(const json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

// The field `key` of object `j` (its name in messages: `field`), or nullptr when absent.
const json* member(const json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

// A JSON integer >= 0 that fits `max`; throws naming the path and field.
uint64_t non_negative_integer(const json& v, const std::string& path, const std::string& field,
                              uint64_t max = std::numeric_limits<uint64_t>::max()) {
  bool integer = false;
  uint64_t out = 0;
  if (v.is_number_unsigned()) {
    out = v.get<uint64_t>();
    integer = true;
  } else if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    out = uint64_t(v.get<int64_t>());
    integer = true;
  }
  const bool too_large = integer && out > max;
  ANVIL_REQUIRE(integer && !too_large, "{}: '{}' must be an integer >= 0{}, got {}", path, field,
                too_large ? fmt::format(" and <= {}", max) : "", describe(v));
  return out;
}

const json& required(const json& j, const char* key, const std::string& path, const std::string& field) {
  const json* v = member(j, key);
  ANVIL_REQUIRE(v, "{}: the field '{}' is missing (is this trainer_state.json from an Anvil checkpoint?)",
                path, field);
  return *v;
}

}  // namespace

TrainerState parse_trainer_state(std::string_view text, const std::string& path) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    ANVIL_THROW("{}: not valid JSON: {}", path, e.what());
  }
  ANVIL_REQUIRE(j.is_object(), "{}: must be a JSON object, got {}", path, describe(j));
  constexpr uint64_t kInt64Max = uint64_t(std::numeric_limits<int64_t>::max());
  TrainerState s;
  s.global_step = int64_t(
      non_negative_integer(required(j, "global_step", path, "global_step"), path, "global_step", kInt64Max));
  if (const json* v = member(j, "total_steps")) {
    s.total_steps = int64_t(non_negative_integer(*v, path, "total_steps", kInt64Max));
    ANVIL_REQUIRE(s.total_steps >= s.global_step, "{}: 'total_steps' ({}) is below 'global_step' ({})", path,
                  s.total_steps, s.global_step);
  }
  const json& loader = required(j, "loader", path, "loader");
  ANVIL_REQUIRE(loader.is_object(), "{}: 'loader' must be an object with 'epoch' and 'batch', got {}", path,
                describe(loader));
  s.loader_epoch =
      non_negative_integer(required(loader, "epoch", path, "loader.epoch"), path, "loader.epoch");
  s.loader_batch =
      non_negative_integer(required(loader, "batch", path, "loader.batch"), path, "loader.batch");
  s.rng_state = non_negative_integer(required(j, "rng_state", path, "rng_state"), path, "rng_state");
  if (const json* v = member(j, "train_loss_sum")) {
    ANVIL_REQUIRE(v->is_number() && std::isfinite(v->get<double>()),
                  "{}: 'train_loss_sum' must be a finite number, got {}", path, describe(*v));
    s.train_loss_sum = v->get<double>();
  }
  if (const json* v = member(j, "train_loss_steps"))
    s.train_loss_steps = int64_t(non_negative_integer(*v, path, "train_loss_steps", kInt64Max));
  if (const json* v = member(j, "loss_scaler")) {
    ANVIL_REQUIRE(v->is_object(), "{}: 'loss_scaler' must be an object, got {}", path, describe(*v));
    s.loss_scaler = *v;
  }
  if (const json* v = member(j, "world_size")) {
    s.world_size = int64_t(non_negative_integer(*v, path, "world_size", kInt64Max));
    ANVIL_REQUIRE(s.world_size >= 1, "{}: 'world_size' must be >= 1, got {}", path, s.world_size);
  }
  if (const json* v = member(j, "config")) {
    ANVIL_REQUIRE(v->is_object(), "{}: 'config' must be an object (the run's training config), got {}", path,
                  describe(*v));
    s.config = *v;
  }
  return s;
}

TrainerState read_trainer_state(const std::string& dir) {
  require_not_interrupted_save(dir);
  const std::string path = dir + "/trainer_state.json";
  ANVIL_REQUIRE(fs::exists(path), "{}: not found ('{}' is not an Anvil checkpoint)", path, dir);
  return parse_trainer_state(read_text_file(path), path);
}

}  // namespace anvil::io
