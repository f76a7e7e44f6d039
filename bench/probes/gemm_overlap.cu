// bench/probes/gemm_overlap.cu: whether the backward of a bert-large block (batch 4 x 512, strict fp32) gains
// from running each Linear's weight-gradient GEMM (and its bias-gradient column sums) on a second stream,
// concurrently with its input-gradient GEMM. The two depend on the output gradient only, so a fork before
// and a join after the pair is the whole synchronisation. cuBLASLt GEMMs fill the GPU in waves of tiles; a
// GEMM whose last wave is partial leaves SMs idle that the other GEMM's tiles can use. Also measured: the
// bias gradient fused into the weight-gradient GEMM (cuBLASLt's BGRADB epilogue), whether cuBLASLt offers
// it in fp32, and whether it overwrites or accumulates. Each variant runs as a CUDA graph (as Anvil's
// training steps do). Standalone, built on the GPU machine with nvcc alone:
//   nvcc -O2 -std=c++17 -arch=sm_90 bench/probes/gemm_overlap.cu -lcublasLt -lcublas -o /tmp/gemm_overlap &&
//   /tmp/gemm_overlap
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_bench_util.cuh"

namespace {

cublasLtHandle_t g_lt;

// Row-major C[m,n] = op(A)[m,k] op(B)[k,n] (+ beta C), issued as Anvil's matmul.cu does (cuBLAS's first
// operand is our B), optionally with the BGRADB epilogue writing the sums of our A over k into `bgrad`
// (for dW = dY^T X: the sums of dY over the tokens, the bias gradient).
struct Gemm {
  cublasLtMatmulDesc_t desc{};
  cublasLtMatrixLayout_t la{}, lb{}, lc{};
  cublasLtMatmulAlgo_t algo{};
  bool ok = false;
  float beta = 0;
  const float *A = nullptr, *B = nullptr;
  float* C = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;

  Gemm(bool ta, int m, int n, int k, const float* a, const float* b, float* c, float beta_, void* ws_,
       size_t wsb, float* bgrad) {
    A = a, B = b, C = c, beta = beta_, ws = ws_, ws_bytes = wsb;
    CB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opb = CUBLAS_OP_N, opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opb, sizeof(opb)));
    CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opa, sizeof(opa)));
    if (bgrad) {
      cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BGRADB;
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
      CB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bgrad, sizeof(bgrad)));
    }
    CB(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, n, k, n));  // our B [k,n] row-major
    if (ta)
      CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, m, k, m));  // our A [k,m] row-major, transposed
    else
      CB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, m, k));
    CB(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, n));
    cublasLtMatmulPreference_t pref;
    CB(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t w = wsb;
    CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w, sizeof(w)));
    cublasLtMatmulHeuristicResult_t r{};
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(g_lt, desc, la, lb, lc, lc, pref, 1, &r, &found) ==
            CUBLAS_STATUS_SUCCESS &&
        found > 0)
      algo = r.algo, ok = true;
    cublasLtMatmulPreferenceDestroy(pref);
  }
  void run(cudaStream_t s) const {
    const float alpha = 1.f;
    CB(cublasLtMatmul(g_lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &algo, ws, ws_bytes, s));
  }
};

// dst[c] += sum_r src[r, c]: 32 columns x 8 row groups a block, one atomic per column and block.
__global__ void column_sums(float* dst, const float* src, int rows, int cols) {
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int r0 = blockIdx.y * 128;
  float s = 0;
  if (c < cols)
    for (int r = r0 + threadIdx.y; r < min(rows, r0 + 128); r += 8) s += src[size_t(r) * cols + c];
  __shared__ float part[8][33];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int i = 1; i < 8; ++i) s += part[i][threadIdx.x];
    atomicAdd(dst + c, s);
  }
}
void launch_column_sums(cudaStream_t s, float* dst, const float* src, int rows, int cols) {
  column_sums<<<dim3((cols + 31) / 32, (rows + 127) / 128), dim3(32, 8), 0, s>>>(dst, src, rows, cols);
  CK(cudaGetLastError());
}

}  // namespace

