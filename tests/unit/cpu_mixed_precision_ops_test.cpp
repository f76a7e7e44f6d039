// The CPU backend with bf16 / fp16 storage against itself in fp32. Each op runs twice on the same values:
// once with 16-bit storage, once in fp32 on the widened (already rounded) inputs. Everything but GEMMs
// and the attention output does the same fp32 arithmetic in both runs and rounds once on store, so its
// 16-bit result must be the fp32 result rounded to nearest: within half a 16-bit spacing of it. A second
// rounding anywhere (e.g. of an accumulated gradient after each addition) would break that bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "anvil/rng.hpp"
#include "core/half.hpp"
#include "kernels/ops.hpp"
#include "runtime/device.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

uint16_t narrow(DType t, float f) {
  return t == DType::BF16 ? float_to_bf16(f) : float_to_fp16(f);
}
float widen(DType t, uint16_t h) {
  return t == DType::BF16 ? bf16_to_float(h) : fp16_to_float(h);
}

// The spacing of dtype t's values around |r| (the distance from |r| to the next value away from zero).
double spacing(DType t, float r) {
  const int mant_bits = t == DType::F32 ? 23 : t == DType::BF16 ? 7 : 10;
  const int min_exp = t == DType::F16 ? -14 : -126;  // smallest normal exponent
  int e = std::ilogb(r == 0 ? 1e-30f : r);
  e = std::max(e, min_exp);
  return std::ldexp(1.0, e - mant_bits);
}

// A tensor stored in dtype `t`: fp32 values, or 16-bit bit patterns.
class Stored {
 public:
  Stored(DType t, std::span<const float> v) : t_(t) {
    if (t == DType::F32) {
      f_.assign(v.begin(), v.end());
    } else {
      h_.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) h_[i] = narrow(t, v[i]);
    }
  }
  Stored(DType t, size_t n, float fill = 0.0f) : Stored(t, std::vector<float>(n, fill)) {}
  void* data() { return t_ == DType::F32 ? static_cast<void*>(f_.data()) : h_.data(); }
  size_t size() const { return t_ == DType::F32 ? f_.size() : h_.size(); }
  DType dtype() const { return t_; }
  // The stored values, widened to fp32.
  std::vector<float> values() const {
    if (t_ == DType::F32) return f_;
    std::vector<float> out(h_.size());
    for (size_t i = 0; i < h_.size(); ++i) out[i] = widen(t_, h_[i]);
    return out;
  }
  const std::vector<uint16_t>& bits() const { return h_; }

 private:
  DType t_;
  std::vector<float> f_;
  std::vector<uint16_t> h_;
};

double max_abs(std::span<const float> v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// Every stored value is within half a spacing of the fp32 reference (what one rounding to nearest of it
// gives), plus `slack` for references computed in a different fp32 order (GEMMs).
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
      if (bad <= 5)
        result << "\n  [" << i << "] " << a[i] << " vs fp32 " << ref[i] << " (error " << err << ")";
    }
  }
  if (bad)
    result << "\n  " << bad << " of " << a.size() << " values off (" << dtype_name(actual.dtype()) << ")";
  return result;
}

struct Combo {
  DType act, grad;
};

void PrintTo(const Combo& c, std::ostream* os) {
  *os << dtype_name(c.act) << " compute, " << dtype_name(c.grad) << " gradients";
}

std::string combo_name(const ::testing::TestParamInfo<Combo>& info) {
  return std::string(dtype_name(info.param.act)) + "_grad" + std::string(dtype_name(info.param.grad));
}

class CpuMixedPrecisionOps : public ::testing::TestWithParam<Combo> {
 protected:
  DType A() const { return GetParam().act; }
  DType G() const { return GetParam().grad; }
  std::vector<float> randn(size_t n, float stddev = 1.0f, float mean = 0.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = mean + stddev * rng_.normal();
    return v;
  }
  // Random values already representable in `t` (inputs are rounded before both runs see them).
  Stored input(DType t, size_t n, float stddev = 1.0f, float mean = 0.0f) {
    return Stored(t, randn(n, stddev, mean));
  }

