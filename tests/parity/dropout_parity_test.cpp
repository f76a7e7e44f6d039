// Parity of the CUDA dropout ops with the CPU reference, in fp32, bf16 and fp16 storage: Ops::dropout and
// Ops::dropout_next_micro must drop exactly the elements the counter hash of kernels/dropout.hpp drops (the
// mask bit for bit; the kept values equal, being one fp32 multiply rounded once to the storage type), and
// attention with probability dropout (AttentionMask::dropout) must agree with the CPU within the tolerances
// of the attention parity tests. Skipped when no GPU is visible. ANVIL_PARITY_SEED replays a run;
// ANVIL_PARITY_VERBOSE=1 prints every error.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dropout.hpp"
#include "kernels/ops.hpp"
#include "parity_fixture.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

std::string dtype_case_name(const ::testing::TestParamInfo<DType>& info) {
  return info.param == DType::F32 ? "Fp32" : info.param == DType::BF16 ? "Bf16" : "Fp16";
}

class DropoutParity : public parity::TypedParityFixture<DType> {
 protected:
  OpsPrecision precision() const override { return {GetParam(), DType::F32}; }

  void SetUp() override {
    TypedParityFixture::SetUp();
    if (IsSkipped()) return;
    cpu_state_ = DeviceBuffer(*cpu_dev_, sizeof(DropoutState));
    gpu_state_ = DeviceBuffer(*gpu_dev_, sizeof(DropoutState));
  }

  // Both backends' DropoutState set to (seed, micro).
  void set_state(uint64_t seed, uint32_t micro) {
    DropoutState s;
    s.seed = seed, s.micro = micro;
    cpu_dev_->copy_to_device(cpu_state_.get(), &s, sizeof(s));
    gpu_dev_->copy_to_device(gpu_state_.get(), &s, sizeof(s));
  }
  DropoutState read_state(bool gpu) {
    DropoutState s;
    (gpu ? *gpu_dev_ : *cpu_dev_).copy_to_host(&s, gpu ? gpu_state_.get() : cpu_state_.get(), sizeof(s));
    return s;
  }
  const DropoutState* cpu_state() const { return static_cast<const DropoutState*>(cpu_state_.get()); }
  const DropoutState* gpu_state() const { return static_cast<const DropoutState*>(gpu_state_.get()); }

  // Attention with probability dropout at one shape, every mask variant, against the CPU (Attention).
  void check_attention(int B, int T, int C, int NH);

  // One dropout result: the mask (zeros) is the hash's, bit for bit, on both backends; the kept values are
  // x * scale rounded once (equal for fp32, within one rounding of the storage type otherwise).
  ::testing::AssertionResult check_dropout(const std::string& what, const std::vector<float>& x,
                                           const std::vector<float>& cpu, const std::vector<float>& gpu,
                                           float p, uint64_t key, size_t index_base) const {
    const uint32_t threshold = dropout_threshold(p);
    const float scale = dropout_scale(p);
    // One rounding of the storage type: at most 2^-8 (bf16) or 2^-11 (fp16) of |value| relative, and one
    // fp16 subnormal step (2^-24) absolute.
    const double tol = act_ == DType::F32 ? 0.0 : ulps(act_, 2);
    const double abs_tol = act_ == DType::F16 ? 6e-8 : 0.0;
    size_t dropped = 0, nonzero = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] == 0.f) continue;
      ++nonzero;
      const bool keep = dropout_keep(key, index_base + i, threshold);
      dropped += keep ? 0 : 1;
      if (keep != (cpu[i] != 0.f) || keep != (gpu[i] != 0.f))
        return ::testing::AssertionFailure() << what << ": element " << i << " keep " << keep << " but cpu "
                                             << cpu[i] << ", cuda " << gpu[i] << " (x " << x[i] << ")";
      const double err = std::fabs(double(cpu[i]) - gpu[i]);
      if (err > tol * std::fabs(double(cpu[i])) + abs_tol)
        return ::testing::AssertionFailure() << what << ": element " << i << ": cpu " << cpu[i] << ", cuda "
                                             << gpu[i] << " (x " << x[i] << " * " << scale << ")";
    }
    const double fraction = nonzero ? double(dropped) / double(nonzero) : 0.0;
    if (std::getenv("ANVIL_PARITY_VERBOSE"))
      std::printf("  %-44s %s dropped %.4f (p %.2f)\n", what.c_str(), std::string(dtype_name(act_)).c_str(),
                  fraction, p);
    if (std::fabs(fraction - p) > 0.01)
      return ::testing::AssertionFailure() << what << ": dropped fraction " << fraction << ", p " << p;
    return ::testing::AssertionSuccess();
  }

  DeviceBuffer cpu_state_, gpu_state_;  // destroyed before the base's devices they live on
};

