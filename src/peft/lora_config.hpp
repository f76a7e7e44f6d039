// LoRA (Hu et al., 2021) as PEFT configures it: beside a frozen Linear weight W [out, in], two trainable
// factors A [r, in] and B [out, r], and the layer computes y = x W^T + s (x A^T) B^T with s = lora_alpha / r
// (use_rslora: lora_alpha / sqrt(r)). A starts uniform in +-1/sqrt(in) (PEFT's kaiming_uniform with
// a = sqrt(5)), B at zero, so training starts from the base model's outputs exactly.
//
// The adapter tensors are declared in the layout table beside the weights they adapt
// (ParamLayout::decoder), named as PEFT saves them ("base_model.model.<module>.lora_A.weight"), so the
// optimizers, ZeRO, checkpoints and the memory plan treat them as any other tensor; the base tensors are
// frozen. The Linear's adapter hook (peft/lora_adapter.hpp) computes the adapter's term.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace anvil {

struct LoraConfig {
  int r = 0;            // the rank; 0: no adapters
  double alpha = 8;     // lora_alpha
  double dropout = 0;   // lora_dropout: on the adapters' input, training forwards only
  bool rslora = false;  // use_rslora: s = alpha / sqrt(r)
  // Module names or suffixes (PEFT's target_modules: "q_proj" matches "model.layers.3.self_attn.q_proj"),
  // or "all-linear" (every Linear of the blocks). Empty: PEFT's default for the family.
  std::vector<std::string> target_modules;

  bool enabled() const { return r > 0; }
  float scale() const;
};

// PEFT's default target modules of a decoder family: q_proj and v_proj for Llama, Qwen2 and Mistral;
// c_attn for GPT-2.
std::vector<std::string> default_lora_targets(const std::string& family);
// The targets a run adapts: cfg.target_modules, or the family's default.
std::vector<std::string> lora_targets(const LoraConfig& cfg, const std::string& family);
// Whether the module `name` (e.g. "model.layers.0.self_attn.q_proj") is one of `targets` (PEFT's rule: the
// name itself or a suffix of it after a dot; "all-linear": every block Linear, which are the only modules
// asked about).
bool lora_targets_module(const std::vector<std::string>& targets, const std::string& name);

// Checks a LoRA configuration (rank, alpha, dropout), naming the key at fault.
void validate_lora_config(const LoraConfig& cfg);

// adapter_config.json as PEFT writes it for this configuration (peft_type LORA, task_type CAUSAL_LM,
// r, lora_alpha, lora_dropout, use_rslora, target_modules as the modules actually adapted, bias "none").
nlohmann::json peft_adapter_config(const LoraConfig& cfg, const std::vector<std::string>& adapted_modules,
                                   const std::string& base_model_name_or_path);
// The LoRA configuration of a PEFT adapter_config.json (`path` names it in errors): a LORA adapter with
// bias "none", no DoRA, no rank or alpha patterns, and no modules_to_save; anything else is an error naming
// the field.
LoraConfig lora_config_from_peft(const nlohmann::json& j, const std::string& path);

}  // namespace anvil
