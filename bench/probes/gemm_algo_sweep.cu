// bench/probes/gemm_algo_sweep.cu: how much faster than cuBLASLt's first heuristic choice each of the seed
// experiment's fp32 GEMMs (bert-large, batch 4 x 512) can run, over every algorithm the heuristic returns
// and (with --exhaustive) every tile / stages / split-K / swizzle the algorithm ids support. The GEMMs are
// laid out exactly as src/kernels/cuda/matmul.cu lays out Anvil's row-major GEMMs (cuBLAS's first operand
// is our B). Standalone so it can be built on the GPU machine with nvcc alone:
//   nvcc -O2 -std=c++17 -arch=sm_90 bench/probes/gemm_algo_sweep.cu -lcublasLt -lcublas \
//     -o /tmp/gemm_algo_sweep
//   /tmp/gemm_algo_sweep [--exhaustive] [--tf32]
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_bench_util.cuh"

struct Shape {
  const char* name;
  bool ta, tb;
  int m, n, k, batch;
  long sa, sb, sc;     // batch strides (elements)
  long lda, ldb, ldc;  // row strides (0: contiguous)
  bool bias;
  float beta;
};

cublasLtMatrixLayout_t layout(long rows, long cols, int batch, long stride, long ld) {
  cublasLtMatrixLayout_t l;
  CB(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, rows, cols, ld ? ld : rows));
  if (batch > 1) {
    int32_t c = batch;
    CB(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c, sizeof(c)));
    CB(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                        sizeof(stride)));
  }
  return l;
}

std::string describe(const cublasLtMatmulAlgo_t& a) {
  int id = 0, tile = 0, stages = 0, splitk = 0, swizzle = 0, red = 0;
  size_t w;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof(red), &w);
  char buf[128];
  std::snprintf(buf, sizeof buf, "id %d tile %d stages %d splitk %d swz %d red %d", id, tile, stages, splitk,
                swizzle, red);
  return buf;
}

