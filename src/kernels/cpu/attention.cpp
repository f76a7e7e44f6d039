// Causal multi-head attention, materialising the probabilities (flash attention comes later).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {

size_t attention_scratch_floats(int B, int T, int C, int NH) {
  return size_t(B) * NH * T;
}

void attention_fwd(float* out, float* probs, const float* qkv, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const int64_t C3 = 3 * int64_t(C);
  const float scale = 1.0f / std::sqrt(float(HS));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const float* q = qkv + (int64_t(b) * T + t) * C3 + h * HS;
        float* p = probs + ((int64_t(b) * NH + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv + (int64_t(b) * T + t2) * C3 + C + h * HS;
          float dot = 0;
          for (int i = 0; i < HS; ++i) dot += q[i] * k[i];
          p[t2] = dot * scale;
          maxv = std::max(maxv, p[t2]);
        }
        double sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          p[t2] = std::exp(p[t2] - maxv);
          sum += p[t2];
        }
        const float inv = float(1.0 / sum);
        for (int t2 = 0; t2 <= t; ++t2) p[t2] *= inv;
        for (int t2 = t + 1; t2 < T; ++t2) p[t2] = 0;
        float* o = out + (int64_t(b) * T + t) * C + h * HS;
        for (int i = 0; i < HS; ++i) o[i] = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv + (int64_t(b) * T + t2) * C3 + 2 * C + h * HS;
          for (int i = 0; i < HS; ++i) o[i] += p[t2] * v[i];
        }
      }
    }
  }
}

void attention_bwd(float* dqkv, const float* dout, const float* qkv, const float* probs, float* scratch,
                   int B, int T, int C, int NH) {
  const int HS = C / NH;
  const int64_t C3 = 3 * int64_t(C);
  const float scale = 1.0f / std::sqrt(float(HS));
  std::memset(dqkv, 0, sizeof(float) * size_t(B) * T * C3);
  // Each (b, h) owns its own head columns of dqkv, so the pairs run in parallel without races.
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      float* dp = scratch + (int64_t(b) * NH + h) * T;
      for (int t = 0; t < T; ++t) {
        const float* p = probs + ((int64_t(b) * NH + h) * T + t) * T;
        const float* d = dout + (int64_t(b) * T + t) * C + h * HS;
        const float* q = qkv + (int64_t(b) * T + t) * C3 + h * HS;
        float* dq = dqkv + (int64_t(b) * T + t) * C3 + h * HS;
        double p_dot_dp = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv + (int64_t(b) * T + t2) * C3 + 2 * C + h * HS;
          float* dv = dqkv + (int64_t(b) * T + t2) * C3 + 2 * C + h * HS;
          float dot = 0;
          for (int i = 0; i < HS; ++i) {
            dot += d[i] * v[i];
            dv[i] += p[t2] * d[i];
          }
          dp[t2] = dot;
          p_dot_dp += double(p[t2]) * dot;
        }
        for (int t2 = 0; t2 <= t; ++t2) {
          const float ds = p[t2] * (dp[t2] - float(p_dot_dp)) * scale;
          const float* k = qkv + (int64_t(b) * T + t2) * C3 + C + h * HS;
          float* dk = dqkv + (int64_t(b) * T + t2) * C3 + C + h * HS;
          for (int i = 0; i < HS; ++i) {
            dq[i] += ds * k[i];
            dk[i] += ds * q[i];
          }
        }
      }
    }
  }
}

}  // namespace anvil::cpu
