// The Llama-family ops of the CPU reference backend: RMSNorm (and its fused residual form), RoPE and SwiGLU,
// and the embedding without learned positions.
//   * forwards against naive fp64 references written here from the contract (and Hugging Face's formulas);
//   * backwards by finite differences of L = sum(out * R) (gradcheck_util.hpp), and their accumulate /
//     overwrite conventions;
//   * bf16 / fp16 storage against the same op in fp32 on the widened inputs: one rounding on store (within
//     half a 16-bit spacing), with RMSNorm's extra rounding of the normalised row before the weight;
//   * residual_rmsnorm_fwd == residual_fwd then rmsnorm_fwd, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "anvil/error.hpp"
#include "anvil/rng.hpp"
#include "core/half.hpp"
#include "gradcheck_util.hpp"
#include "kernels/ops.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

using test::dot;
using test::gradient_matches;
using test::Loss;

std::vector<float> randn(Rng& rng, size_t n, float stddev = 1.0f, float mean = 0.0f) {
  std::vector<float> v(n);
  for (float& x : v) x = mean + stddev * rng.normal();
  return v;
}

// Hugging Face's inverse frequencies: 1 / theta^(2i / HS).
std::vector<float> inv_freq_for(int HS, double theta) {
  std::vector<float> f(size_t(HS / 2));
  for (int i = 0; i < HS / 2; ++i) f[i] = float(1.0 / std::pow(theta, 2.0 * i / HS));
  return f;
}

// Rounds f to dtype t and back (the identity for F32).
float round_to(DType t, float f) {
  if (t == DType::BF16) return bf16_to_float(float_to_bf16(f));
  if (t == DType::F16) return fp16_to_float(float_to_fp16(f));
  return f;
}

// The spacing of dtype t's values around |r|.
double spacing(DType t, float r) {
  const int mant_bits = t == DType::F32 ? 23 : t == DType::BF16 ? 7 : 10;
  const int min_exp = t == DType::F16 ? -14 : -126;
  return std::ldexp(1.0, std::max(std::ilogb(r == 0 ? 1e-30f : r), min_exp) - mant_bits);
}

double max_abs(std::span<const float> v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// A tensor stored in dtype t: fp32 values, or 16-bit bit patterns.
class Stored {
 public:
  Stored(DType t, std::span<const float> v) : t_(t) {
    if (t == DType::F32) {
      f_.assign(v.begin(), v.end());
    } else {
      h_.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i)
        h_[i] = t == DType::BF16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
    }
  }
  Stored(DType t, size_t n, float fill) : Stored(t, std::vector<float>(n, fill)) {}
  void* data() { return t_ == DType::F32 ? static_cast<void*>(f_.data()) : h_.data(); }
  DType dtype() const { return t_; }
  std::vector<float> values() const {
    if (t_ == DType::F32) return f_;
    std::vector<float> out(h_.size());
    for (size_t i = 0; i < h_.size(); ++i)
      out[i] = t_ == DType::BF16 ? bf16_to_float(h_[i]) : fp16_to_float(h_[i]);
    return out;
  }

 private:
  DType t_;
  std::vector<float> f_;
  std::vector<uint16_t> h_;
};

// Every stored value within half a spacing of ref (one rounding to nearest of it), plus `slack`.
::testing::AssertionResult rounded_from(const Stored& actual, std::span<const float> ref, double slack = 0) {
  const std::vector<float> a = actual.values();
  if (a.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << a.size() << " vs " << ref.size();
  int bad = 0;
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(double(a[i]) - double(ref[i]));
    if (!(err <= 0.5 * spacing(actual.dtype(), ref[i]) + slack)) {
      if (bad++ == 0) result = ::testing::AssertionFailure();
      if (bad <= 5) result << "\n  [" << i << "] " << a[i] << " vs " << ref[i] << " (error " << err << ")";
    }
  }
  if (bad)
    result << "\n  " << bad << " of " << a.size() << " values off (" << dtype_name(actual.dtype()) << ")";
  return result;
}

