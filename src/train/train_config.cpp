#include "anvil/train_config.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "anvil/error.hpp"
#include "kernels/quantization.hpp"
#include "kernels/split_gemm_plan.hpp"
#include "model/checkpointing.hpp"
#include "optim/lr_schedule.hpp"
#include "optim/optimizer_kind.hpp"
#include "precision/loss_scaler.hpp"
#include "train/deepspeed_config.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string type_name(const json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  return "null";
}

// Reads the values of one key. `source` names where the key was set: a config file (errors read
// "FILE: 'key' must be ...") or a command-line flag such as "--learning_rate" (errors read "--learning_rate
// must be ...", so a bad flag value is blamed on the flag, not on the config file it overrides).
struct Reader {
  std::string source;
  std::string flag_key;  // the key the flag `source` sets; "" when `source` is a file

  // The subject of an error about `key` (a nested key such as "model.n_layer" under a flag names both).
  std::string subject(const std::string& key) const {
    if (flag_key.empty()) return fmt::format("{}: '{}'", source, key);
    return key == flag_key ? source : fmt::format("{}: '{}'", source, key);
  }
  void expect(bool ok, const std::string& key, const json& v, const char* want) const {
    if (flag_key.empty())
      ANVIL_REQUIRE(ok, "{} must be {}, got {} ({})", subject(key), want, type_name(v), v.dump());
    ANVIL_REQUIRE(ok, "{} must be {}, got {}", subject(key), want, v.dump());
  }
  int64_t integer(const std::string& key, const json& v) const {
    // A float counts when it is whole and within int64 (casting a larger one is undefined behaviour);
    // an unsigned integer above int64's range would wrap.
    const bool whole_float = v.is_number_float() && std::fabs(v.get<double>()) < 1e18 &&
                             v.get<double>() == std::floor(v.get<double>());
    const bool fits =
        !v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max());
    expect((v.is_number_integer() && fits) || whole_float, key, v, "an integer");
    return v.is_number_integer() ? v.get<int64_t>() : int64_t(v.get<double>());
  }
  double number(const std::string& key, const json& v) const {
    expect(v.is_number(), key, v, "a number");
    return v.get<double>();
  }
  bool boolean(const std::string& key, const json& v) const {
    expect(v.is_boolean(), key, v, "true or false");
    return v.get<bool>();
  }
  std::string string(const std::string& key, const json& v) const {
    expect(v.is_string(), key, v, "a string");
    return v.get<std::string>();
  }
};

using Setter = std::function<void(TrainConfig&, const Reader&, const std::string&, const json&)>;

// "model" as a string: a preset name, or a Hugging Face config.json (the file, or a directory holding one):
// the shape only, the weights start fresh (init_from / model_name_or_path load weights too).
void set_model_from_string(TrainConfig& c, const Reader& r, const std::string& name) {
  const std::vector<std::string> presets = TransformerConfig::preset_names();
  if (std::find(presets.begin(), presets.end(), name) != presets.end() || !fs::exists(name)) {
    try {
      c.model = TransformerConfig::preset(name);
    } catch (const Error& e) {
      ANVIL_THROW("{}: {} (or give the path of a Hugging Face config.json)", r.subject("model"), e.what());
    }
    c.model_preset = name;
    c.vocab_from_tokenizer = true;
    c.labels_from_data = true;
    return;
  }
  const std::string path = fs::is_directory(name) ? (fs::path(name) / "config.json").string() : name;
  std::ifstream f(path);
  ANVIL_REQUIRE(f.good(), "{}: '{}' is neither a preset nor a readable config.json ({} not found)",
                r.subject("model"), name, path);
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    ANVIL_THROW("{}: {} is not valid JSON: {}", r.subject("model"), path, e.what());
  }
  c.model = TransformerConfig::from_hf_json(j, path);
  c.model_preset.clear();
  c.vocab_from_tokenizer = false;
  // A config.json without id2label / num_labels (e.g. a pre-training checkpoint's) leaves the labels open.
  c.labels_from_data = !(j.is_object() && (j.contains("id2label") || j.contains("num_labels")));
}

