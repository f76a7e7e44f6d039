// GEMM algorithm tuning (`gemm_tuning: true`): instead of cuBLASLt's heuristic first choice, each distinct
// GEMM runs with the algorithm configuration that measured fastest on this device, timed once on the
// GEMM's own operands and kept in an on-disk cache (kernels/gemm_tuning_cache.hpp) for later runs.
// This header stays free of fmt so matmul.cu (nvcc) can include it.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "kernels/gemm_tuning_cache.hpp"

namespace anvil::cuda {

// One GEMM as cuBLASLt runs it, with the operands to time it on. c_bytes > 0 means C is a plain matrix of
// that size: an accumulating GEMM (beta != 0) is timed on a scratch copy of that size instead, so the
// candidates never add into the real C. A beta == 0 GEMM is timed in place: the real call that follows
// overwrites whatever the candidates wrote.
struct GemmProblem {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t ab_type = CUDA_R_32F, c_type = CUDA_R_32F;
  const void* first_ptr = nullptr;  // cuBLAS's A (or its pointer array)
  const void* second_ptr = nullptr;
  void* c = nullptr;
  size_t c_bytes = 0;
  float alpha = 1.f, beta = 0.f;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
  std::string key;       // the GEMM's shape, layout, types and epilogue (no tab or newline)
  std::string describe;  // for the progress line
};

class GemmTuner {
 public:
  explicit GemmTuner(const GemmTuningOptions& options);
  ~GemmTuner();
  GemmTuner(const GemmTuner&) = delete;
  GemmTuner& operator=(const GemmTuner&) = delete;

  // The cached choice for `p`, when the cache has one that cuBLASLt still accepts (rebuilt with AlgoInit and
  // AlgoCheck alone, so a cache hit never asks the heuristic: the process's first heuristic query costs
  // 30-55 ms on an H200, bench/probes/cublaslt_first_use.cu). A refused entry is reported, and false
  // returned.
  bool cached(const GemmProblem& p, cublasLtMatmulAlgo_t& algo);

  // The algorithm for `p` when cached() has none: unless the stream is capturing a graph, the fastest
  // candidate timed now (and cached); else the heuristic's first choice. Candidates: the heuristic's `count`
  // results (at least one), plus, for fp32 operands, every configuration cuBLASLt accepts (algorithm x tile
  // x stages x split-K x swizzling).
  cublasLtMatmulAlgo_t choose(const GemmProblem& p, const cublasLtMatmulHeuristicResult_t* heuristics,
                              int count);

 private:
  std::string full_key(const GemmProblem& p) const;
  std::unique_ptr<GemmTuningCache> cache_;
  std::string device_;  // name and compute capability, part of every key
};

}  // namespace anvil::cuda
