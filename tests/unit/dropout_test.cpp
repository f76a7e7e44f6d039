// The dropout op on the CPU backend (the reference the CUDA kernels are compared with in
// tests/parity/dropout_parity_test.cpp): which elements it keeps is the shared hash of kernels/dropout.hpp,
// kept ones are scaled by 1 / (1 - p), and it is a pure function of the state, the site and the index.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/half.hpp"
#include "kernels/ops.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

TEST(Dropout, KeepsTheHashedElementsScaled) {
  auto dev = make_cpu_device();
  auto ops = make_cpu_ops(*dev);
  const size_t n = 200003;
  std::vector<float> x(n), y(n);
  for (size_t i = 0; i < n; ++i) x[i] = 1.0f + float(i % 17);
  DropoutState st{1234, 3, 0};
  for (const float p : {0.1f, 0.5f, 0.9f}) {
    ops->dropout(y.data(), x.data(), n, p, &st, 7);
    const uint64_t key = dropout_key(1234, 3, 7);
    size_t dropped = 0;
    for (size_t i = 0; i < n; ++i) {
      const bool keep = dropout_keep(key, i, dropout_threshold(p));
      ASSERT_EQ(y[i], keep ? x[i] * (1.0f / (1.0f - p)) : 0.0f) << i;
      dropped += !keep;
    }
    // Binomial(n, p): 5 standard deviations.
    EXPECT_NEAR(double(dropped) / n, p, 5 * std::sqrt(p * (1 - p) / n)) << p;
  }
  // Another site, micro-batch or seed gives another mask; the same ones give the same mask.
  std::vector<float> a(n), b(n);
  ops->dropout(a.data(), x.data(), n, 0.5f, &st, 7);
  ops->dropout(b.data(), x.data(), n, 0.5f, &st, 7);
  EXPECT_EQ(a, b);
  for (const DropoutState other : {DropoutState{1234, 4, 0}, DropoutState{1235, 3, 0}}) {
    ops->dropout(b.data(), x.data(), n, 0.5f, &other, 7);
    EXPECT_NE(a, b);
  }
  ops->dropout(b.data(), x.data(), n, 0.5f, &st, 8);
  EXPECT_NE(a, b);
  // In place, twice: the mask applied twice, the scale squared (what backward applies to a gradient).
  std::vector<float> z = x;
  ops->dropout(z.data(), z.data(), n, 0.5f, &st, 7);
  ops->dropout(z.data(), z.data(), n, 0.5f, &st, 7);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(z[i], a[i] == 0 ? 0.0f : x[i] * 4.0f) << i;
  // The counter: each training forward advances it.
  ops->dropout_next_micro(&st);
  EXPECT_EQ(st.micro, 4u);
}

// The attention-probability mask (a 32-bit mix per element under a per-row key): the kept fraction is 1 - p
// overall and within rows, and the masks of neighbouring rows and neighbouring keys are independent (they
// agree as often as two independent draws do).
TEST(Dropout, AttentionMaskIsUnbiasedAndIndependent) {
  const uint64_t key = dropout_key(99, 2, 5);
  const int rows = 512, cols = 512;
  for (const float p : {0.1f, 0.5f}) {
    const uint32_t threshold = dropout_threshold(p);
    std::vector<uint8_t> keep(size_t(rows) * cols);
    for (int r = 0; r < rows; ++r) {
      const uint32_t row_key = attention_dropout_row_key(key, uint64_t(r) + 12345);
      for (int j = 0; j < cols; ++j)
        keep[size_t(r) * cols + j] = attention_dropout_keep(row_key, j, threshold);
    }
    const double n = double(rows) * cols;
    size_t kept = 0, same_row_pair = 0, same_col_pair = 0;
    int worst_row = 0;
    for (int r = 0; r < rows; ++r) {
      int row_kept = 0;
      for (int j = 0; j < cols; ++j) {
        const size_t i = size_t(r) * cols + j;
        kept += keep[i], row_kept += keep[i];
        if (r > 0) same_row_pair += keep[i] == keep[i - cols];
        if (j > 0) same_col_pair += keep[i] == keep[i - 1];
      }
      worst_row = std::max(worst_row, std::abs(row_kept - int(std::lround(cols * (1 - p)))));
    }
    const double sd = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(kept / n, 1 - p, 5 * sd) << p;
    // A row of 512 keys: 6 standard deviations of Binomial(512, p) over 512 rows.
    EXPECT_LE(worst_row, int(std::ceil(6 * std::sqrt(cols * p * (1 - p))))) << p;
    const double agree = p * p + (1 - p) * (1 - p), agree_sd = std::sqrt(agree * (1 - agree) / n);
    EXPECT_NEAR(same_row_pair / (n - cols), agree, 6 * agree_sd) << p;
    EXPECT_NEAR(same_col_pair / (n - rows), agree, 6 * agree_sd) << p;
  }
  // Another key gives another mask.
  EXPECT_NE(attention_dropout_row_key(key, 7), attention_dropout_row_key(dropout_key(99, 3, 5), 7));
}

