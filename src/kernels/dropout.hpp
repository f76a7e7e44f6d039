// Dropout masks that every backend draws identically. Whether element i of a tensor is kept is a hash of
// (the run's per-step seed, the micro-batch counter, the tensor's site, i), so the CPU and CUDA backends drop
// the same elements, a backward pass or a recomputation reproduces the forward's mask without storing it,
// and a resumed run draws what the uninterrupted run drew. The seed and counter live in device memory
// (DropoutState), where kernels read them when they run: a step replayed from a CUDA graph draws new masks.
// Included by nvcc and the C++ side.
#pragma once
#include <cstdint>

#include "core/half.hpp"  // ANVIL_HD

namespace anvil {

struct DropoutState {
  uint64_t seed = 0;   // the step's seed, written by the host before the step
  uint32_t micro = 0;  // incremented as each training forward starts (Ops::dropout_next_micro)
  uint32_t unused = 0;
};

// Dropout inside a fused op, on a [rows, C] operand: probability p (0: none), the state and site its mask is
// drawn from, and the element index of row r, column c: r * index_pitch + c (index_pitch C: the operand's own
// indices; larger: its rows are rows of a bigger tensor, as in Ops::dropout_rows).
struct RowDropout {
  float p = 0.f;
  const DropoutState* state = nullptr;
  uint32_t site = 0;
  size_t index_pitch = 0;
};

// The residual branch's gradient that Ops::layernorm_bwd_sum can produce with the LayerNorm's: see there.
struct BranchGrad {
  void* dbranch = nullptr;  // the branch's gradient through `drop` (null without dropout)
  void* dbias = nullptr;    // += its column sums (null: not wanted)
  RowDropout drop;
};

// splitmix64's finaliser: a bijection of 64-bit words with full avalanche.
ANVIL_HD uint64_t dropout_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The key of one tensor's mask in the current micro-batch.
ANVIL_HD uint64_t dropout_key(uint64_t seed, uint32_t micro, uint32_t site) {
  return dropout_mix(seed ^ dropout_mix((uint64_t{micro} << 32 | site) + 0x9E3779B97F4A7C15ull));
}

// Elements whose 32 hash bits fall below this are dropped: round(p * 2^32), for 0 <= p < 1.
ANVIL_HD uint32_t dropout_threshold(float p) {
  const double t = static_cast<double>(p) * 4294967296.0 + 0.5;
  return p <= 0.f ? 0u : t >= 4294967295.0 ? 4294967295u : static_cast<uint32_t>(t);
}

ANVIL_HD bool dropout_keep(uint64_t key, uint64_t i, uint32_t threshold) {
  return static_cast<uint32_t>(dropout_mix(key + i * 0x9E3779B97F4A7C15ull) >> 32) >= threshold;
}

// Attention-probability dropout, [B*NH*T, T] probabilities: element (row, j) (row = (b * NH + h) * T +
// query, j the key) is kept as 16 bits of a 32-bit mix of the row's 32-bit key and the key pair j / 2
// decide. One 64-bit mix per row instead of per element: the per-element 64-bit arithmetic was a quarter of
// the fused attention kernels' instructions; one 32-bit mix per pair of keys halves what remained of it. The
// mix (Wellons' "lowbias32") is a bijection of 32-bit words, so each row's pairs draw distinct words, and
// rows are decorrelated by their avalanche-mixed keys.
ANVIL_HD uint32_t attention_dropout_row_key(uint64_t key, uint64_t row) {
  return static_cast<uint32_t>(dropout_mix(key + row * 0x9E3779B97F4A7C15ull) >> 32);
}
// The 32 bits that decide keys 2 * pair (low half) and 2 * pair + 1 (high half) of a row.
ANVIL_HD uint32_t attention_dropout_pair_bits(uint32_t row_key, uint32_t pair) {
  uint32_t x = row_key ^ (pair * 0x9E3779B9u);
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}
// Key j (its pair's bits given) is kept when its 16 bits, as the top half of a word, reach the 32-bit
// threshold: dropped with probability ceil(threshold / 2^16) / 2^16, within 2^-16 of p (1.000061 p for p =
// 0.1).
ANVIL_HD bool attention_dropout_keep_bits(uint32_t pair_bits, uint32_t j, uint32_t threshold) {
  return ((j & 1u) ? (pair_bits & 0xFFFF0000u) : (pair_bits << 16)) >= threshold;
}
ANVIL_HD bool attention_dropout_keep(uint32_t row_key, uint32_t j, uint32_t threshold) {
  return attention_dropout_keep_bits(attention_dropout_pair_bits(row_key, j >> 1), j, threshold);
}
// The factor kept elements are multiplied by (PyTorch's 1 / (1 - p), in fp32).
ANVIL_HD float dropout_scale(float p) {
  return 1.0f / (1.0f - p);
}

}  // namespace anvil