TEST_P(DropoutParity, Op) {
  const size_t n = 100003;  // no multiple of anything: vectors plus a tail
  const uint64_t seed = (uint64_t(rng_()) << 32) | rng_();
  Buf x = act(randn(n, 2.f)), y = act(randn(n, 100.f));
  const std::vector<float> xh = read(x, false);
  for (const float p : {0.1f, 0.5f}) {
    for (const uint32_t site : {3u, 1000u}) {
      for (const uint32_t micro : {0u, 7u}) {
        const std::string what = "dropout p=" + std::to_string(p) + " site=" + std::to_string(site) +
                                 " micro=" + std::to_string(micro);
        SCOPED_TRACE(what);
        set_state(seed, micro);
        const uint64_t key = dropout_key(seed, micro, site);
        // Forward into y.
        cpu_->dropout(y.cpu(), x.cpu(), n, p, cpu_state(), site);
        gpu_->dropout(y.gpu(), x.gpu(), n, p, gpu_state(), site);
        const std::vector<float> ycpu = read(y, false), ygpu = read(y, true);
        EXPECT_TRUE(check_dropout(what + " fwd", xh, ycpu, ygpu, p, key, 0));
        // Backward: the same call on the gradient, in place (y aliases x); here the gradient is y itself, so
        // the kept elements are scaled twice and the dropped ones stay 0. Each backend from the CPU's y.
        copy_cpu_to_gpu(y);
        cpu_->dropout(y.cpu(), y.cpu(), n, p, cpu_state(), site);
        gpu_->dropout(y.gpu(), y.gpu(), n, p, gpu_state(), site);
        EXPECT_TRUE(check_dropout(what + " bwd in place", xh, read(y, false), read(y, true), p, key, 0));
        // Not 16-byte aligned (the scalar kernel on CUDA): element i of the view is index i of the mask.
        const size_t off = 1;
        auto at = [&](void* base, size_t k) { return static_cast<char*>(base) + dtype_bytes(act_, k); };
        cpu_->dropout(at(y.cpu(), off), at(x.cpu(), off), n - off, p, cpu_state(), site);
        gpu_->dropout(at(y.gpu(), off), at(x.gpu(), off), n - off, p, gpu_state(), site);
        const std::vector<float> xv(xh.begin() + off, xh.end());
        EXPECT_TRUE(
            check_dropout(what + " unaligned", xv, read(y, false, off), read(y, true, off), p, key, 0));
      }
    }
  }
  // Different sites and micro-batches draw different masks.
  set_state(seed, 0);
  gpu_->dropout(y.gpu(), x.gpu(), n, 0.5f, gpu_state(), 3);
  const std::vector<float> a = read(y, true);
  gpu_->dropout(y.gpu(), x.gpu(), n, 0.5f, gpu_state(), 4);
  const std::vector<float> b = read(y, true);
  set_state(seed, 1);
  gpu_->dropout(y.gpu(), x.gpu(), n, 0.5f, gpu_state(), 3);
  const std::vector<float> c = read(y, true);
  size_t differ_site = 0, differ_micro = 0;
  for (size_t i = 0; i < n; ++i) {
    differ_site += (a[i] == 0.f) != (b[i] == 0.f);
    differ_micro += (a[i] == 0.f) != (c[i] == 0.f);
  }
  EXPECT_GT(differ_site, n / 4);
  EXPECT_GT(differ_micro, n / 4);
  // p = 0 copies.
  cpu_->dropout(y.cpu(), x.cpu(), n, 0.f, cpu_state(), 3);
  gpu_->dropout(y.gpu(), x.gpu(), n, 0.f, gpu_state(), 3);
  EXPECT_TRUE(close("dropout p=0 (cpu)", xh, read(y, false), 0.0));
  EXPECT_TRUE(close("dropout p=0 (cuda)", xh, read(y, true), 0.0));
}

