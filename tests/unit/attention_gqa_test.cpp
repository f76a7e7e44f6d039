// The CPU reference of self-attention in its general shape (kernels/ops.hpp AttentionShape): grouped-query
// heads (NKV < NH, down to one key/value head), head sizes that are not C / NH of a model, and Mistral's
// sliding window, with padding lengths and probability dropout as BERT uses them.
//  - forward and backward against a naive fp64 implementation of the contract written here (explicit
//    visibility test per key, softmax, the group sums of dK / dV);
//  - finite-difference checks of the backward (gradcheck_util.hpp);
//  - multi-head results unchanged: the shape form with NKV = NH is bit-identical to the int form, a
//    grouped call to the multi-head call on its key/value heads repeated per query head, and a window that
//    covers every key to no window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "anvil/rng.hpp"
#include "core/half.hpp"
#include "gradcheck_util.hpp"
#include "kernels/dropout.hpp"
#include "kernels/ops.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

using test::dot;
using test::gradient_matches;
using test::Loss;

std::vector<float> randn(Rng& rng, size_t n, float stddev = 1.0f) {
  std::vector<float> v(n);
  for (float& x : v) x = stddev * rng.normal();
  return v;
}

std::string describe(const AttentionShape& s, const AttentionMask& m) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " NKV=" + std::to_string(s.NKV) + " HS=" + std::to_string(s.HS) + (m.causal ? " causal" : " bidir") +
         " window=" + std::to_string(m.window) + (m.lengths ? " padded" : "") +
         (m.dropout > 0 ? " dropout" : "");
}

// --- the fp64 reference ------------------------------------------------------------------------------------
// Straight from the contract: query t of sequence b sees key t2 when both are real tokens, t2 <= t if
// causal, and t - t2 < window if there is one. Query head h reads key/value head h / (NH / NKV).
struct Reference {
  std::vector<double> out, lse, dqkv;
};