int main() {
  CB(cublasLtCreate(&g_lt));
  const int N = 4 * 512, C = 1024, F = 4096;
  struct Linear {
    const char* name;
    int K, OC;  // y[N,OC] = x[N,K] W[OC,K]^T + b
  };
  const Linear lin[] = {{"proj", F, C}, {"fc", C, F}, {"attn-out", C, C}, {"qkv", C, 3 * C}};
  const size_t ws_bytes = 32u << 20;
  void *ws_main, *ws_side;
  CK(cudaMalloc(&ws_main, ws_bytes));
  CK(cudaMalloc(&ws_side, ws_bytes));
  const size_t big = size_t(N) * F;  // the largest operand
  std::vector<float*> bufs;
  auto alloc = [&](size_t n) {
    float* p;
    CK(cudaMalloc(&p, n * 4));
    std::vector<float> h(n);
    unsigned s = unsigned(bufs.size() * 7919 + 1);
    for (auto& x : h) x = ((s = s * 1664525u + 1013904223u) >> 9) * (1.f / 8388608.f) - 0.5f;
    CK(cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice));
    bufs.push_back(p);
    return p;
  };
  float *dY = alloc(big), *X = alloc(big), *W = alloc(big), *dX = alloc(big), *dW = alloc(size_t(F) * C),
        *db = alloc(F), *db2 = alloc(F);
  cudaStream_t main_s, side_s;
  CK(cudaStreamCreateWithFlags(&main_s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&side_s, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

  std::printf("# bert-large block backward GEMMs, batch 4 x 512, strict fp32; us per call (CUDA graph)\n");
  double layer_seq = 0, layer_par = 0;
  std::vector<Gemm> dxs, dws;
  for (const Linear& l : lin) {
    Gemm gx(false, N, l.K, l.OC, dY, W, dX, 0.f, ws_main, ws_bytes, nullptr);  // dX = dY W
    Gemm gw(true, l.OC, l.K, N, dY, X, dW, 1.f, ws_side, ws_bytes, nullptr);   // dW += dY^T X
    Gemm gwb(true, l.OC, l.K, N, dY, X, dW, 1.f, ws_side, ws_bytes, db2);      // with BGRADB
    const double t_dx = time_graph(main_s, [&] { gx.run(main_s); });
    const double t_dw = time_graph(main_s, [&] { gw.run(main_s); });
    const double t_cs = time_graph(main_s, [&] { launch_column_sums(main_s, db, dY, N, l.OC); });
    auto seq = [&] {
      gx.run(main_s);
      gw.run(main_s);
      launch_column_sums(main_s, db, dY, N, l.OC);
    };
    auto par = [&] {
      CK(cudaEventRecord(fork, main_s));
      CK(cudaStreamWaitEvent(side_s, fork));
      gw.run(side_s);
      launch_column_sums(side_s, db, dY, N, l.OC);
      gx.run(main_s);
      CK(cudaEventRecord(join, side_s));
      CK(cudaStreamWaitEvent(main_s, join));
    };
    const double t_seq = time_graph(main_s, seq), t_par = time_graph(main_s, par);
    layer_seq += t_seq, layer_par += t_par;
    std::printf(
        "%-9s dX %6.1f  dW %6.1f  colsum %5.1f | sequential %6.1f  two streams %6.1f  (%.1f%% less)\n",
        l.name, t_dx, t_dw, t_cs, t_seq, t_par, 100 * (t_seq - t_par) / t_seq);
    if (gwb.ok) {
      const double t_dwb = time_graph(main_s, [&] { gwb.run(main_s); });
      // Overwrite or accumulate: fill with 1, run once, compare with the column sums.
      std::vector<float> ones(l.OC, 1.f), got(l.OC), ref(l.OC, 0.f), hy(size_t(N) * l.OC);
      CK(cudaMemcpy(db2, ones.data(), l.OC * 4, cudaMemcpyHostToDevice));
      gwb.run(main_s);
      CK(cudaStreamSynchronize(main_s));
      CK(cudaMemcpy(got.data(), db2, l.OC * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hy.data(), dY, hy.size() * 4, cudaMemcpyDeviceToHost));
      for (int r = 0; r < N; ++r)
        for (int c = 0; c < l.OC; ++c) ref[c] += hy[size_t(r) * l.OC + c];
      double err_over = 0, err_acc = 0;
      for (int c = 0; c < l.OC; ++c)
        err_over = std::fmax(err_over, std::fabs(got[c] - ref[c])),
        err_acc = std::fmax(err_acc, std::fabs(got[c] - ref[c] - 1));
      std::printf(
          "          BGRADB fp32: dW+bias %6.1f us (dW %6.1f + colsum %5.1f); max |err| as overwrite %.3g,"
          " as accumulate %.3g\n",
          t_dwb, t_dw, t_cs, err_over, err_acc);
    } else {
      std::printf("          BGRADB fp32: no algorithm\n");
    }
    dxs.push_back(gx), dws.push_back(gw);
  }
  // The four pairs back to back, as one block's backward issues them (without the kernels between).
  const double all_seq = time_graph(main_s, [&] {
    for (size_t i = 0; i < dxs.size(); ++i) {
      dxs[i].run(main_s);
      dws[i].run(main_s);
      launch_column_sums(main_s, db, dY, N, lin[i].OC);
    }
  });
  const double all_par = time_graph(main_s, [&] {
    for (size_t i = 0; i < dxs.size(); ++i) {
      CK(cudaEventRecord(fork, main_s));
      CK(cudaStreamWaitEvent(side_s, fork));
      dws[i].run(side_s);
      launch_column_sums(side_s, db, dY, N, lin[i].OC);
      dxs[i].run(main_s);
      CK(cudaEventRecord(join, side_s));
      CK(cudaStreamWaitEvent(main_s, join));
    }
  });
  std::printf(
      "# one block's four pairs: sequential %.1f us, two streams %.1f us (%.1f%% less; x24 layers: %.2f "
      "ms)\n",
      all_seq, all_par, 100 * (all_seq - all_par) / all_seq, 24 * (all_seq - all_par) / 1000);
  std::printf("# sum of pairs timed alone: sequential %.1f, two streams %.1f\n", layer_seq, layer_par);
  return 0;
}
