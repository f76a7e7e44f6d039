// DeepSpeed's model-states memory estimators, computed as DeepSpeed computes them, so that `anvil estimate
// --num_gpus N --num_nodes M` can print them beside Anvil's own plan (docs/memory.md). They are DeepSpeed's
// figures for the parameters, gradients and Adam states of 16-bit mixed-precision training under ZeRO-2 and
// ZeRO-3 (no activations, buffers or CUDA context), not Anvil's plan.
//
// Source: DeepSpeed (github.com/deepspeedai/DeepSpeed), deepspeed/runtime/zero/stage_1_and_2.py
// estimate_zero2_model_states_mem_needs (with its GPU formula as changed by DeepSpeed PR #5099, 2024) and
// deepspeed/runtime/zero/stage3.py estimate_zero3_model_states_mem_needs, printed as their
// *_mem_needs_all_cold functions print them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "anvil/model_config.hpp"

namespace anvil {

// What DeepSpeed's estimators take from a model (stage3.py model_to_params): the parameter count, a tied
// tensor counted once, and the largest "layer": the most parameters one module holds itself (its weight and
// bias, not its children's).
struct DeepSpeedParamCounts {
  int64_t total_params = 0;
  int64_t largest_layer_params = 0;
  std::string largest_layer;  // its Hugging Face module name, e.g. "transformer.wte"
};

// The counts of the Hugging Face model a config describes, from Anvil's layout table (Hugging Face names and
// shapes; a module is a tensor name less its last component). A tied LM head holds the token embedding, so
// it never exceeds it.
DeepSpeedParamCounts deepspeed_param_counts(const TransformerConfig& model);

// One row of an estimator's table: bytes as DeepSpeed computes them (truncated to integers).
struct DeepSpeedEstimateRow {
  bool offload_param = false;      // ZeRO-3 only
  bool offload_optimizer = false;  // offload_optimizer=cpu
  bool zero_init = false;          // ZeRO-3 only: the model built under deepspeed.zero.Init
  int64_t cpu_bytes = 0;           // host memory per node
  int64_t gpu_bytes = 0;           // per GPU
};

// DeepSpeed's default additional_buffer_factor.
constexpr double kDeepSpeedBufferFactor = 1.5;

// The rows in DeepSpeed's order: ZeRO-2 offload_optimizer cpu, none; ZeRO-3 (offload_param,
// offload_optimizer) = (cpu, cpu), (none, cpu), (none, none), each with zero_init 1 then 0.
std::vector<DeepSpeedEstimateRow> deepspeed_zero2_estimates(int64_t total_params, int gpus_per_node,
                                                            int num_nodes,
                                                            double buffer_factor = kDeepSpeedBufferFactor);
std::vector<DeepSpeedEstimateRow> deepspeed_zero3_estimates(int64_t total_params,
                                                            int64_t largest_layer_params, int gpus_per_node,
                                                            int num_nodes,
                                                            double buffer_factor = kDeepSpeedBufferFactor);

// The tables exactly as DeepSpeed prints them ("Estimated memory needed for ...", the HW and SW lines, then
// " %7.2fGB | %6.2fGB | options" per row, GB being bytes / 2^30).
std::string deepspeed_zero2_table(int64_t total_params, int gpus_per_node, int num_nodes);
std::string deepspeed_zero3_table(int64_t total_params, int64_t largest_layer_params, int gpus_per_node,
                                  int num_nodes);

}  // namespace anvil