  // A matmul forward and backward with 16-bit storage against fp32 on the same values. The GEMMs may sum in
  // a different order (the 16-bit path widens rows in chunks), hence a small fp32 slack.
  void check_matmul(int N, int K, int OC, bool with_bias, bool with_dinp) {
    Ops& ops = *ops_;
    Ops& ref = *ref_;
    const DType act = ops.precision().compute, grad = ops.precision().grad;
    Stored inp = input(act, size_t(N) * K), w = input(act, size_t(OC) * K, 0.5f), bias = input(act, OC);
    Stored out(act, size_t(N) * OC);
    std::vector<float> ref_out(out.size());
    ops.matmul_fwd(out.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, N, K, OC);
    ref.matmul_fwd(ref_out.data(), inp.values().data(), w.values().data(),
                   with_bias ? bias.values().data() : nullptr, N, K, OC);
    EXPECT_TRUE(rounded_from(out, ref_out, 1e-5 * max_abs(ref_out)));

    Stored dout = input(act, out.size());
    Stored dinp(act, inp.size(), 123.0f);  // overwritten
    Stored dw = input(grad, w.size(), 20.0f), dbias = input(grad, OC, 20.0f);
    std::vector<float> ref_dinp(inp.size()), ref_dw = dw.values(), ref_db = dbias.values();
    ops.matmul_bwd(with_dinp ? dinp.data() : nullptr, dw.data(), with_bias ? dbias.data() : nullptr,
                   dout.data(), inp.data(), w.data(), N, K, OC);
    ref.matmul_bwd(ref_dinp.data(), ref_dw.data(), with_bias ? ref_db.data() : nullptr, dout.values().data(),
                   inp.values().data(), w.values().data(), N, K, OC);
    if (with_dinp) {
      EXPECT_TRUE(rounded_from(dinp, ref_dinp, 1e-5 * max_abs(ref_dinp)));
    } else {
      for (float v : dinp.values()) ASSERT_EQ(v, 123.0f);
    }
    EXPECT_TRUE(rounded_from(dw, ref_dw, 1e-5 * max_abs(ref_dw)));
    if (with_bias) {
      EXPECT_TRUE(rounded_from(dbias, ref_db));  // a fixed-order fp32 sum in both runs
    } else {
      EXPECT_TRUE(rounded_from(dbias, Stored(grad, ref_db).values()));  // untouched
    }
  }

  std::unique_ptr<Device> dev_ = make_cpu_device();
  std::unique_ptr<Ops> ops_ = make_cpu_ops(*dev_, {GetParam().act, GetParam().grad});
  std::unique_ptr<Ops> ref_ = make_cpu_ops(*dev_);
  Rng rng_{2024};
};

TEST_P(CpuMixedPrecisionOps, ReportsItsPrecision) {
  EXPECT_EQ(ops_->precision().compute, A());
  EXPECT_EQ(ops_->precision().grad, G());
  EXPECT_EQ(ops_->attention_scratch_bytes(2, 5, 8, 2),
            attention_scratch_bytes(DeviceKind::CPU, A(), 2, 5, 8, 2));
}

