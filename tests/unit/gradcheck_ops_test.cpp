// Finite-difference gradient checks of every CPU op that has a backward (the reference the CUDA
// backend is compared against, so its gradients must be right on their own terms).
//
// Method: L = sum(out * R) for a fixed random R (the loss op: L = grad_scale * sum(losses)). The analytic
// gradient of L comes from the backward op; the numeric one from central differences of L, evaluated
// in fp32 and differenced in double. Most probes are directional derivatives along random unit
// directions (each one mixes every element of the gradient), plus a few single coordinates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "anvil/rng.hpp"
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

std::vector<float> scaled(std::span<const float> g, float s) {
  std::vector<float> out(g.begin(), g.end());
  for (float& v : out) v *= s;
  return out;
}

std::vector<float> plus(std::span<const float> a, std::span<const float> b) {
  std::vector<float> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

void expect_near_all(std::span<const float> actual, std::span<const float> expected, double tol,
                     const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i)
    ASSERT_NEAR(actual[i], expected[i], tol * (1 + std::abs(expected[i]))) << what << " at " << i;
}

class GradCheckOps : public ::testing::Test {
 protected:
  std::unique_ptr<Device> dev_ = make_cpu_device();
  std::unique_ptr<Ops> ops_ = make_cpu_ops(*dev_);
  Rng rng_{12345};
};

