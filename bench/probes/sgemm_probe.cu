// bench/probes/sgemm_probe.cu: whether an fp32 (FFMA) GEMM laid out for Hopper beats cuBLASLt's sm80 SIMT
// kernels at bert-large's Linear shapes. On Hopper a warp's FFMA issues in one cycle (Ampere: two), so every
// other instruction (shared-memory reads, address arithmetic) takes an FFMA's issue slot: cuBLAS's 8 x 8
// thread patches (4 LDS.128 per 64 FFMA) reach about 75% of the fp32 peak there. This probe gives each thread
// an 8 x 16 patch (6 LDS.128 per 128 FFMA). C[M,N] = A[M,K] B[N,K]^T, row-major (a Linear's forward).
// Standalone, built on the GPU machine with nvcc alone:
//   nvcc -O3 -std=c++17 -arch=sm_90 bench/probes/sgemm_probe.cu -lcublasLt -lcublas -o /tmp/sgemm_probe &&
//   /tmp/sgemm_probe
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_bench_util.cuh"

namespace {

__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(to), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// 256 threads, 8 warps as 4 (M) x 2 (N); a warp's lanes 4 (ty) x 8 (tx); a thread rows ty*4 + {0..3} and
// 16 + ty*4 + {0..3} of its warp's 32, columns tx*4 + 32 j + {0..3}, j < 4, of its warp's 128. CTA tile 128 x
// 256, k-tiles of 16 in kStages shared-memory stages, both operands k-major there ([k][m], [k][n]).
template <int kStages, bool kLoads = true>
__global__ void __launch_bounds__(256, 1) sgemm_tn_128x256(float* __restrict__ C, const float* __restrict__ A,
                                                           const float* __restrict__ B, int M, int N, int K) {
  constexpr int BM = 128, BN = 256, BK = 16, LdA = BM + 4, LdB = BN + 4;
  extern __shared__ __align__(16) float smem[];
  float* As = smem;                       // [kStages][BK][LdA]
  float* Bs = smem + kStages * BK * LdA;  // [kStages][BK][LdB]
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp % 4, wn = warp / 4, ty = lane / 8, tx = lane % 8;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;

  // Copies, 4 bytes each so the tile lands transposed: lanes 0-15 read 16 consecutive k of one row (a warp
  // instruction: two 64-byte segments). Element i * 256 + tid of a tile: row i * 16 + tid / 16, k tid % 16.
  const float* a_src = A + size_t(m0 + tid / 16) * K + tid % 16;
  const float* b_src = B + size_t(n0 + tid / 16) * K + tid % 16;
  const int a_dst = (tid % 16) * LdA + tid / 16, b_dst = (tid % 16) * LdB + tid / 16;
  const size_t row16 = size_t(16) * K;
  auto load_tile = [&](int stage, int kt) {
    float* as = As + stage * BK * LdA + a_dst;
    float* bs = Bs + stage * BK * LdB + b_dst;
    const float* ag = a_src + kt * BK;
    const float* bg = b_src + kt * BK;
#pragma unroll
    for (int i = 0; i < BM / 16; ++i) cp_async4(as + 16 * i, ag + i * row16);
#pragma unroll
    for (int i = 0; i < BN / 16; ++i) cp_async4(bs + 16 * i, bg + i * row16);
  };

  float acc[8][16];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 16; ++j) acc[i][j] = 0.f;

  const int k_tiles = K / BK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_tile(s, s);
    cp_async_commit();
  }
  const int a_off = wm * 32 + ty * 4, b_off = wn * 128 + tx * 4;
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    // The stage read kStages - 1 tiles ago is free: fill it with tile kt + kStages - 1.
    const int next = kt + kStages - 1;
    if (kLoads && next < k_tiles) load_tile(next % kStages, next);
    cp_async_commit();
    const float* as = As + (kt % kStages) * BK * LdA + a_off;
    const float* bs = Bs + (kt % kStages) * BK * LdB + b_off;
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      const float4 a0 = *reinterpret_cast<const float4*>(as + k * LdA);
      const float4 a1 = *reinterpret_cast<const float4*>(as + k * LdA + 16);
      float b[16];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 v = *reinterpret_cast<const float4*>(bs + k * LdB + 32 * j);
        b[4 * j] = v.x, b[4 * j + 1] = v.y, b[4 * j + 2] = v.z, b[4 * j + 3] = v.w;
      }
      const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = m0 + a_off + (i < 4 ? i : 12 + i);
    float* c = C + size_t(row) * N + n0 + b_off;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      *reinterpret_cast<float4*>(c + 32 * j) =
          make_float4(acc[i][4 * j], acc[i][4 * j + 1], acc[i][4 * j + 2], acc[i][4 * j + 3]);
  }
}