TEST_P(CpuMixedPrecisionOps, Embedding) {
  const int B = 3, T = 7, C = 40, V = 5, maxT = 9;
  // Few tokens, so every dwte row sums many positions: a rounding per addition would show.
  std::vector<int32_t> tokens(B * T);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + i / 3) % (V - 1));  // V-1 unused
  Stored wte = input(A(), size_t(V) * C), wpe = input(A(), size_t(maxT) * C);
  Stored out(A(), size_t(B) * T * C);
  std::vector<float> ref(out.size());
  ops_->embedding_fwd(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  ref_->embedding_fwd(ref.data(), tokens.data(), wte.values().data(), wpe.values().data(), B, T, C);
  EXPECT_TRUE(rounded_from(out, ref));

  // Backward accumulates into nonzero gradients of the gradient type.
  Stored dout = input(A(), out.size());
  Stored dwte = input(G(), wte.size(), 10.0f), dwpe = input(G(), wpe.size(), 10.0f);
  const std::vector<float> dwte0 = dwte.values(), dwpe0 = dwpe.values();
  std::vector<float> ref_dwte = dwte0, ref_dwpe = dwpe0;
  ops_->embedding_bwd(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C);
  ref_->embedding_bwd(ref_dwte.data(), ref_dwpe.data(), dout.values().data(), tokens.data(), B, T, C);
  EXPECT_TRUE(rounded_from(dwte, ref_dwte));
  EXPECT_TRUE(rounded_from(dwpe, ref_dwpe));
  // The unused token's row and the positions >= T are left exactly as they were.
  const std::vector<float> dwte1 = dwte.values(), dwpe1 = dwpe.values();
  for (int c = 0; c < C; ++c) EXPECT_EQ(dwte1[(V - 1) * C + c], dwte0[(V - 1) * C + c]);
  for (size_t i = size_t(T) * C; i < dwpe1.size(); ++i) EXPECT_EQ(dwpe1[i], dwpe0[i]);
}