// Rows of a bigger tensor (Ops::dropout_rows): row r draws the mask of row r * 7 of the whole tensor.
TEST_P(DropoutParity, Rows) {
  const int rows = 5, cols = 40009, every = 7;  // rows long enough for the dropped-fraction check
  const uint64_t seed = (uint64_t(rng_()) << 32) | rng_();
  const size_t n = size_t(rows) * cols;
  Buf x = act(randn(n, 2.f)), y = act(randn(n, 100.f));
  const std::vector<float> xh = read(x, false);
  const uint32_t site = 9;
  set_state(seed, 2);
  const uint64_t key = dropout_key(seed, 2, site);
  cpu_->dropout_rows(y.cpu(), x.cpu(), rows, cols, size_t(every) * cols, 0.25f, cpu_state(), site);
  gpu_->dropout_rows(y.gpu(), x.gpu(), rows, cols, size_t(every) * cols, 0.25f, gpu_state(), site);
  const std::vector<float> ycpu = read(y, false), ygpu = read(y, true);
  for (int r = 0; r < rows; ++r) {
    const auto row = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + size_t(r) * cols, v.begin() + size_t(r + 1) * cols);
    };
    EXPECT_TRUE(check_dropout("dropout_rows row " + std::to_string(r), row(xh), row(ycpu), row(ygpu), 0.25f,
                              key, size_t(r) * every * cols));
  }
}

