// bench/probes/attention_kernels.cu: the strict-fp32 fused attention kernels alone, at the seed row's shape
// (bert-large layer: batch 4 x 512 tokens, 16 heads of 64, dropout 0.1), checked against a naive reference
// and timed as CUDA graphs. For iterating on attention_fwd_fused.cu / attention_bwd_scores.cu without a whole
// training run. Standalone, built on the GPU machine with nvcc alone (the kernel files are compiled in from
// any path, so a variant can be timed beside the committed one):
//   nvcc -O3 -std=c++20 -arch=sm_90 --use_fast_math --expt-relaxed-constexpr -Isrc -Iinclude \
//     bench/probes/attention_kernels.cu src/kernels/cuda/attention_fwd_fused.cu \
//     src/kernels/cuda/attention_bwd_scores.cu -o /tmp/attention_kernels && /tmp/attention_kernels [B T C NH]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_bench_util.cuh"
#include "kernels/cuda/attention_common.cuh"

namespace anvil::detail {
// The kernels' launch checks raise through this (core/error.cpp in the library).
[[noreturn]] void raise_at(const char* file, int line, const std::string& msg) {
  std::fprintf(stderr, "%s:%d: %s\n", file, line, msg.c_str());
  std::exit(1);
}
}  // namespace anvil::detail

namespace {

__global__ void fill_uniform(float* x, size_t n, uint32_t salt, float amp) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t h = anvil::dropout_mix(i * 0x9E3779B97F4A7C15ull + salt);
    x[i] = amp * (float(h >> 40) / float(1 << 24) * 2.f - 1.f);
  }
}

// One thread a query row: the dropped softmax of scale q.k over every key (no mask), out, lse, and for the
// backward the dropped probabilities and dscores = scale P (keep * drop_scale * dout.v - rowsum(dout * out)).
__global__ void reference_rows(float* out, float* lse, float* probs, float* dscores, const float* qkv,
                               const float* dout, int B, int T, int C, int NH, float scale,
                               anvil::cuda::DropoutArgs drop, bool with_backward) {
  const int HS = C / NH;
  const size_t row = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (row >= size_t(B) * NH * T) return;
  const int t = row % T, h = (row / T) % NH, b = row / T / NH;
  const float* q = qkv + (size_t(b) * T + t) * 3 * C + h * HS;
  const float* kbase = qkv + size_t(b) * T * 3 * C + C + h * HS;
  const float* vbase = kbase + C;
  const uint32_t rk = anvil::cuda::attention_dropout_row_key(drop, row);
  double mx = -1e30;
  for (int j = 0; j < T; ++j) {
    double s = 0;
    for (int d = 0; d < HS; ++d) s += double(q[d]) * kbase[size_t(j) * 3 * C + d];
    mx = fmax(mx, s * scale);
  }
  double sum = 0;
  for (int j = 0; j < T; ++j) {
    double s = 0;
    for (int d = 0; d < HS; ++d) s += double(q[d]) * kbase[size_t(j) * 3 * C + d];
    sum += exp(s * scale - mx);
  }
  const double l = mx + log(sum);
  lse[row] = float(l);
  float* o = out + (size_t(b) * T + t) * C + h * HS;
  for (int d = 0; d < HS; ++d) o[d] = 0.f;
  for (int j = 0; j < T; ++j) {
    double s = 0;
    for (int d = 0; d < HS; ++d) s += double(q[d]) * kbase[size_t(j) * 3 * C + d];
    const bool keep = anvil::attention_dropout_keep(rk, j, drop.threshold);
    const double p = keep ? exp(s * scale - l) * drop.scale : 0.0;
    for (int d = 0; d < HS; ++d) o[d] += float(p * vbase[size_t(j) * 3 * C + d]);
  }
  if (!with_backward) return;
  const float* dO = dout + (size_t(b) * T + t) * C + h * HS;
  double D = 0;
  for (int d = 0; d < HS; ++d) D += double(dO[d]) * o[d];
  for (int j = 0; j < T; ++j) {
    double s = 0, dp = 0;
    for (int d = 0; d < HS; ++d) {
      s += double(q[d]) * kbase[size_t(j) * 3 * C + d];
      dp += double(dO[d]) * vbase[size_t(j) * 3 * C + d];
    }
    const bool keep = anvil::attention_dropout_keep(rk, j, drop.threshold);
    const double p = exp(s * scale - l);
    probs[row * T + j] = keep ? float(p * drop.scale) : 0.f;
    dscores[row * T + j] = float(scale * p * ((keep ? dp * drop.scale : 0.0) - D));
  }
}

struct Diff {
  double max_abs = 0, max_ref = 0;
};

