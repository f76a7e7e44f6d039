// Multi-head attention, the reference of the flash-attention contract (ops.hpp): the forward keeps only each
// row's log-sum-exp, the backward recomputes the probabilities from q, k and it.
//
// Scratch (in the arena): one fp32 row of T per (b, h) for one query's probabilities. With 16-bit storage
// the probabilities are rounded to it before they multiply v (forward) or dout (dv), as the GPU's
// tensor-core GEMMs do. Output and gradient sums are kept in fp32 (per-thread scratch outside the arena,
// see cpu_kernels.hpp) and rounded once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

// Whether query t of sequence b may see key t2 (AttentionMask).
struct Visibility {
  bool causal;
  int len;  // real tokens of this sequence (T without padding)
  bool row(int t) const { return t < len; }
  int last_key(int t) const { return causal ? std::min(t, len - 1) : len - 1; }
};

Visibility visibility(const AttentionMask& mask, int b, int T) {
  return {mask.causal, mask.lengths ? std::clamp(mask.lengths[b], 0, T) : T};
}

// Attention-probability dropout (AttentionMask::dropout): x times the mask and scale of probability (row,
// j), given row_key(row) (kernels/dropout.hpp); the identity without dropout.
struct ProbDropout {
  explicit ProbDropout(const AttentionMask& m)
      : on(m.dropout > 0),
        key(on ? dropout_key(m.dropout_state->seed, m.dropout_state->micro, m.dropout_site) : 0),
        threshold(dropout_threshold(m.dropout)),
        scale(on ? dropout_scale(m.dropout) : 1.0f) {}
  uint32_t row_key(uint64_t row) const { return on ? attention_dropout_row_key(key, row) : 0; }
  float operator()(float x, uint32_t row_key, int j) const {
    return !on ? x : attention_dropout_keep(row_key, uint32_t(j), threshold) ? x * scale : 0.0f;
  }
  bool on;
  uint64_t key;
  uint32_t threshold;
  float scale;
};

// One query row of the forward over keys 0..last: scores q . k(t2) * scale into p, the softmax (its
// log-sum-exp into row_lse), and o = the probabilities (dropped, and with 16-bit storage rounded to it before
// multiplying v, as the GPU's tensor-core P @ V does) times v(t2), summed in fp32 in acc (HS floats; acc may
// be o itself for fp32 storage). k and v: functions of the key index giving its key and value rows.
template <DType A, class KeyRow, class ValueRow>
void attend_row(storage_t<A>* o, float& row_lse, const storage_t<A>* q, KeyRow k, ValueRow v, int last,
                int HS, float scale, const ProbDropout& drop, uint32_t row_key, float* p, float* acc) {
  using S = Storage<A>;
  float maxv = -INFINITY;
  for (int t2 = 0; t2 <= last; ++t2) {
    const auto* kr = k(t2);
    float dot = 0;
    for (int i = 0; i < HS; ++i) dot += S::load(q[i]) * S::load(kr[i]);
    p[t2] = dot * scale;
    maxv = std::max(maxv, p[t2]);
  }
  double sum = 0;
  for (int t2 = 0; t2 <= last; ++t2) {
    p[t2] = std::exp(p[t2] - maxv);
    sum += p[t2];
  }
  row_lse = maxv + float(std::log(sum));
  const float inv = float(1.0 / sum);
  for (int t2 = 0; t2 <= last; ++t2) p[t2] = S::load(S::store(drop(p[t2] * inv, row_key, t2)));
  for (int i = 0; i < HS; ++i) acc[i] = 0;
  for (int t2 = 0; t2 <= last; ++t2) {
    const auto* vr = v(t2);
    for (int i = 0; i < HS; ++i) acc[i] += p[t2] * S::load(vr[i]);
  }
  if (static_cast<void*>(acc) != static_cast<void*>(o))
    for (int i = 0; i < HS; ++i) o[i] = S::store(acc[i]);
}

template <DType A>
void attention_fwd_t(void* out_, float* lse, const void* qkv_, void* scratch_, int B, int T, int C, int NH,
                     const AttentionMask& mask) {
  using S = Storage<A>;
  constexpr bool kF32 = A == DType::F32;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* qkv = static_cast<const storage_t<A>*>(qkv_);
  const int HS = C / NH;
  const int64_t C3 = 3 * int64_t(C);
  const float scale = 1.0f / std::sqrt(float(HS));
  const ProbDropout drop(mask);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const Visibility vis = visibility(mask, b, T);
      float* p = static_cast<float*>(scratch_) + (int64_t(b) * NH + h) * T;  // this (b, h)'s softmax row
      for (int t = 0; t < T; ++t) {
        const auto* q = qkv + (int64_t(b) * T + t) * C3 + h * HS;
        auto* o = out + (int64_t(b) * T + t) * C + h * HS;
        float& row_lse = lse[(int64_t(b) * NH + h) * T + t];
        if (!vis.row(t)) {  // a padding query: zero output and lse
          for (int i = 0; i < HS; ++i) o[i] = S::store(0.0f);
          row_lse = 0;
          continue;
        }
        float* acc;
        if constexpr (kF32)
          acc = o;
        else
          acc = thread_scratch<float>(kScratchA, HS);
        const auto row = [&](int part) {
          return [=](int t2) { return qkv + (int64_t(b) * T + t2) * C3 + part * C + h * HS; };
        };
        attend_row<A>(o, row_lse, q, row(1), row(2), vis.last_key(t), HS, scale, drop,
                      drop.row_key((uint64_t(b) * NH + h) * T + t), p, acc);
      }
    }
  }
}

