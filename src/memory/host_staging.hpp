// The host memory a training process holds for its steps, outside the device plan: the data loaders' batch
// staging (pinned with dataloader_pin_memory, the default, else pageable) and the pinned host copies of the
// step's values and dropout state that the step uploads. `anvil estimate --num_gpus N` multiplies it by the
// processes of a node (docs/memory.md). Everything else a process holds on the host (the memory-mapped token
// shards, the shuffle order, checkpoint writing, the communicator's buffers) is not planned and not counted.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "anvil/memory_plan.hpp"
#include "anvil/train_config.hpp"

namespace anvil {

struct HostBuffer {
  std::string name;  // e.g. "train loader staging (6 slots x 8 x 1024 tokens, inputs + targets)"
  size_t bytes = 0;
  bool pinned = false;
};

struct HostStaging {
  std::vector<HostBuffer> buffers;
  size_t pinned_bytes() const;
  size_t total_bytes() const;
};

// One process of a run of `cfg` (its batch as the memory fit settled it; a classifier's sequence length as
// its data decides it), whose device plan is `plan` (the step's values and dropout state have host copies)
// and, under optimizer offload, whose host optimizer holds `host_optimizer` (buffers named "pinned" are).
HostStaging host_staging_per_process(const TrainConfig& cfg, const TransformerConfig& model,
                                     const MemoryPlan& plan, const MemoryPlan* host_optimizer = nullptr);

}  // namespace anvil
