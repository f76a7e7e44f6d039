// Self-attention (multi-head and grouped-query, causal, sliding-window and padding masks), the reference of
// the flash-attention contract (ops.hpp): the forward keeps only each row's log-sum-exp, the backward
// recomputes the probabilities from q, k and it.
//
// Scratch (in the arena): one fp32 row of T per (b, h) for one query's probabilities; with grouped-query
// attention also each query head's own k and v gradients, fp32 [B, NH, T, 2 HS], which a second pass sums
// over the group in a fixed order (the CPU stays deterministic, and the query heads of one group run in
// parallel without sharing an accumulator). With 16-bit storage the probabilities are rounded to it before
// they multiply v (forward) or dout (dv), as the GPU's tensor-core GEMMs do. Output and gradient sums are
// kept in fp32 (per-thread scratch outside the arena, see cpu_kernels.hpp) and rounded once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

// The keys query t of sequence b sees (AttentionMask): first_key(t) .. last_key(t).
struct Visibility {
  bool causal;
  int window;  // > 0: the sliding window (causal only)
  int len;     // real tokens of this sequence (T without padding)
  bool row(int t) const { return t < len; }
  int first_key(int t) const { return window > 0 ? std::max(0, t - window + 1) : 0; }
  int last_key(int t) const { return causal ? std::min(t, len - 1) : len - 1; }
};

Visibility visibility(const AttentionMask& mask, int b, int T) {
  return {mask.causal, mask.window, mask.lengths ? std::clamp(mask.lengths[b], 0, T) : T};
}

// Where the heads of one token live: q head h at q(h), the k and v heads of group g at k(g), v(g) (column
// offsets in a qkv row of `row` elements); out and dout rows hold the NH heads side by side.
struct HeadLayout {
  explicit HeadLayout(const AttentionShape& s)
      : HS(s.HS),
        group(s.NH / s.NKV),
        row(s.qkv_width()),
        out_row(s.q_width()),
        k0(s.q_width()),
        v0(int64_t(s.NH + s.NKV) * s.HS) {}
  int64_t q(int h) const { return int64_t(h) * HS; }
  int64_t k(int g) const { return k0 + int64_t(g) * HS; }
  int64_t v(int g) const { return v0 + int64_t(g) * HS; }
  int kv_head(int h) const { return h / group; }
  int HS, group;
  int64_t row, out_row, k0, v0;
};

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

// One query row of the forward over keys first..last: scores q . k(t2) * scale into p, the softmax (its
// log-sum-exp into row_lse), and o = the probabilities (dropped, and with 16-bit storage rounded to it before
// multiplying v, as the GPU's tensor-core P @ V does) times v(t2), summed in fp32 in acc (HS floats; acc may
// be o itself for fp32 storage). k and v: functions of the key index giving its key and value rows.
template <DType A, class KeyRow, class ValueRow>
void attend_row(storage_t<A>* o, float& row_lse, const storage_t<A>* q, KeyRow k, ValueRow v, int first,
                int last, int HS, float scale, const ProbDropout& drop, uint32_t row_key, float* p,
                float* acc) {
  using S = Storage<A>;
  float maxv = -INFINITY;
  for (int t2 = first; t2 <= last; ++t2) {
    const auto* kr = k(t2);
    float dot = 0;
    for (int i = 0; i < HS; ++i) dot += S::load(q[i]) * S::load(kr[i]);
    p[t2] = dot * scale;
    maxv = std::max(maxv, p[t2]);
  }
  double sum = 0;
  for (int t2 = first; t2 <= last; ++t2) {
    p[t2] = std::exp(p[t2] - maxv);
    sum += p[t2];
  }
  row_lse = maxv + float(std::log(sum));
  const float inv = float(1.0 / sum);
  for (int t2 = first; t2 <= last; ++t2) p[t2] = S::load(S::store(drop(p[t2] * inv, row_key, t2)));
  for (int i = 0; i < HS; ++i) acc[i] = 0;
  for (int t2 = first; t2 <= last; ++t2) {
    const auto* vr = v(t2);
    for (int i = 0; i < HS; ++i) acc[i] += p[t2] * S::load(vr[i]);
  }
  if (static_cast<void*>(acc) != static_cast<void*>(o))
    for (int i = 0; i < HS; ++i) o[i] = S::store(acc[i]);
}

