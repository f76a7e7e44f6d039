// The CPU reference of the ops BERT added (kernels/ops.hpp): finite-difference gradient checks of BERT's
// embedding, exact GELU, tanh, the first-token rows and the classification loss, their accumulate / overwrite
// and aliasing contracts, known values, LayerNorm's epsilon, and the 16-bit storage forms against fp32.
//
// Method as in gradcheck_ops_test.cpp: L = sum(out * R) for a fixed random R (the loss: L = sum(losses)),
// central differences in double of fp32 evaluations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "anvil/rng.hpp"
#include "core/half.hpp"
#include "gradcheck_util.hpp"
#include "kernels/ops.hpp"
#include "runtime/device.hpp"
#include "test_util.hpp"

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

class GradCheckBertOps : public ::testing::Test {
 protected:
  std::unique_ptr<Device> dev_ = make_cpu_device();
  std::unique_ptr<Ops> ops_ = make_cpu_ops(*dev_);
  Rng rng_{4242};
};

TEST_F(GradCheckBertOps, BertEmbedding) {
  const int B = 2, T = 5, C = 6, V = 7, maxT = 8, TV = 3, skip = 1;
  // Repeated tokens and types: their rows must sum the contributions of every position. Token 1 (the
  // skipped "pad" token) occurs too, so its finite difference is nonzero while its gradient must be 0.
  const std::vector<int32_t> tokens = {3, 1, 3, 0, 6, 1, 2, 5, 3, 2};
  const std::vector<int32_t> types = {0, 0, 2, 2, 2, 1, 1, 0, 0, 2};
  std::vector<float> wte = randn(rng_, size_t(V) * C), wpe = randn(rng_, size_t(maxT) * C),
                     wtt = randn(rng_, size_t(TV) * C);
  const std::vector<float> R = randn(rng_, size_t(B) * T * C);
  std::vector<float> out(R.size());
  const Loss loss = [&] {
    ops_->bert_embedding_fwd(out.data(), tokens.data(), types.data(), wte.data(), wpe.data(), wtt.data(), B,
                             T, C);
    return dot(out, R);
  };
  loss();
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c)
      ASSERT_FLOAT_EQ(out[bt * C + c],
                      wte[tokens[bt] * C + c] + wtt[types[bt] * C + c] + wpe[(bt % T) * C + c]);
  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f), dwtt(wtt.size(), 0.0f);
  ops_->bert_embedding_bwd(dwte.data(), dwpe.data(), dwtt.data(), R.data(), tokens.data(), types.data(), B, T,
                           C, -1);
  EXPECT_TRUE(gradient_matches(loss, wte, dwte, {.eps = 1e-2}));
  EXPECT_TRUE(gradient_matches(loss, wpe, dwpe, {.eps = 1e-2, .seed = 2}));
  EXPECT_TRUE(gradient_matches(loss, wtt, dwtt, {.eps = 1e-2, .seed = 3}));
  for (int c = 0; c < C; ++c) EXPECT_EQ(dwte[4 * C + c], 0.0f);  // token 4 never occurs

  // skip_token: exactly the skipped token's row differs (it gets nothing); the gradients accumulate.
  std::vector<float> sk_te(wte.size(), 0.5f), sk_pe(wpe.size(), 0.5f), sk_tt(wtt.size(), 0.5f);
  ops_->bert_embedding_bwd(sk_te.data(), sk_pe.data(), sk_tt.data(), R.data(), tokens.data(), types.data(), B,
                           T, C, skip);
  for (size_t i = 0; i < wte.size(); ++i)
    ASSERT_NEAR(sk_te[i], int(i) / C == skip ? 0.5f : 0.5f + dwte[i], 1e-5) << i;
  for (size_t i = 0; i < wpe.size(); ++i) ASSERT_NEAR(sk_pe[i], 0.5f + dwpe[i], 1e-5) << i;
  for (size_t i = 0; i < wtt.size(); ++i) ASSERT_NEAR(sk_tt[i], 0.5f + dwtt[i], 1e-5) << i;

  // Null types: every position adds row 0, and row 0 alone receives the sum of all rows.
  std::vector<float> zero_types_out(out.size()), null_types_out(out.size());
  const std::vector<int32_t> zeros(tokens.size(), 0);
  ops_->bert_embedding_fwd(zero_types_out.data(), tokens.data(), zeros.data(), wte.data(), wpe.data(),
                           wtt.data(), B, T, C);
  ops_->bert_embedding_fwd(null_types_out.data(), tokens.data(), nullptr, wte.data(), wpe.data(), wtt.data(),
                           B, T, C);
  EXPECT_EQ(null_types_out, zero_types_out);
  std::vector<float> n_te(wte.size(), 0.0f), n_pe(wpe.size(), 0.0f), n_tt(wtt.size(), 0.0f);
  ops_->bert_embedding_bwd(n_te.data(), n_pe.data(), n_tt.data(), R.data(), tokens.data(), nullptr, B, T, C,
                           -1);
  for (int c = 0; c < C; ++c) {
    double s = 0;
    for (int bt = 0; bt < B * T; ++bt) s += R[bt * C + c];
    EXPECT_NEAR(n_tt[c], s, 1e-5);
    for (int ty = 1; ty < TV; ++ty) EXPECT_EQ(n_tt[ty * C + c], 0.0f);
  }
}

