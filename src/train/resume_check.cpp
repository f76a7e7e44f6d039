#include "train/resume_check.hpp"

#include <filesystem>
#include <optional>
#include <vector>

#include "dist/dist_env.hpp"
#include "io/atomic_dir.hpp"
#include "model/freeze.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class ResumeCheck {
 public:
  ResumeCheck(const TrainConfig& cfg, const std::string& checkpoint) : cfg_(cfg), checkpoint_(checkpoint) {}

  bool given(const std::string& key) const { return cfg_.origin.contains(key); }

  [[noreturn]] void contradiction(const std::string& key, const std::string& given_value,
                                  const std::string& saved_value, const std::string& where) const {
    const auto it = cfg_.origin.find(key);
    const std::string source = it == cfg_.origin.end() ? "" : fmt::format(" (set by {})", it->second);
    ANVIL_THROW(
        "resume_from_checkpoint '{}': {} is {}{} but the checkpoint has {} ({}); a resume continues the "
        "checkpoint's run, so leave {} unset to take the checkpoint's value, or start a new run from its "
        "weights with --init_from {}",
        checkpoint_, key, given_value, source, saved_value, where, key, checkpoint_);
  }

  // An integer of the checkpoint's training config, if it is recorded as one.
  std::optional<int64_t> saved_int(const json& config, const char* key) const {
    if (!config.is_object()) return std::nullopt;
    const auto it = config.find(key);
    if (it == config.end() || !it->is_number_integer()) return std::nullopt;
    return it->get<int64_t>();
  }
  std::optional<std::string> saved_string(const json& config, const char* key) const {
    if (!config.is_object()) return std::nullopt;
    const auto it = config.find(key);
    if (it == config.end() || !it->is_string()) return std::nullopt;
    return it->get<std::string>();
  }

 private:
  const TrainConfig& cfg_;
  const std::string& checkpoint_;
};

// The shape fields the given model fixes that differ from the checkpoint's, as "n_layer 12" pieces: the
// given values, then the checkpoint's.
struct ShapeDifferences {
  std::vector<std::string> given, saved;
};

ShapeDifferences shape_differences(const TrainConfig& cfg, const TransformerConfig& saved) {
  const TransformerConfig& m = cfg.model;
  ShapeDifferences out;
  const auto cmp = [&](const char* name, auto given, auto had) {
    if (given == had) return;
    out.given.push_back(fmt::format("{} {}", name, given));
    out.saved.push_back(fmt::format("{} {}", name, had));
  };
  cmp("family", m.family, saved.family);
  cmp("n_layer", m.n_layer, saved.n_layer);
  cmp("n_head", m.n_head, saved.n_head);
  cmp("n_embd", m.n_embd, saved.n_embd);
  cmp("block_size", m.block_size, saved.block_size);
  // A preset's (or a shape's without vocab_size) vocabulary follows the tokenizer, compared on its own.
  if (!cfg.vocab_from_tokenizer) cmp("vocab_size", m.vocab_size, saved.vocab_size);
  if (m.exact_gelu() != saved.exact_gelu()) cmp("hidden_act", m.hidden_act, saved.hidden_act);
  if (m.is_bert() && saved.is_bert()) {
    cmp("intermediate_size", m.ffn_size(), saved.ffn_size());  // (GPT-2's is 4 n_embd)
    cmp("type_vocab_size", m.type_vocab_size, saved.type_vocab_size);
    if (!cfg.labels_from_data) cmp("num_labels", m.num_labels, saved.num_labels);
  }
  return out;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

bool same_path(const std::string& a, const std::string& b) {
  if (a == b) return true;
  std::error_code ec;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec);
}

}  // namespace