TEST_P(CpuMixedPrecisionOps, LayerNorm) {
  const int N = 9, C = 72;
  Stored inp = input(A(), size_t(N) * C, 2.0f, 0.5f), w = input(A(), C, 0.3f, 1.0f), b = input(A(), C, 0.3f);
  Stored out(A(), inp.size());
  std::vector<float> ref(inp.size()), mean(N), rstd(N), ref_mean(N), ref_rstd(N);
  ops_->layernorm_fwd(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
  ref_->layernorm_fwd(ref.data(), ref_mean.data(), ref_rstd.data(), inp.values().data(), w.values().data(),
                      b.values().data(), N, C);
  EXPECT_TRUE(rounded_from(out, ref));
  EXPECT_EQ(mean, ref_mean);  // fp32 statistics of the same values
  EXPECT_EQ(rstd, ref_rstd);

  // dinp (compute type), dw and db (gradient type) all accumulate.
  Stored dout = input(A(), inp.size());
  Stored dinp = input(A(), inp.size()), dw = input(G(), C, 5.0f), db = input(G(), C, 5.0f);
  std::vector<float> ref_dinp = dinp.values(), ref_dw = dw.values(), ref_db = db.values();
  ops_->layernorm_bwd(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                      rstd.data(), N, C);
  ref_->layernorm_bwd(ref_dinp.data(), ref_dw.data(), ref_db.data(), dout.values().data(),
                      inp.values().data(), w.values().data(), mean.data(), rstd.data(), N, C);
  EXPECT_TRUE(rounded_from(dinp, ref_dinp));
  EXPECT_TRUE(rounded_from(dw, ref_dw));
  EXPECT_TRUE(rounded_from(db, ref_db));
}

TEST_P(CpuMixedPrecisionOps, Matmul) {
  check_matmul(13, 24, 37, true, true);
  check_matmul(13, 24, 37, false, false);
}

TEST_P(CpuMixedPrecisionOps, MatmulWideOutputInRowChunks) {
  // A vocabulary-sized projection: the 16-bit path widens rows in several chunks, and the weight
  // gradient sums over them.
  check_matmul(130, 8, 70000, true, true);
}

TEST_P(CpuMixedPrecisionOps, Attention) {
  const int B = 2, T = 9, C = 16, NH = 2;
  Stored qkv = input(A(), size_t(B) * T * 3 * C, 1.5f);
  const std::vector<float> qkv_v = qkv.values();
  const double vmax = max_abs(qkv_v);
  for (const AttentionMask mask : {AttentionMask{}, AttentionMask{false, nullptr}}) {
    SCOPED_TRACE(mask.causal ? "causal" : "bidirectional");
    Stored out(A(), size_t(B) * T * C, 7.0f);
    std::vector<float> lse(size_t(B) * NH * T, 7.0f), ref_out(out.size()), ref_lse(lse.size());
    std::vector<unsigned char> scratch(ops_->attention_scratch_bytes(B, T, C, NH) + 1);
    std::vector<unsigned char> ref_scratch(ref_->attention_scratch_bytes(B, T, C, NH) + 1);
    ops_->attention_fwd(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH, mask);
    ref_->attention_fwd(ref_out.data(), ref_lse.data(), qkv_v.data(), ref_scratch.data(), B, T, C, NH, mask);
    // The log-sum-exp comes from the same widened inputs in fp32: identical.
    EXPECT_EQ(lse, ref_lse);
    // The output multiplies v by the probabilities rounded to the storage type: within the probs' rounding
    // error (half an ulp of each, times |v|) plus one rounding of the output.
    EXPECT_TRUE(rounded_from(out, ref_out, spacing(A(), 1.0f) * vmax));

    // Backward: the same inputs widened for the fp32 run; the 16-bit one also rounds the probabilities
    // multiplying dout (dv) and the result, so it is within a few of its ulps of the fp32 gradient.
    Stored dout = input(A(), out.size());
    Stored dqkv(A(), qkv.size(), 99.0f);  // overwritten
    std::vector<float> ref_dqkv(qkv.size(), -5.0f);
    const std::vector<float> out_v = out.values();
    ops_->attention_bwd(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, C,
                        NH, mask);
    ref_->attention_bwd(ref_dqkv.data(), dout.values().data(), qkv_v.data(), out_v.data(), lse.data(),
                        ref_scratch.data(), B, T, C, NH, mask);
    EXPECT_TRUE(rounded_from(dqkv, ref_dqkv, 2 * spacing(A(), 1.0f) * max_abs(ref_dqkv)));
  }
}

TEST_P(CpuMixedPrecisionOps, GeluAndResidual) {
  const size_t n = 1000;
  Stored x = input(A(), n, 3.0f), y = input(A(), n);
  Stored out(A(), n);
  std::vector<float> ref(n);
  ops_->gelu_fwd(out.data(), x.data(), n);
  ref_->gelu_fwd(ref.data(), x.values().data(), n);
  EXPECT_TRUE(rounded_from(out, ref));

  Stored d = input(A(), n);
  Stored dinp(A(), n);
  std::vector<float> ref_dinp(n);
  ops_->gelu_bwd(dinp.data(), x.data(), d.data(), n);
  ref_->gelu_bwd(ref_dinp.data(), x.values().data(), d.values().data(), n);
  EXPECT_TRUE(rounded_from(dinp, ref_dinp));
  ops_->gelu_bwd(d.data(), x.data(), d.data(), n);  // in place, as the model uses it
  EXPECT_EQ(d.values(), dinp.values());

  ops_->residual_fwd(out.data(), x.data(), y.data(), n);
  ref_->residual_fwd(ref.data(), x.values().data(), y.values().data(), n);
  EXPECT_TRUE(rounded_from(out, ref));
  ops_->residual_fwd(x.data(), x.data(), y.data(), n);  // out aliasing an input
  EXPECT_EQ(x.values(), out.values());
}

TEST_P(CpuMixedPrecisionOps, SoftmaxCrossEntropy) {
  const int N = 7, V = 50, Vp = 56;
  const std::vector<int32_t> targets = {4, kIgnoreIndex, 0, 49, 17, kIgnoreIndex, 33};
  std::vector<float> init = randn(size_t(N) * Vp, 3.0f);
  for (int r = 0; r < N; ++r)
    for (int j = V; j < Vp; ++j) init[r * Vp + j] = 40.0f + j;  // padded junk
  Stored logits(A(), init);
  const std::vector<float> logits_v = logits.values();
  std::vector<float> losses(N), ref_losses(N), ref_grad = logits_v;
  ops_->softmax_xent_fwd_bwd(losses.data(), logits.data(), targets.data(), N, V, Vp, 0.25f, false);
  EXPECT_EQ(logits.values(), logits_v) << "without write_grad the logits are left alone";
  ops_->softmax_xent_fwd_bwd(losses.data(), logits.data(), targets.data(), N, V, Vp, 0.25f, true);
  ref_->softmax_xent_fwd_bwd(ref_losses.data(), ref_grad.data(), targets.data(), N, V, Vp, 0.25f, true);
  EXPECT_EQ(losses, ref_losses);  // fp32 losses from the same logits
  EXPECT_TRUE(rounded_from(logits, ref_grad));
  const std::vector<float> g = logits.values();
  for (int r = 0; r < N; ++r)
    for (int j = 0; j < Vp; ++j)
      if (targets[r] == kIgnoreIndex || j >= V) {
        EXPECT_EQ(g[r * Vp + j], 0.0f) << r << "," << j;
      }
}

TEST_P(CpuMixedPrecisionOps, AdamWWithGradientsOfTheGradientType) {
  // param/m/v are fp32; the gradient is widened first, so the step equals the fp32 step on the widened
  // gradient exactly.
  const size_t n = 777;
  Stored grad = input(G(), n, 3.0f);
  std::vector<float> p = randn(n), m = randn(n, 0.1f), v(n);
  for (float& x : v) x = 0.01f * std::fabs(rng_.normal());
  std::vector<float> rp = p, rm = m, rv = v;
  const uint64_t begin0 = 0;
  const uint8_t group0 = 0;
  const ParamGroupTable one_range{&begin0, &group0, nullptr, 1};
  FusedAdamWArgs a;
  a.lr[0] = 1e-2f, a.weight_decay[0] = 0.1f, a.step = 4, a.grad_scale = 0.3f;
  ops_->adamw_fused_step(p.data(), grad.data(), m.data(), v.data(), DType::F32, n, one_range, a);
  ref_->adamw_fused_step(rp.data(), grad.values().data(), rm.data(), rv.data(), DType::F32, n, one_range, a);
  EXPECT_EQ(p, rp);
  EXPECT_EQ(m, rm);
  EXPECT_EQ(v, rv);
}

TEST_P(CpuMixedPrecisionOps, CastWeights) {
  const size_t n = 5000;
  const std::vector<float> master = randn(n);
  Stored nearest(A(), n), seeded(A(), n), again(A(), n);
  ops_->cast_weights(nearest.data(), master.data(), n, 0, nullptr);
  EXPECT_TRUE(rounded_from(nearest, master));
  if (A() == DType::F16) {
    // fp16 always rounds to nearest, seed or not.
    ops_->cast_weights(seeded.data(), master.data(), n, 77, nullptr);
    EXPECT_EQ(seeded.bits(), nearest.bits());
    return;
  }
  ops_->cast_weights(seeded.data(), master.data(), n, 77, nullptr);
  ops_->cast_weights(again.data(), master.data(), n, 77, nullptr);
  EXPECT_EQ(seeded.bits(), again.bits()) << "deterministic";
  int differ = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t s = seeded.bits()[i];
    ASSERT_EQ(s, float_to_bf16_stochastic(master[i], rounding_bits(77, i))) << i;
    const uint16_t lo = uint16_t(float_bits(master[i]) >> 16);
    ASSERT_TRUE(s == lo || s == uint16_t(lo + 1)) << i;
    differ += s != nearest.bits()[i];
  }
  EXPECT_GT(differ, int(n / 10)) << "stochastic rounding rounds away from nearest often";
  ops_->cast_weights(again.data(), master.data(), n, 78, nullptr);
  EXPECT_NE(seeded.bits(), again.bits()) << "another seed, other bits";
}