// The backward's D = dout . out uses `fwd_out` when given (the forward's output as a 16-bit storage holds
// it, which the contract's backward reads), else the reference's own.
Reference naive_attention(const std::vector<float>& qkv, const std::vector<float>& dout,
                          const AttentionShape& s, const AttentionMask& m,
                          const std::vector<float>* fwd_out = nullptr) {
  const int B = s.B, T = s.T, NH = s.NH, NKV = s.NKV, HS = s.HS, G = NH / NKV;
  const size_t W = size_t(s.qkv_width()), C = size_t(s.q_width());
  Reference r;
  r.out.assign(size_t(B) * T * C, 0.0);
  r.lse.assign(size_t(B) * NH * T, 0.0);
  r.dqkv.assign(qkv.size(), 0.0);
  const double scale = 1.0 / std::sqrt(double(HS));
  const auto q_at = [&](int b, int t, int h) { return (size_t(b) * T + t) * W + size_t(h) * HS; };
  const auto k_at = [&](int b, int t, int g) { return (size_t(b) * T + t) * W + C + size_t(g) * HS; };
  const auto v_at = [&](int b, int t, int g) { return k_at(b, t, g) + size_t(NKV) * HS; };
  const auto o_at = [&](int b, int t, int h) { return (size_t(b) * T + t) * C + size_t(h) * HS; };
  const bool dropping = m.dropout > 0;
  const uint64_t key =
      dropping ? dropout_key(m.dropout_state->seed, m.dropout_state->micro, m.dropout_site) : 0;
  const uint32_t threshold = dropout_threshold(m.dropout);
  const double drop_scale = dropping ? double(dropout_scale(m.dropout)) : 1.0;
  for (int b = 0; b < B; ++b) {
    const int len = m.lengths ? m.lengths[b] : T;
    for (int h = 0; h < NH; ++h) {
      const int g = h / G;
      for (int t = 0; t < len; ++t) {
        std::vector<int> keys;
        for (int t2 = 0; t2 < len; ++t2)
          if ((!m.causal || t2 <= t) && (m.window == 0 || t - t2 < m.window)) keys.push_back(t2);
        const size_t n = keys.size();
        std::vector<double> sc(n), p(n), kept(n);
        double mx = -INFINITY;
        for (size_t j = 0; j < n; ++j) {
          double d = 0;
          for (int i = 0; i < HS; ++i) d += double(qkv[q_at(b, t, h) + i]) * qkv[k_at(b, keys[j], g) + i];
          sc[j] = d * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (size_t j = 0; j < n; ++j) sum += std::exp(sc[j] - mx);
        r.lse[(size_t(b) * NH + h) * T + t] = mx + std::log(sum);
        const uint32_t row_key =
            dropping ? attention_dropout_row_key(key, (uint64_t(b) * NH + h) * T + t) : 0;
        for (size_t j = 0; j < n; ++j) {
          p[j] = std::exp(sc[j] - mx) / sum;
          const bool keep = !dropping || attention_dropout_keep(row_key, uint32_t(keys[j]), threshold);
          kept[j] = keep ? drop_scale : 0.0;
          for (int i = 0; i < HS; ++i)
            r.out[o_at(b, t, h) + i] += p[j] * kept[j] * qkv[v_at(b, keys[j], g) + i];
        }
        if (dout.empty()) continue;
        // dP = (dout . v) * mask * scale; dS = P (dP - sum P dP), and sum P dP = dout . out.
        double d_dot_o = 0;
        for (int i = 0; i < HS; ++i) {
          const size_t o = o_at(b, t, h) + i;
          d_dot_o += double(dout[o]) * (fwd_out ? double((*fwd_out)[o]) : r.out[o]);
        }
        for (size_t j = 0; j < n; ++j) {
          double dz = 0;
          for (int i = 0; i < HS; ++i) {
            dz += double(dout[o_at(b, t, h) + i]) * qkv[v_at(b, keys[j], g) + i];
            r.dqkv[v_at(b, keys[j], g) + i] += p[j] * kept[j] * dout[o_at(b, t, h) + i];
          }
          const double ds = p[j] * (dz * kept[j] - d_dot_o) * scale;
          for (int i = 0; i < HS; ++i) {
            r.dqkv[q_at(b, t, h) + i] += ds * qkv[k_at(b, keys[j], g) + i];
            r.dqkv[k_at(b, keys[j], g) + i] += ds * qkv[q_at(b, t, h) + i];
          }
        }
      }
    }
  }
  return r;
}

// --- running the CPU ops over host vectors
// ------------------------------------------------------------------ Storage of `dtype` (F32, BF16, F16) for
// a vector of floats, and back.
std::vector<uint16_t> to_half(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = t == DType::BF16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
  return h;
}
std::vector<float> from_half(const std::vector<uint16_t>& h, DType t) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = t == DType::BF16 ? bf16_to_float(h[i]) : fp16_to_float(h[i]);
  return v;
}
// The values a 16-bit storage actually holds.
std::vector<float> rounded(const std::vector<float>& v, DType t) {
  return t == DType::F32 ? v : from_half(to_half(v, t), t);
}

// One attention call's tensors in storage type `dtype`, all widened back to fp32 for inspection.
struct Results {
  std::vector<float> out, lse, dqkv;
};

class AttentionRunner {
 public:
  explicit AttentionRunner(DType dtype) : dtype_(dtype), ops_(make_cpu_ops(*dev_, {dtype, DType::F32})) {}