__global__ void fill(float* x, size_t n, uint32_t salt) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B9u + salt;
    h ^= h >> 16, h *= 0x7FEB352Du, h ^= h >> 15, h *= 0x846CA68Bu, h ^= h >> 16;
    x[i] = float(h >> 8) / float(1 << 24) - 0.5f;
  }
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs\n", prop.name, prop.multiProcessorCount);
  struct Shape {
    const char* name;
    int M, N, K;
  };
  const Shape shapes[] = {{"fc (2048x4096x1024)", 2048, 4096, 1024},
                          {"qkv (2048x3072x1024)", 2048, 3072, 1024},
                          {"proj (2048x1024x4096)", 2048, 1024, 4096},
                          {"out (2048x1024x1024)", 2048, 1024, 1024},
                          {"square (4096x4096x4096)", 4096, 4096, 4096}};
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  auto smem_for = [](int stages) { return size_t(stages) * 16 * (132 + 260) * sizeof(float); };
  CK(cudaFuncSetAttribute(sgemm_tn_128x256<3>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          int(smem_for(3))));
  CK(cudaFuncSetAttribute(sgemm_tn_128x256<4>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          int(smem_for(4))));
  CK(cudaFuncSetAttribute(sgemm_tn_128x256<3, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          int(smem_for(3))));
  for (const Shape& sh : shapes) {
    const int M = sh.M, N = sh.N, K = sh.K;
    float *A, *B, *C, *R;
    CK(cudaMalloc(&A, size_t(M) * K * 4));
    CK(cudaMalloc(&B, size_t(N) * K * 4));
    CK(cudaMalloc(&C, size_t(M) * N * 4));
    CK(cudaMalloc(&R, size_t(M) * N * 4));
    fill<<<1024, 256>>>(A, size_t(M) * K, 1);
    fill<<<1024, 256>>>(B, size_t(N) * K, 2);
    LtLinearGemm lt(M, N, K, 8);
    const double flops = 2.0 * M * N * K;
    double best_lt = 1e30;
    for (size_t a = 0; a < lt.algos.size(); ++a) {
      const double us = time_graph(
          s, [&] { lt.run(s, R, A, B, int(a)); }, 20);
      best_lt = std::fmin(best_lt, us);
    }
    lt.run(s, R, A, B, 0);
    const dim3 grid(N / 256, M / 128);
    {  // the inner loop alone: no copies after the first tiles (wrong results; its time is the ceiling)
      const double us = time_graph(
          s, [&] { sgemm_tn_128x256<3, false><<<grid, 256, smem_for(3), s>>>(C, A, B, M, N, K); }, 20);
      std::printf("%-26s inner loop alone: %7.1f us %5.1f TFLOP/s\n", sh.name, us, flops / us * 1e-6);
    }
    for (const int stages : {3, 4}) {
      CK(cudaMemset(C, 0, size_t(M) * N * 4));
      const double us = time_graph(
          s,
          [&] {
            if (stages == 3)
              sgemm_tn_128x256<3><<<grid, 256, smem_for(3), s>>>(C, A, B, M, N, K);
            else
              sgemm_tn_128x256<4><<<grid, 256, smem_for(4), s>>>(C, A, B, M, N, K);
          },
          20);
      CK(cudaStreamSynchronize(s));
      std::vector<float> c(size_t(M) * N), r(size_t(M) * N);
      CK(cudaMemcpy(c.data(), C, c.size() * 4, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(r.data(), R, r.size() * 4, cudaMemcpyDeviceToHost));
      double maxd = 0, maxr = 0;
      for (size_t i = 0; i < c.size(); ++i) {
        maxd = std::fmax(maxd, std::fabs(double(c[i]) - r[i]));
        maxr = std::fmax(maxr, std::fabs(double(r[i])));
      }
      std::printf(
          "%-26s cuBLASLt best of %zu: %7.1f us %5.1f TFLOP/s | probe 128x256, %d stages: %7.1f us %5.1f "
          "TFLOP/s (%.2fx) | max|diff| %.2g of %.2g\n",
          sh.name, lt.algos.size(), best_lt, flops / best_lt * 1e-6, stages, us, flops / us * 1e-6,
          best_lt / us, maxd, maxr);
    }
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(C));
    CK(cudaFree(R));
  }
  return 0;
}
