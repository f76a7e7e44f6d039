// bench/probes/gemm_qkv_split.cu: whether bert-large's QKV GEMMs (batch 4 x 512, strict fp32) run faster
// split in two. cuBLASLt's fp32 kernels for [2048 x 3072] outputs take 192 tiles of 256 x 128, 1.45 waves on
// 132 SMs, and run at ~40 TF/s against the ~49 of the MLP GEMMs (bench/results/gemm_algo_sweep_*). Split as
// [Q|K] (2048 columns: 128 tiles, under one wave) plus V (1024 columns), each part may fill the GPU better.
// Measured: the forward (x Wqkv^T + b, written into column blocks of the [N, 3C] output), the weight gradient
// (row blocks of dWqkv from column blocks of dqkv) and the input gradient (split along the inner dimension,
// the second part accumulating). Each variant runs as a CUDA graph. Standalone:
//   nvcc -O2 -std=c++17 -arch=sm_90 bench/probes/gemm_qkv_split.cu -lcublasLt -lcublas -o /tmp/qkv &&
//   /tmp/qkv
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_bench_util.cuh"

namespace {

cublasLtHandle_t g_lt;
void* g_ws;
const size_t kWsBytes = 32u << 20;

// Row-major C[m,n] (row stride ldc) = op(A) op(B) (+ bias[n]) (+ beta C), laid out as Anvil's matmul.cu
// issues it (cuBLAS's first operand is our B). lda / ldb are the stored row strides.
struct G {
  cublasLtMatmulDesc_t desc{};
  cublasLtMatrixLayout_t la{}, lb{}, lc{};
  cublasLtMatmulAlgo_t algo{};
  const float *A, *B;
  float* C;
  float beta;
  G(bool ta, bool tb, int m, int n, int k, const float* a, long lda, const float* b, long ldb, float* c,
    long ldc, const float* bias, float beta_)
      : A(a), B(b), C(c), beta(beta_) {
    CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op1 = tb ? CUBLAS_OP_T : CUBLAS_OP_N, op2 = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op1, sizeof(op1)));
    CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op2, sizeof(op2)));
    if (bias) {
      cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (tb)
      CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, k, n, ldb));  // stored [n, k]
    else
      CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, n, k, ldb));  // stored [k, n]
    if (ta)
      CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, m, k, lda));  // stored [k, m]
    else
      CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, m, lda));  // stored [m, k]
    CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, ldc));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t w = kWsBytes;
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w, sizeof(w)));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, lc, lc, pref, 1, &r, &found));
    if (!found) {
      std::fprintf(stderr, "no algorithm\n");
      std::exit(1);
    }
    algo = r.algo;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  void run(cudaStream_t s) const {
    const float alpha = 1.f;
    CB(cublasLtMatmul(g_lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &algo, g_ws, kWsBytes, s));
  }
};

float* alloc(size_t n, unsigned seed) {
  float* p;
  CK(cudaMalloc(&p, n * 4));
  std::vector<float> h(n);
  for (auto& x : h) x = ((seed = seed * 1664525u + 1013904223u) >> 9) * (1.f / 8388608.f) - 0.5f;
  CK(cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice));
  return p;
}

double max_diff(const float* a, const float* b, size_t n) {
  std::vector<float> x(n), y(n);
  CK(cudaMemcpy(x.data(), a, n * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(y.data(), b, n * 4, cudaMemcpyDeviceToHost));
  double d = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, double(std::abs(x[i] - y[i])));
  return d;
}

}  // namespace