TEST_F(GradCheckBertOps, GeluErf) {
  // Known values of x * Phi(x).
  const std::vector<float> x0 = {-3.0f, -1.0f, 0.0f, 0.5f, 1.0f, 2.0f};
  const std::vector<double> want = {-0.004049694, -0.158655254, 0.0, 0.345731081, 0.841344746, 1.954499736};
  std::vector<float> y0(x0.size());
  ops_->gelu_erf_fwd(y0.data(), x0.data(), x0.size());
  for (size_t i = 0; i < x0.size(); ++i) EXPECT_NEAR(y0[i], want[i], 1e-6) << x0[i];

  const size_t n = 200;
  std::vector<float> x = randn(rng_, n, 2.0f);
  const std::vector<float> R = randn(rng_, n);
  std::vector<float> y(n);
  const Loss loss = [&] {
    ops_->gelu_erf_fwd(y.data(), x.data(), n);
    return dot(y, R);
  };
  std::vector<float> dx(n);
  ops_->gelu_erf_bwd(dx.data(), x.data(), R.data(), n);
  EXPECT_TRUE(gradient_matches(loss, x, dx, {.eps = 1e-2, .directions = 4, .coordinates = 10}));
  // dinp may alias dout; and it is not the tanh approximation (which differs by ~1e-3 near |x| = 2).
  std::vector<float> inplace = R;
  ops_->gelu_erf_bwd(inplace.data(), x.data(), inplace.data(), n);
  EXPECT_EQ(inplace, dx);
  std::vector<float> tanh_gelu(n);
  ops_->gelu_fwd(tanh_gelu.data(), x.data(), n);
  loss();
  double max_diff = 0;
  for (size_t i = 0; i < n; ++i) max_diff = std::max(max_diff, double(std::fabs(tanh_gelu[i] - y[i])));
  EXPECT_GT(max_diff, 1e-4);
}

