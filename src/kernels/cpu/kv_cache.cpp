// Generation with a KV cache, the reference of the "generation (KV cache)" ops (kernels/ops.hpp): the token
// embedding and RoPE at per-sequence positions, writing the new keys and values into the cache, and the
// attention of the new queries over it. The position arithmetic is exactly that of embedding_fwd and
// rope_fwd (a decode step must equal the full forward); the attention keeps its probabilities in fp32.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

void check_shape(const char* op, const AttentionShape& s) {
  ANVIL_REQUIRE(s.B >= 0 && s.T >= 1 && s.NH > 0 && s.NKV > 0 && s.HS > 0 && s.NH % s.NKV == 0,
                "{}: B={} Tn={} NH={} NKV={} HS={}: needs Tn >= 1 and NH a positive multiple of NKV", op, s.B,
                s.T, s.NH, s.NKV, s.HS);
}

// Every sequence's new tokens fit below `bound` (the cache capacity, or cached attention's max_keys).
void check_positions(const char* op, const int32_t* pos, int B, int Tn, int bound, const char* bound_name) {
  for (int b = 0; b < B; ++b)
    ANVIL_REQUIRE(pos[b] >= 0 && int64_t(pos[b]) + Tn <= bound,
                  "{}: sequence {} at position {} with {} new tokens does not fit {} {}", op, b, pos[b], Tn,
                  bound_name, bound);
}

template <DType A>
void embedding_at_t(void* out_, const int32_t* tokens, const void* wte_, const void* wpe_, const int32_t* pos,
                    int B, int Tn, int C) {
  using S = Storage<A>;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* wte = static_cast<const storage_t<A>*>(wte_);
  const auto* wpe = static_cast<const storage_t<A>*>(wpe_);
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < int64_t(B) * Tn; ++bt) {
    const auto* te = wte + int64_t(tokens[bt]) * C;
    auto* o = out + bt * C;
    if (!wpe) {
      std::copy_n(te, C, o);
      continue;
    }
    const auto* pe = wpe + (int64_t(pos[bt / Tn]) + bt % Tn) * C;
    for (int c = 0; c < C; ++c) o[c] = S::store(S::load(te[c]) + S::load(pe[c]));  // as embedding_fwd
  }
}

// rope.cpp's rotation, with the angle of each row's own position.
template <DType A>
void rope_at_t(void* qkv_, const float* inv_freq, const AttentionShape& s, const int32_t* pos) {
  using S = Storage<A>;
  auto* qkv = static_cast<storage_t<A>*>(qkv_);
  const int half = s.HS / 2, heads = s.NH + s.NKV;
  const int64_t W = s.qkv_width();
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < int64_t(s.B) * s.T; ++bt) {
    float* cs = thread_scratch<float>(kScratchA, size_t(2) * half);
    float* sn = cs + half;
    const int p = pos[bt / s.T] + int(bt % s.T);
    for (int i = 0; i < half; ++i) {
      const float a = float(p) * inv_freq[i];
      cs[i] = float(std::cos(double(a)));
      sn[i] = float(std::sin(double(a)));
    }
    auto* row = qkv + bt * W;
    for (int h = 0; h < heads; ++h) {
      auto* x = row + int64_t(h) * s.HS;
      for (int i = 0; i < half; ++i) {
        const float x0 = S::load(x[i]), x1 = S::load(x[i + half]);
        x[i] = S::store(x0 * cs[i] - x1 * sn[i]);
        x[i + half] = S::store(x1 * cs[i] + x0 * sn[i]);
      }
    }
  }
}

template <DType A>
void kv_write_t(const KvCacheLayer& cache, const void* qkv_, const int32_t* pos, const AttentionShape& s) {
  const auto* qkv = static_cast<const storage_t<A>*>(qkv_);
  auto* k = static_cast<storage_t<A>*>(cache.k);
  auto* v = static_cast<storage_t<A>*>(cache.v);
  const int64_t W = s.qkv_width(), kv_row = int64_t(s.NKV) * s.HS, k0 = s.q_width();
  for (int64_t bt = 0; bt < int64_t(s.B) * s.T; ++bt) {
    const int64_t b = bt / s.T, p = pos[b] + bt % s.T;
    const auto* row = qkv + bt * W;
    std::copy_n(row + k0, kv_row, k + (b * cache.S + p) * kv_row);  // the NKV key heads are contiguous
    std::copy_n(row + k0 + kv_row, kv_row, v + (b * cache.S + p) * kv_row);
  }
}