TEST_F(GradCheckOps, Embedding) {
  const int B = 2, T = 5, C = 6, V = 7, maxT = 8;
  // Repeated tokens: their rows of dwte must sum the contributions of every position.
  const std::vector<int32_t> tokens = {3, 1, 3, 0, 6, 1, 1, 5, 3, 2};
  std::vector<float> wte = randn(rng_, size_t(V) * C), wpe = randn(rng_, size_t(maxT) * C);
  const std::vector<float> R = randn(rng_, size_t(B) * T * C);
  std::vector<float> out(R.size());
  const Loss loss = [&] {
    ops_->embedding_fwd(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return dot(out, R);
  };
  std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
  ops_->embedding_bwd(dwte.data(), dwpe.data(), R.data(), tokens.data(), B, T, C);
  EXPECT_TRUE(gradient_matches(loss, wte, dwte, {.eps = 1e-2}));
  EXPECT_TRUE(gradient_matches(loss, wpe, dwpe, {.eps = 1e-2}));
  // Token 4 never occurs and positions >= T are never used: their gradients are exactly zero.
  for (int c = 0; c < C; ++c) EXPECT_EQ(dwte[4 * C + c], 0.0f);
  for (int t = T; t < maxT; ++t)
    for (int c = 0; c < C; ++c) EXPECT_EQ(dwpe[t * C + c], 0.0f);

  // Both gradients accumulate into what the buffers held.
  const std::vector<float> pte = randn(rng_, dwte.size()), ppe = randn(rng_, dwpe.size());
  std::vector<float> acc_te = pte, acc_pe = ppe;
  ops_->embedding_bwd(acc_te.data(), acc_pe.data(), R.data(), tokens.data(), B, T, C);
  expect_near_all(acc_te, plus(pte, dwte), 1e-6, "dwte");
  expect_near_all(acc_pe, plus(ppe, dwpe), 1e-6, "dwpe");
}

// The padding_idx form: embedding_bwd's token-embedding gradient with the pad token's row left alone.
TEST_F(GradCheckOps, EmbeddingBwdSkip) {
  const int B = 2, T = 5, C = 6, V = 7;
  const std::vector<int32_t> tokens = {3, 1, 3, 0, 6, 1, 1, 5, 3, 2};
  const std::vector<float> R = randn(rng_, size_t(B) * T * C);
  const std::vector<float> start = randn(rng_, size_t(V) * C);
  std::vector<float> all = start, skipped = start, dwpe(size_t(T) * C);
  ops_->embedding_bwd(all.data(), dwpe.data(), R.data(), tokens.data(), B, T, C);
  ops_->embedding_bwd_skip(skipped.data(), R.data(), tokens.data(), B, T, C, 3);
  for (int v = 0; v < V; ++v)
    for (int c = 0; c < C; ++c)
      EXPECT_EQ(skipped[v * C + c], v == 3 ? start[v * C + c] : all[v * C + c]) << v << "," << c;
}

TEST_F(GradCheckOps, LayerNorm) {
  const int N = 5, C = 24;
  // A non-zero mean and a non-unit scale, so the mean and variance terms of the gradient matter.
  std::vector<float> inp = randn(rng_, size_t(N) * C, 2.0f, 0.5f);
  std::vector<float> w = randn(rng_, C, 0.3f, 1.0f), b = randn(rng_, C, 0.3f);
  const std::vector<float> R = randn(rng_, inp.size());
  std::vector<float> out(inp.size()), mean(N), rstd(N);
  const Loss loss = [&] {
    ops_->layernorm_fwd(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    return dot(out, R);
  };
  loss();  // fills mean/rstd for the backward
  std::vector<float> dinp(inp.size(), 0.0f), dw(C, 0.0f), db(C, 0.0f);
  ops_->layernorm_bwd(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), mean.data(),
                      rstd.data(), N, C);
  EXPECT_TRUE(gradient_matches(loss, inp, dinp, {.eps = 1e-2, .seed = 2}));
  EXPECT_TRUE(gradient_matches(loss, w, dw, {.eps = 1e-2, .seed = 3}));
  EXPECT_TRUE(gradient_matches(loss, b, db, {.eps = 1e-2, .seed = 4}));

  // dinp (the residual stream's gradient), dw and db all accumulate.
  const std::vector<float> pi = randn(rng_, dinp.size()), pw = randn(rng_, C), pb = randn(rng_, C);
  std::vector<float> ai = pi, aw = pw, ab = pb;
  ops_->layernorm_bwd(ai.data(), aw.data(), ab.data(), R.data(), inp.data(), w.data(), mean.data(),
                      rstd.data(), N, C);
  expect_near_all(ai, plus(pi, dinp), 1e-5, "dinp");
  expect_near_all(aw, plus(pw, dw), 1e-5, "dw");
  expect_near_all(ab, plus(pb, db), 1e-5, "db");
}

TEST_F(GradCheckOps, Matmul) {
  const int N = 6, K = 10, OC = 7;
  std::vector<float> inp = randn(rng_, size_t(N) * K), w = randn(rng_, size_t(OC) * K),
                     bias = randn(rng_, OC);
  const std::vector<float> R = randn(rng_, size_t(N) * OC);
  std::vector<float> out(R.size());
  const Loss loss = [&] {
    ops_->matmul_fwd(out.data(), inp.data(), w.data(), bias.data(), N, K, OC);
    return dot(out, R);
  };
  // dinp is overwritten: stale contents must not leak into it.
  std::vector<float> dinp(inp.size(), 123.0f), dw(w.size(), 0.0f), db(OC, 0.0f);
  ops_->matmul_bwd(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), N, K, OC);
  EXPECT_TRUE(gradient_matches(loss, inp, dinp, {.eps = 1e-2, .seed = 5}));
  EXPECT_TRUE(gradient_matches(loss, w, dw, {.eps = 1e-2, .seed = 6}));
  EXPECT_TRUE(gradient_matches(loss, bias, db, {.eps = 1e-2, .seed = 7}));

  // dw and dbias accumulate; dinp is overwritten (same result whatever it held).
  const std::vector<float> pw = randn(rng_, dw.size()), pb = randn(rng_, OC);
  std::vector<float> ai = randn(rng_, dinp.size()), aw = pw, ab = pb;
  ops_->matmul_bwd(ai.data(), aw.data(), ab.data(), R.data(), inp.data(), w.data(), N, K, OC);
  expect_near_all(ai, dinp, 1e-6, "dinp");
  expect_near_all(aw, plus(pw, dw), 1e-5, "dw");
  expect_near_all(ab, plus(pb, db), 1e-5, "dbias");

  // Null dinp and null dbias are skipped; dw is still right. Without bias, the forward adds nothing.
  std::vector<float> dw2(w.size(), 0.0f);
  ops_->matmul_bwd(nullptr, dw2.data(), nullptr, R.data(), inp.data(), w.data(), N, K, OC);
  expect_near_all(dw2, dw, 1e-6, "dw without dinp/dbias");
  // GradWrite::Overwrite: dw is written, whatever it held (NaN here); dbias still accumulates.
  std::vector<float> dw3(w.size(), std::nanf("")), db3 = pb;
  ops_->matmul_bwd(nullptr, dw3.data(), db3.data(), R.data(), inp.data(), w.data(), N, K, OC,
                   GradWrite::Overwrite);
  expect_near_all(dw3, dw, 1e-6, "overwritten dw");
  expect_near_all(db3, plus(pb, db), 1e-5, "dbias beside an overwritten dw");
  std::vector<float> nobias(out.size());
  ops_->matmul_fwd(nobias.data(), inp.data(), w.data(), nullptr, N, K, OC);
  ops_->matmul_fwd(out.data(), inp.data(), w.data(), bias.data(), N, K, OC);
  for (int r = 0; r < N; ++r)
    for (int o = 0; o < OC; ++o) EXPECT_NEAR(out[r * OC + o] - nobias[r * OC + o], bias[o], 1e-5);
}