template <DType A>
void attention_bwd_t(void* dqkv_, const void* dout_, const void* qkv_, const void* out_, const float* lse,
                     void* scratch_, int B, int T, int C, int NH, const AttentionMask& mask) {
  using S = Storage<A>;
  constexpr bool kF32 = A == DType::F32;
  auto* dqkv = static_cast<storage_t<A>*>(dqkv_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
  const auto* qkv = static_cast<const storage_t<A>*>(qkv_);
  const auto* out = static_cast<const storage_t<A>*>(out_);
  float* scratch = static_cast<float*>(scratch_);
  const int HS = C / NH;
  const int64_t C3 = 3 * int64_t(C);
  const float scale = 1.0f / std::sqrt(float(HS));
  const ProbDropout drop(mask);
  if constexpr (kF32) std::memset(dqkv, 0, sizeof(float) * size_t(B) * T * C3);
    // Each (b, h) owns its own head columns of dqkv, so the pairs run in parallel without races.
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const Visibility vis = visibility(mask, b, T);
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
      float* p = scratch + (int64_t(b) * NH + h) * T;       // the recomputed probabilities of one row
      for (int t = 0; t < vis.len; ++t) {
        const int last = vis.last_key(t);
        const auto* d = dout + (int64_t(b) * T + t) * C + h * HS;
        const auto* o = out + (int64_t(b) * T + t) * C + h * HS;
        const auto* q = qkv + (int64_t(b) * T + t) * C3 + h * HS;
        const float row_lse = lse[(int64_t(b) * NH + h) * T + t];
        // rowsum(P * dP) = dout . out: the softmax backward's correction without the probabilities (with
        // dropout too: dP is the dropped probabilities' gradient times the mask and scale).
        const uint32_t row_key = drop.row_key((uint64_t(b) * NH + h) * T + t);
        float d_dot_o = 0;
        for (int i = 0; i < HS; ++i) d_dot_o += S::load(d[i]) * S::load(o[i]);
        float* dq = acc + t * stride;
        for (int t2 = 0; t2 <= last; ++t2) {
          const auto* k = qkv + (int64_t(b) * T + t2) * C3 + C + h * HS;
          float dot = 0;
          for (int i = 0; i < HS; ++i) dot += S::load(q[i]) * S::load(k[i]);
          p[t2] = std::exp(dot * scale - row_lse);
        }
        for (int t2 = 0; t2 <= last; ++t2) {
          const auto* k = qkv + (int64_t(b) * T + t2) * C3 + C + h * HS;
          const auto* v = qkv + (int64_t(b) * T + t2) * C3 + 2 * C + h * HS;
          float* dk = acc + t2 * stride + koff;
          float* dv = acc + t2 * stride + voff;
          const float p_stored = S::load(S::store(drop(p[t2], row_key, t2)));  // as multiplied in the forward
          float dz = 0;  // the gradient of the (dropped) probability
          for (int i = 0; i < HS; ++i) {
            const float di = S::load(d[i]);
            dz += di * S::load(v[i]);
            dv[i] += p_stored * di;
          }
          const float ds = p[t2] * (drop(dz, row_key, t2) - d_dot_o) * scale;
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

// Query 0 of each sequence against every key (Ops::attention_first_query_fwd): the row computation of
// attention_fwd_t at t = 0, on q [B,C] and kv [B,T,2C].
template <DType A>
void attention_first_query_fwd_t(void* out_, float* lse, const void* q_, const void* kv_, int B, int T, int C,
                                 int NH, const AttentionMask& mask) {
  using S = Storage<A>;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* qs = static_cast<const storage_t<A>*>(q_);
  const auto* kv = static_cast<const storage_t<A>*>(kv_);
  const int HS = C / NH;
  const int64_t C2 = 2 * int64_t(C);
  const float scale = 1.0f / std::sqrt(float(HS));
  const ProbDropout drop(mask);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const Visibility vis = visibility(mask, b, T);
      const auto* q = qs + int64_t(b) * C + h * HS;
      auto* o = out + int64_t(b) * C + h * HS;
      float& row_lse = lse[int64_t(b) * NH + h];
      if (!vis.row(0)) {
        for (int i = 0; i < HS; ++i) o[i] = S::store(0.0f);
        row_lse = 0;
        continue;
      }
      const int last = vis.last_key(0);
      std::vector<float> p(size_t(last) + 1), acc(HS);
      const auto row = [&](int part) {
        return [=](int t2) { return kv + (int64_t(b) * T + t2) * C2 + part * C + h * HS; };
      };
      attend_row<A>(o, row_lse, q, row(0), row(1), last, HS, scale, drop,
                    drop.row_key((uint64_t(b) * NH + h) * T), p.data(), acc.data());
    }
  }
}

// Its backward: attention_bwd_t's loop body for the one row t = 0, with the q gradient in dq [B,C] and the
// k, v gradients in dkv [B,T,2C] (overwritten).
template <DType A>
void attention_first_query_bwd_t(void* dq_, void* dkv_, const void* dout_, const void* q_, const void* kv_,
                                 const void* out_, const float* lse, int B, int T, int C, int NH,
                                 const AttentionMask& mask) {
  using S = Storage<A>;
  auto* dqs = static_cast<storage_t<A>*>(dq_);
  auto* dkv = static_cast<storage_t<A>*>(dkv_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
  const auto* qs = static_cast<const storage_t<A>*>(q_);
  const auto* kv = static_cast<const storage_t<A>*>(kv_);
  const auto* out = static_cast<const storage_t<A>*>(out_);
  const int HS = C / NH;
  const int64_t C2 = 2 * int64_t(C);
  const float scale = 1.0f / std::sqrt(float(HS));
  const ProbDropout drop(mask);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const Visibility vis = visibility(mask, b, T);
      const int last = vis.row(0) ? vis.last_key(0) : -1;
      const auto* d = dout + int64_t(b) * C + h * HS;
      const auto* o = out + int64_t(b) * C + h * HS;
      const auto* q = qs + int64_t(b) * C + h * HS;
      const float row_lse = lse[int64_t(b) * NH + h];
      const uint32_t row_key = drop.row_key((uint64_t(b) * NH + h) * T);
      float d_dot_o = 0;
      for (int i = 0; i < HS; ++i) d_dot_o += S::load(d[i]) * S::load(o[i]);
      std::vector<float> dq(HS, 0.0f);
      for (int t2 = 0; t2 < T; ++t2) {
        const auto* k = kv + (int64_t(b) * T + t2) * C2 + h * HS;
        const auto* v = k + C;
        auto* dk = dkv + (int64_t(b) * T + t2) * C2 + h * HS;
        auto* dv = dk + C;
        if (t2 > last) {
          for (int i = 0; i < HS; ++i) dk[i] = dv[i] = S::store(0.0f);
          continue;
        }
        float dot = 0;
        for (int i = 0; i < HS; ++i) dot += S::load(q[i]) * S::load(k[i]);
        const float p = std::exp(dot * scale - row_lse);
        const float p_stored = S::load(S::store(drop(p, row_key, t2)));  // as multiplied in the forward
        float dz = 0;  // the gradient of the (dropped) probability
        for (int i = 0; i < HS; ++i) {
          const float di = S::load(d[i]);
          dz += di * S::load(v[i]);
          dv[i] = S::store(p_stored * di);
        }
        const float ds = p * (drop(dz, row_key, t2) - d_dot_o) * scale;
        for (int i = 0; i < HS; ++i) {
          dq[i] += ds * S::load(k[i]);
          dk[i] = S::store(ds * S::load(q[i]));
        }
      }
      auto* dst = dqs + int64_t(b) * C + h * HS;
      for (int i = 0; i < HS; ++i) dst[i] = S::store(dq[i]);
    }
  }
}

}  // namespace