template <DType A>
void attention_fwd_t(void* out_, float* lse, const void* qkv_, void* scratch_, const AttentionShape& s,
                     const AttentionMask& mask) {
  using S = Storage<A>;
  constexpr bool kF32 = A == DType::F32;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* qkv = static_cast<const storage_t<A>*>(qkv_);
  const int B = s.B, T = s.T, NH = s.NH, HS = s.HS;
  const HeadLayout L(s);
  const float scale = 1.0f / std::sqrt(float(HS));
  const ProbDropout drop(mask);
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const Visibility vis = visibility(mask, b, T);
      float* p = static_cast<float*>(scratch_) + (int64_t(b) * NH + h) * T;  // this (b, h)'s softmax row
      const int64_t k_col = L.k(L.kv_head(h)), v_col = L.v(L.kv_head(h));
      for (int t = 0; t < T; ++t) {
        const auto* q = qkv + (int64_t(b) * T + t) * L.row + L.q(h);
        auto* o = out + (int64_t(b) * T + t) * L.out_row + L.q(h);
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
        const auto row = [&](int64_t col) {
          return [=](int t2) { return qkv + (int64_t(b) * T + t2) * L.row + col; };
        };
        attend_row<A>(o, row_lse, q, row(k_col), row(v_col), vis.first_key(t), vis.last_key(t), HS, scale,
                      drop, drop.row_key((uint64_t(b) * NH + h) * T + t), p, acc);
      }
    }
  }
}

