// The training run the offload tests compare (tests/unit/offload_test.cpp, offload_nvme_test.cpp): llama-tiny
// on the CPU, 6 steps of 4 x 32 tokens, a checkpoint every 3, with `extra` on top.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "anvil/train_config.hpp"
#include "test_util.hpp"

namespace anvil::test {

inline TrainConfig offload_run_config(const ByteCorpus& c, const std::string& out,
                                      const nlohmann::json& extra) {
  nlohmann::json j = {{"model", "llama-tiny"},
                      {"train_data", c.dir / "data/train.bin"},
                      {"per_device_train_batch_size", 4},
                      {"max_seq_length", 32},
                      {"max_steps", 6},
                      {"learning_rate", 1e-3},
                      {"weight_decay", 0.1},
                      {"logging_steps", 1},
                      {"save_steps", 3},
                      {"device", "cpu"},
                      {"seed", 3},
                      {"dataloader_pin_memory", false},
                      {"output_dir", out}};
  j.update(extra);
  return TrainConfig::from_json(j, "test");
}

}  // namespace anvil::test