// |actual - ref| <= tol * (1 + |ref|) everywhere.
void expect_close(std::span<const float> actual, std::span<const double> ref, double tol, const char* what) {
  ASSERT_EQ(actual.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(actual[i], ref[i], tol * (1 + std::fabs(ref[i]))) << what << " at " << i;
}

class DecoderOps : public ::testing::Test {
 protected:
  std::unique_ptr<Device> dev_ = make_cpu_device();
  std::unique_ptr<Ops> ops_ = make_cpu_ops(*dev_);
  Rng rng_{4242};
};

// --- forwards against fp64 references ------------------------------------------------------------------

TEST_F(DecoderOps, RmsNormForwardMatchesFp64Reference) {
  for (const int C : {48, 5}) {
    SCOPED_TRACE("C=" + std::to_string(C));
    const int N = 7;
    const float eps = 1e-6f;
    const std::vector<float> inp = randn(rng_, size_t(N) * C, 2.0f, 0.7f), w = randn(rng_, C, 0.3f, 1.0f);
    std::vector<float> out(inp.size(), 99.0f), rstd(N, 99.0f);
    ops_->rmsnorm_fwd(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
    std::vector<double> ref(inp.size()), ref_rstd(N);
    for (int r = 0; r < N; ++r) {
      double ms = 0;
      for (int c = 0; c < C; ++c) ms += double(inp[r * C + c]) * inp[r * C + c];
      ref_rstd[r] = 1.0 / std::sqrt(ms / C + eps);
      for (int c = 0; c < C; ++c) ref[r * C + c] = inp[r * C + c] * ref_rstd[r] * w[c];
    }
    expect_close(out, ref, 1e-6, "out");
    expect_close(rstd, ref_rstd, 1e-6, "rstd");
  }
}

// RoPE as Hugging Face writes it: q * cos + rotate_half(q) * sin with rotate_half(x) = cat(-x2, x1) and
// cos, sin of the fp32 angle, per q and k head; v untouched. Grouped-query shape (NKV < NH), positions from
// pos_offset, and angles up to ~1e5 radians (a 100k-token position), where a fast fp32 sin would be off.
TEST_F(DecoderOps, RopeMatchesHuggingFaceRotateHalf) {
  struct Case {
    AttentionShape s;
    int pos_offset;
    double theta;
  };
  for (const Case& k : {Case{{2, 5, 4, 2, 8}, 3, 10000.0}, Case{{1, 4, 2, 1, 16}, 100000, 500000.0},
                        Case{{2, 3, 3, 3, 6}, 0, 10000.0}}) {
    const AttentionShape& s = k.s;
    SCOPED_TRACE("NH=" + std::to_string(s.NH) + " NKV=" + std::to_string(s.NKV) +
                 " HS=" + std::to_string(s.HS) + " pos_offset=" + std::to_string(k.pos_offset));
    const int W = s.qkv_width(), half = s.HS / 2;
    const std::vector<float> inv_freq = inv_freq_for(s.HS, k.theta);
    const std::vector<float> qkv0 = randn(rng_, size_t(s.B) * s.T * W);
    std::vector<double> ref(qkv0.begin(), qkv0.end());
    for (int b = 0; b < s.B; ++b)
      for (int t = 0; t < s.T; ++t)
        for (int h = 0; h < s.NH + s.NKV; ++h) {
          const size_t base = (size_t(b) * s.T + t) * W + size_t(h) * s.HS;
          for (int d = 0; d < s.HS; ++d) {
            const int i = d % half;  // emb = cat(freqs, freqs)
            const double a = float(float(k.pos_offset + t) * inv_freq[i]);
            const double rot = d < half ? -double(qkv0[base + d + half]) : double(qkv0[base + d - half]);
            ref[base + d] = qkv0[base + d] * std::cos(a) + rot * std::sin(a);
          }
        }
    std::vector<float> qkv = qkv0;
    ops_->rope_fwd(qkv.data(), inv_freq.data(), s, k.pos_offset);
    expect_close(qkv, ref, 1e-6, "rope_fwd");
    for (size_t row = 0; row < size_t(s.B) * s.T; ++row)  // v: bit for bit
      for (int c = (s.NH + s.NKV) * s.HS; c < W; ++c) ASSERT_EQ(qkv[row * W + c], qkv0[row * W + c]);
    // The backward rotates back: the inverse of an orthogonal map is its transpose.
    ops_->rope_bwd(qkv.data(), inv_freq.data(), s, k.pos_offset);
    expect_close(qkv, std::vector<double>(qkv0.begin(), qkv0.end()), 1e-6, "rope_bwd(rope_fwd(x))");
  }
}

TEST_F(DecoderOps, RopeRejectsAnOddHeadSize) {
  std::vector<float> qkv(5 * 3, 0.f), inv_freq(2, 1.f);
  EXPECT_THROW(ops_->rope_fwd(qkv.data(), inv_freq.data(), AttentionShape{1, 1, 1, 1, 5}, 0), Error);
  EXPECT_THROW(ops_->rope_bwd(qkv.data(), inv_freq.data(), AttentionShape{1, 1, 1, 1, 5}, 0), Error);
}

TEST_F(DecoderOps, SwigluForwardMatchesFp64Reference) {
  const int N = 4, I = 9;
  std::vector<float> inp = randn(rng_, size_t(N) * 2 * I, 3.0f);
  inp[0] = -120.0f, inp[1] = 120.0f;  // exp(-g) overflowing and vanishing: silu -> -0 and g
  std::vector<float> out(size_t(N) * I, 99.0f);
  ops_->swiglu_fwd(out.data(), inp.data(), N, I);
  std::vector<double> ref(out.size());
  for (int r = 0; r < N; ++r)
    for (int j = 0; j < I; ++j) {
      const double g = inp[r * 2 * I + j], u = inp[r * 2 * I + I + j];
      ref[r * I + j] = g / (1 + std::exp(-g)) * u;
    }
  expect_close(out, ref, 1e-6, "swiglu_fwd");
}

// --- the fused residual form is the two ops in sequence ---------------------------------------------------

TEST_F(DecoderOps, ResidualRmsNormEqualsResidualThenRmsNorm) {
  for (const DType t : {DType::F32, DType::BF16, DType::F16}) {
    for (const bool alias : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + (alias ? " out = a" : ""));
      const auto ops = make_cpu_ops(*dev_, {t, DType::F32});
      const int N = 6, C = 40;
      const size_t NC = size_t(N) * C;
      const float eps = 1e-5f;
      const Stored a(t, randn(rng_, NC, 2.0f, 1.0f)), b(t, randn(rng_, NC, 0.5f)),
          w(t, randn(rng_, C, 0.3f, 1.f));
      // The sequence.
      Stored sa = a, sb = b, sw = w, sum(t, NC, 7.f), ln(t, NC, 7.f);
      std::vector<float> rstd(N, 7.f);
      ops->residual_fwd(sum.data(), sa.data(), sb.data(), NC);
      ops->rmsnorm_fwd(ln.data(), rstd.data(), sum.data(), sw.data(), N, C, eps);
      // The fused op.
      Stored fa = a, fb = b, fsum(t, NC, 9.f), fln(t, NC, 9.f);
      std::vector<float> frstd(N, 9.f);
      Stored& out = alias ? fa : fsum;
      ops->residual_rmsnorm_fwd(out.data(), fln.data(), frstd.data(), fa.data(), fb.data(), sw.data(), N, C,
                                eps);
      EXPECT_EQ(out.values(), sum.values());
      EXPECT_EQ(fln.values(), ln.values());
      EXPECT_EQ(frstd, rstd);
    }
  }
}

// --- gradients ---------------------------------------------------------------------------------------------

TEST_F(DecoderOps, RmsNormGradients) {
  const int N = 5, C = 24;
  const float eps = 1e-5f;
  // A non-zero mean and a non-unit weight, so every term of the gradient matters.
  std::vector<float> inp = randn(rng_, size_t(N) * C, 2.0f, 0.5f), w = randn(rng_, C, 0.3f, 1.0f);
  const std::vector<float> R = randn(rng_, inp.size());
  std::vector<float> out(inp.size()), rstd(N);
  const Loss loss = [&] {
    ops_->rmsnorm_fwd(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
    return dot(out, R);
  };
  loss();  // rstd for the backward
  std::vector<float> dinp(inp.size(), 0.f), dw(C, 0.f);
  ops_->rmsnorm_bwd(dinp.data(), dw.data(), R.data(), inp.data(), w.data(), rstd.data(), N, C);
  EXPECT_TRUE(gradient_matches(loss, inp, dinp, {.eps = 1e-2, .seed = 2}));
  EXPECT_TRUE(gradient_matches(loss, w, dw, {.eps = 1e-2, .seed = 3}));

  // dinp (the residual stream's gradient) and dw accumulate.
  const std::vector<float> pi = randn(rng_, dinp.size()), pw = randn(rng_, C);
  std::vector<float> ai = pi, aw = pw;
  ops_->rmsnorm_bwd(ai.data(), aw.data(), R.data(), inp.data(), w.data(), rstd.data(), N, C);
  for (size_t i = 0; i < ai.size(); ++i) ASSERT_NEAR(ai[i], pi[i] + dinp[i], 1e-5 * (1 + std::fabs(ai[i])));
  for (int c = 0; c < C; ++c) ASSERT_NEAR(aw[c], pw[c] + dw[c], 1e-5 * (1 + std::fabs(aw[c])));
}

TEST_F(DecoderOps, RopeGradient) {
  const AttentionShape s{2, 4, 4, 2, 8};
  const std::vector<float> inv_freq = inv_freq_for(s.HS, 10000.0);
  std::vector<float> qkv = randn(rng_, size_t(s.B) * s.T * s.qkv_width());
  const std::vector<float> R = randn(rng_, qkv.size());
  const Loss loss = [&] {
    std::vector<float> x = qkv;
    ops_->rope_fwd(x.data(), inv_freq.data(), s, 5);
    return dot(x, R);
  };
  std::vector<float> g = R;  // rope_bwd works in place on the output gradient
  ops_->rope_bwd(g.data(), inv_freq.data(), s, 5);
  EXPECT_TRUE(gradient_matches(loss, qkv, g, {.eps = 1e-2, .seed = 5}));
}

TEST_F(DecoderOps, SwigluGradient) {
  const int N = 3, I = 7;
  std::vector<float> inp = randn(rng_, size_t(N) * 2 * I, 2.0f);
  const std::vector<float> R = randn(rng_, size_t(N) * I);
  std::vector<float> out(R.size());
  const Loss loss = [&] {
    ops_->swiglu_fwd(out.data(), inp.data(), N, I);
    return dot(out, R);
  };
  std::vector<float> dinp(inp.size(), 1234.f);  // overwritten, not accumulated
  ops_->swiglu_bwd(dinp.data(), inp.data(), R.data(), N, I);
  EXPECT_TRUE(gradient_matches(loss, inp, dinp, {.eps = 1e-2, .seed = 7}));
}

// --- embedding without learned positions ------------------------------------------------------------------

TEST_F(DecoderOps, EmbeddingWithoutPositions) {
  for (const DType t : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(t));
    const auto ops = make_cpu_ops(*dev_, {t, DType::F32});
    const int B = 2, T = 5, C = 6, V = 7;
    const std::vector<int32_t> tokens = {3, 1, 3, 0, 6, 1, 1, 5, 3, 2};
    Stored wte(t, randn(rng_, size_t(V) * C));
    Stored out(t, size_t(B) * T * C, 99.f);
    ops->embedding_fwd(out.data(), tokens.data(), wte.data(), nullptr, B, T, C);
    const std::vector<float> o = out.values(), e = wte.values();
    for (int bt = 0; bt < B * T; ++bt)
      for (int c = 0; c < C; ++c) ASSERT_EQ(o[bt * C + c], e[tokens[bt] * C + c]);
    // dwte is the same with or without the position gradient.
    const Stored dout(t, randn(rng_, out.values().size()));
    Stored d1 = dout, d2 = dout;
    std::vector<float> dwte1(size_t(V) * C, 0.5f), dwte2 = dwte1, dwpe(size_t(T) * C, 0.f);
    ops->embedding_bwd(dwte1.data(), nullptr, d1.data(), tokens.data(), B, T, C);
    ops->embedding_bwd(dwte2.data(), dwpe.data(), d2.data(), tokens.data(), B, T, C);
    EXPECT_EQ(dwte1, dwte2);
  }
}

// --- 16-bit storage against fp32 math on the same (widened) values -----------------------------------------

struct Combo {
  DType act, grad;
};

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  return std::string(dtype_name(info.param.act)) + "_grad" + std::string(dtype_name(info.param.grad));
}