template <DType A>
void cached_attention_t(void* out_, const void* qkv_, const KvCacheLayer& cache, const int32_t* pos,
                        int window, const AttentionShape& s) {
  using S = Storage<A>;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* qkv = static_cast<const storage_t<A>*>(qkv_);
  const auto* kc = static_cast<const storage_t<A>*>(cache.k);
  const auto* vc = static_cast<const storage_t<A>*>(cache.v);
  const int Tn = s.T, NH = s.NH, HS = s.HS, group = s.NH / s.NKV;
  const int64_t W = s.qkv_width(), kv_row = int64_t(s.NKV) * HS;
  const float scale = 1.0f / std::sqrt(float(HS));
#pragma omp parallel for collapse(3) schedule(static)
  for (int b = 0; b < s.B; ++b) {
    for (int t = 0; t < Tn; ++t) {
      for (int h = 0; h < NH; ++h) {
        const int p = pos[b] + t, first = window > 0 ? std::max(0, p - window + 1) : 0;
        const auto* q = qkv + (int64_t(b) * Tn + t) * W + int64_t(h) * HS;
        // Key / value head h / group of sequence b at position p2: base + p2 * kv_row.
        const int64_t base = int64_t(b) * cache.S * kv_row + int64_t(h / group) * HS;
        float* sc = thread_scratch<float>(kScratchA, size_t(p - first + 1));
        float* acc = thread_scratch<float>(kScratchB, size_t(HS));
        float maxv = -INFINITY;
        for (int p2 = first; p2 <= p; ++p2) {
          const auto* kr = kc + base + p2 * kv_row;
          float dot = 0;
          for (int i = 0; i < HS; ++i) dot += S::load(q[i]) * S::load(kr[i]);
          sc[p2 - first] = dot * scale;
          maxv = std::max(maxv, sc[p2 - first]);
        }
        double sum = 0;
        for (int j = 0; j <= p - first; ++j) sum += sc[j] = std::exp(sc[j] - maxv);
        const float inv = float(1.0 / sum);
        std::fill(acc, acc + HS, 0.0f);
        for (int p2 = first; p2 <= p; ++p2) {
          const float pr = sc[p2 - first] * inv;
          const auto* vr = vc + base + p2 * kv_row;
          for (int i = 0; i < HS; ++i) acc[i] += pr * S::load(vr[i]);
        }
        auto* o = out + (int64_t(b) * Tn + t) * s.q_width() + int64_t(h) * HS;
        for (int i = 0; i < HS; ++i) o[i] = S::store(acc[i]);
      }
    }
  }
}

}  // namespace

void embedding_fwd_at(DType act, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                      const int32_t* pos, int B, int Tn, int C) {
  ANVIL_REQUIRE(B >= 0 && Tn >= 1 && C >= 1, "embedding_fwd_at: bad shape B={} Tn={} C={}", B, Tn, C);
  check_positions("embedding_fwd_at", pos, B, Tn, INT32_MAX, "positions up to");
  dispatch_float(act,
                 [&](auto a) { embedding_at_t<decltype(a)::value>(out, tokens, wte, wpe, pos, B, Tn, C); });
}

void rope_fwd_at(DType act, void* qkv, const float* inv_freq, const AttentionShape& s, const int32_t* pos) {
  check_shape("rope_fwd_at", s);
  ANVIL_REQUIRE(s.HS % 2 == 0, "rope_fwd_at: head size {} must be even (RoPE rotates pairs)", s.HS);
  check_positions("rope_fwd_at", pos, s.B, s.T, INT32_MAX, "positions up to");
  dispatch_float(act, [&](auto a) { rope_at_t<decltype(a)::value>(qkv, inv_freq, s, pos); });
}

void kv_cache_write(DType act, const KvCacheLayer& cache, const void* qkv, const int32_t* pos,
                    const AttentionShape& s) {
  check_shape("kv_cache_write", s);
  check_positions("kv_cache_write", pos, s.B, s.T, cache.S, "the cache capacity");
  dispatch_float(act, [&](auto a) { kv_write_t<decltype(a)::value>(cache, qkv, pos, s); });
}

void cached_attention_fwd(DType act, void* out, const void* qkv, const KvCacheLayer& cache,
                          const int32_t* pos, int max_keys, int window, const AttentionShape& s) {
  check_shape("cached_attention_fwd", s);
  ANVIL_REQUIRE(max_keys >= 1 && max_keys <= cache.S && window >= 0,
                "cached_attention_fwd: max_keys {} must be in [1, the cache capacity {}] and window {} >= 0",
                max_keys, cache.S, window);
  check_positions("cached_attention_fwd", pos, s.B, s.T, max_keys, "max_keys");
  dispatch_float(act,
                 [&](auto a) { cached_attention_t<decltype(a)::value>(out, qkv, cache, pos, window, s); });
}

}  // namespace anvil::cpu