Diff compare(const float* a_dev, const float* ref_dev, size_t n) {
  std::vector<float> a(n), r(n);
  CK(cudaMemcpy(a.data(), a_dev, n * sizeof(float), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(r.data(), ref_dev, n * sizeof(float), cudaMemcpyDeviceToHost));
  Diff d;
  for (size_t i = 0; i < n; ++i) {
    d.max_abs = std::fmax(d.max_abs, std::fabs(double(a[i]) - r[i]));
    d.max_ref = std::fmax(d.max_ref, std::fabs(double(r[i])));
  }
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  const int B = argc > 4 ? std::atoi(argv[1]) : 4, T = argc > 4 ? std::atoi(argv[2]) : 512;
  const int C = argc > 4 ? std::atoi(argv[3]) : 1024, NH = argc > 4 ? std::atoi(argv[4]) : 16;
  const int HS = C / NH;
  const float p = 0.1f, scale = 1.f / std::sqrt(float(HS));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s: B %d, T %d, C %d, NH %d, dropout %.2f\n", prop.name, B, T, C, NH, p);

  const size_t n_qkv = size_t(B) * T * 3 * C, n_act = size_t(B) * T * C, rows = size_t(B) * NH * T;
  const size_t n_probs = rows * T;
  float *qkv, *out, *lse, *dout, *probs, *dscores, *ref_out, *ref_lse, *ref_probs, *ref_dscores;
  CK(cudaMalloc(&qkv, n_qkv * 4));
  CK(cudaMalloc(&out, n_act * 4));
  CK(cudaMalloc(&dout, n_act * 4));
  CK(cudaMalloc(&ref_out, n_act * 4));
  CK(cudaMalloc(&lse, rows * 4));
  CK(cudaMalloc(&ref_lse, rows * 4));
  CK(cudaMalloc(&probs, n_probs * 4));
  CK(cudaMalloc(&dscores, n_probs * 4));
  CK(cudaMalloc(&ref_probs, n_probs * 4));
  CK(cudaMalloc(&ref_dscores, n_probs * 4));
  fill_uniform<<<1024, 256>>>(qkv, n_qkv, 1, 2.f);
  fill_uniform<<<1024, 256>>>(dout, n_act, 2, 1.f);
  anvil::DropoutState state_host{0x1234567ull, 3, 0}, *state;
  CK(cudaMalloc(&state, sizeof(state_host)));
  CK(cudaMemcpy(state, &state_host, sizeof(state_host), cudaMemcpyHostToDevice));
  const anvil::cuda::AttentionDropout dropout{p, state, 7};
  const anvil::cuda::DropoutArgs drop = anvil::cuda::dropout_args(dropout);

  reference_rows<<<(rows + 127) / 128, 128>>>(ref_out, ref_lse, ref_probs, ref_dscores, qkv, dout, B, T, C,
                                              NH, scale, drop, true);
  CK(cudaGetLastError());
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  anvil::cuda::attention_fwd_fused(s, out, lse, qkv, B, T, C, NH, false, nullptr, dropout);
  CK(cudaStreamSynchronize(s));
  // The backward reads the forward's own out and lse, as in training.
  anvil::cuda::attention_bwd_scores(s, probs, dscores, qkv, dout, out, lse, B, T, C, NH, scale, false,
                                    nullptr, dropout);
  CK(cudaStreamSynchronize(s));
  const Diff d_out = compare(out, ref_out, n_act), d_lse = compare(lse, ref_lse, rows);
  const Diff d_p = compare(probs, ref_probs, n_probs), d_ds = compare(dscores, ref_dscores, n_probs);
  std::printf(
      "check: out max |diff| %.3g (max |ref| %.3g), lse %.3g (%.3g), probs %.3g (%.3g), dscores %.3g "
      "(%.3g)\n",
      d_out.max_abs, d_out.max_ref, d_lse.max_abs, d_lse.max_ref, d_p.max_abs, d_p.max_ref, d_ds.max_abs,
      d_ds.max_ref);
  const bool ok = d_out.max_abs <= 1e-4 * d_out.max_ref + 1e-5 &&
                  d_lse.max_abs <= 1e-4 * d_lse.max_ref + 1e-5 && d_p.max_abs <= 1e-4 * d_p.max_ref + 1e-6 &&
                  d_ds.max_abs <= 1e-3 * d_ds.max_ref + 1e-6;
  std::printf("check: %s\n", ok ? "PASS" : "FAIL");

  const double flops = 2.0 * 2.0 * double(rows) * T * HS;  // two [T, T] x [T, HS] products a head
  const double fwd_us = time_graph(
      s, [&] { anvil::cuda::attention_fwd_fused(s, out, lse, qkv, B, T, C, NH, false, nullptr, dropout); });
  const double bwd_us = time_graph(s, [&] {
    anvil::cuda::attention_bwd_scores(s, probs, dscores, qkv, dout, out, lse, B, T, C, NH, scale, false,
                                      nullptr, dropout);
  });
  const anvil::cuda::AttentionDropout none{};  // the same kernels without dropout: what the masks cost
  const double fwd0_us = time_graph(
      s, [&] { anvil::cuda::attention_fwd_fused(s, out, lse, qkv, B, T, C, NH, false, nullptr, none); });
  const double bwd0_us = time_graph(s, [&] {
    anvil::cuda::attention_bwd_scores(s, probs, dscores, qkv, dout, out, lse, B, T, C, NH, scale, false,
                                      nullptr, none);
  });
  std::printf("attention_fwd_fused   %8.1f us  %5.1f TFLOP/s   without dropout %8.1f us\n", fwd_us,
              flops / fwd_us * 1e-6, fwd0_us);
  std::printf("attention_bwd_scores  %8.1f us  %5.1f TFLOP/s   without dropout %8.1f us\n", bwd_us,
              flops / bwd_us * 1e-6, bwd0_us);
  return ok ? 0 : 2;
}