// layernorm_bwd_sum with the residual branch's gradient (BERT's post-LayerNorm blocks): the gradient through
// the branch's dropout and its column sums (the branch bias), against the CPU's ops in sequence. Rows of the
// tensor itself and rows of a bigger one (index pitch), fp32 rows the fused kernel takes (C <= 1024) and
// ones it leaves to the unfused kernels; without dropout, the bias gradient of dinp itself.
TEST_P(DropoutParity, LayerNormBwdBranch) {
  struct Shape {
    int N, C, pitch_rows;
  };
  const uint64_t seed = (uint64_t(rng_()) << 32) | rng_();
  const double tol = act_ == DType::F32 ? 1e-4 : ulps(act_, 4);
  const double tol_sums = act_ == DType::F32 ? 1e-4 : ulps(act_, 8);
  for (const Shape s : {Shape{37, 1024, 1}, Shape{4, 64, 9}, Shape{19, 200, 1}, Shape{5, 1100, 1}}) {
    const size_t NC = size_t(s.N) * s.C;
    Buf inp = act(randn(NC, 2.f, 3.f)), w = act(randn(size_t(s.C), 0.5f, 1.f)), b = act(randn(size_t(s.C)));
    Buf out = act(randn(NC)), mean = f32(randn(size_t(s.N))), rstd = f32(randn(size_t(s.N)));
    cpu_->layernorm_fwd(out.cpu(), static_cast<float*>(mean.cpu()), static_cast<float*>(rstd.cpu()),
                        inp.cpu(), w.cpu(), b.cpu(), s.N, s.C);
    copy_cpu_to_gpu(mean);
    copy_cpu_to_gpu(rstd);
    for (const float p : {0.f, 0.1f}) {
      SCOPED_TRACE("N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + " pitch rows " +
                   std::to_string(s.pitch_rows) + " p=" + std::to_string(p));
      set_state(seed, 6);
      Buf dout = act(randn(NC)), dout2 = act(randn(NC, 0.5f)), dinp = act(randn(NC, 100.f));
      Buf dw = grad(randn(size_t(s.C))), db = grad(randn(size_t(s.C))), dbias = grad(randn(size_t(s.C)));
      Buf dbranch = act(randn(NC, 100.f));
      const auto branch = [&](bool gpu) {
        BranchGrad g;
        g.dbias = gpu ? dbias.gpu() : dbias.cpu();
        if (p > 0) {
          g.dbranch = gpu ? dbranch.gpu() : dbranch.cpu();
          g.drop = {p, gpu ? gpu_state() : cpu_state(), 11, size_t(s.pitch_rows) * s.C};
        }
        return g;
      };
      cpu_->layernorm_bwd_sum(dinp.cpu(), dw.cpu(), db.cpu(), dout.cpu(), dout2.cpu(), inp.cpu(), w.cpu(),
                              static_cast<const float*>(mean.cpu()), static_cast<const float*>(rstd.cpu()),
                              s.N, s.C, branch(false));
      gpu_->layernorm_bwd_sum(dinp.gpu(), dw.gpu(), db.gpu(), dout.gpu(), dout2.gpu(), inp.gpu(), w.gpu(),
                              static_cast<const float*>(mean.gpu()), static_cast<const float*>(rstd.gpu()),
                              s.N, s.C, branch(true));
      EXPECT_TRUE(same("layernorm_bwd_sum dinp", dinp, tol));
      EXPECT_TRUE(same("layernorm_bwd_sum dw", dw, tol_sums));
      EXPECT_TRUE(same("layernorm_bwd_sum db", db, tol_sums));
      EXPECT_TRUE(same("layernorm_bwd_sum branch dbias", dbias, tol_sums));
      if (p > 0) {
        EXPECT_TRUE(same("layernorm_bwd_sum dbranch", dbranch, tol));
        // The mask is the dropout op's: dbranch is dropout_rows of the CPU's dinp, on each backend.
        Buf ref = act(randn(NC, 100.f));
        cpu_->dropout_rows(ref.cpu(), dinp.cpu(), s.N, s.C, size_t(s.pitch_rows) * s.C, p, cpu_state(), 11);
        EXPECT_TRUE(close("dbranch = dropout_rows(dinp) (cpu)", read(ref, false), read(dbranch, false), 0.0));
        const std::vector<float> dg = read(dbranch, true), rg = read(ref, false);
        size_t mask_differs = 0;
        for (size_t i = 0; i < NC; ++i) mask_differs += (dg[i] == 0.f) != (rg[i] == 0.f);
        EXPECT_EQ(mask_differs, 0u) << "seed " << seed_;
      }
    }
  }
  // A dbranch without dropout, or dropout without a dbranch of its own, is refused.
  Buf x = act(randn(64)), wv = act(randn(8)), st = f32(randn(8));
  BranchGrad bad;
  bad.dbranch = x.gpu();
  EXPECT_THROW(gpu_->layernorm_bwd_sum(x.gpu(), nullptr, nullptr, x.gpu(), nullptr, x.gpu(), wv.gpu(),
                                       static_cast<const float*>(st.gpu()),
                                       static_cast<const float*>(st.gpu()), 8, 8, bad),
               std::exception);
  bad.drop = {0.1f, gpu_state(), 1, 8};
  bad.dbranch = nullptr;
  EXPECT_THROW(gpu_->layernorm_bwd_sum(x.gpu(), nullptr, nullptr, x.gpu(), nullptr, x.gpu(), wv.gpu(),
                                       static_cast<const float*>(st.gpu()),
                                       static_cast<const float*>(st.gpu()), 8, 8, bad),
               std::exception);
}