size_t attention_scratch_bytes(DType act, int B, int T, int C, int NH) {
  dispatch_float(act, [](auto) {});  // rejects a non-float compute type
  return sizeof(float) * size_t(B) * NH * T;
}

void attention_fwd(DType act, void* out, float* lse, const void* qkv, void* scratch, int B, int T, int C,
                   int NH, const AttentionMask& mask) {
  dispatch_float(
      act, [&](auto a) { attention_fwd_t<decltype(a)::value>(out, lse, qkv, scratch, B, T, C, NH, mask); });
}

void attention_bwd(DType act, void* dqkv, const void* dout, const void* qkv, const void* out,
                   const float* lse, void* scratch, int B, int T, int C, int NH, const AttentionMask& mask) {
  dispatch_float(act, [&](auto a) {
    attention_bwd_t<decltype(a)::value>(dqkv, dout, qkv, out, lse, scratch, B, T, C, NH, mask);
  });
}

}  // namespace anvil::cpu

namespace anvil::cpu {

void attention_first_query_fwd(DType act, void* out, float* lse, const void* q, const void* kv, int B, int T,
                               int C, int NH, const AttentionMask& mask) {
  dispatch_float(act, [&](auto a) {
    attention_first_query_fwd_t<decltype(a)::value>(out, lse, q, kv, B, T, C, NH, mask);
  });
}

void attention_first_query_bwd(DType act, void* dq, void* dkv, const void* dout, const void* q,
                               const void* kv, const void* out, const float* lse, int B, int T, int C, int NH,
                               const AttentionMask& mask) {
  dispatch_float(act, [&](auto a) {
    attention_first_query_bwd_t<decltype(a)::value>(dq, dkv, dout, q, kv, out, lse, B, T, C, NH, mask);
  });
}

}  // namespace anvil::cpu
