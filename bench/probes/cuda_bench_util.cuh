// Helpers shared by the standalone cuBLASLt benches (bench/probes/*.cu), which build with nvcc alone on the
// GPU machine: error checks that name the call and location, the timing of work captured as a CUDA graph, and
// an fp32 Linear GEMM through cuBLASLt.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define CB(x)                                                                                  \
  do {                                                                                         \
    cublasStatus_t s_ = (x);                                                                   \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusName(s_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

// Microseconds per replay of `body` (work queued on stream s, possibly forking to others and joining back)
// recorded once as a CUDA graph, after three warm-up replays.
template <class F>
double time_graph(cudaStream_t s, F&& body, int iters = 30) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  body();
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(ge, s));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0, s));
  for (int i = 0; i < iters; ++i) CK(cudaGraphLaunch(ge, s));
  CK(cudaEventRecord(e1, s));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  return 1000.0 * ms / iters;
}

// An fp32 Linear's forward through cuBLASLt, C[M, N] = A[M, K] B[N, K]^T row-major (as column-major C^T = B
// A^T: op(B) = T), with the heuristic's first `candidates` algorithms for `run` to choose from.
struct LtLinearGemm {
  cublasLtHandle_t lt{};
  cublasLtMatmulDesc_t desc{};
  cublasLtMatrixLayout_t la{}, lb{}, lc{};
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  void* ws = nullptr;
  size_t ws_bytes = 32 << 20;
  LtLinearGemm(int M, int N, int K, int candidates = 1) {
    CB(cublasLtCreate(&lt));
    CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, K, N, K));  // B [N, K] row-major = [K, N] col-major
    CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, K, M, K));  // A
    CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, M, N));
    CK(cudaMalloc(&ws, ws_bytes));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                            sizeof(ws_bytes)));
    algos.resize(candidates);
    int found = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, candidates, algos.data(), &found));
    CB(cublasLtMatmulPreferenceDestroy(pref));
    if (found == 0) {
      std::fprintf(stderr, "cuBLASLt has no fp32 algorithm for %d x %d x %d\n", M, N, K);
      std::exit(1);
    }
    algos.resize(found);
  }
  void run(cudaStream_t s, float* C, const float* A, const float* B, int algo = 0) {
    const float one = 1.f, zero = 0.f;
    CB(cublasLtMatmul(lt, desc, &one, B, la, A, lb, &zero, C, lc, C, lc, &algos[algo].algo, ws, ws_bytes, s));
  }
};
