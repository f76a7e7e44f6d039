// Activation checkpointing policy. A checkpointed block keeps only its input (the previous block's
// output, always stored); the activations its backward needs are recomputed by re-running its forward
// just before its backward, into one block's worth of recompute buffers shared by all checkpointed blocks.
//   full       recompute everything inside the block
//   selective  keep the attention tensors (qkv, attention output, probabilities: the expensive part to
//              recompute) and recompute the LayerNorm outputs, the residual and the MLP activations
// `every` = N checkpoints blocks 0, N, 2N, ... and stores the others in full.
#pragma once
#include <string>
#include <string_view>

namespace anvil {

enum class CheckpointMode { None, Full, Selective };

struct CheckpointPolicy {
  CheckpointMode mode = CheckpointMode::None;
  int every = 1;
  bool checkpointed(int layer) const { return mode != CheckpointMode::None && layer % every == 0; }
};

CheckpointMode parse_checkpoint_mode(std::string_view name);  // "full" | "selective"; throws naming the value
std::string checkpoint_mode_name(CheckpointMode m);

}  // namespace anvil
