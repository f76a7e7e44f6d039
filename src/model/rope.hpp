// Rotary position embedding frequencies of the Llama-family decoders (llama, qwen2, mistral), computed as
// Hugging Face transformers computes them (modeling_rope_utils.py and each model's RotaryEmbedding), in
// fp32, so a model imported from a checkpoint rotates exactly as it did in PyTorch.
#pragma once
#include <vector>

#include "anvil/model_config.hpp"

namespace anvil {

// The HS/2 inverse frequencies (HS = head_size()) of cfg.rope_scaling's type; pair i of a head rotates
// by position * inv_freq[i] (HF rotate_half layout: element i pairs with element i + HS/2).
//   default ("")  inv_freq[i] = 1 / theta^(2i / HS)
//   linear        inv_freq[i] / factor            (= positions divided by factor)
//   llama3        with wavelen = 2 pi / inv_freq, lo = orig / low_freq_factor, hi = orig / high
//                 (orig = original_max_position_embeddings, high = high_freq_factor):
//                   wavelen < hi:  inv_freq                  (high frequencies kept)
//                   wavelen > lo:  inv_freq / factor         (low frequencies scaled)
//                   otherwise:     (1 - s) inv_freq / factor + s inv_freq,
//                                  s = (orig / wavelen - low_freq_factor) / (high - low_freq_factor)
// The cos/sin attention scaling of these three types is 1 (HF's attention_factor). Every step is a float
// operation in PyTorch's order (e.g. theta^e as powf of the fp32 theta and exponent, 2 pi / x as
// reciprocal(x) * 2 pi), so results match HF's CPU computation to the last bit, except where PyTorch's
// vectorised powf is itself off by an ulp. Throws anvil::Error for a non-RoPE family or an unknown type.
std::vector<float> rope_inv_freq(const TransformerConfig& cfg);

}  // namespace anvil