class DecoderOpsMixed : public ::testing::TestWithParam<Combo> {
 protected:
  DType A() const { return GetParam().act; }
  DType G() const { return GetParam().grad; }
  Stored input(DType t, size_t n, float stddev = 1.0f, float mean = 0.0f) {
    return Stored(t, randn(rng_, n, stddev, mean));
  }
  std::unique_ptr<Device> dev_ = make_cpu_device();
  std::unique_ptr<Ops> ops_ = make_cpu_ops(*dev_, {GetParam().act, GetParam().grad});
  std::unique_ptr<Ops> ref_ = make_cpu_ops(*dev_);
  Rng rng_{99};
};

TEST_P(DecoderOpsMixed, RmsNorm) {
  const int N = 9, C = 72;
  const float eps = 1e-6f;
  Stored inp = input(A(), size_t(N) * C, 2.0f, 0.5f), w = input(A(), C, 0.3f, 1.0f);
  const std::vector<float> x = inp.values(), wv = w.values();
  Stored out(A(), x.size(), 99.f);
  std::vector<float> rstd(N), ref_out(x.size()), ref_rstd(N);
  ops_->rmsnorm_fwd(out.data(), rstd.data(), inp.data(), w.data(), N, C, eps);
  ref_->rmsnorm_fwd(ref_out.data(), ref_rstd.data(), x.data(), wv.data(), N, C, eps);
  EXPECT_EQ(rstd, ref_rstd);  // fp32 statistics of the same values
  // The normalised row is rounded to the storage type before the weight (Hugging Face's order), then the
  // product once more: the fp32 run does neither.
  std::vector<float> expected(x.size());
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) expected[r * C + c] = round_to(A(), x[r * C + c] * rstd[r]) * wv[c];
  EXPECT_TRUE(rounded_from(out, expected));
  EXPECT_FALSE(rounded_from(out, ref_out)) << "the intermediate rounding shows somewhere";

  // dinp (compute type) and dw (gradient type) accumulate; dw multiplies dout by the rounded normalised row.
  Stored dout = input(A(), x.size()), dinp = input(A(), x.size()), dw = input(G(), C, 5.0f);
  const std::vector<float> dy = dout.values();
  std::vector<float> ref_dinp = dinp.values(), ref_dw_unused(C, 0.f);
  std::vector<double> sum_dw(C, 0.0);
  for (int r = 0; r < N; ++r)
    for (int c = 0; c < C; ++c) sum_dw[c] += double(dy[r * C + c]) * round_to(A(), x[r * C + c] * rstd[r]);
  std::vector<float> expected_dw = dw.values();
  for (int c = 0; c < C; ++c) expected_dw[c] = float(expected_dw[c] + sum_dw[c]);
  ops_->rmsnorm_bwd(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), N, C);
  ref_->rmsnorm_bwd(ref_dinp.data(), ref_dw_unused.data(), dy.data(), x.data(), wv.data(), rstd.data(), N, C);
  EXPECT_TRUE(rounded_from(dinp, ref_dinp));
  EXPECT_TRUE(rounded_from(dw, expected_dw, 1e-6 * max_abs(expected_dw)));  // fp32 sums vs fp64
}