  // Forward (and, with dout, backward) of `s` on fp32 values (rounded to the storage type first).
  // `int_form`: through the multi-head int-argument overloads (NKV must equal NH).
  Results run(const std::vector<float>& qkv, const std::vector<float>& dout, const AttentionShape& s,
              const AttentionMask& mask, bool int_form = false) {
    const size_t n_out = size_t(s.B) * s.T * s.q_width(), n_lse = size_t(s.B) * s.NH * s.T;
    std::vector<float> scratch(ops_->attention_scratch_bytes(s, mask.dropout > 0) / sizeof(float) + 1);
    EXPECT_EQ(ops_->attention_scratch_bytes(s), attention_scratch_bytes(DeviceKind::CPU, dtype_, s));
    Results r;
    r.lse.assign(n_lse, 9.0f);
    Storage out(dtype_, std::vector<float>(n_out, 7.0f)), in(dtype_, qkv), g(dtype_, dout),
        dqkv(dtype_, std::vector<float>(qkv.size(), 5.0f));
    const int C = s.q_width();
    if (int_form)
      ops_->attention_fwd(out.ptr(), r.lse.data(), in.ptr(), scratch.data(), s.B, s.T, C, s.NH, mask);
    else
      ops_->attention_fwd(out.ptr(), r.lse.data(), in.ptr(), scratch.data(), s, mask);
    r.out = out.values();
    if (dout.empty()) return r;
    if (int_form)
      ops_->attention_bwd(dqkv.ptr(), g.ptr(), in.ptr(), out.ptr(), r.lse.data(), scratch.data(), s.B, s.T, C,
                          s.NH, mask);
    else
      ops_->attention_bwd(dqkv.ptr(), g.ptr(), in.ptr(), out.ptr(), r.lse.data(), scratch.data(), s, mask);
    r.dqkv = dqkv.values();
    return r;
  }
  Ops& ops() { return *ops_; }

 private:
  // A tensor in the storage type.
  struct Storage {
    Storage(DType t, const std::vector<float>& v) : t(t), f(t == DType::F32 ? v : std::vector<float>{}) {
      if (t != DType::F32) h = to_half(v, t);
    }
    void* ptr() { return t == DType::F32 ? static_cast<void*>(f.data()) : static_cast<void*>(h.data()); }
    std::vector<float> values() const { return t == DType::F32 ? f : from_half(h, t); }
    DType t;
    std::vector<float> f;
    std::vector<uint16_t> h;
  };

  DType dtype_;
  std::unique_ptr<Device> dev_ = make_cpu_device();
  std::unique_ptr<Ops> ops_;
};

struct Case {
  AttentionShape s;
  bool causal = true;
  int window = 0;
  bool padded = false;
  float dropout = 0;
};

// Grouped (NKV = NH / 2, 1), multi-head, head sizes 8 and 24 (not a power of two), windows of 1 (each query
// sees itself), a few keys, exactly T and more than T, with and without padding and dropout, and T = 1.
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {{2, 9, 4, 2, 8}},
      {{2, 9, 4, 1, 8}, true, 0, true},
      {{2, 9, 4, 4, 8}, true, 3},
      {{2, 10, 6, 2, 24}, true, 4, true},
      {{2, 10, 6, 3, 24}, false, 0, true},
      {{1, 8, 4, 2, 8}, true, 1},
      {{2, 7, 4, 1, 8}, true, 1, true},
      {{1, 7, 2, 1, 16}, true, 7},
      {{2, 7, 4, 2, 8}, true, 12, true},
      {{2, 9, 4, 2, 8}, true, 3, true, 0.25f},
      {{2, 9, 6, 3, 8}, false, 0, true, 0.25f},
      {{3, 1, 4, 2, 8}, true, 2},
      {{3, 1, 4, 1, 24}, false, 0},
  };
  return c;
}

class AttentionGqa : public ::testing::Test {
 protected:
  // The mask of case c (lengths: full, then shorter, including a sequence of one token).
  AttentionMask mask_of(const Case& c) {
    lengths_.assign(size_t(c.s.B), c.s.T);
    for (size_t b = 1; b < lengths_.size(); ++b) lengths_[b] = std::max(1, c.s.T - 3 * int(b) - 1);
    AttentionMask m;
    m.causal = c.causal;
    m.window = c.window;
    m.lengths = c.padded ? lengths_.data() : nullptr;
    m.dropout = c.dropout;
    m.dropout_state = c.dropout > 0 ? &dropout_state_ : nullptr;
    m.dropout_site = 3;
    return m;
  }
  std::vector<int32_t> lengths_;
  DropoutState dropout_state_{0x5eed, 2, 0};
  Rng rng_{2024};
};

::testing::AssertionResult near_all(const std::vector<float>& got, const std::vector<double>& ref, double tol,
                                    const char* what) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << what << ": size mismatch";
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - ref[i]) <= tol * (1 + std::abs(ref[i]))))
      return ::testing::AssertionFailure()
             << what << "[" << i << "] = " << got[i] << ", reference " << ref[i];
  return ::testing::AssertionSuccess();
}

