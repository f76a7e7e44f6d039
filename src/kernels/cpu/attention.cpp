// Causal multi-head attention, materialising the probabilities (flash attention comes later).
//
// Scratch (in the arena): one fp32 row of T per (b, h): the backward's dL/dprobs row, and with 16-bit
// storage the forward's unrounded softmax row. With 16-bit storage the probabilities are rounded when
// stored and the output is computed from the rounded values (as the GPU multiplies the stored probs);
// the backward reads the stored probs. Output and gradient sums are kept in fp32 (per-thread scratch
// outside the arena, see cpu_kernels.hpp) and rounded once.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

template <DType A>
void attention_fwd_t(void* out_, void* probs_, const void* qkv_, void* scratch_, int B, int T, int C,
                     int NH) {
  using S = Storage<A>;
  constexpr bool kF32 = A == DType::F32;
  auto* out = static_cast<storage_t<A>*>(out_);
  auto* probs = static_cast<storage_t<A>*>(probs_);
  const auto* qkv = static_cast<const storage_t<A>*>(qkv_);
  const int HS = C / NH;
  const int64_t C3 = 3 * int64_t(C);
  const float scale = 1.0f / std::sqrt(float(HS));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const auto* q = qkv + (int64_t(b) * T + t) * C3 + h * HS;
        auto* prow = probs + ((int64_t(b) * NH + h) * T + t) * T;
        // The fp32 softmax row: the stored row itself for fp32, else this (b, h)'s scratch row.
        float* p;
        if constexpr (kF32)
          p = prow;
        else
          p = static_cast<float*>(scratch_) + (int64_t(b) * NH + h) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; ++t2) {
          const auto* k = qkv + (int64_t(b) * T + t2) * C3 + C + h * HS;
          float dot = 0;
          for (int i = 0; i < HS; ++i) dot += S::load(q[i]) * S::load(k[i]);
          p[t2] = dot * scale;
          maxv = std::max(maxv, p[t2]);
        }
        double sum = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          p[t2] = std::exp(p[t2] - maxv);
          sum += p[t2];
        }
        const float inv = float(1.0 / sum);
        for (int t2 = 0; t2 <= t; ++t2) {
          p[t2] *= inv;
          if constexpr (!kF32) {
            prow[t2] = S::store(p[t2]);
            p[t2] = S::load(prow[t2]);  // the output uses the probabilities as stored
          }
        }
        for (int t2 = t + 1; t2 < T; ++t2) prow[t2] = S::store(0.0f);
        auto* o = out + (int64_t(b) * T + t) * C + h * HS;
        float* acc;
        if constexpr (kF32)
          acc = o;
        else
          acc = thread_scratch<float>(kScratchA, HS);
        for (int i = 0; i < HS; ++i) acc[i] = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          const auto* v = qkv + (int64_t(b) * T + t2) * C3 + 2 * C + h * HS;
          for (int i = 0; i < HS; ++i) acc[i] += p[t2] * S::load(v[i]);
        }
        if constexpr (!kF32)
          for (int i = 0; i < HS; ++i) o[i] = S::store(acc[i]);
      }
    }
  }
}

template <DType A>
void attention_bwd_t(void* dqkv_, const void* dout_, const void* qkv_, const void* probs_, void* scratch_,
                     int B, int T, int C, int NH) {
  using S = Storage<A>;
  constexpr bool kF32 = A == DType::F32;
  auto* dqkv = static_cast<storage_t<A>*>(dqkv_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
  const auto* qkv = static_cast<const storage_t<A>*>(qkv_);
  const auto* probs = static_cast<const storage_t<A>*>(probs_);
  float* scratch = static_cast<float*>(scratch_);
  const int HS = C / NH;
  const int64_t C3 = 3 * int64_t(C);
  const float scale = 1.0f / std::sqrt(float(HS));
  if constexpr (kF32) std::memset(dqkv, 0, sizeof(float) * size_t(B) * T * C3);
    // Each (b, h) owns its own head columns of dqkv, so the pairs run in parallel without races.
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      // Gradient accumulators for this head's q, k, v columns: dqkv itself for fp32 (row stride 3C), else
      // an fp32 [T, 3*HS] block rounded into dqkv at the end.
      float* acc;
      int64_t stride;
      if constexpr (kF32) {
        acc = dqkv + int64_t(b) * T * C3 + h * HS;
        stride = C3;
      } else {
        stride = 3 * int64_t(HS);
        acc = thread_scratch<float>(kScratchA, size_t(T) * stride);
        std::fill(acc, acc + T * stride, 0.0f);
      }
      const int64_t koff = kF32 ? C : HS, voff = 2 * koff;  // k and v columns within an accumulator row
      float* dp = scratch + (int64_t(b) * NH + h) * T;
      for (int t = 0; t < T; ++t) {
        const auto* p = probs + ((int64_t(b) * NH + h) * T + t) * T;
        const auto* d = dout + (int64_t(b) * T + t) * C + h * HS;
        const auto* q = qkv + (int64_t(b) * T + t) * C3 + h * HS;
        float* dq = acc + t * stride;
        double p_dot_dp = 0;
        for (int t2 = 0; t2 <= t; ++t2) {
          const auto* v = qkv + (int64_t(b) * T + t2) * C3 + 2 * C + h * HS;
          float* dv = acc + t2 * stride + voff;
          const float pt2 = S::load(p[t2]);
          float dot = 0;
          for (int i = 0; i < HS; ++i) {
            const float di = S::load(d[i]);
            dot += di * S::load(v[i]);
            dv[i] += pt2 * di;
          }
          dp[t2] = dot;
          p_dot_dp += double(pt2) * dot;
        }
        for (int t2 = 0; t2 <= t; ++t2) {
          const float ds = S::load(p[t2]) * (dp[t2] - float(p_dot_dp)) * scale;
          const auto* k = qkv + (int64_t(b) * T + t2) * C3 + C + h * HS;
          float* dk = acc + t2 * stride + koff;
          for (int i = 0; i < HS; ++i) {
            dq[i] += ds * S::load(k[i]);
            dk[i] += ds * S::load(q[i]);
          }
        }
      }
      if constexpr (!kF32) {
        for (int t = 0; t < T; ++t) {
          auto* dst = dqkv + (int64_t(b) * T + t) * C3 + h * HS;
          const float* src = acc + t * stride;
          for (int i = 0; i < HS; ++i) {
            dst[i] = S::store(src[i]);
            dst[C + i] = S::store(src[HS + i]);
            dst[2 * C + i] = S::store(src[2 * HS + i]);
          }
        }
      }
    }
  }
}

}  // namespace

size_t attention_scratch_bytes(DType act, int B, int T, int C, int NH) {
  dispatch_float(act, [](auto) {});  // rejects a non-float compute type
  return sizeof(float) * size_t(B) * NH * T;
}

void attention_fwd(DType act, void* out, void* probs, const void* qkv, void* scratch, int B, int T, int C,
                   int NH) {
  dispatch_float(act,
                 [&](auto a) { attention_fwd_t<decltype(a)::value>(out, probs, qkv, scratch, B, T, C, NH); });
}

void attention_bwd(DType act, void* dqkv, const void* dout, const void* qkv, const void* probs, void* scratch,
                   int B, int T, int C, int NH) {
  dispatch_float(act, [&](auto a) {
    attention_bwd_t<decltype(a)::value>(dqkv, dout, qkv, probs, scratch, B, T, C, NH);
  });
}

}  // namespace anvil::cpu
