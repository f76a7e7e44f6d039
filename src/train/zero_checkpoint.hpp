// Checkpoints under ZeRO stages 1-2 (docs/distributed.md, "Checkpoints"). Every rank takes part: the fp32
// master weights are gathered for rank 0, which writes the Hugging Face model files, trainer_state.json and
// the tokenizer; each rank writes its shard's optimizer state (io/optimizer_state.hpp) into the same
// temporary directory; the directory is renamed into place only once every rank's file is written and
// synced (a barrier), so a rank that fails part way leaves the previous checkpoint as the latest. A shared
// filesystem is assumed across nodes, as DeepSpeed does.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "dist/process_group.hpp"
#include "dist/zero_partition.hpp"
#include "io/base_reference.hpp"
#include "io/optimizer_state.hpp"
#include "train/engine.hpp"

namespace anvil {

// Where rank `rank`'s optimizer state (its shard of `p`) sits in the one-process state tensors: the optimizer
// of every shard is built on the host (tables only, no state) and its tensors' lengths summed in rank order.
io::StateSlices zero_state_slices(const Optimizer& mine, const dist::ZeroPartition& p, int rank);

// Writes checkpoint directory `dir` (a collective: every rank calls it with the same `dir`). `state` is
// trainer_state.json's content, `tokenizer_file` and `base` as io::save_checkpoint.
void save_zero_checkpoint(const std::string& dir, Engine& e, dist::ProcessGroup& group,
                          const io::StateSlices& slices, const nlohmann::json& state,
                          const std::string& tokenizer_file, const io::BaseReference* base = nullptr);

}  // namespace anvil