// The fused MLP ops are, on the CPU, exactly the unfused sequence (the CUDA epilogues are checked against
// them by the parity suite).
TEST_F(GradCheckOps, MatmulGeluFusedEqualsUnfused) {
  const int N = 6, K = 5, OC = 7;
  const std::vector<float> inp = randn(rng_, size_t(N) * K), w = randn(rng_, size_t(OC) * K),
                           bias = randn(rng_, size_t(OC));
  std::vector<float> out(size_t(N) * OC), pre(out.size()), ref_pre(out.size()), ref_out(out.size());
  ops_->matmul_gelu_fwd(out.data(), pre.data(), inp.data(), w.data(), bias.data(), N, K, OC);
  ops_->matmul_fwd(ref_pre.data(), inp.data(), w.data(), bias.data(), N, K, OC);
  ops_->gelu_fwd(ref_out.data(), ref_pre.data(), ref_out.size());
  EXPECT_EQ(pre, ref_pre);
  EXPECT_EQ(out, ref_out);
  // y = out @ w2^T: its backward with GELU's derivative applied to dinp.
  const std::vector<float> w2 = randn(rng_, size_t(K) * OC), dout = randn(rng_, size_t(N) * K);
  std::vector<float> dinp(out.size()), dw(w2.size(), 0.5f), db(size_t(K), 0.25f);
  std::vector<float> ref_dinp(out.size()), ref_dw = dw, ref_db = db;
  ops_->matmul_bwd_dgelu(dinp.data(), dw.data(), db.data(), dout.data(), out.data(), w2.data(), pre.data(), N,
                         OC, K);
  ops_->matmul_bwd(ref_dinp.data(), ref_dw.data(), ref_db.data(), dout.data(), out.data(), w2.data(), N, OC,
                   K);
  ops_->gelu_bwd(ref_dinp.data(), pre.data(), ref_dinp.data(), ref_dinp.size());
  EXPECT_EQ(dinp, ref_dinp);
  EXPECT_EQ(dw, ref_dw);
  EXPECT_EQ(db, ref_db);
}

// Attention in double from its definition: explicit scores, mask, softmax, probabilities times v.
void naive_attention(const std::vector<float>& qkv, int B, int T, int C, int NH, const AttentionMask& mask,
                     std::vector<double>& out, std::vector<double>& lse) {
  const int HS = C / NH;
  out.assign(size_t(B) * T * C, 0.0);
  lse.assign(size_t(B) * NH * T, 0.0);
  auto at = [&](int b, int t, int part, int h, int i) {
    return qkv[(size_t(b) * T + t) * 3 * C + part * C + h * HS + i];
  };
  for (int b = 0; b < B; ++b) {
    const int len = mask.lengths ? mask.lengths[b] : T;
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < len; ++t) {
        std::vector<double> s;
        for (int t2 = 0; t2 < len && (!mask.causal || t2 <= t); ++t2) {
          double d = 0;
          for (int i = 0; i < HS; ++i) d += double(at(b, t, 0, h, i)) * at(b, t2, 1, h, i);
          s.push_back(d / std::sqrt(double(HS)));
        }
        double mx = *std::max_element(s.begin(), s.end()), sum = 0;
        for (double x : s) sum += std::exp(x - mx);
        lse[(size_t(b) * NH + h) * T + t] = mx + std::log(sum);
        for (size_t t2 = 0; t2 < s.size(); ++t2)
          for (int i = 0; i < HS; ++i)
            out[(size_t(b) * T + t) * C + h * HS + i] += std::exp(s[t2] - mx) / sum * at(b, int(t2), 2, h, i);
      }
  }
}

