#include "peft/lora_config.hpp"

#include <algorithm>
#include <cmath>

#include "anvil/error.hpp"

namespace anvil {

float LoraConfig::scale() const {
  return float(rslora ? alpha / std::sqrt(double(r)) : alpha / double(r));
}

std::vector<std::string> default_lora_targets(const std::string& family) {
  if (family == "gpt2") return {"c_attn"};
  return {"q_proj", "v_proj"};
}

std::vector<std::string> lora_targets(const LoraConfig& cfg, const std::string& family) {
  return cfg.target_modules.empty() ? default_lora_targets(family) : cfg.target_modules;
}

bool lora_targets_module(const std::vector<std::string>& targets, const std::string& name) {
  for (const std::string& t : targets) {
    if (t == "all-linear" || name == t) return true;
    if (name.size() > t.size() && name.ends_with(t) && name[name.size() - t.size() - 1] == '.') return true;
  }
  return false;
}

void validate_lora_config(const LoraConfig& cfg) {
  ANVIL_REQUIRE(cfg.r >= 0, "lora_r must be >= 0 (0: no LoRA), got {}", cfg.r);
  if (!cfg.enabled()) return;
  ANVIL_REQUIRE(std::isfinite(cfg.alpha) && cfg.alpha > 0, "lora_alpha must be > 0, got {}", cfg.alpha);
  ANVIL_REQUIRE(cfg.dropout >= 0 && cfg.dropout < 1, "lora_dropout must be in [0, 1), got {}", cfg.dropout);
  for (const std::string& t : cfg.target_modules)
    ANVIL_REQUIRE(!t.empty() && t.find_first_of(" *?[") == std::string::npos,
                  "lora_target_modules: '{}' is not a module name (give names such as q_proj,v_proj, "
                  "comma-separated, or all-linear)",
                  t);
}

nlohmann::json peft_adapter_config(const LoraConfig& cfg, const std::vector<std::string>& adapted_modules,
                                   const std::string& base_model_name_or_path) {
  // target_modules as the short names PEFT matches by suffix: the last part of each adapted module.
  std::vector<std::string> targets;
  for (const std::string& m : adapted_modules) {
    const std::string leaf = m.substr(m.rfind('.') + 1);
    if (std::find(targets.begin(), targets.end(), leaf) == targets.end()) targets.push_back(leaf);
  }
  nlohmann::json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] =
      base_model_name_or_path.empty() ? nullptr : nlohmann::json(base_model_name_or_path);
  j["r"] = cfg.r;
  j["lora_alpha"] = cfg.alpha;
  j["lora_dropout"] = cfg.dropout;
  j["use_rslora"] = cfg.rslora;
  j["target_modules"] = targets;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["init_lora_weights"] = true;
  j["inference_mode"] = true;
  j["modules_to_save"] = nullptr;
  j["use_dora"] = false;
  j["rank_pattern"] = nlohmann::json::object();
  j["alpha_pattern"] = nlohmann::json::object();
  j["layers_to_transform"] = nullptr;
  return j;
}

LoraConfig lora_config_from_peft(const nlohmann::json& j, const std::string& path) {
  ANVIL_REQUIRE(j.is_object(), "{}: not a JSON object", path);
  auto field = [&](const char* key) -> const nlohmann::json* {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  const nlohmann::json* type = field("peft_type");
  ANVIL_REQUIRE(type && type->is_string() && type->get<std::string>() == "LORA",
                "{}: peft_type is {}; Anvil reads LoRA adapters (peft_type \"LORA\")", path,
                type ? type->dump() : "missing");
  LoraConfig c;
  const nlohmann::json* r = field("r");
  ANVIL_REQUIRE(r && r->is_number_integer() && r->get<int>() > 0, "{}: field 'r' must be a positive integer",
                path);
  c.r = r->get<int>();
  if (const nlohmann::json* a = field("lora_alpha")) {
    ANVIL_REQUIRE(a->is_number(), "{}: field 'lora_alpha' must be a number, got {}", path, a->dump());
    c.alpha = a->get<double>();
  }
  if (const nlohmann::json* d = field("lora_dropout")) {
    ANVIL_REQUIRE(d->is_number(), "{}: field 'lora_dropout' must be a number, got {}", path, d->dump());
    c.dropout = d->get<double>();
  }
  if (const nlohmann::json* rs = field("use_rslora")) c.rslora = rs->is_boolean() && rs->get<bool>();
  const nlohmann::json* targets = field("target_modules");
  ANVIL_REQUIRE(targets, "{}: field 'target_modules' is missing", path);
  if (targets->is_string()) {
    c.target_modules = {targets->get<std::string>()};
  } else {
    ANVIL_REQUIRE(targets->is_array(), "{}: field 'target_modules' must be a list of module names", path);
    for (const auto& t : *targets) {
      ANVIL_REQUIRE(t.is_string(), "{}: field 'target_modules' holds {}, not a module name", path, t.dump());
      c.target_modules.push_back(t.get<std::string>());
    }
  }
  if (const nlohmann::json* b = field("bias"))
    ANVIL_REQUIRE(b->is_string() && b->get<std::string>() == "none",
                  "{}: bias {} is not supported (Anvil's adapters train no biases: \"none\")", path,
                  b->dump());
  if (const nlohmann::json* d = field("use_dora"))
    ANVIL_REQUIRE(!d->is_boolean() || !d->get<bool>(), "{}: use_dora true is not supported (plain LoRA only)",
                  path);
  if (const nlohmann::json* m = field("modules_to_save"))
    ANVIL_REQUIRE(m->empty(), "{}: modules_to_save {} is not supported (only the adapters train)", path,
                  m->dump());
  for (const char* key : {"rank_pattern", "alpha_pattern"})
    if (const nlohmann::json* p = field(key))
      ANVIL_REQUIRE(p->empty(), "{}: {} {} is not supported (one rank and alpha for every module)", path, key,
                    p->dump());
  if (const nlohmann::json* f = field("fan_in_fan_out"))
    ANVIL_REQUIRE(f->is_boolean(), "{}: field 'fan_in_fan_out' must be true or false", path);
  validate_lora_config(c);
  return c;
}

}  // namespace anvil