// "model" as an object: the fields of TransformerConfig by name. Missing fields take the values of the
// family's smallest preset (tiny, bert-tiny); "family" is read first so the defaults are the family's.
void set_model_from_object(TrainConfig& c, const Reader& r, const json& v) {
  std::string family = "gpt2";
  if (v.contains("family")) family = r.string("model.family", v["family"]);
  ANVIL_REQUIRE(family == "gpt2" || family == "bert", "{} must be gpt2 or bert, got '{}'",
                r.subject("model.family"), family);
  TransformerConfig m = TransformerConfig::preset(family == "bert" ? "bert-tiny" : "tiny");
  static const std::vector<std::string> model_keys = {"family",
                                                      "n_layer",
                                                      "n_head",
                                                      "n_embd",
                                                      "vocab_size",
                                                      "block_size",
                                                      "eos_token_id",
                                                      "intermediate_size",
                                                      "layer_norm_eps",
                                                      "hidden_act",
                                                      "type_vocab_size",
                                                      "pad_token_id",
                                                      "num_labels",
                                                      "problem_type",
                                                      "label_names",
                                                      "initializer_range",
                                                      "hidden_dropout_prob",
                                                      "attention_probs_dropout_prob",
                                                      "classifier_dropout"};
  for (auto& [k, val] : v.items()) {
    const std::string full = "model." + k;
    if (k == "family")
      m.family = family;
    else if (k == "n_layer")
      m.n_layer = int(r.integer(full, val));
    else if (k == "n_head")
      m.n_head = int(r.integer(full, val));
    else if (k == "n_embd")
      m.n_embd = int(r.integer(full, val));
    else if (k == "vocab_size")
      m.vocab_size = int(r.integer(full, val));
    else if (k == "block_size")
      m.block_size = int(r.integer(full, val));
    else if (k == "eos_token_id")
      m.eos_token_id = int(r.integer(full, val));
    else if (k == "intermediate_size")
      m.intermediate_size = int(r.integer(full, val));
    else if (k == "layer_norm_eps")
      m.layer_norm_eps = r.number(full, val);
    else if (k == "hidden_act")
      m.hidden_act = r.string(full, val);
    else if (k == "type_vocab_size")
      m.type_vocab_size = int(r.integer(full, val));
    else if (k == "pad_token_id")
      m.pad_token_id = int(r.integer(full, val));
    else if (k == "num_labels")
      m.num_labels = int(r.integer(full, val));
    else if (k == "problem_type")
      m.problem_type = r.string(full, val);
    else if (k == "initializer_range")
      m.initializer_range = r.number(full, val);
    else if (k == "hidden_dropout_prob")
      m.hidden_dropout_prob = r.number(full, val);
    else if (k == "attention_probs_dropout_prob")
      m.attention_probs_dropout_prob = r.number(full, val);
    else if (k == "classifier_dropout")
      m.classifier_dropout = val.is_null() ? -1.0 : r.number(full, val);
    else if (k == "label_names") {
      r.expect(val.is_array(), full, val, "an array of label names");
      m.label_names.clear();
      for (const json& name : val) m.label_names.push_back(r.string(full, name));
    } else {
      const std::string near = nearest_key(k, model_keys);
      ANVIL_THROW("{}: unknown key '{}'{}", r.source, full,
                  near.empty() ? "" : " (did you mean 'model." + near + "'?)");
    }
  }
  // Names without a count fix the count.
  if (v.contains("label_names") && !v.contains("num_labels")) m.num_labels = int(m.label_names.size());
  m.validate(r.flag_key.empty() ? r.source + ": model" : r.source);
  c.model = m;
  c.model_preset.clear();
  c.vocab_from_tokenizer = !v.contains("vocab_size");
  c.labels_from_data = !v.contains("num_labels") && !v.contains("label_names");
}

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> table = [] {
    std::map<std::string, Setter> t;
    auto int_field = [&](const char* k, auto member) {
      t[k] = [member](TrainConfig& c, const Reader& r, const std::string& key, const json& v) {
        using T = std::remove_reference_t<decltype(c.*member)>;
        const int64_t i = r.integer(key, v);
        ANVIL_REQUIRE(
            i >= int64_t(std::numeric_limits<T>::min()) && i <= int64_t(std::numeric_limits<T>::max()),
            "{} is out of range, got {}", r.subject(key), i);
        c.*member = static_cast<T>(i);
      };
    };
    auto bool_field = [&](const char* k, bool TrainConfig::*member) {
      t[k] = [member](TrainConfig& c, const Reader& r, const std::string& key, const json& v) {
        c.*member = r.boolean(key, v);
      };
    };
    auto num_field = [&](const char* k, double TrainConfig::*member) {
      t[k] = [member](TrainConfig& c, const Reader& r, const std::string& key, const json& v) {
        c.*member = r.number(key, v);
      };
    };
    auto str_field = [&](const char* k, std::string TrainConfig::*member) {
      t[k] = [member](TrainConfig& c, const Reader& r, const std::string& key, const json& v) {
        c.*member = r.string(key, v);
      };
    };
    t["model"] = [](TrainConfig& c, const Reader& r, const std::string& key, const json& v) {
      if (v.is_string()) return set_model_from_string(c, r, v.get<std::string>());
      r.expect(v.is_object(), key, v, "a preset name, a config.json path or an object");
      set_model_from_object(c, r, v);
    };
    str_field("init_from", &TrainConfig::init_from);
    str_field("freeze_parameters", &TrainConfig::freeze_parameters);
    int_field("lora_r", &TrainConfig::lora_r);
    num_field("lora_alpha", &TrainConfig::lora_alpha);
    num_field("lora_dropout", &TrainConfig::lora_dropout);
    bool_field("use_rslora", &TrainConfig::use_rslora);
    str_field("lora_target_modules", &TrainConfig::lora_target_modules);
    str_field("lora_adapter", &TrainConfig::lora_adapter);
    str_field("quantization", &TrainConfig::quantization);
    str_field("tokenizer", &TrainConfig::tokenizer);
    str_field("train_data", &TrainConfig::train_data);
    str_field("val_data", &TrainConfig::val_data);
    int_field("per_device_train_batch_size", &TrainConfig::per_device_train_batch_size);
    int_field("per_device_eval_batch_size", &TrainConfig::per_device_eval_batch_size);
    int_field("gradient_accumulation_steps", &TrainConfig::gradient_accumulation_steps);
    t["auto_find_batch_size"] = [](TrainConfig& c, const Reader& r, const std::string& key, const json& v) {
      c.auto_find_batch_size = r.boolean(key, v);
    };
    t["gradient_checkpointing"] = [](TrainConfig& c, const Reader& r, const std::string& key, const json& v) {
      c.gradient_checkpointing = r.boolean(key, v);
    };
    str_field("gradient_checkpointing_mode", &TrainConfig::gradient_checkpointing_mode);
    int_field("gradient_checkpointing_every", &TrainConfig::gradient_checkpointing_every);
    int_field("max_seq_length", &TrainConfig::max_seq_length);
    int_field("dataloader_num_workers", &TrainConfig::dataloader_num_workers);
    t["dataloader_pin_memory"] = [](TrainConfig& c, const Reader& r, const std::string& key, const json& v) {
      c.dataloader_pin_memory = r.boolean(key, v);
    };
    int_field("max_steps", &TrainConfig::max_steps);
    num_field("num_train_epochs", &TrainConfig::num_train_epochs);
    num_field("learning_rate", &TrainConfig::learning_rate);
    num_field("weight_decay", &TrainConfig::weight_decay);
    num_field("adam_beta1", &TrainConfig::adam_beta1);
    num_field("adam_beta2", &TrainConfig::adam_beta2);
    num_field("adam_epsilon", &TrainConfig::adam_epsilon);
    int_field("warmup_steps", &TrainConfig::warmup_steps);
    str_field("lr_scheduler_type", &TrainConfig::lr_scheduler_type);
    num_field("max_grad_norm", &TrainConfig::max_grad_norm);
    int_field("ddp_timeout", &TrainConfig::ddp_timeout);
    num_field("ddp_bucket_cap_mb", &TrainConfig::ddp_bucket_cap_mb);
    str_field("communication_data_type", &TrainConfig::communication_data_type);
    str_field("backward_grad_dtype", &TrainConfig::backward_grad_dtype);
    int_field("zero_stage", &TrainConfig::zero_stage);
    str_field("offload_optimizer", &TrainConfig::offload_optimizer);
    str_field("offload_param", &TrainConfig::offload_param);
    int_field("offload_param_buffer_count", &TrainConfig::offload_param_buffer_count);
    str_field("offload_nvme_path", &TrainConfig::offload_nvme_path);
    int_field("sub_group_size", &TrainConfig::sub_group_size);
    int_field("aio_block_size", &TrainConfig::aio_block_size);
    int_field("aio_threads", &TrainConfig::aio_threads);
    int_field("zero_allgather_bucket_size", &TrainConfig::zero_allgather_bucket_size);
    str_field("optim", &TrainConfig::optim);
    num_field("no_decay_lr_multiplier", &TrainConfig::no_decay_lr_multiplier);
    num_field("embedding_lr_multiplier", &TrainConfig::embedding_lr_multiplier);
    bool_field("adamw_bf16_moments", &TrainConfig::adamw_bf16_moments);
    int_field("optim_8bit_min_size", &TrainConfig::optim_8bit_min_size);
    bool_field("optim_8bit_embedding_fp32", &TrainConfig::optim_8bit_embedding_fp32);
    num_field("momentum", &TrainConfig::momentum);
    num_field("dampening", &TrainConfig::dampening);
    bool_field("nesterov", &TrainConfig::nesterov);
    num_field("adafactor_eps1", &TrainConfig::adafactor_eps1);
    num_field("adafactor_eps2", &TrainConfig::adafactor_eps2);
    num_field("adafactor_clip_threshold", &TrainConfig::adafactor_clip_threshold);
    num_field("adafactor_decay_rate", &TrainConfig::adafactor_decay_rate);
    num_field("adafactor_beta1", &TrainConfig::adafactor_beta1);
    bool_field("adafactor_scale_parameter", &TrainConfig::adafactor_scale_parameter);
    bool_field("adafactor_relative_step", &TrainConfig::adafactor_relative_step);
    bool_field("adafactor_warmup_init", &TrainConfig::adafactor_warmup_init);
    t["seed"] = [](TrainConfig& c, const Reader& r, const std::string& key, const json& v) {
      const int64_t s = r.integer(key, v);
      ANVIL_REQUIRE(s >= 0, "{} must be >= 0, got {}", r.subject(key), s);
      c.seed = uint64_t(s);
    };
    str_field("output_dir", &TrainConfig::output_dir);
    bool_field("overwrite_output_dir", &TrainConfig::overwrite_output_dir);
    int_field("save_total_limit", &TrainConfig::save_total_limit);
    bool_field("save_base_model", &TrainConfig::save_base_model);
    int_field("logging_steps", &TrainConfig::logging_steps);
    int_field("save_steps", &TrainConfig::save_steps);
    str_field("save_strategy", &TrainConfig::save_strategy);
    int_field("eval_steps", &TrainConfig::eval_steps);
    int_field("max_eval_batches", &TrainConfig::max_eval_batches);
    bool_field("fp16", &TrainConfig::fp16);
    bool_field("bf16", &TrainConfig::bf16);
    bool_field("tf32", &TrainConfig::tf32);
    str_field("fp32_matmul", &TrainConfig::fp32_matmul);
    num_field("loss_scale", &TrainConfig::loss_scale);
    int_field("initial_scale_power", &TrainConfig::initial_scale_power);
    int_field("loss_scale_window", &TrainConfig::loss_scale_window);
    int_field("hysteresis", &TrainConfig::hysteresis);
    bool_field("consecutive_hysteresis", &TrainConfig::consecutive_hysteresis);
    num_field("min_loss_scale", &TrainConfig::min_loss_scale);
    int_field("max_overflows_at_min_scale", &TrainConfig::max_overflows_at_min_scale);
    bool_field("stochastic_rounding", &TrainConfig::stochastic_rounding);
    bool_field("cuda_graphs", &TrainConfig::cuda_graphs);
    bool_field("gemm_tuning", &TrainConfig::gemm_tuning);
    str_field("gemm_tuning_cache", &TrainConfig::gemm_tuning_cache);
    str_field("grad_accum_dtype", &TrainConfig::grad_accum_dtype);
    // A JSON array of step numbers; or, from the command line, one number or a comma-separated list.
    t["debug_inject_overflow_steps"] = [](TrainConfig& c, const Reader& r, const std::string& key,
                                          const json& v) {
      json list = v;
      if (v.is_number()) list = json::array({v});
      if (v.is_string()) {
        list = json::array();
        const std::string text = v.get<std::string>();
        size_t start = 0;
        while (start <= text.size()) {
          size_t end = text.find(',', start);
          if (end == std::string::npos) end = text.size();
          const std::string item = text.substr(start, end - start);
          size_t pos = 0;
          long long step = 0;
          try {
            step = std::stoll(item, &pos);
          } catch (const std::exception&) {
            pos = 0;
          }
          ANVIL_REQUIRE(pos > 0 && pos == item.size(),
                        "{} must be a list of step numbers (e.g. 3,4,5), got \"{}\" (bad item \"{}\")",
                        r.subject(key), text, item);
          list.push_back(step);
          start = end + 1;
        }
      }
      r.expect(list.is_array(), key, v, "an array of step numbers");
      std::set<int64_t> steps;
      for (const json& item : list) {
        const int64_t step = r.integer(key, item);
        ANVIL_REQUIRE(step >= 1, "{} holds 1-based global step numbers, got {}", r.subject(key), step);
        steps.insert(step);
      }
      c.debug_inject_overflow_steps.assign(steps.begin(), steps.end());
    };
    str_field("deepspeed", &TrainConfig::deepspeed);
    str_field("memory_trace", &TrainConfig::memory_trace);
    int_field("memory_trace_step", &TrainConfig::memory_trace_step);
    str_field("profile_steps", &TrainConfig::profile_steps);
    num_field("peak_flops", &TrainConfig::peak_flops);
    str_field("device", &TrainConfig::device);
    str_field("resume_from_checkpoint", &TrainConfig::resume_from_checkpoint);
    str_field("sample_prompt", &TrainConfig::sample_prompt);
    int_field("sample_max_new_tokens", &TrainConfig::sample_max_new_tokens);
    num_field("sample_temperature", &TrainConfig::sample_temperature);
    int_field("sample_top_k", &TrainConfig::sample_top_k);
    return t;
  }();
  return table;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string nearest_key(const std::string& key, const std::vector<std::string>& valid) {
  std::string best;
  size_t best_d = std::max<size_t>(3, key.size() / 3) + 1;
  for (const auto& k : valid) {
    const size_t d = edit_distance(key, k);
    if (d < best_d) best_d = d, best = k;
  }
  return best;
}