TEST_P(DecoderOpsMixed, Rope) {
  const AttentionShape s{2, 6, 4, 2, 16};
  const std::vector<float> inv_freq = inv_freq_for(s.HS, 500000.0);
  Stored qkv = input(A(), size_t(s.B) * s.T * s.qkv_width());
  std::vector<float> ref = qkv.values();
  ops_->rope_fwd(qkv.data(), inv_freq.data(), s, 8000);
  ref_->rope_fwd(ref.data(), inv_freq.data(), s, 8000);
  EXPECT_TRUE(rounded_from(qkv, ref));
  ref = qkv.values();
  ops_->rope_bwd(qkv.data(), inv_freq.data(), s, 8000);
  ref_->rope_bwd(ref.data(), inv_freq.data(), s, 8000);
  EXPECT_TRUE(rounded_from(qkv, ref));
}

TEST_P(DecoderOpsMixed, Swiglu) {
  const int N = 5, I = 33;
  Stored inp = input(A(), size_t(N) * 2 * I, 3.0f);
  const std::vector<float> x = inp.values();
  Stored out(A(), size_t(N) * I, 99.f);
  std::vector<float> ref(size_t(N) * I);
  ops_->swiglu_fwd(out.data(), inp.data(), N, I);
  ref_->swiglu_fwd(ref.data(), x.data(), N, I);
  EXPECT_TRUE(rounded_from(out, ref));

  Stored dout = input(A(), size_t(N) * I), dinp(A(), x.size(), 99.f);
  std::vector<float> ref_dinp(x.size());
  ops_->swiglu_bwd(dinp.data(), inp.data(), dout.data(), N, I);
  ref_->swiglu_bwd(ref_dinp.data(), x.data(), dout.values().data(), N, I);
  EXPECT_TRUE(rounded_from(dinp, ref_dinp));
}

INSTANTIATE_TEST_SUITE_P(DecoderOpsMixed, DecoderOpsMixed,
                         ::testing::Values(Combo{DType::BF16, DType::F32}, Combo{DType::BF16, DType::BF16},
                                           Combo{DType::F16, DType::F32}, Combo{DType::F16, DType::F16}),
                         combo_name);

}  // namespace
}  // namespace anvil