TEST_P(CpuMixedPrecisionOps, SumSquaresOfEachDtype) {
  const size_t n = 3001;
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    Stored x = input(t, n, 4.0f);
    const std::vector<float> xv = x.values();
    EXPECT_EQ(ops_->sum_squares(x.data(), t, n), ref_->sum_squares(xv.data(), DType::F32, n))
        << dtype_name(t);
  }
}

INSTANTIATE_TEST_SUITE_P(CpuMixedPrecision, CpuMixedPrecisionOps,
                         ::testing::Values(Combo{DType::BF16, DType::F32}, Combo{DType::BF16, DType::BF16},
                                           Combo{DType::F16, DType::F32}, Combo{DType::F16, DType::F16}),
                         combo_name);

// layernorm_bwd_sum is exactly the sequence it replaces in BERT's backward: residual_fwd of the two output
// gradients into a buffer, fill_zero of dinp, layernorm_bwd (fp32 storage too, unlike the suite above).
class LayerNormBwdSumOps : public ::testing::TestWithParam<Combo> {
 protected:
  std::unique_ptr<Device> dev_ = make_cpu_device();
  std::unique_ptr<Ops> ops_ = make_cpu_ops(*dev_, {GetParam().act, GetParam().grad});
  Rng rng_{77};
  Stored input(DType t, size_t n, float stddev = 1.0f, float mean = 0.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = mean + stddev * rng_.normal();
    return Stored(t, v);
  }
};

