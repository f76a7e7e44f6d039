// Model FLOPs utilisation: the model's training FLOPs per token against the device's dense peak.
#pragma once
#include <cstdint>
#include <string>

#include "anvil/model_config.hpp"

namespace anvil {

// Training FLOPs per token of a model at sequence length `seq_len`: 6 N (forward + backward of every
// parameter's multiply-add) + 12 L C T (attention scores and weighted values), the nanoGPT / PaLM
// convention. GPT-2: N = every parameter (the tied embedding is the LM head's matrix); BERT: N = the
// encoder blocks' parameters (embeddings are lookups; the pooler and classifier run once per sequence).
// Recomputation for activation checkpointing is not counted (model FLOPs, not hardware FLOPs), so
// checkpointing shows as lower MFU.
double training_flops_per_token(const TransformerConfig& m, int seq_len);

struct PeakFlops {
  double flops = 0;    // per second; 0: unknown
  std::string source;  // where the figure comes from
};
// The dense peak of `device_name` for `precision` (fp32 | tf32 | 3xtf32 | bf16 | fp16; 3xtf32: a third of
// tf32): `configured` when > 0, else the measured 16-bit GEMM peak of a GPU we benchmarked (bf16 / fp16),
// else the nominal figure of a known GPU (NVIDIA's spec sheets; docs/performance.md), else unknown.
PeakFlops peak_flops(const std::string& device_name, const std::string& precision, double configured);

}  // namespace anvil
