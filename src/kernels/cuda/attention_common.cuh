// Device helpers shared by the materialised attention kernels (attention.cu) and the fused backward scores
// kernel (attention_bwd_scores.cu): which keys a query row sees, and the device side of attention dropout.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "kernels/dropout.hpp"

namespace anvil::cuda {

// The keys row `row` (query t of sequence b, head any) sees: 0..last (last = -1: a padding query).
__device__ inline int last_key(size_t row, int seq, int NH, bool causal, const int32_t* lengths) {
  const int t = static_cast<int>(row % seq);
  int len = seq;
  if (lengths) len = min(max(lengths[row / seq / NH], 0), seq);
  if (t >= len) return -1;
  return causal ? min(t, len - 1) : len - 1;
}

// The device side of AttentionDropout: the threshold and the factor 1 / (1 - p), computed on the host.
struct DropoutArgs {
  const anvil::DropoutState* state;
  uint32_t site;
  uint32_t threshold;
  float scale;
};

inline DropoutArgs dropout_args(const AttentionDropout& d) {
  return {d.state, d.site, anvil::dropout_threshold(d.p), anvil::dropout_scale(d.p)};
}

// The key of the probabilities' whole mask in the current micro-batch (read from device memory); each row's
// 32-bit key derives from it.
__device__ inline uint64_t probabilities_dropout_key(const DropoutArgs& d) {
  return anvil::dropout_key(d.state->seed, d.state->micro, d.site);
}

// The 32-bit key of probability row `row` (anvil::attention_dropout_keep's first argument).
__device__ inline uint32_t attention_dropout_row_key(const DropoutArgs& d, uint64_t row) {
  return anvil::attention_dropout_row_key(probabilities_dropout_key(d), row);
}

// attention_bwd_scores.cu: the fused front half of the fp32 backward (see there). Writes the dropped
// probabilities into `probs` and dscores into `dscores`, both [B, NH, T, T]. Supported for fp32 with head
// sizes 32, 64 and 128 when the operands allow 4-element vector reads; otherwise attention.cu runs the
// unfused kernels.
// attention_fwd_fused.cu: the whole fp32 forward in one kernel (out and lse; see there). Supported for fp32
// with head sizes 32 and 64 when qkv and out allow 4-element vector access; otherwise attention.cu runs the
// GEMMs and the softmax kernel.
bool attention_fwd_fused_supported(anvil::DType act, int B, int T, int C, int NH, const void* qkv,
                                   const void* out);
void attention_fwd_fused(cudaStream_t stream, float* out, float* lse, const float* qkv, int B, int T, int C,
                         int NH, bool causal, const int32_t* lengths, const AttentionDropout& dropout);

bool attention_bwd_scores_supported(anvil::DType act, int B, int T, int C, int NH, const void* qkv,
                                    const void* dout, const void* out);
void attention_bwd_scores(cudaStream_t stream, float* probs, float* dscores, const float* qkv,
                          const float* dout, const float* out, const float* lse, int B, int T, int C, int NH,
                          float scale, bool causal, const int32_t* lengths, const AttentionDropout& dropout);

}  // namespace anvil::cuda
