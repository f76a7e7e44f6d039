// The bf16 / fp16 conversions of core/half.hpp against independent references: the compiler's own fp16
// type (_Float16, correctly rounded by libgcc) and a bf16 rounding written in terms of neighbours and
// distances rather than bit tricks. Plus the statistics of stochastic rounding.
#include "core/half.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace anvil {
namespace {

#if !defined(__FLT16_MAX__)
#error "half_test needs the compiler's _Float16 (GCC >= 12 on x86-64) as the fp16 reference"
#endif

uint16_t ref_fp16_bits(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, sizeof(b));
  return b;
}

float ref_fp16_value(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, sizeof(h));
  return static_cast<float>(h);
}

bool fp16_is_nan(uint16_t b) {
  return (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0;
}
bool bf16_is_nan(uint16_t b) {
  return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0;
}

// bf16 round-to-nearest-even from first principles: the two bf16 neighbours of f (truncation, and one
// step further from zero), compared by distance in double; a tie picks the even mantissa. Beyond the
// largest finite value the outer neighbour is 2^128, which stands for infinity.
uint16_t ref_bf16_bits(float f) {
  if (std::isnan(f)) return 0x7fc0;
  if (std::isinf(f)) return f > 0 ? 0x7f80 : 0xff80;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(double(f));
  const uint16_t lo = uint16_t(float_bits(float(a)) >> 16);  // truncated magnitude
  const double lo_v = double(bits_float(uint32_t(lo) << 16));
  const uint16_t hi = uint16_t(lo + 1);
  const double hi_v = hi == 0x7f80 ? std::ldexp(1.0, 128) : double(bits_float(uint32_t(hi) << 16));
  const double dlo = a - lo_v, dhi = hi_v - a;
  uint16_t pick;
  if (dlo < dhi)
    pick = lo;
  else if (dhi < dlo)
    pick = hi;
  else
    pick = (lo & 1) ? hi : lo;
  return uint16_t(sign | pick);
}

TEST(HalfFp16, AllHalfValuesWidenExactlyAndRoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = uint16_t(b);
    const float f = fp16_to_float(h);
    if (fp16_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      ASSERT_TRUE(fp16_is_nan(float_to_fp16(f))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(float_bits(f), float_bits(ref_fp16_value(h))) << std::hex << b;
    ASSERT_EQ(float_to_fp16(f), h) << std::hex << b;
  }
}

// Compares float_to_fp16 with the reference for one fp32 bit pattern; returns false on a mismatch.
::testing::AssertionResult fp16_matches(uint32_t u) {
  const float f = bits_float(u);
  const uint16_t got = float_to_fp16(f), want = ref_fp16_bits(f);
  if (std::isnan(f)) {
    if (fp16_is_nan(got) && (got & 0x8000u) == (want & 0x8000u)) return ::testing::AssertionSuccess();
  } else if (got == want) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "fp32 bits 0x" << std::hex << u << " (" << f << "): got 0x" << got << ", reference 0x" << want;
}

TEST(HalfFp16, MatchesCompilerConversionOnEdgeCases) {
  const float edge[] = {0.0f,
                        -0.0f,
                        65504.0f,
                        65519.996f,
                        65520.0f,
                        65535.0f,
                        65536.0f,
                        1e10f,
                        INFINITY,
                        -INFINITY,
                        NAN,
                        -NAN,
                        std::ldexp(1.0f, -14),  // smallest normal
                        std::ldexp(1.0f, -24),  // smallest subnormal
                        std::ldexp(1.0f, -25),  // half of it: ties to 0
                        std::ldexp(1.5f, -25),
                        std::ldexp(1.0f, -26),
                        std::ldexp(3.0f, -25),  // 1.5 subnormal ulps: ties to 2
                        std::ldexp(1023.5f, -24),
                        std::ldexp(2047.5f, -25),
                        1.0f + std::ldexp(1.0f, -11),  // tie between 1 and 1 + 2^-10: to 1
                        1.0f + std::ldexp(3.0f, -11),  // tie: to 1 + 2^-9
                        std::numeric_limits<float>::denorm_min(),
                        std::numeric_limits<float>::min(),
                        std::numeric_limits<float>::max()};
  for (float f : edge) {
    EXPECT_TRUE(fp16_matches(float_bits(f)));
    EXPECT_TRUE(fp16_matches(float_bits(-f)));
  }
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65519.996f), 0x7bff);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_fp16(-65520.0f), 0xfc00);
}

