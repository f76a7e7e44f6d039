// bench/probes/optimizer_gemm_overlap.cu: whether a memory-bound optimizer pass gains from running beside
// compute-bound strict-fp32 GEMMs on a second stream (the plan it tested: overlap a step's AdamW update with
// the next step's forward, layer by layer). Stream A runs four repetitions of a bert-large block's twelve
// Linear GEMMs (batch 4 x 512; forward, input and weight gradients); stream B runs one AdamW-like pass
// over 64M parameters (28 bytes each: p, g, m, v read, p, m, v written, streaming accesses) with a fixed
// grid of 128-thread blocks. It prints the GEMMs alone, the pass alone, and both started together: how much
// longer the GEMMs take is what the overlap costs them. Standalone, built on the GPU machine with nvcc alone:
//   nvcc -O3 -std=c++17 -arch=sm_90 bench/probes/optimizer_gemm_overlap.cu -lcublasLt -lcublas -o /tmp/og &&
//   /tmp/og
#include <cublas_v2.h>

#include "cuda_bench_util.cuh"

template <int kUnroll>
__global__ void __launch_bounds__(128, 8)
    adamw_like(float* p, const float* g, float* m, float* v, size_t quads, float lr) {
  const size_t stride = size_t(gridDim.x) * blockDim.x * kUnroll;
  for (size_t q0 = size_t(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x; q0 < quads; q0 += stride) {
    float4 P[kUnroll], G[kUnroll], M[kUnroll], V[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t q = q0 + u * blockDim.x;
      if (q < quads) {
        P[u] = __ldcs(reinterpret_cast<const float4*>(p) + q),
        G[u] = __ldcs(reinterpret_cast<const float4*>(g) + q);
        M[u] = __ldcs(reinterpret_cast<const float4*>(m) + q),
        V[u] = __ldcs(reinterpret_cast<const float4*>(v) + q);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t q = q0 + u * blockDim.x;
      if (q >= quads) continue;
      const auto one = [&](float& pp, float gg, float& mm, float& vv) {
        mm = 0.9f * mm + 0.1f * gg, vv = 0.999f * vv + 0.001f * gg * gg;
        pp -= lr * 0.01f * pp, pp -= lr * mm / (sqrtf(vv) + 1e-8f);
      };
      one(P[u].x, G[u].x, M[u].x, V[u].x), one(P[u].y, G[u].y, M[u].y, V[u].y);
      one(P[u].z, G[u].z, M[u].z, V[u].z), one(P[u].w, G[u].w, M[u].w, V[u].w);
      __stcs(reinterpret_cast<float4*>(p) + q, P[u]), __stcs(reinterpret_cast<float4*>(m) + q, M[u]);
      __stcs(reinterpret_cast<float4*>(v) + q, V[u]);
    }
  }
}

int main() {
  cublasHandle_t h;
  CB(cublasCreate(&h));
  CB(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH));  // strict fp32
  const int T = 2048, C = 1024;
  float *x, *w, *y;
  CK(cudaMalloc(&x, sizeof(float) * T * 4 * C));
  CK(cudaMalloc(&w, sizeof(float) * 4 * C * C * 3));
  CK(cudaMalloc(&y, sizeof(float) * T * 4 * C));
  CK(cudaMemset(x, 0, sizeof(float) * T * 4 * C));
  CK(cudaMemset(w, 0, sizeof(float) * 4 * C * C * 3));
  const size_t n = size_t(64) << 20, quads = n / 4;
  float *p, *g, *m, *v;
  for (float** a : {&p, &g, &m, &v}) {
    CK(cudaMalloc(a, n * sizeof(float)));
    CK(cudaMemset(*a, 0, n * sizeof(float)));
  }
  cudaStream_t sa, sb;
  CK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
  const float one = 1, zero = 0;
  // Row-major y[T, N] = x[T, K] w[N, K]^T and its two gradients, for the block's four Linears.
  const auto gemms = [&](int reps) {
    CB(cublasSetStream(h, sa));
    const int shapes[4][2] = {{3 * C, C}, {C, C}, {4 * C, C}, {C, 4 * C}};
    for (int r = 0; r < reps; ++r)
      for (const auto& s : shapes) {
        const int N = s[0], K = s[1];
        CB(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, w, K, x, K, &zero, y, N));
        CB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, K, T, N, &one, w, K, y, N, &zero, x, K));
        CB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_T, K, N, T, &one, x, K, y, N, &zero, w, K));
      }
  };
  const auto pass = [&](int blocks, int unroll) {
    if (unroll == 1)
      adamw_like<1><<<blocks, 128, 0, sb>>>(p, g, m, v, quads, 1e-4f);
    else
      adamw_like<2><<<blocks, 128, 0, sb>>>(p, g, m, v, quads, 1e-4f);
    CK(cudaGetLastError());
  };
  cudaEvent_t e0, ea, eb;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&ea));
  CK(cudaEventCreate(&eb));
  const auto ms = [&](cudaEvent_t a, cudaEvent_t b) {
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    return t;
  };
  gemms(2), pass(1056, 1);
  CK(cudaDeviceSynchronize());
  CK(cudaEventRecord(e0, sa));
  gemms(4);
  CK(cudaEventRecord(ea, sa));
  CK(cudaDeviceSynchronize());
  const float alone = ms(e0, ea);
  std::printf("gemms alone: %.3f ms\n", alone);
  for (int unroll : {1, 2})
    for (int blocks : {132, 264, 528, 1056, 4224}) {
      CK(cudaEventRecord(e0, sb));
      pass(blocks, unroll);
      CK(cudaEventRecord(eb, sb));
      CK(cudaDeviceSynchronize());
      const float pass_alone = ms(e0, eb);
      CK(cudaEventRecord(e0, sa));
      CK(cudaStreamWaitEvent(sb, e0));
      gemms(4), pass(blocks, unroll);
      CK(cudaEventRecord(ea, sa));
      CK(cudaEventRecord(eb, sb));
      CK(cudaDeviceSynchronize());
      std::printf(
          "unroll %d blocks %5d: pass alone %.3f ms (%.2f TB/s); together: gemms %.3f ms (+%.3f), pass %.3f "
          "ms\n",
          unroll, blocks, pass_alone, 28.0 * n / pass_alone / 1e9, ms(e0, ea), ms(e0, ea) - alone,
          ms(e0, eb));
    }
}