TEST_F(AttentionGqa, MatchesFp64Reference) {
  AttentionRunner cpu(DType::F32);
  for (const Case& c : cases()) {
    const AttentionMask mask = mask_of(c);
    SCOPED_TRACE(describe(c.s, mask));
    const std::vector<float> qkv = randn(rng_, size_t(c.s.B) * c.s.T * c.s.qkv_width());
    const std::vector<float> dout = randn(rng_, size_t(c.s.B) * c.s.T * c.s.q_width());
    const Results r = cpu.run(qkv, dout, c.s, mask);
    const Reference ref = naive_attention(qkv, dout, c.s, mask);
    EXPECT_TRUE(near_all(r.out, ref.out, 2e-6, "out"));
    EXPECT_TRUE(near_all(r.lse, ref.lse, 2e-6, "lse"));
    EXPECT_TRUE(near_all(r.dqkv, ref.dqkv, 1e-5, "dqkv"));
  }
}

// 16-bit storage: the inputs as stored, against the fp64 reference within the rounding the CPU emulates
// (probabilities rounded before they multiply v, outputs rounded once); the reference's backward reads the
// stored forward output, as the op does.
TEST_F(AttentionGqa, SixteenBitMatchesReference) {
  for (DType t : {DType::BF16, DType::F16}) {
    AttentionRunner cpu(t);
    const double eps = t == DType::BF16 ? 1.0 / 256 : 1.0 / 2048;
    for (const Case& c : cases()) {
      const AttentionMask mask = mask_of(c);
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + describe(c.s, mask));
      const std::vector<float> qkv = rounded(randn(rng_, size_t(c.s.B) * c.s.T * c.s.qkv_width()), t);
      const std::vector<float> dout = rounded(randn(rng_, size_t(c.s.B) * c.s.T * c.s.q_width()), t);
      const Results r = cpu.run(qkv, dout, c.s, mask);
      const Reference ref = naive_attention(qkv, dout, c.s, mask, &r.out);
      EXPECT_TRUE(near_all(r.out, ref.out, 4 * eps, "out"));
      EXPECT_TRUE(near_all(r.lse, ref.lse, 1e-5, "lse"));  // fp32 whatever the storage
      EXPECT_TRUE(near_all(r.dqkv, ref.dqkv, 8 * eps, "dqkv"));
    }
  }
}

TEST_F(AttentionGqa, GradientMatchesFiniteDifferences) {
  AttentionRunner cpu(DType::F32);
  uint64_t seed = 1;
  for (const Case& c : cases()) {
    const AttentionMask mask = mask_of(c);
    SCOPED_TRACE(describe(c.s, mask));
    std::vector<float> qkv = randn(rng_, size_t(c.s.B) * c.s.T * c.s.qkv_width());
    const std::vector<float> R = randn(rng_, size_t(c.s.B) * c.s.T * c.s.q_width());
    const std::vector<float> dqkv = cpu.run(qkv, R, c.s, mask).dqkv;
    const Loss loss = [&] { return dot(cpu.run(qkv, {}, c.s, mask).out, R); };
    EXPECT_TRUE(
        gradient_matches(loss, qkv, dqkv, {.eps = 1e-2, .directions = 6, .coordinates = 10, .seed = seed++}));
  }
}

