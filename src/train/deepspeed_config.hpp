// DeepSpeed config import: applies a DeepSpeed config JSON (the file HF TrainingArguments' `deepspeed`
// names) onto a TrainConfig, with the "auto" semantics of HF's HfTrainerDeepSpeedConfig:
//   - a value "auto" takes the TrainConfig's value;
//   - a concrete value sets the TrainConfig key it maps to, unless the user set that key too (in the
//     config file or on the command line) to a different value: then it is an error naming both keys and
//     values (HF reports every mismatch in one error; so does this). HF cannot tell a TrainingArguments
//     default from a value the user gave, so it also errors against defaults; Anvil only against keys
//     the user gave.
// Supported keys (docs/config.md, "DeepSpeed config"): fp16 {enabled, loss_scale, initial_scale_power,
// loss_scale_window, hysteresis, consecutive_hysteresis, min_loss_scale}, bf16 {enabled},
// data_types {grad_accum_dtype}, train_micro_batch_size_per_gpu, gradient_accumulation_steps,
// train_batch_size (= micro-batch x accumulation x world size 1; the missing one is derived as DeepSpeed
// does), gradient_clipping, steps_per_print, optimizer {type Adam | AdamW, params {lr, betas, eps,
// weight_decay, adam_w_mode true}}, zero_optimization {stage 0}, wall_clock_breakdown (ignored).
// Anything else is an error naming the key and the file.
#pragma once
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "anvil/train_config.hpp"

namespace anvil {

// Reads the DeepSpeed config at `path` and applies it onto `cfg`. `given_keys` are the TrainConfig keys
// the user set; `referrer` (e.g. the Anvil config file) names where `path` came from in a "not found"
// error. Does not validate `cfg` as a whole (TrainConfig::from_json does, afterwards).
void apply_deepspeed_config(TrainConfig& cfg, const std::string& path,
                            const std::set<std::string>& given_keys, const std::string& referrer = "");

// The same, from a parsed DeepSpeed config; `source` names it in errors.
void apply_deepspeed_json(TrainConfig& cfg, const nlohmann::json& ds, const std::string& source,
                          const std::set<std::string>& given_keys);

// The top-level DeepSpeed keys apply_deepspeed_json accepts.
const std::vector<std::string>& deepspeed_supported_keys();

// What each key of a DeepSpeed config became, for the run's plan: one line per key the file sets, "key:
// value -> anvil_key value" with the value `cfg` (the run's final config) holds, "auto" resolved, or what a
// key accepted with nothing to change does ("accepted: ..."). `ds` is the file's JSON (already validated by
// apply_deepspeed_json).
std::vector<std::string> deepspeed_resolution(const nlohmann::json& ds, const TrainConfig& cfg);

}  // namespace anvil