TEST_F(GradCheckOps, Attention) {
  const int B = 2, T = 5, C = 8, NH = 2;
  const int32_t lengths[B] = {5, 3};
  struct Case {
    const char* name;
    AttentionMask mask;
  };
  for (const Case& c :
       {Case{"causal", {true, nullptr}}, Case{"bidirectional", {false, nullptr}},
        Case{"bidirectional + padding", {false, lengths}}, Case{"causal + padding", {true, lengths}}}) {
    SCOPED_TRACE(c.name);
    // Unit-variance q and k give q.k/sqrt(HS) of order 1: the softmax is far from uniform.
    std::vector<float> qkv = randn(rng_, size_t(B) * T * 3 * C);
    const std::vector<float> R = randn(rng_, size_t(B) * T * C);
    std::vector<float> out(R.size(), 9.0f), lse(size_t(B) * NH * T, 9.0f);
    std::vector<float> scratch(
        std::max<size_t>(1, ops_->attention_scratch_bytes(B, T, C, NH) / sizeof(float)));
    const Loss loss = [&] {
      ops_->attention_fwd(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH, c.mask);
      return dot(out, R);
    };
    loss();  // fills out and lse for the backward
    // The forward against the definition (padding rows are zero in both).
    std::vector<double> ref_out, ref_lse;
    naive_attention(qkv, B, T, C, NH, c.mask, ref_out, ref_lse);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], ref_out[i], 1e-5) << "out " << i;
    for (size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(lse[i], ref_lse[i], 1e-5) << "lse " << i;

    std::vector<float> dqkv(qkv.size(), 123.0f);  // overwritten
    ops_->attention_bwd(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, C,
                        NH, c.mask);
    EXPECT_TRUE(
        gradient_matches(loss, qkv, dqkv, {.eps = 1e-2, .directions = 6, .coordinates = 10, .seed = 8}));
    if (c.mask.lengths) {  // padding tokens get no gradient
      for (int t = lengths[1]; t < T; ++t)
        for (int j = 0; j < 3 * C; ++j) EXPECT_EQ(dqkv[(size_t(1) * T + t) * 3 * C + j], 0.0f) << t;
    }

    if (c.mask.causal && !c.mask.lengths) {
      // Causality: output 0 depends on q, k, v at position 0 only, so with dout nonzero only at t = 0
      // every later row of dqkv is exactly zero.
      loss();  // out and lse of the unperturbed qkv again
      std::vector<float> d0(R.size(), 0.0f);
      for (int b = 0; b < B; ++b)
        for (int j = 0; j < C; ++j) d0[size_t(b) * T * C + j] = R[size_t(b) * T * C + j];
      ops_->attention_bwd(dqkv.data(), d0.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, C,
                          NH, c.mask);
      for (int b = 0; b < B; ++b)
        for (int t = 1; t < T; ++t)
          for (int j = 0; j < 3 * C; ++j)
            EXPECT_EQ(dqkv[(size_t(b) * T + t) * 3 * C + j], 0.0f) << b << "," << t;
    }
  }
}