template <DType A>
void attention_bwd_t(void* dqkv_, const void* dout_, const void* qkv_, const void* out_, const float* lse,
                     void* scratch_, const AttentionShape& s, const AttentionMask& mask) {
  using S = Storage<A>;
  constexpr bool kF32 = A == DType::F32;
  auto* dqkv = static_cast<storage_t<A>*>(dqkv_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
  const auto* qkv = static_cast<const storage_t<A>*>(qkv_);
  const auto* out = static_cast<const storage_t<A>*>(out_);
  float* scratch = static_cast<float*>(scratch_);
  const int B = s.B, T = s.T, NH = s.NH, NKV = s.NKV, HS = s.HS;
  const HeadLayout L(s);
  const bool grouped = NKV < NH;
  // Grouped: each query head's k and v gradients [T, 2 HS] (k | v), summed over the group at the end.
  float* kv_partials = scratch + int64_t(B) * NH * T;
  const float scale = 1.0f / std::sqrt(float(HS));
  const ProbDropout drop(mask);
  if constexpr (kF32) std::memset(dqkv, 0, sizeof(float) * size_t(B) * T * L.row);
    // Each (b, h) owns its q head's columns of dqkv and (multi-head) its k and v heads' columns or (grouped)
    // its own partials, so the pairs run in parallel without races.
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const Visibility vis = visibility(mask, b, T);
      const int g = L.kv_head(h);
      // fp32 accumulators of this head's dq, dk and dv rows (row strides q_stride and kv_stride). Multi-head:
      // dqkv itself for fp32 storage (row stride L.row), else one [T, 3 HS] block (q | k | v) rounded into
      // dqkv at the end. Grouped: dq likewise (a [T, HS] block for 16-bit), dk and dv in the partials.
      float *dq, *dk, *dv;
      int64_t q_stride, kv_stride;
      if (grouped) {
        dk = kv_partials + (int64_t(b) * NH + h) * T * 2 * HS;
        dv = dk + HS;
        kv_stride = 2 * int64_t(HS);
        std::fill(dk, dk + T * kv_stride, 0.0f);
        if constexpr (kF32) {
          dq = dqkv + int64_t(b) * T * L.row + L.q(h);
          q_stride = L.row;
        } else {
          q_stride = HS;
          dq = thread_scratch<float>(kScratchA, size_t(T) * HS);
          std::fill(dq, dq + T * q_stride, 0.0f);
        }
      } else if constexpr (kF32) {
        dq = dqkv + int64_t(b) * T * L.row + L.q(h);
        dk = dqkv + int64_t(b) * T * L.row + L.k(g);
        dv = dqkv + int64_t(b) * T * L.row + L.v(g);
        q_stride = kv_stride = L.row;
      } else {
        q_stride = kv_stride = 3 * int64_t(HS);
        dq = thread_scratch<float>(kScratchA, size_t(T) * q_stride);
        std::fill(dq, dq + T * q_stride, 0.0f);
        dk = dq + HS;
        dv = dq + 2 * HS;
      }
      const int64_t k_col = L.k(g), v_col = L.v(g);
      float* p = scratch + (int64_t(b) * NH + h) * T;  // the recomputed probabilities of one row
      for (int t = 0; t < vis.len; ++t) {
        const int first = vis.first_key(t), last = vis.last_key(t);
        const auto* d = dout + (int64_t(b) * T + t) * L.out_row + L.q(h);
        const auto* o = out + (int64_t(b) * T + t) * L.out_row + L.q(h);
        const auto* q = qkv + (int64_t(b) * T + t) * L.row + L.q(h);
        const float row_lse = lse[(int64_t(b) * NH + h) * T + t];
        // rowsum(P * dP) = dout . out: the softmax backward's correction without the probabilities (with
        // dropout too: dP is the dropped probabilities' gradient times the mask and scale).
        const uint32_t row_key = drop.row_key((uint64_t(b) * NH + h) * T + t);
        float d_dot_o = 0;
        for (int i = 0; i < HS; ++i) d_dot_o += S::load(d[i]) * S::load(o[i]);
        float* dq_row = dq + t * q_stride;
        for (int t2 = first; t2 <= last; ++t2) {
          const auto* k = qkv + (int64_t(b) * T + t2) * L.row + k_col;
          float dot = 0;
          for (int i = 0; i < HS; ++i) dot += S::load(q[i]) * S::load(k[i]);
          p[t2] = std::exp(dot * scale - row_lse);
        }
        for (int t2 = first; t2 <= last; ++t2) {
          const auto* k = qkv + (int64_t(b) * T + t2) * L.row + k_col;
          const auto* v = qkv + (int64_t(b) * T + t2) * L.row + v_col;
          float* dk_row = dk + t2 * kv_stride;
          float* dv_row = dv + t2 * kv_stride;
          const float p_stored = S::load(S::store(drop(p[t2], row_key, t2)));  // as multiplied in the forward
          float dz = 0;  // the gradient of the (dropped) probability
          for (int i = 0; i < HS; ++i) {
            const float di = S::load(d[i]);
            dz += di * S::load(v[i]);
            dv_row[i] += p_stored * di;
          }
          const float ds = p[t2] * (drop(dz, row_key, t2) - d_dot_o) * scale;
          for (int i = 0; i < HS; ++i) {
            dq_row[i] += ds * S::load(k[i]);
            dk_row[i] += ds * S::load(q[i]);
          }
        }
      }
      if constexpr (!kF32) {
        for (int t = 0; t < T; ++t) {
          auto* dst = dqkv + (int64_t(b) * T + t) * L.row;
          const float* src = dq + t * q_stride;
          for (int i = 0; i < HS; ++i) dst[L.q(h) + i] = S::store(src[i]);
          if (!grouped)
            for (int i = 0; i < HS; ++i) {
              dst[L.k(g) + i] = S::store(src[HS + i]);
              dst[L.v(g) + i] = S::store(src[2 * HS + i]);
            }
        }
      }
    }
  }
  if (!grouped) return;
  // dk and dv of each key/value head: its query heads' partials summed in head order, rounded once.
  const int G = L.group;
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      auto* dst = dqkv + (int64_t(b) * T + t) * L.row;
      for (int g = 0; g < NKV; ++g) {
        for (int part = 0; part < 2; ++part) {
          const int64_t col = part == 0 ? L.k(g) : L.v(g);
          for (int i = 0; i < HS; ++i) {
            float sum = 0;
            for (int j = 0; j < G; ++j)
              sum += kv_partials[((int64_t(b) * NH + g * G + j) * T + t) * 2 * HS + part * HS + i];
            dst[col + i] = S::store(sum);
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
      attend_row<A>(o, row_lse, q, row(0), row(1), 0, last, HS, scale, drop,
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

namespace {
void validate_attention(const AttentionShape& s, const AttentionMask& mask) {
  ANVIL_REQUIRE(s.B >= 0 && s.T >= 0 && s.NH > 0 && s.NKV > 0 && s.HS > 0 && s.NH % s.NKV == 0,
                "attention: B={} T={} NH={} NKV={} HS={}: NH must be a positive multiple of NKV, HS positive",
                s.B, s.T, s.NH, s.NKV, s.HS);
  ANVIL_REQUIRE(mask.window >= 0 && (mask.window == 0 || mask.causal),
                "attention: sliding window {} needs a causal mask and a window >= 0", mask.window);
}
}  // namespace

size_t attention_scratch_bytes(DType act, const AttentionShape& s) {
  dispatch_float(act, [](auto) {});  // rejects a non-float compute type
  const size_t rows = size_t(s.B) * s.NH * s.T;
  return sizeof(float) * (rows + (s.NKV < s.NH ? rows * 2 * size_t(s.HS) : 0));
}

void attention_fwd(DType act, void* out, float* lse, const void* qkv, void* scratch, const AttentionShape& s,
                   const AttentionMask& mask) {
  validate_attention(s, mask);
  dispatch_float(act, [&](auto a) { attention_fwd_t<decltype(a)::value>(out, lse, qkv, scratch, s, mask); });
}

void attention_bwd(DType act, void* dqkv, const void* dout, const void* qkv, const void* out,
                   const float* lse, void* scratch, const AttentionShape& s, const AttentionMask& mask) {
  validate_attention(s, mask);
  dispatch_float(
      act, [&](auto a) { attention_bwd_t<decltype(a)::value>(dqkv, dout, qkv, out, lse, scratch, s, mask); });
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