void check_resume_consistency(const TrainConfig& cfg, const std::string& checkpoint,
                              const TransformerConfig& saved_model, const io::TrainerState& state) {
  const ResumeCheck check(cfg, checkpoint);
  const json& saved = state.config;  // null for a checkpoint without it: only config.json is compared
  const std::string state_file = checkpoint + "/trainer_state.json";

  if (check.given("model")) {
    const ShapeDifferences diffs = shape_differences(cfg, saved_model);
    if (!diffs.given.empty())
      check.contradiction(
          "model",
          fmt::format("{} ({})", cfg.model_preset.empty() ? "a shape" : "'" + cfg.model_preset + "'",
                      join(diffs.given)),
          join(diffs.saved), checkpoint + "/config.json");
  }

  if (check.given("tokenizer") && !cfg.tokenizer.empty()) {
    const std::string carried = io::find_tokenizer_file(checkpoint);
    const bool given_bytes = cfg.tokenizer == "bytes";
    if (given_bytes && !carried.empty())
      check.contradiction("tokenizer", "'bytes'", "the tokenizer '" + carried + "'", "the file it carries");
    if (!given_bytes && carried.empty())
      check.contradiction("tokenizer", "'" + cfg.tokenizer + "'", "the byte tokenizer",
                          "it carries no tokenizer file");
    if (!given_bytes && io::read_text_file(cfg.tokenizer) != io::read_text_file(carried))
      check.contradiction("tokenizer", "'" + cfg.tokenizer + "'", "another tokenizer, '" + carried + "'",
                          "the files differ");
  }

  // The optimizer's state covers the trainable tensors only (compact), so the frozen set must be the same,
  // given or not: another set of the same size would load states into the wrong tensors.
  if (saved.is_object()) {
    const std::string had = check.saved_string(saved, "freeze_parameters").value_or("");
    ANVIL_REQUIRE(
        split_patterns(had) == split_patterns(cfg.freeze_parameters),
        "resume_from_checkpoint '{}': freeze_parameters is '{}' but the checkpoint's run froze '{}' "
        "({}); the optimizer's state covers the trainable tensors only, so a resume keeps them: give "
        "the same freeze_parameters, or start a new run from the checkpoint's weights (fresh optimizer "
        "state) with --init_from {}",
        checkpoint, cfg.freeze_parameters, had, state_file, checkpoint);
  }

  if (check.given("init_from")) {
    const std::optional<std::string> had = check.saved_string(saved, "init_from");
    if (had && !same_path(cfg.init_from, *had))
      check.contradiction("init_from", "'" + cfg.init_from + "'", had->empty() ? "none" : "'" + *had + "'",
                          state_file);
  }

  if (check.given("max_seq_length") && (cfg.max_seq_length > 0 || !saved_model.is_bert())) {
    // 0 means the model's block_size (GPT-2); a BERT run with 0 takes the length from its data.
    const std::optional<int64_t> had = check.saved_int(saved, "max_seq_length");
    if (had) {
      const int64_t given_len = cfg.max_seq_length > 0 ? cfg.max_seq_length : saved_model.block_size;
      const int64_t had_len = *had > 0 ? *had : saved_model.block_size;
      if (given_len != had_len)
        check.contradiction("max_seq_length", std::to_string(given_len), std::to_string(had_len), state_file);
    }
  }

  if (check.given("seed") && saved.is_object() && saved.contains("seed") &&
      saved["seed"].is_number_integer()) {
    const json& had = saved["seed"];
    if (!(had.is_number_unsigned() ? had.get<uint64_t>() == cfg.seed
                                   : had.get<int64_t>() >= 0 && uint64_t(had.get<int64_t>()) == cfg.seed))
      check.contradiction("seed", std::to_string(cfg.seed), had.dump(), state_file);
  }

  const bool batch_given =
      check.given("per_device_train_batch_size") || check.given("gradient_accumulation_steps");
  const std::optional<int64_t> had_b = check.saved_int(saved, "per_device_train_batch_size");
  const std::optional<int64_t> had_a = check.saved_int(saved, "gradient_accumulation_steps");
  const int64_t world = dist::read_dist_env().world_size;
  if (had_b && had_a && world != state.world_size) {
    // Another world size: the global batch (micro-batch x accumulation x processes) is what a resume keeps,
    // so that the data position means the same windows.
    const int64_t had_global = *had_b * *had_a * state.world_size;
    const int64_t global = int64_t(cfg.per_device_train_batch_size) * cfg.gradient_accumulation_steps * world;
    ANVIL_REQUIRE(
        global == had_global,
        "resume_from_checkpoint '{}': the checkpoint's run had {} process(es) x {} x {} accumulation = a "
        "global batch of {}, this one has {} x {} x {} = {} ({}); set per_device_train_batch_size and "
        "gradient_accumulation_steps so that their product times {} process(es) is {}",
        checkpoint, state.world_size, *had_b, *had_a, had_global, world, cfg.per_device_train_batch_size,
        cfg.gradient_accumulation_steps, global, state_file, world, had_global);
  } else if (batch_given && had_b && had_a) {
    const bool had_auto = saved.contains("auto_find_batch_size") && saved["auto_find_batch_size"] == true;
    if (cfg.auto_find_batch_size || had_auto) {
      // auto_find_batch_size trades micro-batch for accumulation at start-up: their product is what is fixed.
      const int64_t given_eff = int64_t(cfg.per_device_train_batch_size) * cfg.gradient_accumulation_steps;
      if (given_eff != *had_b * *had_a)
        check.contradiction(
            check.given("per_device_train_batch_size") ? "per_device_train_batch_size"
                                                       : "gradient_accumulation_steps",
            fmt::format("{} x {} accumulation = effective batch {}", cfg.per_device_train_batch_size,
                        cfg.gradient_accumulation_steps, given_eff),
            fmt::format("{} x {} = effective batch {}", *had_b, *had_a, *had_b * *had_a), state_file);
    } else {
      if (check.given("per_device_train_batch_size") && cfg.per_device_train_batch_size != *had_b)
        check.contradiction("per_device_train_batch_size", std::to_string(cfg.per_device_train_batch_size),
                            std::to_string(*had_b), state_file);
      if (check.given("gradient_accumulation_steps") && cfg.gradient_accumulation_steps != *had_a)
        check.contradiction("gradient_accumulation_steps", std::to_string(cfg.gradient_accumulation_steps),
                            std::to_string(*had_a), state_file);
    }
  }
}

}  // namespace anvil
