// The values of a training step that change from one step to the next (learning rate, bias corrections,
// rounding seeds, the gradient unscale factor), gathered in one plain struct that can live in device memory.
//
// Kernels normally take these values as arguments, which a CUDA graph freezes at capture. An op called with
// a `step_values` pointer instead reads them from that struct when it runs, so a recorded training step
// replays with the values the host wrote for this step (the trainer refreshes the struct with one
// host-to-device copy that is itself part of the graph). Included by nvcc (cuda_kernels.hpp) and the C++
// side (ops.hpp): no dependencies.
#pragma once
#include <cstdint>

namespace anvil {

struct StepValues {
  // Per parameter group (kMaxParamGroups entries): the learning rate (AdamW, 8-bit AdamW, SGD) or the step
  // size (Adafactor), the group's multiplier included.
  float lr[4] = {};
  // The 1-based count of applied updates (SGD: step 1 initialises the momentum buffer).
  int64_t step = 1;
  // AdamW and 8-bit AdamW: 1 - beta1^step and 1 - beta2^step, computed on the host in fp64 (the kernels
  // derive their fp32 factors from these with correctly rounded fp64 operations, as the host did).
  double bias1 = 1, bias2 = 1;
  // Adafactor: 1 - step^decay_rate.
  float beta2t = 0;
  // AdamW with bf16 moments: the stochastic-rounding seed of this step, and the flat-buffer index of the
  // optimizer's element 0 (a ZeRO shard's first element; 0 otherwise): element i rounds with the bits of
  // index moment_index_base + i, as one process rounds it.
  uint64_t moment_seed = 0;
  uint64_t moment_index_base = 0;
  // Ops::cast_weights with stochastic rounding: the seed of this step's weight cast.
  uint64_t cast_seed = 0;
  // Ops::grad_clip_scale: stored gradients x unscale = the gradient of the step's mean loss.
  double unscale = 1;
};

}  // namespace anvil