std::vector<std::string> TrainConfig::keys() {
  std::vector<std::string> k;
  for (const auto& [name, _] : setters()) k.push_back(name);
  return k;
}

const std::map<std::string, std::string>& TrainConfig::key_aliases() {
  // model_name_or_path: the name Hugging Face's example scripts give the pretrained model to start from.
  static const std::map<std::string, std::string> aliases = {{"model_name_or_path", "init_from"}};
  return aliases;
}

TrainConfig TrainConfig::from_json(const json& j, const std::string& source,
                                   const std::map<std::string, std::string>& key_sources) {
  ANVIL_REQUIRE(j.is_object(), "{}: the config must be a JSON object, got {}", source, type_name(j));
  TrainConfig c;
  const auto reader = [&](const std::string& key) {
    const auto it = key_sources.find(key);
    if (it == key_sources.end()) return Reader{source, ""};
    return Reader{it->second, it->second.starts_with("--") ? key : ""};
  };
  const auto& table = setters();
  // "model" first, so that keys depending on it (e.g. max_seq_length) validate against the right shape.
  if (j.contains("model")) table.at("model")(c, reader("model"), "model", j["model"]);
  std::set<std::string> given;
  for (auto& [name, value] : j.items()) {
    // An alias sets its key (and may not disagree with it).
    std::string key = name;
    if (const auto alias = key_aliases().find(name); alias != key_aliases().end()) {
      key = alias->second;
      ANVIL_REQUIRE(!j.contains(key) || j[key] == value,
                    "{}: '{}' ({}) and '{}' ({}) name the same setting; give one", source, name, value.dump(),
                    key, j[key].dump());
    }
    given.insert(key);
    const Reader r = reader(key);
    c.origin[key] = r.source;
    if (key == "model") continue;
    auto it = table.find(key);
    if (it == table.end()) {
      std::vector<std::string> valid = keys();
      for (const auto& [alias, _] : key_aliases()) valid.push_back(alias);
      const std::string near = nearest_key(key, valid);
      ANVIL_THROW("{}: unknown key '{}'{}", source, key,
                  near.empty() ? "" : " (did you mean '" + near + "'?)");
    }
    it->second(c, r, key, value);
  }
  if (c.deepspeed.empty()) {
    c.validate(source);
  } else {
    apply_deepspeed_config(c, c.deepspeed, given, source);
    c.validate(source + " with deepspeed " + c.deepspeed);
  }
  return c;
}