// Attention of the first query only (BERT's [CLS]-rows block): exactly row (b, 0) of the whole attention's
// output and lse, and, for an output gradient at those rows only, exactly the whole backward's q gradient
// at t = 0 and its k, v gradients, with dropout and padding (one sequence empty) too; and its own gradients
// by finite differences.
TEST_F(GradCheckOps, AttentionFirstQuery) {
  const int B = 3, T = 5, C = 8, NH = 2;
  const int32_t lengths[B] = {5, 3, 0};
  DropoutState state{0x5eedull, 3, 0};
  for (int variant = 0; variant < 6; ++variant) {
    AttentionMask mask{variant % 2 == 1, variant / 2 % 2 == 1 ? lengths : nullptr};
    if (variant >= 4) mask.dropout = 0.3f, mask.dropout_state = &state, mask.dropout_site = 7;
    SCOPED_TRACE(variant);
    const std::vector<float> qkv = randn(rng_, size_t(B) * T * 3 * C);
    std::vector<float> q(size_t(B) * C), kv(size_t(B) * T * 2 * C);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < 3 * C; ++j) {
          const float x = qkv[(size_t(b) * T + t) * 3 * C + j];
          if (j >= C)
            kv[(size_t(b) * T + t) * 2 * C + j - C] = x;
          else if (t == 0)
            q[size_t(b) * C + j] = x;
        }
    std::vector<float> out(size_t(B) * T * C), lse(size_t(B) * NH * T);
    std::vector<float> scratch(
        std::max<size_t>(1, ops_->attention_scratch_bytes(B, T, C, NH) / sizeof(float)));
    ops_->attention_fwd(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH, mask);
    std::vector<float> out1(size_t(B) * C, 9.0f), lse1(size_t(B) * NH, 9.0f);
    ops_->attention_first_query_fwd(out1.data(), lse1.data(), q.data(), kv.data(), B, T, C, NH, mask);
    for (int b = 0; b < B; ++b) {
      for (int j = 0; j < C; ++j)
        EXPECT_EQ(out1[size_t(b) * C + j], out[size_t(b) * T * C + j]) << b << "," << j;
      for (int h = 0; h < NH; ++h) EXPECT_EQ(lse1[size_t(b) * NH + h], lse[(size_t(b) * NH + h) * T]) << b;
    }
    // Backward: the output gradient at rows (b, 0) only.
    const std::vector<float> R = randn(rng_, size_t(B) * C);
    std::vector<float> dout(out.size(), 0.0f);
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < C; ++j) dout[size_t(b) * T * C + j] = R[size_t(b) * C + j];
    std::vector<float> dqkv(qkv.size());
    ops_->attention_bwd(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, C,
                        NH, mask);
    std::vector<float> dq(q.size(), 123.0f), dkv(kv.size(), 123.0f);  // overwritten
    ops_->attention_first_query_bwd(dq.data(), dkv.data(), R.data(), q.data(), kv.data(), out1.data(),
                                    lse1.data(), B, T, C, NH, mask);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < 3 * C; ++j) {
          const float want = dqkv[(size_t(b) * T + t) * 3 * C + j];
          if (j >= C) {
            EXPECT_FLOAT_EQ(dkv[(size_t(b) * T + t) * 2 * C + j - C], want) << b << "," << t << "," << j;
          } else if (t == 0) {
            EXPECT_FLOAT_EQ(dq[size_t(b) * C + j], want) << b << "," << j;
          }
        }
    // Its own gradients, by finite differences of L = out1 . R over q and kv (bidirectional: a causal first
    // query sees one key, so its q gradient is 0 up to rounding, which a relative check cannot judge).
    if (mask.causal) continue;
    const Loss loss = [&] {
      ops_->attention_first_query_fwd(out1.data(), lse1.data(), q.data(), kv.data(), B, T, C, NH, mask);
      return dot(out1, R);
    };
    EXPECT_TRUE(gradient_matches(loss, q, dq, {.eps = 1e-2, .directions = 4, .coordinates = 6, .seed = 21}));
    EXPECT_TRUE(
        gradient_matches(loss, kv, dkv, {.eps = 1e-2, .directions = 4, .coordinates = 6, .seed = 22}));
  }
}

TEST_F(GradCheckOps, Gelu) {
  const size_t n = 64;
  // Spread over [-6, 6]: both tails and the curved middle.
  std::vector<float> inp = randn(rng_, n, 2.0f);
  const std::vector<float> R = randn(rng_, n);
  std::vector<float> out(n);
  const Loss loss = [&] {
    ops_->gelu_fwd(out.data(), inp.data(), n);
    return dot(out, R);
  };
  std::vector<float> dinp(n, 123.0f);
  ops_->gelu_bwd(dinp.data(), inp.data(), R.data(), n);
  EXPECT_TRUE(gradient_matches(loss, inp, dinp, {.eps = 1e-3, .coordinates = 10, .seed = 9}));
  // In place (dinp aliasing dout), as the model uses it.
  std::vector<float> inplace = R;
  ops_->gelu_bwd(inplace.data(), inp.data(), inplace.data(), n);
  EXPECT_EQ(inplace, dinp);
}