TEST(HalfFp16, MatchesCompilerConversionOnMillionsOfPatterns) {
  // Around every kept/dropped boundary that matters: for each fp32 exponent from far below the fp16
  // subnormals to beyond the fp16 range, random upper mantissas with the dropped low bits set to 0, 1,
  // just below / at / just above half, and all ones, for every number of dropped bits (13 for normals,
  // up to 24 for subnormals).
  std::mt19937_64 rng(1);
  int64_t checked = 0;
  for (uint32_t exp = 96; exp <= 150; ++exp) {
    for (int k = 0; k < 1024; ++k) {
      const uint32_t high = uint32_t(rng()) & 0x7fffffu;
      for (uint32_t shift = 13; shift <= 23; ++shift) {
        const uint32_t half = 1u << (shift - 1), mask = (1u << shift) - 1u;
        for (uint32_t low : {0u, 1u, half - 1u, half, half + 1u, mask}) {
          const uint32_t mant = (high & ~mask) | (low & mask);
          const uint32_t u = (exp << 23) | mant;
          ASSERT_TRUE(fp16_matches(u));
          ASSERT_TRUE(fp16_matches(u | 0x80000000u));
          checked += 2;
        }
      }
    }
  }
  // Uniformly random bit patterns (every exponent, NaN payloads, infinities).
  for (int i = 0; i < 4'000'000; ++i) ASSERT_TRUE(fp16_matches(uint32_t(rng())));
  // Every fp32 value from just below the fp16 overflow boundary to just past it.
  for (uint32_t u = float_bits(65400.0f); u <= float_bits(65600.0f); ++u) ASSERT_TRUE(fp16_matches(u));
  checked += 4'000'000;
  EXPECT_GT(checked, 8'000'000);
}

TEST(HalfBf16, AllBf16ValuesRoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t h = uint16_t(b);
    const float f = bf16_to_float(h);
    ASSERT_EQ(float_bits(f), uint32_t(h) << 16);
    if (bf16_is_nan(h)) {
      ASSERT_TRUE(bf16_is_nan(float_to_bf16(f))) << std::hex << b;
      ASSERT_EQ(float_to_bf16(f) & 0x8000u, h & 0x8000u) << std::hex << b;
    } else {
      ASSERT_EQ(float_to_bf16(f), h) << std::hex << b;
    }
  }
}

::testing::AssertionResult bf16_matches(uint32_t u) {
  const float f = bits_float(u);
  const uint16_t got = float_to_bf16(f), want = ref_bf16_bits(f);
  if (std::isnan(f) ? (bf16_is_nan(got) && (got & 0x8000u) == (u >> 16 & 0x8000u)) : got == want)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "fp32 bits 0x" << std::hex << u << ": got 0x" << got << ", reference 0x" << want;
}

TEST(HalfBf16, MatchesReferenceRounding) {
  // Every tie and both of its neighbours, for every bf16 value of either sign (this includes the ties
  // between the largest finite value and infinity, and in the subnormals).
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint32_t base = b << 16;
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      ASSERT_TRUE(bf16_matches(base | low));
  }
  // A stride through all 2^32 patterns, and random ones.
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 257) ASSERT_TRUE(bf16_matches(uint32_t(u)));
  std::mt19937 rng(2);
  for (int i = 0; i < 2'000'000; ++i) ASSERT_TRUE(bf16_matches(uint32_t(rng())));
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // beyond max bf16 + half ulp
  EXPECT_EQ(float_to_bf16(bits_float(0x7f7f7fffu)), 0x7f7f);            // just below the tie
}

// --- stochastic rounding -------------------------------------------------------------------------------

