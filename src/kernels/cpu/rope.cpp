// Rotary position embedding (Hugging Face Llama's rotate-half form), the reference of Ops::rope_fwd /
// rope_bwd: in place on the q and k heads of a qkv buffer.
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

// sign = 1 rotates by +a (forward), -1 by -a (backward: the transpose of the rotation). cos and sin are
// evaluated once per (t, i) and shared by every sequence and head.
template <DType A>
void rope_t(void* qkv_, const float* inv_freq, const AttentionShape& s, int pos_offset, float sign) {
  using S = Storage<A>;
  auto* qkv = static_cast<storage_t<A>*>(qkv_);
  const int half = s.HS / 2, heads = s.NH + s.NKV;  // the v heads come last and are left alone
  const int64_t W = s.qkv_width();
#pragma omp parallel for schedule(static)
  for (int t = 0; t < s.T; ++t) {
    float* cs = thread_scratch<float>(kScratchA, size_t(2) * half);
    float* sn = cs + half;
    for (int i = 0; i < half; ++i) {
      // The fp32 angle as the contract defines it; its cos and sin in fp64 rounded to fp32 (accurate at the
      // ~1e5 radians long contexts reach, unlike a fast fp32 sin).
      const float a = float(pos_offset + t) * inv_freq[i];
      cs[i] = float(std::cos(double(a)));
      sn[i] = sign * float(std::sin(double(a)));
    }
    for (int b = 0; b < s.B; ++b) {
      auto* row = qkv + (int64_t(b) * s.T + t) * W;
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
}

void check_rope_shape(const AttentionShape& s) {
  ANVIL_REQUIRE(s.B >= 0 && s.T >= 0 && s.NH > 0 && s.NKV > 0 && s.HS > 0 && s.HS % 2 == 0,
                "RoPE: bad shape B={} T={} NH={} NKV={} HS={} (HS must be even)", s.B, s.T, s.NH, s.NKV,
                s.HS);
}

}  // namespace

void rope_fwd(DType act, void* qkv, const float* inv_freq, const AttentionShape& s, int pos_offset) {
  check_rope_shape(s);
  dispatch_float(act, [&](auto a) { rope_t<decltype(a)::value>(qkv, inv_freq, s, pos_offset, 1.f); });
}

void rope_bwd(DType act, void* dqkv, const float* inv_freq, const AttentionShape& s, int pos_offset) {
  check_rope_shape(s);
  dispatch_float(act, [&](auto a) { rope_t<decltype(a)::value>(dqkv, inv_freq, s, pos_offset, -1.f); });
}

}  // namespace anvil::cpu