// Keys outside a query's window get no gradient from it: with dout nonzero only at the last query of each
// sequence, only the last `window` keys of the key/value heads receive gradient.
TEST_F(AttentionGqa, WindowLimitsGradient) {
  AttentionRunner cpu(DType::F32);
  const AttentionShape s{2, 11, 4, 2, 8};
  for (int window : {1, 3, 6}) {
    AttentionMask mask;
    mask.window = window;
    const std::vector<float> qkv = randn(rng_, size_t(s.B) * s.T * s.qkv_width());
    std::vector<float> dout(size_t(s.B) * s.T * s.q_width(), 0.0f);
    for (int b = 0; b < s.B; ++b)
      for (int c = 0; c < s.q_width(); ++c) dout[(size_t(b) * s.T + s.T - 1) * s.q_width() + c] = 1.0f + c;
    const Results r = cpu.run(qkv, dout, s, mask);
    for (int b = 0; b < s.B; ++b)
      for (int t = 0; t < s.T; ++t) {
        const bool inside = s.T - 1 - t < window;
        for (int c = s.q_width(); c < s.qkv_width(); ++c) {
          const float d = r.dqkv[(size_t(b) * s.T + t) * s.qkv_width() + c];
          if (!inside) {
            EXPECT_EQ(d, 0.0f) << "window " << window << " b " << b << " t " << t;
          }
        }
        if (!inside) continue;
        float norm = 0;
        for (int c = s.q_width() + s.NKV * s.HS; c < s.qkv_width(); ++c)
          norm += std::abs(r.dqkv[(size_t(b) * s.T + t) * s.qkv_width() + c]);
        EXPECT_GT(norm, 0.0f) << "window " << window << " t " << t;  // dv of a visible key
      }
  }
}

// Window 1: each query sees only its own key, so out is v exactly and lse the query's own scaled score.
TEST_F(AttentionGqa, WindowOfOneCopiesValues) {
  AttentionRunner cpu(DType::F32);
  const AttentionShape s{2, 6, 4, 2, 24};
  AttentionMask mask;
  mask.window = 1;
  const std::vector<float> qkv = randn(rng_, size_t(s.B) * s.T * s.qkv_width());
  const Results r = cpu.run(qkv, {}, s, mask);
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int h = 0; h < s.NH; ++h) {
        const size_t row = (size_t(b) * s.T + t) * s.qkv_width();
        const size_t v = row + s.q_width() + size_t(s.NKV + h / 2) * s.HS;
        for (int i = 0; i < s.HS; ++i)
          EXPECT_EQ(r.out[(size_t(b) * s.T + t) * s.q_width() + h * s.HS + i], qkv[v + i]);
      }
}

// Multi-head attention is unchanged: the shape form with NKV = NH is the int form, bit for bit, in every
// storage type with every mask kind; a window reaching every key is no window.
TEST_F(AttentionGqa, MultiHeadBitIdentical) {
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    AttentionRunner cpu(t);
    for (const Case& c : {Case{{2, 9, 4, 4, 8}}, Case{{2, 9, 3, 3, 16}, false, 0, true},
                          Case{{2, 9, 4, 4, 8}, true, 0, true, 0.25f}}) {
      const AttentionMask mask = mask_of(c);
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + describe(c.s, mask));
      const std::vector<float> qkv = randn(rng_, size_t(c.s.B) * c.s.T * c.s.qkv_width());
      const std::vector<float> dout = randn(rng_, size_t(c.s.B) * c.s.T * c.s.q_width());
      const Results shape_form = cpu.run(qkv, dout, c.s, mask);
      const Results int_form = cpu.run(qkv, dout, c.s, mask, true);
      EXPECT_EQ(shape_form.out, int_form.out);
      EXPECT_EQ(shape_form.lse, int_form.lse);
      EXPECT_EQ(shape_form.dqkv, int_form.dqkv);
      if (!c.causal) continue;
      for (int window : {c.s.T, c.s.T + 5}) {
        AttentionMask wide = mask;
        wide.window = window;
        const Results w = cpu.run(qkv, dout, c.s, wide);
        EXPECT_EQ(w.out, shape_form.out) << window;
        EXPECT_EQ(w.lse, shape_form.lse) << window;
        EXPECT_EQ(w.dqkv, shape_form.dqkv) << window;
      }
    }
  }
}

