// The reductions that leave their result in device memory (Ops::accumulate_sum, sum_squares_to,
// grad_clip_scale), which let a training step run without a host synchronisation, against the
// host-returning forms (Ops::sum, sum_squares) and the trainer's former host arithmetic. The trainer
// relies on them being equal bit for bit: moving the step's loss and gradient norm to the device must not
// change a printed value, a logged metric or a clipped update. The CUDA forms are checked against these in
// tests/parity/parity_ops_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "anvil/rng.hpp"
#include "core/half.hpp"
#include "kernels/ops.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

class DeviceReduction : public ::testing::Test {
 protected:
  void SetUp() override {
    dev_ = make_cpu_device();
    ops_ = make_cpu_ops(*dev_);
  }
  std::vector<float> randn(size_t n, float scale, float offset, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> v(n);
    for (float& x : v) x = offset + scale * rng.normal();
    return v;
  }
  std::unique_ptr<Device> dev_;
  std::unique_ptr<Ops> ops_;
};

// The trainer's clip arithmetic before it moved to the device (src/train/trainer.cpp), kept here as the
// reference: norm = sqrt(ss) * unscale; clip only above max_norm; scale = fp32(fp32(clip) * unscale).
struct HostClip {
  double norm;
  float scale;
};
HostClip host_clip(double sum_squares, double unscale, double max_norm) {
  const double norm = std::sqrt(sum_squares) * unscale;
  const float clip = max_norm > 0 && norm > max_norm ? float(max_norm / (norm + 1e-6)) : 1.0f;
  return {norm, float(double(clip) * unscale)};
}

// Bit equality that also holds for NaN (EXPECT_EQ would fail on NaN == NaN).
template <class T>
bool same_bits(T a, T b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

TEST_F(DeviceReduction, AccumulateSumAddsExactlyWhatSumReturns) {
  // Three "micro-batches" of per-token losses, summed into one device scalar as the trainer does.
  const size_t n = 4099;  // not a multiple of the fixed chunk count
  std::vector<std::vector<float>> batches;
  for (uint64_t k = 0; k < 3; ++k) batches.push_back(randn(n, 0.7f, 3.0f, 10 + k));
  double host = 0, device = 0;
  for (const std::vector<float>& b : batches) {
    host += ops_->sum(b.data(), n);
    ops_->accumulate_sum(&device, b.data(), n);
  }
  EXPECT_TRUE(same_bits(device, host)) << device << " vs " << host;
  // Accumulates onto what is there; n == 0 adds nothing.
  double start = 1.25;
  ops_->accumulate_sum(&start, batches[0].data(), n);
  EXPECT_TRUE(same_bits(start, 1.25 + ops_->sum(batches[0].data(), n)));
  ops_->accumulate_sum(&start, batches[0].data(), 0);
  EXPECT_TRUE(same_bits(start, 1.25 + ops_->sum(batches[0].data(), n)));
}

TEST_F(DeviceReduction, SumSquaresToOverwritesWithSumSquaresOfEachDtype) {
  const size_t n = 3001;
  const std::vector<float> v = randn(n, 2.0f, 0.1f, 7);
  std::vector<uint16_t> bf(n), hf(n);
  for (size_t i = 0; i < n; ++i) bf[i] = float_to_bf16(v[i]), hf[i] = float_to_fp16(v[i]);
  struct Case {
    DType t;
    const void* x;
  };
  for (const Case c :
       {Case{DType::F32, v.data()}, Case{DType::BF16, bf.data()}, Case{DType::F16, hf.data()}}) {
    double out = 12345.0;  // overwritten, not accumulated
    ops_->sum_squares_to(&out, c.x, c.t, n);
    EXPECT_TRUE(same_bits(out, ops_->sum_squares(c.x, c.t, n))) << dtype_name(c.t);
  }
  double out = 5.0;
  ops_->sum_squares_to(&out, v.data(), DType::F32, 0);
  EXPECT_EQ(out, 0.0);
  // Inf anywhere makes it non-finite (the overflow check and the trainer's non-finite error rely on it).
  std::vector<float> w = v;
  w[1234] = std::numeric_limits<float>::infinity();
  ops_->sum_squares_to(&out, w.data(), DType::F32, n);
  EXPECT_FALSE(std::isfinite(out));
}

TEST_F(DeviceReduction, GradClipScaleIsTheTrainersHostArithmetic) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    double sum_squares, unscale, max_norm;
  };
  const Case cases[] = {
      {4.0, 1.0, 1.0},               // norm 2 > 1: clipped
      {0.25, 1.0, 1.0},              // norm 0.5: not clipped
      {1.0, 1.0, 1.0},               // norm == max_norm: not clipped (strictly above only)
      {4.0, 1.0, 0.0},               // max_norm 0: never clipped
      {1e6, 1.0 / 3.0, 0.5},         // an unscale that is not a power of two
      {3.7e9, 2.0 / 65536.0, 1.0},   // a loss-scaled fp16 gradient
      {123.456, 1.0 / 4096.0, 1.0},  // small norm: scale = unscale
      {0.0, 0.01, 1.0},              // zero gradient
      {inf, 1.0, 1.0},               // overflow: clip 0, the caller must check the norm
      {nan, 1.0, 1.0},               // NaN: clip 1, likewise
  };
  for (const Case& c : cases) {
    const HostClip want = host_clip(c.sum_squares, c.unscale, c.max_norm);
    float scale = -1.f;
    double norm = -1.0;
    ops_->grad_clip_scale(&scale, &norm, &c.sum_squares, c.unscale, c.max_norm, nullptr);
    EXPECT_TRUE(same_bits(norm, want.norm)) << c.sum_squares << " " << c.unscale << " " << c.max_norm;
    EXPECT_TRUE(same_bits(scale, want.scale)) << c.sum_squares << " " << c.unscale << " " << c.max_norm;
  }
  // The clip itself: norm 2 clipped to 1 gives scale 1 / (2 + 1e-6) rounded to fp32.
  const double ss = 4.0;
  float scale = 0;
  double norm = 0;
  ops_->grad_clip_scale(&scale, &norm, &ss, 1.0, 1.0, nullptr);
  EXPECT_EQ(norm, 2.0);
  EXPECT_EQ(scale, float(1.0 / (2.0 + 1e-6)));
}

