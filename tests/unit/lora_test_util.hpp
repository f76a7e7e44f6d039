// Shared by the LoRA and QLoRA tests: a short LoRA training run's config on a byte corpus, and random weights
// for a layout.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/rng.hpp"
#include "anvil/train_config.hpp"
#include "model/param_layout.hpp"
#include "test_util.hpp"

namespace anvil::test {

// llama-tiny on the corpus, LoRA r 8 (lora_alpha 16) on every block Linear, `steps` steps of batch 4 x 32 on
// the CPU, a checkpoint at the end; `extra` (JSON) overrides or adds keys.
inline TrainConfig lora_run(const ByteCorpus& c, const std::string& out, int steps,
                            const std::string& extra = "{}") {
  nlohmann::json j = {{"model", "llama-tiny"},
                      {"train_data", c.dir / "data/train.bin"},
                      {"per_device_train_batch_size", 4},
                      {"max_seq_length", 32},
                      {"max_steps", steps},
                      {"learning_rate", 1e-2},
                      {"logging_steps", 1},
                      {"save_steps", steps},
                      {"device", "cpu"},
                      {"seed", 7},
                      {"lora_r", 8},
                      {"lora_alpha", 16},
                      {"lora_target_modules", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"},
                      {"output_dir", out}};
  j.update(nlohmann::json::parse(extra));
  return TrainConfig::from_json(j, "test");
}

// Weights for every tensor of `l`: the norms' 1, everything else (adapter factors too, B included, so that
// every gradient is non-trivial) N(0, 0.05).
inline std::vector<float> random_weights(const ParamLayout& l, Rng& rng) {
  std::vector<float> w(l.total_numel());
  for (const ParamTensor& t : l.tensors()) {
    const bool norm = t.role == TensorRole::Norm1Weight || t.role == TensorRole::Norm2Weight ||
                      t.role == TensorRole::FinalNormWeight;
    for (size_t i = 0; i < t.numel(); ++i) w[t.offset + i] = norm ? 1.0f : 0.05f * rng.normal();
  }
  return w;
}

}  // namespace anvil::test