TEST_F(GradCheckBertOps, Tanh) {
  const size_t n = 150;
  std::vector<float> x = randn(rng_, n, 1.5f);
  const std::vector<float> R = randn(rng_, n);
  std::vector<float> y(n);
  const Loss loss = [&] {
    ops_->tanh_fwd(y.data(), x.data(), n);
    return dot(y, R);
  };
  loss();
  for (size_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(y[i], std::tanh(x[i]));
  std::vector<float> dx(n);
  ops_->tanh_bwd(dx.data(), y.data(), R.data(), n);  // from the output
  EXPECT_TRUE(gradient_matches(loss, x, dx, {.eps = 1e-2, .directions = 4, .coordinates = 10}));
  loss();  // y of the unperturbed x again
  // In place, both directions.
  std::vector<float> in_place = x;
  ops_->tanh_fwd(in_place.data(), in_place.data(), n);
  EXPECT_EQ(in_place, y);
  std::vector<float> d_in_place = R;
  ops_->tanh_bwd(d_in_place.data(), y.data(), d_in_place.data(), n);
  EXPECT_EQ(d_in_place, dx);
}

TEST_F(GradCheckBertOps, FirstToken) {
  const int B = 3, T = 4, C = 5;
  const std::vector<float> x = randn(rng_, size_t(B) * T * C);
  std::vector<float> y(size_t(B) * C, 7.0f);
  ops_->first_token_fwd(y.data(), x.data(), B, T, C);
  for (int b = 0; b < B; ++b)
    for (int c = 0; c < C; ++c) EXPECT_EQ(y[b * C + c], x[(b * T) * C + c]);
  // The backward is the forward's transpose, and overwrites every element (stale values must not survive).
  const std::vector<float> R = randn(rng_, y.size());
  std::vector<float> dx(x.size(), 9.0f);
  ops_->first_token_bwd(dx.data(), R.data(), B, T, C);
  EXPECT_NEAR(dot(y, R), dot(x, dx), 1e-5);
  for (int bt = 0; bt < B * T; ++bt)
    for (int c = 0; c < C; ++c) EXPECT_EQ(dx[bt * C + c], bt % T == 0 ? R[(bt / T) * C + c] : 0.0f);
}

TEST_F(GradCheckBertOps, ClassificationCrossEntropy) {
  const int N = 6, NL = 4;
  std::vector<float> logits = randn(rng_, size_t(N) * NL, 2.0f);
  const std::vector<int32_t> labels = {3, 0, kIgnoreIndex, 1, 2, 3};
  std::vector<float> losses(N);
  const float scale = 0.7f;
  const Loss loss = [&] {
    ops_->classification_loss(losses.data(), nullptr, logits.data(), labels.data(), N, NL, 1.0f);
    double s = 0;
    for (float l : losses) s += l;
    return scale * s;
  };
  std::vector<float> dlogits(logits.size(), 5.0f);  // overwritten, ignored rows included
  ops_->classification_loss(losses.data(), dlogits.data(), logits.data(), labels.data(), N, NL, scale);
  EXPECT_TRUE(gradient_matches(loss, logits, dlogits, {.eps = 1e-2, .directions = 4, .coordinates = 8}));
  EXPECT_EQ(losses[2], 0.0f);
  for (int j = 0; j < NL; ++j) EXPECT_EQ(dlogits[2 * NL + j], 0.0f);
  for (int r = 0; r < N; ++r) {
    if (labels[r] == kIgnoreIndex) continue;
    double s = 0;
    for (int j = 0; j < NL; ++j) s += std::exp(double(logits[r * NL + j]));
    EXPECT_NEAR(losses[r], std::log(s) - logits[r * NL + labels[r]], 1e-5) << r;
  }
  // A label outside [0, NL) is named.
  const std::vector<int32_t> bad = {0, 4, 1, 1, 1, 1};
  test::expect_error(
      [&] { ops_->classification_loss(losses.data(), nullptr, logits.data(), bad.data(), N, NL, 1.0f); },
      {"label 4", "sequence 1"});
}

TEST_F(GradCheckBertOps, ClassificationRegression) {
  const int N = 5;
  std::vector<float> logits = randn(rng_, N);
  const std::vector<float> labels = randn(rng_, N);
  std::vector<float> losses(N);
  const Loss loss = [&] {
    ops_->classification_loss(losses.data(), nullptr, logits.data(), labels.data(), N, 1, 1.0f);
    double s = 0;
    for (float l : losses) s += l;
    return s / N;
  };
  std::vector<float> dlogits(N);
  ops_->classification_loss(losses.data(), dlogits.data(), logits.data(), labels.data(), N, 1, 1.0f / N);
  for (int i = 0; i < N; ++i) {
    const double d = double(logits[i]) - labels[i];
    EXPECT_NEAR(losses[i], d * d, 1e-6 * (1 + d * d));
    EXPECT_NEAR(dlogits[i], 2 * d / N, 1e-6);
  }
  EXPECT_TRUE(gradient_matches(loss, logits, dlogits, {.eps = 1e-2, .directions = 4, .coordinates = 5}));
}

// LayerNorm's epsilon is the caller's: BERT's 1e-12 differs from GPT-2's 1e-5 in rstd, and the form without
// epsilon is exactly kLayerNormEps.
TEST_F(GradCheckBertOps, LayerNormEpsilon) {
  const int N = 3, C = 8;
  std::vector<float> x = randn(rng_, size_t(N) * C, 0.01f);
  std::fill_n(x.begin(), C, 0.25f);  // a constant row: variance 0, rstd = 1 / sqrt(eps)
  const std::vector<float> w(C, 1.0f), b(C, 0.0f);
  std::vector<float> out(x.size()), mean(N), rstd(N), out5(x.size()), mean5(N), rstd5(N);
  ops_->layernorm_fwd(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-12f);
  ops_->layernorm_fwd(out5.data(), mean5.data(), rstd5.data(), x.data(), w.data(), b.data(), N, C);
  EXPECT_NEAR(rstd[0], 1e6, 1.0);
  EXPECT_NEAR(rstd5[0], 1.0 / std::sqrt(1e-5), 1e-2);
  for (int r = 1; r < N; ++r) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[r * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[r * C + c] - m) * (x[r * C + c] - m);
    v /= C;
    EXPECT_NEAR(rstd[r], 1.0 / std::sqrt(v + 1e-12), 1e-5 * rstd[r]) << r;
    EXPECT_NEAR(rstd5[r], 1.0 / std::sqrt(v + 1e-5), 1e-5 * rstd5[r]) << r;
  }
  std::vector<float> out5b(x.size()), mean5b(N), rstd5b(N);
  ops_->layernorm_fwd(out5b.data(), mean5b.data(), rstd5b.data(), x.data(), w.data(), b.data(), N, C,
                      kLayerNormEps);
  EXPECT_EQ(out5b, out5);
}

