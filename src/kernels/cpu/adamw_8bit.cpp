// 8-bit AdamW with block-wise quantised moments (semantics: AdamW8bitArgs in kernels/ops.hpp). One
// quantisation block at a time per thread, its elements in order, so a CPU run is bit-for-bit reproducible;
// the arithmetic is the CUDA kernel's (cuda/adamw_8bit.cu), step for step.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

constexpr int kMapSize = 256;

// The first code whose map value is >= x (kMapSize when none is); NaN gives 0.
int map_lower_bound(const float* map, float x) {
  int lo = 0, hi = kMapSize;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (map[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// The nearest code (ties to the lower) given x's lower bound `i`.
uint8_t nearest_code(const float* map, float x, int i) {
  if (i == 0) return 0;
  if (i == kMapSize) return kMapSize - 1;
  return uint8_t(x - map[i - 1] <= map[i] - x ? i - 1 : i);
}

// map_lower_bound without the binary search (an 8B-parameter update requantises 16 billion values): floats
// are bucketed by the top 16 bits of an order-preserving key of their bits, and start[b] is the lower
// bound of bucket b's smallest value. A value's lower bound lies in [start[b], start[b + 1]] (the maps'
// neighbouring values are rarely in one bucket, so the scan is a step or two): the same code as the binary
// search, for every float.
class MapIndex {
 public:
  explicit MapIndex(const float* map) : map_(map, map + kMapSize), start_(kBuckets + 1) {
    for (uint32_t b = 0; b < kBuckets; ++b) start_[b] = uint16_t(map_lower_bound(map, key_value(b << 16)));
    start_[kBuckets] = kMapSize;
  }
  bool is_for(const float* map) const { return std::equal(map_.begin(), map_.end(), map); }
  int lower_bound(float x) const {
    if (x != x) return 0;  // NaN, as the binary search
    const uint32_t b = key(x) >> 16;
    int c = start_[b];
    const int end = start_[b + 1];
    while (c < end && map_[size_t(c)] < x) ++c;
    return c;
  }
  uint8_t quantize(float x) const { return nearest_code(map_.data(), x, lower_bound(x)); }

 private:
  static constexpr uint32_t kBuckets = 1u << 16;
  // Monotone in the float's value (negative floats' bits run backwards; -0 sorts just below +0).
  static uint32_t key(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof(u));
    return u & 0x80000000u ? ~u : u | 0x80000000u;
  }
  static float key_value(uint32_t k) {
    const uint32_t u = k & 0x80000000u ? k & 0x7fffffffu : ~k;
    float x;
    std::memcpy(&x, &u, sizeof(x));
    return x;
  }
  std::vector<float> map_;
  std::vector<uint16_t> start_;
};

// The index of `map`, built once per map (the two 8-bit AdamW maps are constants).
const MapIndex& map_index(const float* map) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<MapIndex>> built;
  const std::lock_guard<std::mutex> lock(mutex);
  for (const auto& m : built)
    if (m->is_for(map)) return *m;
  built.push_back(std::make_unique<MapIndex>(map));
  return *built.back();
}

// m's code keeps m's sign (bitsandbytes): a value nearest a code of the other sign (0 counts as positive)
// moves one code towards its own sign.
uint8_t quantize_signed(const MapIndex& index, const float* map, float m, float inv_absmax) {
  int c = index.quantize(m * inv_absmax);
  if (m < 0.0f && map[c] >= 0.0f && c > 0) --c;
  if (m > 0.0f && map[c] < 0.0f && c < kMapSize - 1) ++c;
  return uint8_t(c);
}

template <DType G>
void adamw8bit_t(float* param, const void* grad_, uint8_t* m_codes, float* m_absmax, uint8_t* v_codes,
                 float* v_absmax, const float* m_map, const float* v_map, size_t n, size_t num_blocks,
                 const ParamGroupTable& g, const AdamW8bitArgs& a) {
  using T = storage_t<G>;
  const auto* grad = static_cast<const T*>(grad_);
  // The same float factors the CUDA adapter computes.
  const StepValues sv = step_values_for(a);
  const double bias1 = sv.bias1;
  const double sqrt_bias2 = std::sqrt(sv.bias2);
  const float step_factor = float(sqrt_bias2 / bias1);
  const float eps_hat = float(a.eps * sqrt_bias2);
  const float grad_scale = effective_grad_scale(a);
  constexpr size_t B = kAdamW8bitBlockSize;
  const MapIndex &m_index = map_index(m_map), &v_index = map_index(v_map);

#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < int64_t(num_blocks); ++b) {
    const uint64_t s0 = uint64_t(b) * B;
    // The range holding state element s0: the last one whose state starts at or before it.
    const uint64_t* sb = g.state_begins;
    const int r = int(std::upper_bound(sb, sb + g.count, s0) - sb) - 1;
    if (r < 0 || g.groups[r] == kSkipGroup) continue;
    const uint64_t p_begin = g.begins[r];
    const uint64_t p_end = r + 1 < g.count ? g.begins[r + 1] : n;
    const uint64_t off = s0 - sb[r];  // of this block within the range
    if (off >= p_end - p_begin) continue;
    const size_t count = std::min<uint64_t>(B, p_end - p_begin - off);
    const float lr = sv.lr[g.groups[r]], wd = a.weight_decay[g.groups[r]];
    const float step_size = lr * step_factor, decay = 1.0f - lr * wd;
    const float m_scale = m_absmax[b], v_scale = v_absmax[b];

    float m[B], v[B];
    float m_max = 0.0f, v_max = 0.0f;
    for (size_t j = 0; j < count; ++j) {
      const size_t s = s0 + j, i = p_begin + off + j;
      const float gj = Storage<G>::load(grad[i]) * grad_scale;
      float mj = 0.0f, vj = 0.0f;
      if (std::isfinite(gj)) {
        mj = a.beta1 * (m_map[m_codes[s]] * m_scale) + (1.0f - a.beta1) * gj;
        vj = a.beta2 * (v_map[v_codes[s]] * v_scale) + (1.0f - a.beta2) * (gj * gj);
        float p = param[i] * decay;
        p -= step_size * (mj / (std::sqrt(vj) + eps_hat));
        param[i] = p;
      }
      m[j] = mj, v[j] = vj;
      m_max = std::max(m_max, std::abs(mj));
      v_max = std::max(v_max, vj);
    }
    m_absmax[b] = m_max;
    v_absmax[b] = v_max;
    const float m_inv = m_max > 0.0f ? 1.0f / m_max : 0.0f;
    const float v_inv = v_max > 0.0f ? 1.0f / v_max : 0.0f;
    for (size_t j = 0; j < count; ++j) {
      m_codes[s0 + j] = quantize_signed(m_index, m_map, m[j], m_inv);
      v_codes[s0 + j] = v_index.quantize(v[j] * v_inv);
    }
  }
}

}  // namespace

uint8_t quantize_to_map(const float* map, float x) {
  return nearest_code(map, x, map_lower_bound(map, x));
}

uint8_t quantize_to_map_indexed(const float* map, float x) {
  return map_index(map).quantize(x);
}

void adamw8bit_step(DType grad_type, float* param, const void* grad, uint8_t* m_codes, float* m_absmax,
                    uint8_t* v_codes, float* v_absmax, const float* m_map, const float* v_map, size_t n,
                    size_t num_blocks, const ParamGroupTable& g, const AdamW8bitArgs& a) {
  if (num_blocks == 0 || g.count == 0) return;
  ANVIL_ASSERT(g.state_begins, "adamw8bit_step needs a table with state_begins");
  dispatch_float(grad_type, [&](auto t) {
    adamw8bit_t<decltype(t)::value>(param, grad, m_codes, m_absmax, v_codes, v_absmax, m_map, v_map, n,
                                    num_blocks, g, a);
  });
}

}  // namespace anvil::cpu
