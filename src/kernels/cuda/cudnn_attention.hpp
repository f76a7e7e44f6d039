// Flash attention through cuDNN's fused scaled-dot-product-attention graphs (the cuDNN frontend's SDPA
// forward and backward): bf16 / fp16, causal, sliding-window and padding masks, grouped-query heads (cuDNN
// takes NKV < NH key/value heads natively, its backward summing dK / dV over each group), no T x T matrix
// anywhere. q, k and v are read in place from the [B, T, (NH + 2 NKV) HS] qkv buffer and out / dqkv written
// in place through strides, so there are no permutes or copies. Implements the Ops attention contract
// (kernels/ops.hpp) with the forward's softmax statistics (cuDNN "Stats", the natural log-sum-exp) as lse.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "anvil/dtype.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace anvil::cuda {

class CudnnAttention {
 public:
  // Whether this build has the cuDNN frontend (third_party/cudnn_frontend, scripts/setup.sh).
  static bool compiled();
  // Whether compiled() and the head size suits cuDNN's flash kernels: 16-bit storage, HS a multiple of 8 and
  // at most 128 (the backward's limit on Ampere and Hopper).
  static bool supports(anvil::DType act, int HS);
  // The scratch to plan for the cuDNN workspace (an upper bound of what the forward and backward graphs
  // ask; a graph that wants more is reported as an error naming both sizes).
  static size_t workspace_bytes(const AttentionDims& s);

  CudnnAttention();
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // `window`: AttentionMask::window (> 0 with causal: cuDNN's diagonal band left bound).
  void fwd(cudaStream_t stream, anvil::DType act, void* out, float* lse, const void* qkv, void* workspace,
           size_t workspace_bytes, const AttentionDims& s, bool causal, int window, const int32_t* lengths);
  void bwd(cudaStream_t stream, anvil::DType act, void* dqkv, const void* dout, const void* qkv,
           const void* out, const float* lse, void* workspace, size_t workspace_bytes, const AttentionDims& s,
           bool causal, int window, const int32_t* lengths);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace anvil::cuda