// 16-bit storage: the elementwise ops and the loss do fp32 math on the widened inputs and round once, so the
// 16-bit result is the fp32 result of the same (rounded) inputs, rounded to nearest.
TEST_F(GradCheckBertOps, SixteenBitStorageRoundsTheFp32Result) {
  for (const DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const bool bf16 = t == DType::BF16;
    auto narrow = [&](float f) { return bf16 ? float_to_bf16(f) : float_to_fp16(f); };
    auto widen = [&](uint16_t h) { return bf16 ? bf16_to_float(h) : fp16_to_float(h); };
    std::unique_ptr<Ops> ops16 = make_cpu_ops(*dev_, {t, DType::F32});
    const size_t n = 300;
    std::vector<uint16_t> x16(n), d16(n);
    std::vector<float> x(n), d(n);
    for (size_t i = 0; i < n; ++i) {
      x16[i] = narrow(2.0f * rng_.normal()), x[i] = widen(x16[i]);
      d16[i] = narrow(rng_.normal()), d[i] = widen(d16[i]);
    }
    auto check = [&](const char* what, const std::vector<uint16_t>& got, const std::vector<float>& ref) {
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], narrow(ref[i])) << what << " at " << i;
    };
    std::vector<uint16_t> y16(n);
    std::vector<float> y(n);
    ops16->gelu_erf_fwd(y16.data(), x16.data(), n);
    ops_->gelu_erf_fwd(y.data(), x.data(), n);
    check("gelu_erf_fwd", y16, y);
    ops16->gelu_erf_bwd(y16.data(), x16.data(), d16.data(), n);
    ops_->gelu_erf_bwd(y.data(), x.data(), d.data(), n);
    check("gelu_erf_bwd", y16, y);
    ops16->tanh_fwd(y16.data(), x16.data(), n);
    ops_->tanh_fwd(y.data(), x.data(), n);
    check("tanh_fwd", y16, y);
    std::vector<float> yr(n);
    for (size_t i = 0; i < n; ++i) yr[i] = widen(y16[i]);  // the backward reads the stored output
    std::vector<uint16_t> dx16(n);
    std::vector<float> dx(n);
    ops16->tanh_bwd(dx16.data(), y16.data(), d16.data(), n);
    ops_->tanh_bwd(dx.data(), yr.data(), d.data(), n);
    check("tanh_bwd", dx16, dx);
    // Cross-entropy: fp32 losses equal, 16-bit gradients rounded once.
    const int N = 10, NL = 30;
    std::vector<int32_t> labels(N);
    for (int i = 0; i < N; ++i) labels[i] = i == 4 ? kIgnoreIndex : int32_t(rng_.below(NL));
    std::vector<float> l16(N), l32(N), g32(size_t(N) * NL);
    std::vector<uint16_t> g16(g32.size());
    const std::span<const uint16_t> z16(x16.data(), g32.size());
    const std::span<const float> z(x.data(), g32.size());
    ops16->classification_loss(l16.data(), g16.data(), z16.data(), labels.data(), N, NL, 0.5f);
    ops_->classification_loss(l32.data(), g32.data(), z.data(), labels.data(), N, NL, 0.5f);
    EXPECT_EQ(l16, l32);
    for (size_t i = 0; i < g32.size(); ++i) ASSERT_EQ(g16[i], narrow(g32[i])) << "classification grad " << i;
  }
}

}  // namespace
}  // namespace anvil