int main() {
  CB(cublasLtCreate(&g_lt));
  CK(cudaMalloc(&g_ws, kWsBytes));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int N = 4 * 512, C = 1024, C3 = 3 * C;
  float *x = alloc(size_t(N) * C, 1), *w = alloc(size_t(C3) * C, 2), *bias = alloc(C3, 3),
        *qkv = alloc(size_t(N) * C3, 4), *qkv2 = alloc(size_t(N) * C3, 5), *dqkv = alloc(size_t(N) * C3, 6),
        *dw = alloc(size_t(C3) * C, 7), *dw2 = alloc(size_t(C3) * C, 7), *dx = alloc(size_t(N) * C, 8),
        *dx2 = alloc(size_t(N) * C, 9);
  const double gf = 2.0 * N * C3 * double(C) / 1e9;
  std::printf(
      "# bert-large QKV GEMMs, batch 4 x 512, strict fp32; us per call (CUDA graph), %.1f GFLOP each\n", gf);
  auto report = [&](const char* what, double whole, double split, double diff) {
    std::printf(
        "%-26s one GEMM %6.1f us (%4.1f TF/s) | [Q|K] + V %6.1f us (%4.1f TF/s) | %+.1f%% | max diff %.3g\n",
        what, whole, gf / whole * 1e3, split, gf / split * 1e3, 100 * (split - whole) / whole, diff);
  };
  {  // forward: qkv[N, 3C] = x[N, C] w[3C, C]^T + bias
    G one(false, true, N, C3, C, x, C, w, C, qkv, C3, bias, 0.f);
    G qk(false, true, N, 2 * C, C, x, C, w, C, qkv2, C3, bias, 0.f);
    G v(false, true, N, C, C, x, C, w + size_t(2 * C) * C, C, qkv2 + 2 * C, C3, bias + 2 * C, 0.f);
    const double t1 = time_graph(s, [&] { one.run(s); });
    const double t2 = time_graph(s, [&] {
      qk.run(s);
      v.run(s);
    });
    CK(cudaStreamSynchronize(s));
    report("fwd x Wqkv^T + b", t1, t2, max_diff(qkv, qkv2, size_t(N) * C3));
    G qkvs[3] = {
        G(false, true, N, C, C, x, C, w, C, qkv2, C3, bias, 0.f),
        G(false, true, N, C, C, x, C, w + size_t(C) * C, C, qkv2 + C, C3, bias + C, 0.f),
        G(false, true, N, C, C, x, C, w + size_t(2 * C) * C, C, qkv2 + 2 * C, C3, bias + 2 * C, 0.f)};
    const double t3 = time_graph(s, [&] {
      for (auto& g : qkvs) g.run(s);
    });
    std::printf("%-26s Q + K + V (three GEMMs) %6.1f us\n", "", t3);
  }
  {  // weight gradient: dw[3C, C] = dqkv[N, 3C]^T x[N, C] (no accumulation, for the comparison)
    G one(true, false, C3, C, N, dqkv, C3, x, C, dw, C, nullptr, 0.f);
    G qk(true, false, 2 * C, C, N, dqkv, C3, x, C, dw2, C, nullptr, 0.f);
    G v(true, false, C, C, N, dqkv + 2 * C, C3, x, C, dw2 + size_t(2 * C) * C, C, nullptr, 0.f);
    const double t1 = time_graph(s, [&] { one.run(s); });
    const double t2 = time_graph(s, [&] {
      qk.run(s);
      v.run(s);
    });
    CK(cudaStreamSynchronize(s));
    report("bwd dWqkv = dqkv^T x", t1, t2, max_diff(dw, dw2, size_t(C3) * C));
  }
  {  // input gradient: dx[N, C] = dqkv[N, 3C] w[3C, C], split along the inner dimension
    G one(false, false, N, C, C3, dqkv, C3, w, C, dx, C, nullptr, 0.f);
    G qk(false, false, N, C, 2 * C, dqkv, C3, w, C, dx2, C, nullptr, 0.f);
    G v(false, false, N, C, C, dqkv + 2 * C, C3, w + size_t(2 * C) * C, C, dx2, C, nullptr, 1.f);
    const double t1 = time_graph(s, [&] { one.run(s); });
    const double t2 = time_graph(s, [&] {
      qk.run(s);
      v.run(s);
    });
    CK(cudaStreamSynchronize(s));
    report("bwd dx = dqkv Wqkv", t1, t2, max_diff(dx, dx2, size_t(N) * C));
  }
  return 0;
}
