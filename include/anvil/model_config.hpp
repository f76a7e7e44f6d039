// The shape of a transformer: TransformerConfig, GPT-2 presets, and the vocabulary padding rule.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace anvil {

struct TransformerConfig {
  std::string family = "gpt2";
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int vocab_size = 256;   // real vocabulary
  int block_size = 128;   // maximum sequence length (HF n_positions)
  int eos_token_id = -1;  // -1: none

  // Vocabulary rounded up to a multiple of 128, so the head GEMM has Tensor-Core friendly shapes.
  // The extra rows are zero and never receive gradient.
  int padded_vocab_size() const { return (vocab_size + 127) / 128 * 128; }
  int head_size() const { return n_embd / n_head; }
  // Parameter count as Hugging Face counts it (real vocabulary, tied head counted once).
  int64_t num_parameters() const;
  // Throws anvil::Error naming the field and value when the shape is invalid; `where` prefixes messages.
  void validate(std::string_view where = "model") const;

  // GPT-2 presets: "tiny" (CPU default), "d12" (124M), "d24" (350M), "d36" (774M), "d48" (1.5B).
  static TransformerConfig preset(std::string_view name);
  static std::vector<std::string> preset_names();

  // Hugging Face GPT2Config (config.json) import and export.
  static TransformerConfig from_hf_json(const nlohmann::json& j, std::string_view source);
  nlohmann::json to_hf_json() const;
};

}  // namespace anvil