int main(int argc, char** argv) {
  bool exhaustive = false, tf32 = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--exhaustive")) exhaustive = true;
    if (!std::strcmp(argv[i], "--tf32")) tf32 = true;
  }
  const int T = 512, NH = 16, C = 1024, F = 4096, BT = 4 * T, HS = 64;
  const long row3 = 3 * C, pp = long(T) * T;
  // Row-major C[M,N] = op(A) op(B), as the BERT block issues them (forward: x W^T + b; backward: dX = dY W,
  // dW += dY^T X; attention: one head-batched GEMM per sequence, heads read in place).
  std::vector<Shape> shapes = {
      {"fwd qkv", false, true, BT, 3 * C, C, 1, 0, 0, 0, 0, 0, 0, true, 0.f},
      {"fwd attn-out", false, true, BT, C, C, 1, 0, 0, 0, 0, 0, 0, true, 0.f},
      {"fwd fc", false, true, BT, F, C, 1, 0, 0, 0, 0, 0, 0, true, 0.f},
      {"fwd proj", false, true, BT, C, F, 1, 0, 0, 0, 0, 0, 0, true, 0.f},
      {"bwd dX proj", false, false, BT, F, C, 1, 0, 0, 0, 0, 0, 0, false, 0.f},
      {"bwd dW proj", true, false, C, F, BT, 1, 0, 0, 0, 0, 0, 0, false, 0.f},
      {"bwd dX fc", false, false, BT, C, F, 1, 0, 0, 0, 0, 0, 0, false, 0.f},
      {"bwd dW fc", true, false, F, C, BT, 1, 0, 0, 0, 0, 0, 0, false, 0.f},
      {"bwd dX attn-out", false, false, BT, C, C, 1, 0, 0, 0, 0, 0, 0, false, 0.f},
      {"bwd dW attn-out", true, false, C, C, BT, 1, 0, 0, 0, 0, 0, 0, false, 0.f},
      {"bwd dX qkv", false, false, BT, C, 3 * C, 1, 0, 0, 0, 0, 0, 0, false, 0.f},
      {"bwd dW qkv", true, false, 3 * C, C, BT, 1, 0, 0, 0, 0, 0, 0, false, 0.f},
      {"att q k^T (per seq)", false, true, T, T, HS, NH, HS, HS, pp, row3, row3, 0, false, 0.f},
      {"att p v (per seq)", false, false, T, HS, T, NH, pp, HS, HS, 0, row3, C, false, 0.f},
      {"att dO v^T (per seq)", false, true, T, T, HS, NH, HS, HS, pp, C, row3, 0, false, 0.f},
      {"att p^T dO (per seq)", true, false, T, HS, T, NH, pp, HS, HS, 0, C, row3, false, 0.f},
      {"att dS k (per seq)", false, false, T, HS, T, NH, pp, HS, HS, 0, row3, row3, false, 0.f},
      {"att dS^T q (per seq)", true, false, T, HS, T, NH, pp, HS, HS, 0, row3, row3, false, 0.f},
  };
  cublasLtHandle_t h;
  CB(cublasLtCreate(&h));
  const size_t ws_bytes = 32u << 20;
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  const size_t big = size_t(64) << 20;  // floats per operand buffer: covers every shape above
  float *A, *B, *Cm, *bias;
  CK(cudaMalloc(&A, big * 4));
  CK(cudaMalloc(&B, big * 4));
  CK(cudaMalloc(&Cm, big * 4));
  CK(cudaMalloc(&bias, 1 << 20));
  {
    std::vector<float> host(big);
    unsigned s = 1;
    for (auto& x : host) x = ((s = s * 1664525u + 1013904223u) >> 9) * (1.f / 8388608.f) - 0.5f;
    CK(cudaMemcpy(A, host.data(), big * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(B, host.data(), big * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(Cm, 0, big * 4));
    CK(cudaMemset(bias, 0, 1 << 20));
  }
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  double total_default = 0, total_best = 0;
  std::printf(
      "# %s fp32 GEMMs of the bert-large block, batch 4 x 512; us per call (attention: per sequence)\n",
      tf32 ? "TF32" : "strict");
  for (const Shape& s : shapes) {
    cublasLtMatmulDesc_t desc;
    CB(cublasLtMatmulDescCreate(&desc, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t op1 = s.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op2 = s.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op1, sizeof(op1)));
    CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op2, sizeof(op2)));
    if (s.bias) {
      cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    cublasLtMatrixLayout_t l1 =
        s.tb ? layout(s.k, s.n, s.batch, s.sb, s.ldb) : layout(s.n, s.k, s.batch, s.sb, s.ldb);
    cublasLtMatrixLayout_t l2 =
        s.ta ? layout(s.m, s.k, s.batch, s.sa, s.lda) : layout(s.k, s.m, s.batch, s.sa, s.lda);
    cublasLtMatrixLayout_t lo = layout(s.n, s.m, s.batch, s.sc, s.ldc);
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = ws_bytes;
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                            sizeof(wsb)));
    // Operand alignment as Anvil reports it: head-strided operands are 256-byte aligned (64 floats).
    std::vector<cublasLtMatmulHeuristicResult_t> res(64);
    int found = 0;
    CB(cublasLtMatmulAlgoGetHeuristic(h, desc, l1, l2, lo, lo, pref, int(res.size()), res.data(), &found));
    std::vector<cublasLtMatmulAlgo_t> cands;
    for (int i = 0; i < found; ++i) cands.push_back(res[i].algo);
    if (exhaustive) {
      int ids[256], nid = 0;
      CB(cublasLtMatmulAlgoGetIds(h, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F,
                                  CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, 256, ids, &nid));
      for (int a = 0; a < nid; ++a) {
        cublasLtMatmulAlgo_t algo;
        if (cublasLtMatmulAlgoInit(h, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F,
                                   CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, CUDA_R_32F, ids[a],
                                   &algo) != CUBLAS_STATUS_SUCCESS)
          continue;
        size_t w = 0;
        cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &w);
        std::vector<int> tiles(std::max<size_t>(1, w / sizeof(int)), 0);
        if (w) cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), w, &w);
        cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, nullptr, 0, &w);
        std::vector<int> stages(std::max<size_t>(1, w / sizeof(int)), 0);
        if (w) cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, stages.data(), w, &w);
        int splitk_ok = 0, swz_max = 0;
        cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &splitk_ok, sizeof(int),
                                          &w);
        cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT, &swz_max,
                                          sizeof(int), &w);
        for (int tile : tiles)
          for (int st : stages)
            for (int sk : {1, 2, 3, 4})
              for (int swz = 0; swz <= swz_max; ++swz) {
                if (sk > 1 && !splitk_ok) continue;
                cublasLtMatmulAlgo_t c = algo;
                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile));
                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_STAGES_ID, &st, sizeof(st));
                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &sk, sizeof(sk));
                cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz,
                                                     sizeof(swz));
                if (sk > 1) {
                  int red = CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
                  cublasLtMatmulAlgoConfigSetAttribute(&c, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red,
                                                       sizeof(red));
                }
                cublasLtMatmulHeuristicResult_t r{};
                if (cublasLtMatmulAlgoCheck(h, desc, l1, l2, lo, lo, &c, &r) == CUBLAS_STATUS_SUCCESS &&
                    r.workspaceSize <= ws_bytes)
                  cands.push_back(c);
              }
      }
    }
    const float alpha = 1.f, beta = s.beta;
    auto time_algo = [&](const cublasLtMatmulAlgo_t& algo) -> double {
      for (int i = 0; i < 3; ++i)
        if (cublasLtMatmul(h, desc, &alpha, B, l1, A, l2, &beta, Cm, lo, Cm, lo, &algo, ws, ws_bytes,
                           stream) != CUBLAS_STATUS_SUCCESS)
          return -1;
      const int iters = 20;
      CK(cudaEventRecord(e0, stream));
      for (int i = 0; i < iters; ++i)
        cublasLtMatmul(h, desc, &alpha, B, l1, A, l2, &beta, Cm, lo, Cm, lo, &algo, ws, ws_bytes, stream);
      CK(cudaEventRecord(e1, stream));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      return 1000.0 * ms / iters;
    };
    double t_default = -1, t_best = 1e30;
    std::string best_desc;
    int best_i = -1, valid = 0;
    for (size_t i = 0; i < cands.size(); ++i) {
      const double t = time_algo(cands[i]);
      if (t < 0) continue;
      ++valid;
      if (i == 0) t_default = t;
      if (t < t_best) t_best = t, best_desc = describe(cands[i]), best_i = int(i);
    }
    const double flop = 2.0 * s.m * s.n * double(s.k) * s.batch;
    std::printf("%-22s default %8.1f us (%5.1f TF/s) [%s]\n", s.name, t_default, flop / t_default / 1e6,
                found ? describe(cands[0]).c_str() : "-");
    std::printf("%-22s best    %8.1f us (%5.1f TF/s) [%s] #%d of %d timed (%d heuristic)  gain %.1f%%\n", "",
                t_best, flop / t_best / 1e6, best_desc.c_str(), best_i, valid, found,
                100.0 * (t_default - t_best) / t_default);
    // Calls per block: attention runs once per sequence, and backward recomputes the scores.
    const int calls = (s.batch > 1 ? 4 : 1) * (std::strncmp(s.name, "att q k^T", 9) == 0 ? 2 : 1);
    total_default += calls * t_default, total_best += calls * t_best;
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(l1);
    cublasLtMatrixLayoutDestroy(l2);
    cublasLtMatrixLayoutDestroy(lo);
    cublasLtMatmulDescDestroy(desc);
  }
  std::printf(
      "# per block, each listed GEMM once (attention x 4 sequences; the forward q k^T runs again in "
      "backward): default %.0f us, best %.0f us (%.1f%% less)\n",
      total_default, total_best, 100.0 * (total_default - total_best) / total_default);
  return 0;
}