// Attention masks decide a pair of keys from one 32-bit mix: the even key by the low 16 bits, the odd key by
// the high 16, each kept when its 16 bits reach ceil(threshold / 2^16) (the drop probability rounded up to a
// multiple of 2^-16).
TEST(Dropout, AttentionKeysOfAPairTakeSixteenBitsEach) {
  const uint32_t threshold = dropout_threshold(0.1f);
  const uint32_t t16 = uint32_t((uint64_t(threshold) + 0xFFFFu) >> 16);  // 6554 for p = 0.1
  EXPECT_EQ(t16, 6554u);
  EXPECT_FALSE(attention_dropout_keep_bits(t16 - 1, 0, threshold));
  EXPECT_TRUE(attention_dropout_keep_bits(t16, 0, threshold));
  EXPECT_FALSE(attention_dropout_keep_bits((t16 - 1) << 16 | 0xFFFFu, 1, threshold));
  EXPECT_TRUE(attention_dropout_keep_bits(t16 << 16, 1, threshold));
  EXPECT_TRUE(attention_dropout_keep_bits(0, 0, dropout_threshold(0.f)));  // p = 0 keeps everything
  const uint32_t row_key = attention_dropout_row_key(dropout_key(7, 1, 3), 42);
  for (uint32_t j = 0; j < 64; ++j)
    EXPECT_EQ(attention_dropout_keep(row_key, j, threshold),
              attention_dropout_keep_bits(attention_dropout_pair_bits(row_key, j / 2), j, threshold))
        << j;
}

// Rows of a bigger tensor draw that tensor's masks: row r of the rows is row r * 5 of a [rows * 5, cols]
// tensor (BERT's last block computing only the [CLS] rows).
TEST(Dropout, RowsDrawTheWholeTensorsMask) {
  auto dev = make_cpu_device();
  auto ops = make_cpu_ops(*dev);
  const int rows = 7, cols = 33, every = 5;
  std::vector<float> whole(size_t(rows) * every * cols), dropped_whole(whole.size());
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = 0.5f + float(i % 13);
  DropoutState st{99, 2, 0};
  ops->dropout(dropped_whole.data(), whole.data(), whole.size(), 0.3f, &st, 11);
  std::vector<float> x(size_t(rows) * cols), y(x.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) x[size_t(r) * cols + c] = whole[size_t(r) * every * cols + c];
  ops->dropout_rows(y.data(), x.data(), rows, cols, size_t(every) * cols, 0.3f, &st, 11);
  size_t dropped = 0;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      ASSERT_EQ(y[size_t(r) * cols + c], dropped_whole[size_t(r) * every * cols + c]) << r << "," << c;
      dropped += y[size_t(r) * cols + c] == 0.f;
    }
  EXPECT_GT(dropped, 0u);
  EXPECT_LT(dropped, x.size());
  // In place, as backward applies it.
  std::vector<float> z = x;
  ops->dropout_rows(z.data(), z.data(), rows, cols, size_t(every) * cols, 0.3f, &st, 11);
  EXPECT_EQ(z, y);
}

TEST(Dropout, SixteenBitStorageRoundsOnce) {
  auto dev = make_cpu_device();
  const DropoutState st{99, 1, 0};
  const size_t n = 4099;
  for (const DType t : {DType::BF16, DType::F16}) {
    auto ops = make_cpu_ops(*dev, {t, DType::F32});
    std::vector<uint16_t> x(n), y(n);
    for (size_t i = 0; i < n; ++i) {
      const float v = 0.37f * float(int(i % 23) - 11);
      x[i] = t == DType::BF16 ? float_to_bf16(v) : float_to_fp16(v);
    }
    ops->dropout(y.data(), x.data(), n, 0.3f, &st, 2);
    const uint64_t key = dropout_key(99, 1, 2);
    for (size_t i = 0; i < n; ++i) {
      const float xi = t == DType::BF16 ? bf16_to_float(x[i]) : fp16_to_float(x[i]);
      const float want = dropout_keep(key, i, dropout_threshold(0.3f)) ? xi * (1.0f / 0.7f) : 0.0f;
      ASSERT_EQ(y[i], t == DType::BF16 ? float_to_bf16(want) : float_to_fp16(want)) << i;
    }
  }
}

TEST(Dropout, ThresholdIsRoundedProbability) {
  EXPECT_EQ(dropout_threshold(0.0f), 0u);
  EXPECT_EQ(dropout_threshold(0.5f), 2147483648u);
  EXPECT_EQ(dropout_threshold(0.25f), 1073741824u);
  EXPECT_EQ(dropout_scale(0.5f), 2.0f);
}

}  // namespace
}  // namespace anvil