TEST_F(GradCheckOps, SoftmaxCrossEntropy) {
  const int N = 6, V = 11, Vp = 16;
  const float grad_scale = 0.37f;
  const std::vector<int32_t> targets = {4, kIgnoreIndex, 0, 10, kIgnoreIndex, 7};
  std::vector<float> logits = randn(rng_, size_t(N) * Vp, 2.0f);
  // Padded columns hold large junk: it must neither enter the loss nor receive gradient.
  for (int r = 0; r < N; ++r)
    for (int j = V; j < Vp; ++j) logits[r * Vp + j] = 50.0f + j;
  std::vector<float> losses(N);
  const Loss loss = [&] {
    ops_->softmax_xent_fwd_bwd(losses.data(), logits.data(), targets.data(), N, V, Vp, grad_scale, false);
    double s = 0;
    for (float l : losses) s += l;
    return grad_scale * s;
  };
  const std::vector<float> logits0 = logits;
  loss();
  EXPECT_EQ(logits, logits0) << "without write_grad the logits must be left alone";
  // The forward against a double-precision log-sum-exp over the real columns.
  for (int r = 0; r < N; ++r) {
    if (targets[r] == kIgnoreIndex) {
      EXPECT_EQ(losses[r], 0.0f);
      continue;
    }
    double s = 0;
    for (int j = 0; j < V; ++j) s += std::exp(double(logits[r * Vp + j]));
    EXPECT_NEAR(losses[r], std::log(s) - logits[r * Vp + targets[r]], 1e-5);
  }

  std::vector<float> grad = logits;
  ops_->softmax_xent_fwd_bwd(losses.data(), grad.data(), targets.data(), N, V, Vp, grad_scale, true);
  for (int r = 0; r < N; ++r) {
    for (int j = 0; j < Vp; ++j) {
      if (targets[r] == kIgnoreIndex || j >= V) {
        EXPECT_EQ(grad[r * Vp + j], 0.0f) << r << "," << j;
      }
    }
  }
  EXPECT_TRUE(gradient_matches(loss, logits, grad, {.eps = 1e-2, .coordinates = 10, .seed = 10}));
}

TEST_F(GradCheckOps, Residual) {
  // No backward op: the model passes dout through to both inputs, so that is the analytic gradient.
  const size_t n = 40;
  std::vector<float> a = randn(rng_, n), b = randn(rng_, n);
  const std::vector<float> R = randn(rng_, n);
  std::vector<float> out(n);
  const Loss loss = [&] {
    ops_->residual_fwd(out.data(), a.data(), b.data(), n);
    return dot(out, R);
  };
  EXPECT_TRUE(gradient_matches(loss, a, R, {.eps = 1e-2, .seed = 11}));
  EXPECT_TRUE(gradient_matches(loss, b, R, {.eps = 1e-2, .seed = 12}));
  // out may alias an input.
  loss();
  std::vector<float> alias = a;
  ops_->residual_fwd(alias.data(), alias.data(), b.data(), n);
  EXPECT_EQ(alias, out);
}

// Negative controls: a gradient that is 10% off must fail the same comparison, for a linear op
// (exact differences) and a nonlinear one (differences with truncation error), so the tolerance
// above is shown to discriminate.
TEST_F(GradCheckOps, NegativeControlWrongGradientFails) {
  const int N = 5, C = 24;
  std::vector<float> inp = randn(rng_, size_t(N) * C, 2.0f, 0.5f);
  const std::vector<float> w = randn(rng_, C, 0.3f, 1.0f), b = randn(rng_, C, 0.3f);
  const std::vector<float> R = randn(rng_, inp.size());
  std::vector<float> out(inp.size()), mean(N), rstd(N);
  const Loss loss = [&] {
    ops_->layernorm_fwd(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    return dot(out, R);
  };
  loss();
  std::vector<float> dinp(inp.size(), 0.0f), dw(C, 0.0f), db(C, 0.0f);
  ops_->layernorm_bwd(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), mean.data(),
                      rstd.data(), N, C);
  EXPECT_TRUE(gradient_matches(loss, inp, dinp, {.seed = 2}));
  EXPECT_FALSE(gradient_matches(loss, inp, scaled(dinp, 1.1f), {.seed = 2}));
  EXPECT_FALSE(gradient_matches(loss, inp, scaled(dinp, 0.9f), {.seed = 2}));

  std::vector<float> gelu_in = randn(rng_, 64, 2.0f);
  const std::vector<float> Rg = randn(rng_, 64);
  std::vector<float> gelu_out(64), dgelu(64);
  const Loss gelu_loss = [&] {
    ops_->gelu_fwd(gelu_out.data(), gelu_in.data(), 64);
    return dot(gelu_out, Rg);
  };
  ops_->gelu_bwd(dgelu.data(), gelu_in.data(), Rg.data(), 64);
  EXPECT_FALSE(gradient_matches(gelu_loss, gelu_in, scaled(dgelu, 1.1f), {.eps = 1e-3, .seed = 9}));
}

}  // namespace
}  // namespace anvil