TrainConfig TrainConfig::from_file(const std::string& path) {
  std::ifstream f(path);
  ANVIL_REQUIRE(f.good(), "config file '{}' not found or not readable", path);
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    ANVIL_THROW("{}: not valid JSON: {}", path, e.what());
  }
  return from_json(j, path);
}

void TrainConfig::validate(const std::string& s) const {
  // A key given as a flag is blamed on the flag ("--learning_rate must be ..."), a key from the config after
  // `s` ("run.json: learning_rate must be ..."); a check of several keys names the flags among them, else
  // `s`.
  const auto from_flag = [&](const std::string& key) -> const std::string* {
    const auto it = origin.find(key);
    return it != origin.end() && it->second.starts_with("--") ? &it->second : nullptr;
  };
  const auto subject = [&](const std::string& key) {
    const std::string* flag = from_flag(key);
    return flag ? *flag : s + ": " + key;
  };
  const auto blame = [&](std::initializer_list<const char*> keys) {
    std::vector<std::string> flags;
    for (const char* key : keys)
      if (const std::string* flag = from_flag(key)) flags.push_back(*flag);
    return flags.empty() ? s : fmt::format("{}", fmt::join(flags, ", "));
  };
  // A setting's valid names are those of its parser (as resolve_train_config uses it); errors name the key.
  const auto parses = [](const auto& parse) {
    try {
      parse();
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  model.validate(from_flag("model") ? *from_flag("model") : s + ": model");
  ANVIL_REQUIRE(per_device_train_batch_size >= 1, "{} must be >= 1, got {}",
                subject("per_device_train_batch_size"), per_device_train_batch_size);
  ANVIL_REQUIRE(per_device_eval_batch_size >= 0, "{} must be >= 0, got {}",
                subject("per_device_eval_batch_size"), per_device_eval_batch_size);
  ANVIL_REQUIRE(gradient_accumulation_steps >= 1, "{} must be >= 1, got {}",
                subject("gradient_accumulation_steps"), gradient_accumulation_steps);
  try {
    (void)profile_range();
  } catch (const Error& e) {
    ANVIL_THROW("{}: {}", blame({"profile_steps"}), e.what());
  }
  ANVIL_REQUIRE(peak_flops >= 0, "{} must be >= 0 (0: automatic), got {}", subject("peak_flops"), peak_flops);
  ANVIL_REQUIRE(memory_trace_step >= 1, "{} must be >= 1 (a 1-based global step), got {}",
                subject("memory_trace_step"), memory_trace_step);
  // Weights from a directory bring their own block_size: resolve_run_model checks against it.
  const bool shape_from_weights = !init_from.empty() || !resume_from_checkpoint.empty();
  ANVIL_REQUIRE(max_seq_length >= 0 && (shape_from_weights || max_seq_length <= model.block_size),
                "{} must be between 1 and the model's block_size {}, got {}", subject("max_seq_length"),
                model.block_size, max_seq_length);
  ANVIL_REQUIRE(parses([&] { parse_checkpoint_mode(gradient_checkpointing_mode); }),
                "{} must be full or selective, got '{}'", subject("gradient_checkpointing_mode"),
                gradient_checkpointing_mode);
  ANVIL_REQUIRE(gradient_checkpointing_every >= 1, "{} must be >= 1, got {}",
                subject("gradient_checkpointing_every"), gradient_checkpointing_every);
  ANVIL_REQUIRE(dataloader_num_workers >= 0 && dataloader_num_workers <= 256,
                "{} must be between 0 and 256, got {}", subject("dataloader_num_workers"),
                dataloader_num_workers);
  ANVIL_REQUIRE(max_steps == -1 || max_steps >= 1, "{} must be >= 1 (or -1 to use num_train_epochs), got {}",
                subject("max_steps"), max_steps);
  ANVIL_REQUIRE(num_train_epochs > 0, "{} must be > 0, got {}", subject("num_train_epochs"),
                num_train_epochs);
  ANVIL_REQUIRE(learning_rate >= 0 && learning_rate < 10, "{} must be in [0, 10), got {}",
                subject("learning_rate"), learning_rate);
  ANVIL_REQUIRE(weight_decay >= 0, "{} must be >= 0, got {}", subject("weight_decay"), weight_decay);
  ANVIL_REQUIRE(adam_beta1 >= 0 && adam_beta1 < 1, "{} must be in [0, 1), got {}", subject("adam_beta1"),
                adam_beta1);
  ANVIL_REQUIRE(adam_beta2 >= 0 && adam_beta2 < 1, "{} must be in [0, 1), got {}", subject("adam_beta2"),
                adam_beta2);
  ANVIL_REQUIRE(adam_epsilon > 0, "{} must be > 0, got {}", subject("adam_epsilon"), adam_epsilon);
  try {
    const OptimizerKind kind = parse_optimizer(optim);
    ANVIL_REQUIRE(!adamw_bf16_moments || kind == OptimizerKind::AdamW,
                  "adamw_bf16_moments applies to optim adamw_torch_fused, not {}", optim);
    ANVIL_REQUIRE(kind == OptimizerKind::SGD || (momentum == 0 && dampening == 0 && !nesterov),
                  "momentum, dampening and nesterov apply to optim sgd, not {}", optim);
  } catch (const Error& e) {
    ANVIL_THROW("{}: {}", blame({"optim", "adamw_bf16_moments", "momentum", "dampening", "nesterov"}),
                e.what());
  }
  ANVIL_REQUIRE(
      no_decay_lr_multiplier >= 0 && embedding_lr_multiplier >= 0,
      "{}: the lr multipliers must be >= 0, got no_decay_lr_multiplier {} and embedding_lr_multiplier {}",
      blame({"no_decay_lr_multiplier", "embedding_lr_multiplier"}), no_decay_lr_multiplier,
      embedding_lr_multiplier);
  ANVIL_REQUIRE(optim_8bit_min_size >= 0, "{} must be >= 0, got {}", subject("optim_8bit_min_size"),
                optim_8bit_min_size);
  ANVIL_REQUIRE(momentum >= 0 && dampening >= 0 && dampening <= 1,
                "{}: momentum must be >= 0 and dampening in [0, 1], got {} and {}",
                blame({"momentum", "dampening"}), momentum, dampening);
  ANVIL_REQUIRE(!nesterov || (momentum > 0 && dampening == 0),
                "{}: nesterov needs momentum > 0 and dampening 0 (as PyTorch), got momentum {} dampening {}",
                blame({"nesterov", "momentum", "dampening"}), momentum, dampening);
  ANVIL_REQUIRE(adafactor_eps1 > 0 && adafactor_eps2 > 0 && adafactor_clip_threshold > 0,
                "{}: adafactor_eps1, adafactor_eps2 and adafactor_clip_threshold must be > 0",
                blame({"adafactor_eps1", "adafactor_eps2", "adafactor_clip_threshold"}));
  ANVIL_REQUIRE(adafactor_decay_rate < 0, "{} must be < 0 (HF default -0.8), got {}",
                subject("adafactor_decay_rate"), adafactor_decay_rate);
  ANVIL_REQUIRE(adafactor_beta1 < 1, "{} must be < 1 (negative: no first moment), got {}",
                subject("adafactor_beta1"), adafactor_beta1);
  ANVIL_REQUIRE(!adafactor_warmup_init || adafactor_relative_step,
                "{}: adafactor_warmup_init needs adafactor_relative_step (as in transformers)",
                blame({"adafactor_warmup_init", "adafactor_relative_step"}));
  ANVIL_REQUIRE(warmup_steps >= 0, "{} must be >= 0, got {}", subject("warmup_steps"), warmup_steps);
  ANVIL_REQUIRE(parses([&] { parse_lr_schedule(lr_scheduler_type); }),
                "{} '{}' is not supported (constant, constant_with_warmup, linear, cosine)",
                subject("lr_scheduler_type"), lr_scheduler_type);
  ANVIL_REQUIRE(ddp_timeout >= 1, "{} must be >= 1 second, got {}", subject("ddp_timeout"), ddp_timeout);
  ANVIL_REQUIRE(ddp_bucket_cap_mb >= 0,
                "{} must be >= 0 (MB; 0: one reduction after the whole backward), got {}",
                subject("ddp_bucket_cap_mb"), ddp_bucket_cap_mb);
  ANVIL_REQUIRE(zero_stage >= 0 && zero_stage <= 3, "{} must be 0, 1, 2 or 3, got {}", subject("zero_stage"),
                zero_stage);
  ANVIL_REQUIRE(zero_allgather_bucket_size >= 1, "{} must be >= 1 (elements), got {}",
                subject("zero_allgather_bucket_size"), zero_allgather_bucket_size);
  ANVIL_REQUIRE(max_grad_norm >= 0, "{} must be >= 0 (0 disables clipping), got {}", subject("max_grad_norm"),
                max_grad_norm);
  ANVIL_REQUIRE(logging_steps >= 1, "{} must be >= 1, got {}", subject("logging_steps"), logging_steps);
  ANVIL_REQUIRE(save_total_limit >= 0, "{} must be >= 0 (0 keeps every checkpoint), got {}",
                subject("save_total_limit"), save_total_limit);
  ANVIL_REQUIRE(save_steps >= 0, "{} must be >= 0, got {}", subject("save_steps"), save_steps);
  ANVIL_REQUIRE(save_strategy == "steps" || save_strategy == "no", "{} must be steps or no, got '{}'",
                subject("save_strategy"), save_strategy);
  ANVIL_REQUIRE(eval_steps >= 0, "{} must be >= 0, got {}", subject("eval_steps"), eval_steps);
  ANVIL_REQUIRE(max_eval_batches >= 0, "{} must be >= 0 (0: the default), got {}",
                subject("max_eval_batches"), max_eval_batches);
  ANVIL_REQUIRE(fp32_matmul.empty() || parses([&] { parse_fp32_matmul(fp32_matmul); }),
                "{} must be fp32, tf32 or 3xtf32, got '{}'", subject("fp32_matmul"), fp32_matmul);
  ANVIL_REQUIRE(!tf32 || fp32_matmul.empty() || fp32_matmul == "tf32",
                "{}: tf32 true asks for TF32 matmuls but fp32_matmul is '{}'; set one of them",
                blame({"tf32", "fp32_matmul"}), fp32_matmul);
  ANVIL_REQUIRE(device == "auto" || device == "cpu" || device == "cuda",
                "{} must be auto, cpu or cuda, got '{}'", subject("device"), device);
  ANVIL_REQUIRE(!output_dir.empty(), "{} must not be empty", subject("output_dir"));
  ANVIL_REQUIRE(sample_max_new_tokens >= 0, "{} must be >= 0, got {}", subject("sample_max_new_tokens"),
                sample_max_new_tokens);
  ANVIL_REQUIRE(sample_temperature >= 0, "{} must be >= 0, got {}", subject("sample_temperature"),
                sample_temperature);
  ANVIL_REQUIRE(sample_top_k >= 0, "{} must be >= 0, got {}", subject("sample_top_k"), sample_top_k);

  // Precision.
  ANVIL_REQUIRE(!(fp16 && bf16), "{}: fp16 and bf16 are both true; choose one (bf16 needs no loss scaling)",
                blame({"fp16", "bf16"}));
  ANVIL_REQUIRE(
      !stochastic_rounding || bf16,
      "{}: stochastic_rounding rounds bf16 weights, so it needs bf16 true (got stochastic_rounding true "
      "with {})",
      blame({"stochastic_rounding", "bf16"}), precision());
  ANVIL_REQUIRE(!stochastic_rounding || freeze_parameters.empty(),
                "{}: stochastic_rounding and freeze_parameters cannot be combined: stochastic rounding "
                "re-rounds every bf16 weight from its master weight at each step, so frozen weights would "
                "move; remove one of them",
                blame({"stochastic_rounding", "freeze_parameters"}));
  ANVIL_REQUIRE(lora_r >= 0, "{} must be >= 0 (0: no LoRA), got {}", subject("lora_r"), lora_r);
  if (lora_r > 0) {
    ANVIL_REQUIRE(std::isfinite(lora_alpha) && lora_alpha > 0, "{} must be > 0, got {}",
                  subject("lora_alpha"), lora_alpha);
    ANVIL_REQUIRE(lora_dropout >= 0 && lora_dropout < 1, "{} must be in [0, 1), got {}",
                  subject("lora_dropout"), lora_dropout);
    ANVIL_REQUIRE(!model.is_bert(),
                  "{}: LoRA is for the decoder families (gpt2, llama, qwen2, mistral) for now, not bert; "
                  "fine-tune the classifier whole, or freeze its encoder (freeze_parameters)",
                  blame({"lora_r", "model"}));
    ANVIL_REQUIRE(!stochastic_rounding,
                  "{}: stochastic_rounding and LoRA cannot be combined: stochastic rounding re-rounds every "
                  "bf16 weight from its master weight at each step, so the frozen base would move; remove "
                  "stochastic_rounding",
                  blame({"stochastic_rounding", "lora_r"}));
  }
  if (!lora_adapter.empty()) {
    ANVIL_REQUIRE(lora_r > 0,
                  "{}: lora_adapter's factors start the run's LoRA adapters: set lora_r, lora_alpha and "
                  "lora_target_modules as its adapter_config.json has them",
                  blame({"lora_adapter", "lora_r"}));
    ANVIL_REQUIRE(!init_from.empty(),
                  "{}: lora_adapter needs its base model: set model_name_or_path to the base's directory",
                  blame({"lora_adapter", "model_name_or_path"}));
  }
  if (parse_weight_storage(quantization, subject("quantization").c_str()) != WeightStorage::Compute) {
    ANVIL_REQUIRE(lora_r > 0,
                  "{}: a quantized base trains through LoRA adapters only (QLoRA): set lora_r (e.g. 16), or "
                  "quantization none to train the model itself",
                  blame({"quantization", "lora_r"}));
    ANVIL_REQUIRE(zero_stage <= 2,
                  "{}: QLoRA keeps the quantized base whole on every process (stages 1-2 shard the adapters' "
                  "state); stage 3 would shard the base, which this version does not do for a quantized one: "
                  "set zero_stage 2",
                  blame({"quantization", "zero_stage"}));
    ANVIL_REQUIRE(freeze_parameters.empty(),
                  "{}: under QLoRA every adapter trains and the base is frozen already; remove "
                  "freeze_parameters",
                  blame({"quantization", "freeze_parameters"}));
  }
  ANVIL_REQUIRE(offload_optimizer == "none" || offload_optimizer == "cpu" || offload_optimizer == "nvme",
                "{} must be none, cpu or nvme, got '{}'", subject("offload_optimizer"), offload_optimizer);
  const bool nvme = offload_optimizer == "nvme" || offload_param == "nvme";
  if (nvme) {
    ANVIL_REQUIRE(
        !offload_nvme_path.empty(),
        "{}: {} nvme keeps {} in a swap file: set offload_nvme_path to a directory on the NVMe "
        "drive (DeepSpeed's {}.nvme_path)",
        blame({offload_optimizer == "nvme" ? "offload_optimizer" : "offload_param", "offload_nvme_path"}),
        offload_optimizer == "nvme" ? "offload_optimizer" : "offload_param",
        offload_optimizer == "nvme" ? "the optimizer state" : "the weights",
        offload_optimizer == "nvme" ? "offload_optimizer" : "offload_param");
    ANVIL_REQUIRE(sub_group_size >= 1,
                  "{} must be >= 1 (elements of the parameters per swapped sub-group), got {}",
                  subject("sub_group_size"), sub_group_size);
    ANVIL_REQUIRE(aio_block_size >= 4096 && aio_block_size % 4096 == 0,
                  "{} must be a multiple of 4096 bytes (direct I/O), at least 4096, got {}",
                  subject("aio_block_size"), aio_block_size);
    ANVIL_REQUIRE(aio_threads >= 1 && aio_threads <= 256, "{} must be 1..256, got {}", subject("aio_threads"),
                  aio_threads);
  }
  ANVIL_REQUIRE(
      offload_nvme_path.empty() || nvme,
      "{}: offload_nvme_path is where offload_optimizer nvme and offload_param nvme keep their swap "
      "files, but offload_optimizer is '{}' and offload_param '{}': set either to nvme, or remove "
      "offload_nvme_path",
      blame({"offload_nvme_path", "offload_optimizer", "offload_param"}), offload_optimizer, offload_param);
  if (offload_optimizer != "none") {
    ANVIL_REQUIRE(lora_r == 0,
                  "{}: LoRA keeps master weights and optimizer state for the adapters only (a few MB); "
                  "offloading them gains nothing: remove offload_optimizer",
                  blame({"offload_optimizer", "lora_r"}));
    ANVIL_REQUIRE(!stochastic_rounding,
                  "{}: the host update rounds the master weights to nearest; remove stochastic_rounding",
                  blame({"offload_optimizer", "stochastic_rounding"}));
  }
  ANVIL_REQUIRE(offload_param == "none" || offload_param == "cpu" || offload_param == "nvme",
                "{} must be none, cpu or nvme, got '{}'", subject("offload_param"), offload_param);
  if (offload_param != "none") {
    ANVIL_REQUIRE(zero_stage == 3,
                  "{}: offload_param {} keeps each rank's shard of the weights off the device, and only ZeRO "
                  "stage 3 shards the weights: set zero_stage 3 (with one process too)",
                  blame({"offload_param", "zero_stage"}), offload_param);
    ANVIL_REQUIRE(
        offload_optimizer != "none",
        "{}: with offload_param {} the weights off the device are updated there by the offloaded "
        "optimizer: set offload_optimizer cpu too (or nvme; DeepSpeed's ZeRO-Infinity offloads both)",
        blame({"offload_param", "offload_optimizer"}), offload_param);
  }
  ANVIL_REQUIRE(offload_param_buffer_count >= 2 && offload_param_buffer_count <= 1024,
                "{} must be 2..1024 (pinned buffers the weight shard is paged through: one copied to the GPU "
                "while the next is read), got {}",
                subject("offload_param_buffer_count"), offload_param_buffer_count);
  ANVIL_REQUIRE(grad_accum_dtype == "fp32" || grad_accum_dtype == "bf16" || grad_accum_dtype == "fp16",
                "{} must be fp32, bf16 or fp16, got '{}'", subject("grad_accum_dtype"), grad_accum_dtype);
  ANVIL_REQUIRE(communication_data_type.empty() || communication_data_type == "fp32" ||
                    communication_data_type == "bf16" || communication_data_type == "fp16",
                "{} must be fp32, bf16 or fp16 (or \"\" for the gradient type, grad_accum_dtype), got '{}'",
                subject("communication_data_type"), communication_data_type);
  if (!backward_grad_dtype.empty() && backward_grad_dtype != grad_accum_dtype) {
    ANVIL_REQUIRE(
        backward_grad_dtype == precision(),
        "{}: backward_grad_dtype '{}' must be the gradients' type (grad_accum_dtype {}) or the 16-bit "
        "compute type in use (the precision is {})",
        blame({"backward_grad_dtype", "grad_accum_dtype", "bf16", "fp16"}), backward_grad_dtype,
        grad_accum_dtype, precision());
    ANVIL_REQUIRE(zero_stage >= 2,
                  "{}: backward_grad_dtype '{}' writes each micro-batch's gradients in {} and adds them into "
                  "{} gradients once they are reduced unit by unit, which ZeRO stages 2 and 3 do; with "
                  "zero_stage {} set zero_stage 2, or grad_accum_dtype {} for 16-bit gradients throughout",
                  blame({"backward_grad_dtype", "zero_stage"}), backward_grad_dtype, backward_grad_dtype,
                  grad_accum_dtype, zero_stage, backward_grad_dtype);
  }
  ANVIL_REQUIRE(
      grad_accum_dtype == "fp32" || grad_accum_dtype == precision(),
      "{}: grad_accum_dtype '{}' needs {} true (16-bit gradient accumulation uses the 16-bit type in "
      "use; the precision is {})",
      blame({"grad_accum_dtype", "fp16", "bf16"}), grad_accum_dtype, grad_accum_dtype, precision());
  loss_scaler().validate(blame({"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                                "consecutive_hysteresis", "min_loss_scale", "max_overflows_at_min_scale"}));
  ANVIL_REQUIRE(
      debug_inject_overflow_steps.empty() || fp16,
      "{}: debug_inject_overflow_steps needs fp16 true (only the fp16 loss scaler skips overflowing steps)",
      blame({"debug_inject_overflow_steps", "fp16"}));
  for (const int64_t step : debug_inject_overflow_steps)
    ANVIL_REQUIRE(step >= 1, "{} holds 1-based global step numbers, got {}",
                  subject("debug_inject_overflow_steps"), step);
}

LossScalerConfig TrainConfig::loss_scaler() const {
  LossScalerConfig l;
  l.loss_scale = loss_scale;
  l.initial_scale_power = initial_scale_power;
  l.loss_scale_window = loss_scale_window;
  l.hysteresis = hysteresis;
  l.consecutive_hysteresis = consecutive_hysteresis;
  l.min_loss_scale = min_loss_scale;
  l.max_overflows_at_min_scale = max_overflows_at_min_scale;
  return l;
}

json TrainConfig::to_json() const {
  json m;
  if (!model_preset.empty()) {
    m = model_preset;
  } else {
    m = {{"family", model.family},
         {"n_layer", model.n_layer},
         {"n_head", model.n_head},
         {"n_embd", model.n_embd},
         {"vocab_size", model.vocab_size},
         {"block_size", model.block_size},
         {"eos_token_id", model.eos_token_id}};
    if (model.is_bert()) {  // every encoder field, so the file reads back into the same model
      m["intermediate_size"] = model.intermediate_size;
      m["layer_norm_eps"] = model.layer_norm_eps;
      m["hidden_act"] = model.hidden_act;
      m["type_vocab_size"] = model.type_vocab_size;
      m["pad_token_id"] = model.pad_token_id;
      m["initializer_range"] = model.initializer_range;
      m["hidden_dropout_prob"] = model.hidden_dropout_prob;
      m["attention_probs_dropout_prob"] = model.attention_probs_dropout_prob;
      if (model.classifier_dropout >= 0) m["classifier_dropout"] = model.classifier_dropout;
      m["problem_type"] = model.problem_type;
      // The labels only when the config fixed them (otherwise they follow the data, on reading back too).
      if (!labels_from_data) {
        m["num_labels"] = model.num_labels;
        m["label_names"] = model.label_names;
      }
    }
  }
  return {{"model", m},
          {"init_from", init_from},
          {"freeze_parameters", freeze_parameters},
          {"lora_r", lora_r},
          {"lora_alpha", lora_alpha},
          {"lora_dropout", lora_dropout},
          {"use_rslora", use_rslora},
          {"lora_target_modules", lora_target_modules},
          {"lora_adapter", lora_adapter},
          {"quantization", quantization},
          {"tokenizer", tokenizer},
          {"train_data", train_data},
          {"val_data", val_data},
          {"per_device_train_batch_size", per_device_train_batch_size},
          {"per_device_eval_batch_size", per_device_eval_batch_size},
          {"gradient_accumulation_steps", gradient_accumulation_steps},
          {"auto_find_batch_size", auto_find_batch_size},
          {"gradient_checkpointing", gradient_checkpointing},
          {"gradient_checkpointing_mode", gradient_checkpointing_mode},
          {"gradient_checkpointing_every", gradient_checkpointing_every},
          {"max_seq_length", max_seq_length},
          {"dataloader_num_workers", dataloader_num_workers},
          {"dataloader_pin_memory", dataloader_pin_memory},
          {"max_steps", max_steps},
          {"num_train_epochs", num_train_epochs},
          {"learning_rate", learning_rate},
          {"weight_decay", weight_decay},
          {"adam_beta1", adam_beta1},
          {"adam_beta2", adam_beta2},
          {"adam_epsilon", adam_epsilon},
          {"warmup_steps", warmup_steps},
          {"lr_scheduler_type", lr_scheduler_type},
          {"max_grad_norm", max_grad_norm},
          {"ddp_timeout", ddp_timeout},
          {"ddp_bucket_cap_mb", ddp_bucket_cap_mb},
          {"communication_data_type", communication_data_type},
          {"backward_grad_dtype", backward_grad_dtype},
          {"zero_stage", zero_stage},
          {"offload_optimizer", offload_optimizer},
          {"offload_param", offload_param},
          {"offload_param_buffer_count", offload_param_buffer_count},
          {"offload_nvme_path", offload_nvme_path},
          {"sub_group_size", sub_group_size},
          {"aio_block_size", aio_block_size},
          {"aio_threads", aio_threads},
          {"zero_allgather_bucket_size", zero_allgather_bucket_size},
          {"optim", optim},
          {"no_decay_lr_multiplier", no_decay_lr_multiplier},
          {"embedding_lr_multiplier", embedding_lr_multiplier},
          {"adamw_bf16_moments", adamw_bf16_moments},
          {"optim_8bit_min_size", optim_8bit_min_size},
          {"optim_8bit_embedding_fp32", optim_8bit_embedding_fp32},
          {"momentum", momentum},
          {"dampening", dampening},
          {"nesterov", nesterov},
          {"adafactor_eps1", adafactor_eps1},
          {"adafactor_eps2", adafactor_eps2},
          {"adafactor_clip_threshold", adafactor_clip_threshold},
          {"adafactor_decay_rate", adafactor_decay_rate},
          {"adafactor_beta1", adafactor_beta1},
          {"adafactor_scale_parameter", adafactor_scale_parameter},
          {"adafactor_relative_step", adafactor_relative_step},
          {"adafactor_warmup_init", adafactor_warmup_init},
          {"seed", seed},
          {"output_dir", output_dir},
          {"overwrite_output_dir", overwrite_output_dir},
          {"save_total_limit", save_total_limit},
          {"save_base_model", save_base_model},
          {"logging_steps", logging_steps},
          {"save_steps", save_steps},
          {"save_strategy", save_strategy},
          {"eval_steps", eval_steps},
          {"max_eval_batches", max_eval_batches},
          {"fp16", fp16},
          {"bf16", bf16},
          {"tf32", tf32},
          {"fp32_matmul", fp32_matmul},
          {"loss_scale", loss_scale},
          {"initial_scale_power", initial_scale_power},
          {"loss_scale_window", loss_scale_window},
          {"hysteresis", hysteresis},
          {"consecutive_hysteresis", consecutive_hysteresis},
          {"min_loss_scale", min_loss_scale},
          {"max_overflows_at_min_scale", max_overflows_at_min_scale},
          {"stochastic_rounding", stochastic_rounding},
          {"grad_accum_dtype", grad_accum_dtype},
          {"debug_inject_overflow_steps", debug_inject_overflow_steps},
          {"deepspeed", deepspeed},
          {"memory_trace", memory_trace},
          {"memory_trace_step", memory_trace_step},
          {"profile_steps", profile_steps},
          {"cuda_graphs", cuda_graphs},
          {"gemm_tuning", gemm_tuning},
          {"gemm_tuning_cache", gemm_tuning_cache},
          {"peak_flops", peak_flops},
          {"device", device},
          {"resume_from_checkpoint", resume_from_checkpoint},
          {"sample_prompt", sample_prompt},
          {"sample_max_new_tokens", sample_max_new_tokens},
          {"sample_temperature", sample_temperature},
          {"sample_top_k", sample_top_k}};
}

std::pair<int64_t, int64_t> TrainConfig::profile_range() const {
  if (profile_steps.empty()) return {0, 0};
  const size_t colon = profile_steps.find(':');
  long long a = 0, b = 0;
  size_t pa = 0, pb = 0;
  bool ok = colon != std::string::npos;
  if (ok) {
    try {
      a = std::stoll(profile_steps.substr(0, colon), &pa);
      b = std::stoll(profile_steps.substr(colon + 1), &pb);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  ok = ok && pa == colon && pb == profile_steps.size() - colon - 1 && a >= 1 && b >= a;
  ANVIL_REQUIRE(ok, "profile_steps must be A:B with 1 <= A <= B (global steps, e.g. 5:7), got '{}'",
                profile_steps);
  return {a, b};
}

void set_config_override(json& j, const std::string& key, const std::string& value) {
  // `--output_dir 2024` or `--sample_prompt true` are strings, not a number or a boolean.
  static const json defaults = TrainConfig().to_json();
  if (const auto d = defaults.find(key); d != defaults.end() && d->is_string()) {
    j[key] = value;
    return;
  }
  json v;
  if (value == "true" || value == "false") {
    v = value == "true";
  } else {
    try {
      size_t pos = 0;
      const long long iv = std::stoll(value, &pos);
      if (pos == value.size()) {
        v = iv;
      } else {
        const double dv = std::stod(value, &pos);
        v = pos == value.size() ? json(dv) : json(value);
      }
    } catch (const std::exception&) {
      v = value;
    }
  }
  j[key] = v;
}

}  // namespace anvil
