#include "model/rope.hpp"

#include <cmath>
#include <numbers>

#include "anvil/error.hpp"

namespace anvil {

std::vector<float> rope_inv_freq(const TransformerConfig& cfg) {
  ANVIL_REQUIRE(cfg.family == "llama" || cfg.family == "qwen2" || cfg.family == "mistral",
                "rope_inv_freq: family '{}' has no rotary embedding (llama, qwen2, mistral)", cfg.family);
  const int HS = cfg.head_size();
  ANVIL_REQUIRE(HS >= 2 && HS % 2 == 0, "rope_inv_freq: head size {} must be even", HS);
  const RopeScaling& rs = cfg.rope_scaling;
  ANVIL_REQUIRE(rs.type.empty() || rs.type == "linear" || rs.type == "llama3",
                "rope_inv_freq: rope_scaling type '{}' is not supported (default, linear, llama3)", rs.type);

  // torch: 1.0 / (base ** (arange(0, HS, 2).float() / HS)): the exponent is an fp32 division, the power is
  // taken of the fp32 base (a Python scalar joins an fp32 tensor as fp32), and 1.0 / x is reciprocal(x).
  // pow in double then rounded is the correctly rounded powf.
  const float base = float(cfg.rope_theta);
  std::vector<float> inv(size_t(HS / 2));
  for (int i = 0; i < HS / 2; ++i) {
    const float e = float(2 * i) / float(HS);
    const float p = float(std::pow(double(base), double(e)));
    inv[size_t(i)] = 1.0f / p;
  }
  const float factor = float(rs.factor);
  if (rs.type == "linear") {
    for (float& f : inv) f = f / factor;
  } else if (rs.type == "llama3") {
    const double orig = rs.original_max_position_embeddings;
    const float low_wavelen = float(orig / rs.low_freq_factor);
    const float high_wavelen = float(orig / rs.high_freq_factor);
    const float two_pi = float(2 * std::numbers::pi);
    const float orig_f = float(orig), low_f = float(rs.low_freq_factor);
    const float band = float(rs.high_freq_factor - rs.low_freq_factor);
    for (float& f : inv) {
      const float wavelen = (1.0f / f) * two_pi;
      const float scaled = wavelen > low_wavelen ? f / factor : f;  // low frequencies: divided by factor
      if (wavelen < high_wavelen || wavelen > low_wavelen) {
        f = scaled;
        continue;
      }
      // The band between: interpolate smoothly (HF evaluates left to right, in fp32).
      const float s = ((1.0f / wavelen) * orig_f - low_f) / band;
      const float a = (1.0f - s) * scaled / factor;
      const float b = s * scaled;
      f = a + b;
    }
  }
  return inv;
}

}  // namespace anvil