TEST(HalfBf16Stochastic, ResultIsAlwaysANeighbour) {
  std::mt19937 rng(3);
  for (int i = 0; i < 200'000; ++i) {
    uint32_t u = uint32_t(rng());
    if ((u & 0x7f800000u) == 0x7f800000u) continue;  // inf / NaN: checked below
    const float f = bits_float(u);
    const uint16_t lo = uint16_t(u >> 16);  // truncation toward zero
    const uint16_t r = float_to_bf16_stochastic(f, rounding_bits(uint64_t(i) + 1, 7));
    if ((u & 0xffffu) == 0) {
      ASSERT_EQ(r, lo) << std::hex << u;  // exactly representable
    } else {
      ASSERT_TRUE(r == lo || r == uint16_t(lo + 1)) << std::hex << u << " -> " << r;
    }
  }
  for (uint32_t rbits : {0u, 1u, 0x7fffu, 0x8000u, 0xffffu}) {
    EXPECT_EQ(float_to_bf16_stochastic(INFINITY, rbits), 0x7f80);
    EXPECT_EQ(float_to_bf16_stochastic(-INFINITY, rbits), 0xff80);
    EXPECT_TRUE(bf16_is_nan(float_to_bf16_stochastic(NAN, rbits)));
    // The largest finite value never overflows to infinity by chance.
    EXPECT_EQ(float_to_bf16_stochastic(bits_float(0x7f7f7000u), rbits) & 0x7f80u, 0x7f00u);
  }
}

TEST(HalfBf16Stochastic, EqualsNearestForRepresentableValues) {
  std::mt19937 rng(4);
  for (int i = 0; i < 100'000; ++i) {
    const uint16_t h = uint16_t(rng());
    if (bf16_is_nan(h)) continue;
    const float f = bf16_to_float(h);
    for (uint64_t seed : {1ull, 99ull, 0xdeadbeefull})
      ASSERT_EQ(float_to_bf16_stochastic(f, rounding_bits(seed, uint64_t(i))), float_to_bf16(f))
          << std::hex << h;
  }
}

TEST(HalfBf16Stochastic, IsUnbiased) {
  // The mean of many stochastic roundings of x converges to x: within a few standard errors of the mean
  // (one rounding's deviation is at most one ulp, so its standard deviation is at most ulp / 2).
  std::mt19937 rng(5);
  constexpr int kSeeds = 40'000;
  for (int trial = 0; trial < 40; ++trial) {
    const float x = std::ldexp(float(rng() % 100000) / 100000.0f + 1.0f, int(rng() % 40) - 20) *
                    (trial % 2 ? -1.0f : 1.0f);
    const uint16_t lo = uint16_t(float_bits(x) >> 16);
    const double ulp = std::fabs(double(bf16_to_float(uint16_t(lo + 1))) - double(bf16_to_float(lo)));
    double sum = 0;
    int ups = 0;
    for (int s = 1; s <= kSeeds; ++s) {
      const uint16_t r = float_to_bf16_stochastic(x, rounding_bits(uint64_t(s) * 7919u, uint64_t(trial)));
      sum += bf16_to_float(r);
      ups += r != lo;
    }
    const double mean = sum / kSeeds;
    EXPECT_NEAR(mean, double(x), 5 * 0.5 * ulp / std::sqrt(double(kSeeds))) << "x = " << x;
    // Round-away-from-zero happens with probability equal to the discarded fraction.
    const double frac = double(float_bits(x) & 0xffffu) / 65536.0;
    EXPECT_NEAR(double(ups) / kSeeds, frac, 5 * 0.5 / std::sqrt(double(kSeeds))) << "x = " << x;
  }
}

TEST(HalfRoundingBits, DeterministicSixteenBitsThatDependOnSeedAndIndex) {
  int same_seed_diff = 0, same_index_diff = 0;
  std::vector<int> histogram(16, 0);
  for (uint64_t i = 0; i < 65536; ++i) {
    const uint32_t r = rounding_bits(42, i);
    ASSERT_LT(r, 65536u);
    ASSERT_EQ(r, rounding_bits(42, i));
    same_seed_diff += r != rounding_bits(42, i + 1);
    same_index_diff += r != rounding_bits(43, i);
    ++histogram[r >> 12];
  }
  EXPECT_GT(same_seed_diff, 65000);
  EXPECT_GT(same_index_diff, 65000);
  for (int count : histogram) EXPECT_NEAR(count, 4096, 400);  // roughly uniform top bits
}

}  // namespace
}  // namespace anvil