// A grouped call is the multi-head call on its key/value heads repeated for each query head of the group:
// the same out and lse and dq bit for bit (each query head computes exactly as before), and in fp32 each
// key/value head's gradient is the multi-head gradients of its query heads summed in head order.
TEST_F(AttentionGqa, GroupedEqualsRepeatedHeads) {
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    AttentionRunner cpu(t);
    for (const Case& c : {Case{{2, 9, 4, 2, 8}, true, 3, true}, Case{{2, 9, 6, 1, 24}},
                          Case{{2, 9, 4, 2, 8}, false, 0, true, 0.25f}}) {
      const AttentionMask mask = mask_of(c);
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + describe(c.s, mask));
      const AttentionShape g = c.s, m{g.B, g.T, g.NH, g.NH, g.HS};
      const int G = g.NH / g.NKV, HS = g.HS;
      const std::vector<float> qkv = rounded(randn(rng_, size_t(g.B) * g.T * g.qkv_width()), t);
      const std::vector<float> dout = randn(rng_, size_t(g.B) * g.T * g.q_width());
      std::vector<float> expanded(size_t(g.B) * g.T * m.qkv_width());
      for (size_t bt = 0; bt < size_t(g.B) * g.T; ++bt) {
        const float* src = &qkv[bt * g.qkv_width()];
        float* dst = &expanded[bt * m.qkv_width()];
        std::copy(src, src + g.q_width(), dst);
        for (int h = 0; h < g.NH; ++h)
          for (int i = 0; i < HS; ++i) {
            dst[m.q_width() + h * HS + i] = src[g.q_width() + (h / G) * HS + i];
            dst[2 * m.q_width() + h * HS + i] = src[g.q_width() + (g.NKV + h / G) * HS + i];
          }
      }
      const Results rg = cpu.run(qkv, dout, g, mask), rm = cpu.run(expanded, dout, m, mask);
      EXPECT_EQ(rg.out, rm.out);
      EXPECT_EQ(rg.lse, rm.lse);
      for (size_t bt = 0; bt < size_t(g.B) * g.T; ++bt) {
        const float* dg = &rg.dqkv[bt * g.qkv_width()];
        const float* dm = &rm.dqkv[bt * m.qkv_width()];
        for (int c2 = 0; c2 < g.q_width(); ++c2) ASSERT_EQ(dg[c2], dm[c2]) << "dq " << bt << "," << c2;
        if (t != DType::F32) continue;  // 16-bit: the multi-head call rounds each head's part before the sum
        for (int kv = 0; kv < g.NKV; ++kv)
          for (int part = 0; part < 2; ++part)
            for (int i = 0; i < HS; ++i) {
              float sum = 0;
              for (int j = 0; j < G; ++j) sum += dm[(1 + part) * m.q_width() + (kv * G + j) * HS + i];
              ASSERT_EQ(dg[g.q_width() + (part * g.NKV + kv) * HS + i], sum)
                  << bt << " kv " << kv << " " << i;
            }
      }
    }
  }
}

TEST_F(AttentionGqa, ScratchAndValidation) {
  const auto bytes = [](const AttentionShape& s) {
    return attention_scratch_bytes(DeviceKind::CPU, DType::F32, s);
  };
  // Multi-head: one probability row per (b, h) as before; grouped adds the per-query-head k and v partials.
  EXPECT_EQ(bytes({2, 16, 8, 8, 64}), 4u * 2 * 8 * 16);
  EXPECT_EQ(bytes({2, 16, 8, 2, 64}), 4u * 2 * 8 * 16 * (1 + 2 * 64));
  EXPECT_EQ(attention_scratch_bytes(DeviceKind::CPU, DType::BF16, 2, 16, 512, 8), bytes({2, 16, 8, 8, 64}));

  AttentionRunner cpu(DType::F32);
  std::vector<float> buf(4096, 0.0f);
  const auto call = [&](const AttentionShape& s, const AttentionMask& m) {
    cpu.ops().attention_fwd(buf.data(), buf.data() + 2048, buf.data() + 1024, buf.data() + 3072, s, m);
  };
  AttentionMask bidir_window;
  bidir_window.causal = false;
  bidir_window.window = 4;
  EXPECT_THROW(call({1, 4, 4, 2, 8}, bidir_window), Error);
  AttentionMask negative;
  negative.window = -1;
  EXPECT_THROW(call({1, 4, 4, 2, 8}, negative), Error);
  EXPECT_THROW(call({1, 4, 4, 3, 8}, {}), Error);  // NH not a multiple of NKV
  EXPECT_THROW(call({1, 4, 4, 0, 8}, {}), Error);
}

}  // namespace
}  // namespace anvil