// convert_grads_sum_squares: convert_grads, then the squares of the values written added into the sum (fp64):
// the CPU reference is those two ops.
TEST_F(DeviceReduction, ConvertGradsSumSquaresAddsTheSquaresOfWhatItWrote) {
  std::vector<float> a = {1.0f, -2.0f, 0.5f}, b = {2.0f, 1.0f, -0.5f};
  double sum = 1.0;
  ops_->convert_grads_sum_squares(a.data(), DType::F32, b.data(), DType::F32, a.size(), true, &sum);
  EXPECT_EQ(a, (std::vector<float>{3.0f, -1.0f, 0.0f}));
  EXPECT_EQ(sum, 1.0 + 9.0 + 1.0);
  std::vector<uint16_t> h = {float_to_bf16(1.0f + 1.0f / 512)};  // rounds to 1 in bf16
  std::vector<float> f = {7.0f};
  ops_->convert_grads_sum_squares(f.data(), DType::F32, h.data(), DType::BF16, 1, false, &sum);
  EXPECT_EQ(f[0], bf16_to_float(h[0]));
  EXPECT_EQ(sum, 11.0 + double(f[0]) * f[0]);
}

// convert_grads adds or copies in fp32 and rounds once into the destination's type: fp32 exactly, bf16
// with one rounding of the fp32 sum, and across types (fp32 gradients to and from a bf16 or fp16
// communication buffer).
TEST_F(DeviceReduction, ConvertGradsRoundsOnceIntoTheDestinationType) {
  std::vector<float> a = {1.0f, -2.5f, 3e-8f, 1e30f}, b = {0.5f, 2.5f, 1.0f, -1e30f};
  ops_->convert_grads(a.data(), DType::F32, b.data(), DType::F32, a.size(), true);
  EXPECT_EQ(a, (std::vector<float>{1.5f, 0.0f, 1.0f + 3e-8f, 0.0f}));
  std::vector<uint16_t> x = {float_to_bf16(1.0f), float_to_bf16(256.0f)},
                        y = {float_to_bf16(1.0f / 256), float_to_bf16(1.0f)};
  ops_->convert_grads(x.data(), DType::BF16, y.data(), DType::BF16, x.size(), true);
  EXPECT_EQ(bf16_to_float(x[0]), bf16_to_float(float_to_bf16(1.0f + 1.0f / 256)));
  EXPECT_EQ(bf16_to_float(x[1]), 256.0f);  // 257 rounds to even in bf16's 8 bits
  // fp32 -> bf16 rounds to nearest even; bf16 -> fp32 is exact; a bf16 piece added into fp32 once.
  const std::vector<float> f = {1.0f + 1.0f / 512, 3.0f + 1.0f / 128, -7e-3f};
  std::vector<uint16_t> h(f.size());
  ops_->convert_grads(h.data(), DType::BF16, f.data(), DType::F32, f.size(), false);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(h[i], float_to_bf16(f[i])) << i;
  std::vector<float> back(f.size(), 0.25f);
  ops_->convert_grads(back.data(), DType::F32, h.data(), DType::BF16, h.size(), false);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(back[i], bf16_to_float(h[i])) << i;
  ops_->convert_grads(back.data(), DType::F32, h.data(), DType::BF16, h.size(), true);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(back[i], 2 * bf16_to_float(h[i])) << i;
  std::vector<uint16_t> half(f.size());
  ops_->convert_grads(half.data(), DType::F16, f.data(), DType::F32, f.size(), false);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(half[i], float_to_fp16(f[i])) << i;
}

}  // namespace
}  // namespace anvil