TEST_P(LayerNormBwdSumOps, EqualsResidualThenLayerNormBwd) {
  const DType act = GetParam().act, grad = GetParam().grad;
  for (const int C : {72, 7}) {
    const int N = 9;
    const size_t NC = size_t(N) * C;
    SCOPED_TRACE("C=" + std::to_string(C));
    Stored inp = input(act, NC, 2.0f, 0.5f), w = input(act, C, 0.3f, 1.0f), b = input(act, C, 0.3f);
    Stored out(act, NC);
    std::vector<float> mean(N), rstd(N);
    ops_->layernorm_fwd(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    // dout2 of another scale than dout, so that rounding their sum (16-bit storage) shows.
    const Stored dout = input(act, NC), dout2 = input(act, NC, 0.3f);
    const Stored dw0 = input(grad, C, 5.0f), db0 = input(grad, C, 5.0f);  // dw, db accumulate
    for (const bool with_dout2 : {true, false}) {
      SCOPED_TRACE(with_dout2 ? "dout + dout2" : "dout only");
      // The old sequence.
      Stored sum = dout, ref_dinp(act, NC), ref_dw = dw0, ref_db = db0;
      Stored d2 = dout2;
      if (with_dout2) ops_->residual_fwd(sum.data(), sum.data(), d2.data(), NC);
      ops_->layernorm_bwd(ref_dinp.data(), ref_dw.data(), ref_db.data(), sum.data(), inp.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
      // Into a separate dinp holding garbage (overwritten, not accumulated).
      Stored a = dout, dinp(act, NC, 123.0f), dw = dw0, db = db0;
      ops_->layernorm_bwd_sum(dinp.data(), dw.data(), db.data(), a.data(), with_dout2 ? d2.data() : nullptr,
                              inp.data(), w.data(), mean.data(), rstd.data(), N, C);
      EXPECT_EQ(dinp.values(), ref_dinp.values());
      EXPECT_EQ(dw.values(), ref_dw.values());
      EXPECT_EQ(db.values(), ref_db.values());
      EXPECT_EQ(a.values(), dout.values()) << "dout is read only";
      EXPECT_EQ(d2.values(), dout2.values()) << "dout2 is read only";
      if (!with_dout2) continue;
      // dinp aliasing dout2, as BERT's attention LayerNorm runs it.
      Stored alias = dout2, adw = dw0, adb = db0;
      ops_->layernorm_bwd_sum(alias.data(), adw.data(), adb.data(), a.data(), alias.data(), inp.data(),
                              w.data(), mean.data(), rstd.data(), N, C);
      EXPECT_EQ(alias.values(), ref_dinp.values());
      EXPECT_EQ(adw.values(), ref_dw.values());
      EXPECT_EQ(adb.values(), ref_db.values());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, LayerNormBwdSumOps,
                         ::testing::Values(Combo{DType::F32, DType::F32}, Combo{DType::BF16, DType::F32},
                                           Combo{DType::BF16, DType::BF16}, Combo{DType::F16, DType::F32}),
                         combo_name);

// --- not parameterised ----------------------------------------------------------------------------------

TEST(CpuMixedPrecisionChecks, SumSquaresIsNonFiniteWithInfOrNaN) {
  auto dev = make_cpu_device();
  auto ops = make_cpu_ops(*dev, {DType::F16, DType::F16});
  const size_t n = 4099;
  struct Special {
    DType t;
    uint32_t bits;  // as stored: fp32 bits or a 16-bit pattern
    const char* what;
  };
  const Special specials[] = {
      {DType::F32, 0x7f800000u, "F32 +inf"}, {DType::F32, 0xff800000u, "F32 -inf"},
      {DType::F32, 0x7fc00000u, "F32 NaN"},  {DType::BF16, 0x7f80u, "BF16 +inf"},
      {DType::BF16, 0xff80u, "BF16 -inf"},   {DType::BF16, 0x7fc1u, "BF16 NaN"},
      {DType::F16, 0x7c00u, "F16 +inf"},     {DType::F16, 0xfc00u, "F16 -inf"},
      {DType::F16, 0x7e00u, "F16 NaN"},
  };
  for (const Special& s : specials) {
    for (size_t pos : {size_t(0), size_t(1234), n - 1}) {
      Stored x(s.t, std::vector<float>(n, 0.5f));
      if (s.t == DType::F32) {
        const float v = bits_float(s.bits);
        std::memcpy(static_cast<float*>(x.data()) + pos, &v, sizeof(v));
      } else {
        static_cast<uint16_t*>(x.data())[pos] = uint16_t(s.bits);
      }
      EXPECT_FALSE(std::isfinite(ops->sum_squares(x.data(), s.t, n))) << s.what << " at " << pos;
    }
  }
  // The largest finite fp16 values, many times over, stay finite.
  Stored big(DType::F16, std::vector<float>(n, -65504.0f));
  const double s = ops->sum_squares(big.data(), DType::F16, n);
  EXPECT_TRUE(std::isfinite(s));
  EXPECT_DOUBLE_EQ(s, double(n) * 65504.0 * 65504.0);
}

TEST(CpuMixedPrecisionChecks, CastWeightsF32IsACopy) {
  auto dev = make_cpu_device();
  auto ops = make_cpu_ops(*dev);
  std::vector<float> master = {1.0f, -0.0f, 3.14159265f, 1e-40f, INFINITY, 65519.0f};
  std::vector<float> out(master.size(), 9.0f);
  ops->cast_weights(out.data(), master.data(), master.size(), 12345,
                    nullptr);  // the seed does not matter for F32
  EXPECT_EQ(std::memcmp(out.data(), master.data(), master.size() * sizeof(float)), 0);
}

TEST(CpuMixedPrecisionChecks, ValidatesThePrecision) {
  for (Combo ok :
       {Combo{DType::F32, DType::F32}, Combo{DType::BF16, DType::F32}, Combo{DType::BF16, DType::BF16},
        Combo{DType::F16, DType::F32}, Combo{DType::F16, DType::F16}})
    EXPECT_NO_THROW(validate_ops_precision({ok.act, ok.grad}))
        << dtype_name(ok.act) << "/" << dtype_name(ok.grad);
  test::expect_error(
      [] {
        validate_ops_precision({DType::F16, DType::BF16});
      },
      {"gradient dtype BF16 with compute dtype F16", "F32 or the compute dtype"});
  test::expect_error(
      [] {
        validate_ops_precision({DType::F32, DType::F16});
      },
      {"gradient dtype F16 with compute dtype F32"});
  test::expect_error(
      [] {
        validate_ops_precision({DType::I8, DType::F32});
      },
      {"compute dtype I8", "F32, BF16 or F16"});
  test::expect_error([] { validate_ops_precision({DType::NF4, DType::NF4}); }, {"compute dtype NF4"});
  auto dev = make_cpu_device();
  test::expect_error(
      [&] {
        make_cpu_ops(*dev, {DType::BF16, DType::F16});
      },
      {"gradient dtype F16 with compute dtype BF16"});
  if (!cuda_compiled())
    test::expect_error([] { attention_scratch_bytes(DeviceKind::CUDA, DType::BF16, 1, 2, 4, 1); },
                       {"without CUDA"});
}

}  // namespace
}  // namespace anvil