TEST_P(DropoutParity, NextMicro) {
  set_state(0x0123456789abcdefull, 41);
  cpu_->dropout_next_micro(static_cast<DropoutState*>(cpu_state_.get()));
  gpu_->dropout_next_micro(static_cast<DropoutState*>(gpu_state_.get()));
  gpu_->dropout_next_micro(static_cast<DropoutState*>(gpu_state_.get()));
  const DropoutState c = read_state(false), g = read_state(true);
  EXPECT_EQ(c.seed, 0x0123456789abcdefull);
  EXPECT_EQ(c.micro, 42u);
  EXPECT_EQ(g.seed, 0x0123456789abcdefull);
  EXPECT_EQ(g.micro, 43u);
}

// Attention with probability dropout against the CPU, at a shape where cuDNN flash attention would run
// without dropout (16-bit storage), for every mask variant.
TEST_P(DropoutParity, Attention) {
  // Head sizes 32 and 64 (fp32: the pair and the tiled fused forward), the second over several query and key
  // tiles of the fused kernels with ragged edges.
  for (const auto& [B, T, C, NH] : {std::array<int, 4>{3, 40, 64, 2}, std::array<int, 4>{2, 150, 128, 2}}) {
    SCOPED_TRACE("B " + std::to_string(B) + " T " + std::to_string(T) + " C " + std::to_string(C) + " NH " +
                 std::to_string(NH));
    check_attention(B, T, C, NH);
  }
}

void DropoutParity::check_attention(int B, int T, int C, int NH) {
  const float p = 0.1f;
  const uint32_t site = 12;
  const std::string impl = cuda_attention_implementation(act_, C, NH, false);
  const std::string impl_drop = cuda_attention_implementation(act_, C, NH, true);
  EXPECT_EQ(impl_drop, impl == "cudnn flash attention" ? "materialized attention (attention dropout)" : impl);
  EXPECT_EQ(gpu_->attention_scratch_bytes(B, T, C, NH, true),
            cuda_attention_scratch_bytes(act_, B, T, C, NH, true));
  const double tol_out = act_ == DType::F32 ? 5e-4 : ulps(act_, 4);
  const double tol_lse = act_ == DType::F32 ? 5e-4 : 1e-5;
  const double tol_dqkv = act_ == DType::F32 ? 5e-4 : ulps(act_, 6);
  const uint64_t seed = (uint64_t(rng_()) << 32) | rng_();
  for (int mask_kind = 0; mask_kind < 4; ++mask_kind) {
    const bool causal = mask_kind % 2 == 0, padded = mask_kind >= 2;
    SCOPED_TRACE(impl_drop + (causal ? " causal" : " bidirectional") + (padded ? " padded" : ""));
    set_state(seed, 3 + uint32_t(mask_kind));
    std::vector<int32_t> len_host(size_t(B), T);
    for (size_t b = 1; b < len_host.size(); ++b) len_host[b] = 1 + int(rng_() % uint32_t(T));
    Buf lengths = ints(len_host);
    AttentionMask cpu_mask{causal, padded ? static_cast<const int32_t*>(lengths.cpu()) : nullptr};
    AttentionMask gpu_mask{causal, padded ? static_cast<const int32_t*>(lengths.gpu()) : nullptr};
    cpu_mask.dropout = gpu_mask.dropout = p;
    cpu_mask.dropout_site = gpu_mask.dropout_site = site;
    cpu_mask.dropout_state = cpu_state();
    gpu_mask.dropout_state = gpu_state();
    const size_t BTC = size_t(B) * T * C, R = size_t(B) * NH * T;
    Buf qkv = act(randn(3 * BTC)), out = act(randn(BTC, 100.f)), lse = f32(randn(R, 100.f));
    DeviceBuffer cs(*cpu_dev_, std::max<size_t>(1, cpu_->attention_scratch_bytes(B, T, C, NH, true)));
    DeviceBuffer gs(*gpu_dev_, gpu_->attention_scratch_bytes(B, T, C, NH, true));
    cpu_->attention_fwd(out.cpu(), static_cast<float*>(lse.cpu()), qkv.cpu(), cs.get(), B, T, C, NH,
                        cpu_mask);
    gpu_->attention_fwd(out.gpu(), static_cast<float*>(lse.gpu()), qkv.gpu(), gs.get(), B, T, C, NH,
                        gpu_mask);
    EXPECT_TRUE(close("attention_fwd lse (dropout)", read(lse, false), read(lse, true), tol_lse));
    const std::vector<float> out_drop = read(out, true);
    EXPECT_TRUE(close("attention_fwd out (dropout)", read(out, false), out_drop, tol_out));

    // The mask does something: without dropout (the same scratch: cuDNN's where it runs) out differs.
    Buf out0 = act(randn(BTC, 100.f)), lse0 = f32(randn(R, 100.f));
    AttentionMask plain = gpu_mask;
    plain.dropout = 0;
    gpu_->attention_fwd(out0.gpu(), static_cast<float*>(lse0.gpu()), qkv.gpu(), gs.get(), B, T, C, NH, plain);
    EXPECT_TRUE(close("attention_fwd lse (dropout vs none)", read(lse0, true), read(lse, true),
                      act_ == DType::F32 ? 5e-4 : 1e-3));
    const std::vector<float> out_plain = read(out0, true);
    double max_diff = 0, max_abs = 0;
    for (size_t i = 0; i < BTC; ++i) {
      max_diff = std::max(max_diff, std::fabs(double(out_plain[i]) - out_drop[i]));
      max_abs = std::max(max_abs, std::fabs(double(out_plain[i])));
    }
    EXPECT_GT(max_diff, 0.05 * max_abs) << "attention dropout changed nothing; seed " << seed_;

    // Both backwards from the CPU's forward outputs.
    copy_cpu_to_gpu(out);
    copy_cpu_to_gpu(lse);
    Buf dout = act(randn(BTC)), dqkv = act(randn(3 * BTC, 100.f));
    cpu_->attention_bwd(dqkv.cpu(), dout.cpu(), qkv.cpu(), out.cpu(), static_cast<const float*>(lse.cpu()),
                        cs.get(), B, T, C, NH, cpu_mask);
    gpu_->attention_bwd(dqkv.gpu(), dout.gpu(), qkv.gpu(), out.gpu(), static_cast<const float*>(lse.gpu()),
                        gs.get(), B, T, C, NH, gpu_mask);
    const std::vector<float> ref = read(dqkv, false), got = read(dqkv, true);
    for (int part = 0; part < 3; ++part) {
      std::vector<float> r, g;
      for (size_t bt = 0; bt < size_t(B) * T; ++bt)
        for (int c = 0; c < C; ++c)
          r.push_back(ref[bt * 3 * C + part * C + c]), g.push_back(got[bt * 3 * C + part * C + c]);
      EXPECT_TRUE(close(std::string("attention_bwd d") + "qkv"[part] + " (dropout)", r, g, tol_dqkv));
    }
  }
}

