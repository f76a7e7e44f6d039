// bf16 and fp16 storage conversions shared by the CPU backend (which emulates 16-bit storage with fp32
// math) and the CUDA kernels (stochastic rounding uses the same hash on both, so the two backends write
// bit-identical weights). Conversions from fp32 round to nearest, ties to even, like __float2bfloat16 and
// __float2half; NaN stays NaN and out-of-range values become +-inf.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ANVIL_HD __host__ __device__ __forceinline__
#else
#define ANVIL_HD inline
#endif

namespace anvil {

ANVIL_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

ANVIL_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

ANVIL_HD float bf16_to_float(uint16_t h) {
  return bits_float(uint32_t(h) << 16);
}

ANVIL_HD uint16_t float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // NaN stays a (quiet) NaN
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);                     // ties to even
  return uint16_t((u + rounding) >> 16);
}

// Stochastic rounding to bf16: adds 16 random bits below the kept mantissa, then truncates, so the result
// rounds up with probability equal to the discarded fraction (unbiased in expectation). Infinities and
// NaN pass through; a value within one bf16 ulp of the largest finite value may round to infinity only if
// it would also do so in round-to-nearest.
ANVIL_HD uint16_t float_to_bf16_stochastic(float f, uint32_t random16) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return float_to_bf16(f);
  const uint32_t r = (u + (random16 & 0xffffu)) >> 16;
  if ((r & 0x7f80u) == 0x7f80u) return float_to_bf16(f);  // carried into infinity: do not overflow
  return uint16_t(r);
}

ANVIL_HD float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: value = mant * 2^-24.
    const float v = float(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

ANVIL_HD uint16_t float_to_fp16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to infinity
  if (abs < 0x38800000u) {                                  // below the smallest normal 2^-14: subnormal
    if (abs < 0x33000000u) return sign;                     // below half the smallest subnormal 2^-25
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - exp;  // 14..24: mant >> shift = value in units of 2^-24
    const uint32_t kept = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    const uint32_t rounded = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
    return uint16_t(sign | rounded);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  const uint32_t rebased = abs - 0x38000000u;
  const uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return uint16_t(sign | ((rebased + rounding) >> 13));
}

// A counter-based hash (splitmix64 finaliser) giving the random bits of stochastic rounding for element
// `index` under `seed`: deterministic, and identical on the CPU and the GPU.
ANVIL_HD uint32_t rounding_bits(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return uint32_t(z >> 16) & 0xffffu;
}

// The seed that makes element i of a range starting at `begin` draw the bits element begin + i draws with
// `seed` (rounding_bits hashes seed + (index + 1) * golden): a ZeRO shard rounds as one process does. 0 (no
// stochastic rounding) stays 0.
ANVIL_HD uint64_t shard_rounding_seed(uint64_t seed, uint64_t begin) {
  return seed == 0 ? 0 : seed + begin * 0x9e3779b97f4a7c15ull;
}

}  // namespace anvil