// Attention of the first query only (BERT's [CLS]-rows block), with and without probability dropout, causal
// and bidirectional, padded (one sequence empty) or not, against the CPU: out, lse, dq and dkv. Head sizes 64
// and 48, and a sequence longer than the kernels' 1024-key chunks.
TEST_P(DropoutParity, FirstQueryAttention) {
  struct Shape {
    int B, T, C, NH;
  };
  const double tol_out = act_ == DType::F32 ? 5e-5 : ulps(act_, 4);
  const double tol_lse = act_ == DType::F32 ? 5e-5 : 1e-5;
  const double tol_grad = act_ == DType::F32 ? 5e-5 : ulps(act_, 6);
  const uint64_t seed = (uint64_t(rng_()) << 32) | rng_();
  for (const Shape s : {Shape{3, 37, 256, 4}, Shape{2, 1100, 96, 2}}) {
    for (int variant = 0; variant < 8; ++variant) {
      const bool causal = variant % 2 == 1, padded = variant / 2 % 2 == 1;
      const float p = variant >= 4 ? 0.1f : 0.f;
      SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
                   " NH=" + std::to_string(s.NH) + (causal ? " causal" : "") + (padded ? " padded" : "") +
                   " p=" + std::to_string(p));
      set_state(seed, 5 + uint32_t(variant));
      std::vector<int32_t> len_host(size_t(s.B), s.T);
      len_host[0] = 0;  // an empty sequence: zero output, lse and gradients
      for (size_t b = 1; b < len_host.size(); ++b) len_host[b] = 1 + int(rng_() % uint32_t(s.T));
      Buf lengths = ints(len_host);
      AttentionMask cpu_mask{causal, padded ? static_cast<const int32_t*>(lengths.cpu()) : nullptr};
      AttentionMask gpu_mask{causal, padded ? static_cast<const int32_t*>(lengths.gpu()) : nullptr};
      cpu_mask.dropout = gpu_mask.dropout = p;
      cpu_mask.dropout_site = gpu_mask.dropout_site = 21;
      cpu_mask.dropout_state = cpu_state();
      gpu_mask.dropout_state = gpu_state();
      const size_t BC = size_t(s.B) * s.C, BTC = BC * s.T, R = size_t(s.B) * s.NH;
      Buf q = act(randn(BC)), kv = act(randn(2 * BTC)), out = act(randn(BC, 100.f)),
          lse = f32(randn(R, 100.f));
      cpu_->attention_first_query_fwd(out.cpu(), static_cast<float*>(lse.cpu()), q.cpu(), kv.cpu(), s.B, s.T,
                                      s.C, s.NH, cpu_mask);
      gpu_->attention_first_query_fwd(out.gpu(), static_cast<float*>(lse.gpu()), q.gpu(), kv.gpu(), s.B, s.T,
                                      s.C, s.NH, gpu_mask);
      EXPECT_TRUE(same("attention_first_query_fwd out", out, tol_out));
      EXPECT_TRUE(close("attention_first_query_fwd lse", read(lse, false), read(lse, true), tol_lse));
      // Both backwards from the CPU's forward.
      copy_cpu_to_gpu(out);
      copy_cpu_to_gpu(lse);
      Buf dout = act(randn(BC)), dq = act(randn(BC, 100.f)), dkv = act(randn(2 * BTC, 100.f));
      cpu_->attention_first_query_bwd(dq.cpu(), dkv.cpu(), dout.cpu(), q.cpu(), kv.cpu(), out.cpu(),
                                      static_cast<const float*>(lse.cpu()), s.B, s.T, s.C, s.NH, cpu_mask);
      gpu_->attention_first_query_bwd(dq.gpu(), dkv.gpu(), dout.gpu(), q.gpu(), kv.gpu(), out.gpu(),
                                      static_cast<const float*>(lse.gpu()), s.B, s.T, s.C, s.NH, gpu_mask);
      if (causal) {
        // Query 0 sees key 0 alone: its q gradient is 0 up to the rounding of D = dout . out (out in the
        // storage type), which a relative check of dq cannot judge; both sides' noise is judged against dkv's
        // scale.
        const std::vector<float> ref = read(dq, false), got = read(dq, true), dkv_ref = read(dkv, false);
        double scale = 1e-30;
        for (const float x : dkv_ref) scale = std::max(scale, double(std::fabs(x)));
        for (size_t i = 0; i < ref.size(); ++i)
          EXPECT_LE(std::fabs(double(ref[i]) - got[i]), tol_grad * scale)
              << "dq[" << i << "]; seed " << seed_;
      } else {
        EXPECT_TRUE(same("attention_first_query_bwd dq", dq, tol_grad));
      }
      EXPECT_TRUE(same("attention_first_query_bwd dkv", dkv, tol_grad));
      // The empty sequence's gradients are exactly 0 on the GPU too (overwritten, not left).
      const std::vector<float> g = read(dkv, true);
      EXPECT_TRUE(std::all_of(g.begin(), g.begin() + 2 * size_t(s.T) * s.C,
                              [&](float x) { return !padded || x == 0.f; }));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DropoutParity, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         dtype_case_name);

}  // namespace
}  // namespace anvil
