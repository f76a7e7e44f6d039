// Parity of the CUDA ops with the CPU reference in bf16 and fp16 storage (the CPU emulates 16-bit storage
// with fp32 math): fresh random inputs, rounded once to the storage type on the host and copied to both
// backends; outputs widened back to fp32 and compared relative to the largest |CPU value|. The two backends
// differ only in fp32 summation order, which can move a result across a rounding boundary, so the
// tolerances are a few units in the last place of the storage type. Each case runs with fp32 gradients and
// with 16-bit gradients. ANVIL_PARITY_SEED replays a run; ANVIL_PARITY_VERBOSE=1 prints every error.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "kernels/ops.hpp"
#include "parity_fixture.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

struct Case {
  DType compute;
  bool half_grads;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(info.param.compute == DType::BF16 ? "Bf16" : "Fp16") +
         (info.param.half_grads ? "Grads16" : "Grads32");
}

class MixedParity : public parity::TypedParityFixture<Case> {
 protected:
  OpsPrecision precision() const override {
    return {GetParam().compute, GetParam().half_grads ? GetParam().compute : DType::F32};
  }
};

TEST_P(MixedParity, Embedding) {
  const int B = 3, T = 17, C = 40, V = 50, maxT = 32;
  std::uniform_int_distribution<int32_t> tok(0, V - 1);
  std::vector<int32_t> ids(size_t(B) * T);
  for (int32_t& t : ids) t = tok(rng_);
  Buf tokens = ints(ids);
  Buf wte = act(randn(size_t(V) * C)), wpe = act(randn(size_t(maxT) * C));
  Buf out = act(randn(size_t(B) * T * C, 100.f));
  cpu_->embedding_fwd(out.cpu(), static_cast<int32_t*>(tokens.cpu()), wte.cpu(), wpe.cpu(), B, T, C);
  gpu_->embedding_fwd(out.gpu(), static_cast<int32_t*>(tokens.gpu()), wte.gpu(), wpe.gpu(), B, T, C);
  EXPECT_TRUE(same("embedding_fwd", out, ulps(act_, 1)));
  Buf dout = act(randn(size_t(B) * T * C));
  Buf dwte = grad(randn(size_t(V) * C)), dwpe = grad(randn(size_t(maxT) * C));
  cpu_->embedding_bwd(dwte.cpu(), dwpe.cpu(), dout.cpu(), static_cast<int32_t*>(tokens.cpu()), B, T, C);
  gpu_->embedding_bwd(dwte.gpu(), dwpe.gpu(), dout.gpu(), static_cast<int32_t*>(tokens.gpu()), B, T, C);
  // 16-bit gradients accumulate with one rounding per atomic add on the GPU (per token), once on the CPU.
  const double tol = grad_ == DType::F32 ? 1e-5 : ulps(grad_, 8);
  EXPECT_TRUE(same("embedding_bwd dwte", dwte, tol));
  EXPECT_TRUE(same("embedding_bwd dwpe", dwpe, tol));
}

TEST_P(MixedParity, LayerNorm) {
  // C = 192: rows of whole 16-byte vectors (the vectorised kernels); C = 100: element by element.
  for (const int C : {192, 100}) {
    SCOPED_TRACE("C=" + std::to_string(C));
    const int N = 67;
    const size_t NC = size_t(N) * C;
    Buf inp = act(randn(NC, 2.f, 3.f)), w = act(randn(C, 0.5f, 1.f)), b = act(randn(C, 0.5f));
    Buf out = act(randn(NC, 100.f)), mean = f32(randn(N)), rstd = f32(randn(N));
    cpu_->layernorm_fwd(out.cpu(), static_cast<float*>(mean.cpu()), static_cast<float*>(rstd.cpu()),
                        inp.cpu(), w.cpu(), b.cpu(), N, C);
    gpu_->layernorm_fwd(out.gpu(), static_cast<float*>(mean.gpu()), static_cast<float*>(rstd.gpu()),
                        inp.gpu(), w.gpu(), b.gpu(), N, C);
    EXPECT_TRUE(same("layernorm_fwd out", out, ulps(act_, 2)));
    EXPECT_TRUE(same("layernorm_fwd mean", mean, 1e-5));
    EXPECT_TRUE(same("layernorm_fwd rstd", rstd, 1e-4));
    Buf dout = act(randn(NC)), dinp = act(randn(NC)), dw = grad(randn(C)), db = grad(randn(C));
    cpu_->layernorm_bwd(dinp.cpu(), dw.cpu(), db.cpu(), dout.cpu(), inp.cpu(), w.cpu(),
                        static_cast<float*>(mean.cpu()), static_cast<float*>(rstd.cpu()), N, C);
    gpu_->layernorm_bwd(dinp.gpu(), dw.gpu(), db.gpu(), dout.gpu(), inp.gpu(), w.gpu(),
                        static_cast<float*>(mean.gpu()), static_cast<float*>(rstd.gpu()), N, C);
    EXPECT_TRUE(same("layernorm_bwd dinp", dinp, ulps(act_, 2)));
    const double gtol = grad_ == DType::F32 ? 1e-4 : ulps(grad_, 4);
    EXPECT_TRUE(same("layernorm_bwd dw", dw, gtol));
    EXPECT_TRUE(same("layernorm_bwd db", db, gtol));
  }
}

// The output gradient as a pair, each sum rounded to the storage type on both backends (as residual_fwd
// would store it); dinp overwritten, also written over dout2.
TEST_P(MixedParity, LayerNormBwdSum) {
  for (const int C : {192, 100}) {
    const int N = 67;
    const size_t NC = size_t(N) * C;
    Buf inp = act(randn(NC, 2.f, 3.f)), w = act(randn(C, 0.5f, 1.f)), b = act(randn(C, 0.5f));
    Buf out = act(randn(NC, 100.f)), mean = f32(randn(N)), rstd = f32(randn(N));
    cpu_->layernorm_fwd(out.cpu(), static_cast<float*>(mean.cpu()), static_cast<float*>(rstd.cpu()),
                        inp.cpu(), w.cpu(), b.cpu(), N, C);
    copy_cpu_to_gpu(mean);  // the same statistics on both sides: only the backward is compared
    copy_cpu_to_gpu(rstd);
    for (const int variant : {0, 1, 2}) {  // 0: dout only, 1: dout + dout2, 2: dinp = dout2 (aliased)
      SCOPED_TRACE("C=" + std::to_string(C) + " variant " + std::to_string(variant));
      Buf dout = act(randn(NC)), dout2 = act(randn(NC, 0.5f)), dinp = act(randn(NC, 100.f));
      Buf dw = grad(randn(C)), db = grad(randn(C));
      Buf& di = variant == 2 ? dout2 : dinp;
      const bool sum = variant >= 1;
      cpu_->layernorm_bwd_sum(di.cpu(), dw.cpu(), db.cpu(), dout.cpu(), sum ? dout2.cpu() : nullptr,
                              inp.cpu(), w.cpu(), static_cast<float*>(mean.cpu()),
                              static_cast<float*>(rstd.cpu()), N, C);
      gpu_->layernorm_bwd_sum(di.gpu(), dw.gpu(), db.gpu(), dout.gpu(), sum ? dout2.gpu() : nullptr,
                              inp.gpu(), w.gpu(), static_cast<float*>(mean.gpu()),
                              static_cast<float*>(rstd.gpu()), N, C);
      EXPECT_TRUE(same("layernorm_bwd_sum dinp", di, ulps(act_, 2)));
      const double gtol = grad_ == DType::F32 ? 1e-4 : ulps(grad_, 4);
      EXPECT_TRUE(same("layernorm_bwd_sum dw", dw, gtol));
      EXPECT_TRUE(same("layernorm_bwd_sum db", db, gtol));
    }
  }
}

TEST_P(MixedParity, Matmul) {
  struct S {
    int N, K, OC;
  };
  for (const S s : {S{37, 29, 51}, S{256, 768, 768}, S{64, 128, 50304}}) {
    SCOPED_TRACE("N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) + " OC=" + std::to_string(s.OC));
    const size_t NK = size_t(s.N) * s.K, NOC = size_t(s.N) * s.OC, OCK = size_t(s.OC) * s.K;
    Buf inp = act(randn(NK)), w = act(randn(OCK, 0.2f)), bias = act(randn(s.OC));
    Buf out = act(randn(NOC, 100.f));
    cpu_->matmul_fwd(out.cpu(), inp.cpu(), w.cpu(), bias.cpu(), s.N, s.K, s.OC);
    gpu_->matmul_fwd(out.gpu(), inp.gpu(), w.gpu(), bias.gpu(), s.N, s.K, s.OC);
    EXPECT_TRUE(same("matmul_fwd", out, ulps(act_, 2)));
    Buf dout = act(randn(NOC)), dinp = act(randn(NK, 100.f));
    Buf dw = grad(randn(OCK)), dbias = grad(randn(s.OC));
    cpu_->matmul_bwd(dinp.cpu(), dw.cpu(), dbias.cpu(), dout.cpu(), inp.cpu(), w.cpu(), s.N, s.K, s.OC);
    gpu_->matmul_bwd(dinp.gpu(), dw.gpu(), dbias.gpu(), dout.gpu(), inp.gpu(), w.gpu(), s.N, s.K, s.OC);
    EXPECT_TRUE(same("matmul_bwd dinp", dinp, ulps(act_, 2)));
    const double gtol = grad_ == DType::F32 ? 2e-4 : ulps(grad_, 2);
    EXPECT_TRUE(same("matmul_bwd dw", dw, gtol));
    EXPECT_TRUE(same("matmul_bwd dbias", dbias, grad_ == DType::F32 ? 1e-4 : ulps(grad_, 4)));
  }
}

TEST_P(MixedParity, MatmulGeluEpilogues) {
  const int N = 256, K = 768, OC = 3072;
  const size_t NK = size_t(N) * K, NOC = size_t(N) * OC, OCK = size_t(OC) * K;
  Buf inp = act(randn(NK)), w = act(randn(OCK, 0.05f)), bias = act(randn(OC));
  Buf out = act(randn(NOC, 100.f)), pre = act(randn(NOC, 100.f));
  cpu_->matmul_gelu_fwd(out.cpu(), pre.cpu(), inp.cpu(), w.cpu(), bias.cpu(), N, K, OC);
  gpu_->matmul_gelu_fwd(out.gpu(), pre.gpu(), inp.gpu(), w.gpu(), bias.gpu(), N, K, OC);
  EXPECT_TRUE(same("matmul_gelu_fwd pre", pre, ulps(act_, 2)));
  // The GPU applies GELU to the fp32 GEMM result, the CPU to the rounded pre-activation: two roundings.
  EXPECT_TRUE(same("matmul_gelu_fwd out", out, ulps(act_, 3)));
  copy_cpu_to_gpu(out);
  copy_cpu_to_gpu(pre);
  Buf w2 = act(randn(OCK, 0.05f)), dout = act(randn(NK)), dinp = act(randn(NOC, 100.f));
  Buf dw = grad(randn(OCK)), dbias = grad(randn(K));
  cpu_->matmul_bwd_dgelu(dinp.cpu(), dw.cpu(), dbias.cpu(), dout.cpu(), out.cpu(), w2.cpu(), pre.cpu(), N, OC,
                         K);
  gpu_->matmul_bwd_dgelu(dinp.gpu(), dw.gpu(), dbias.gpu(), dout.gpu(), out.gpu(), w2.gpu(), pre.gpu(), N, OC,
                         K);
  EXPECT_TRUE(same("matmul_bwd_dgelu dinp", dinp, ulps(act_, 3)));
  const double gtol = grad_ == DType::F32 ? 2e-4 : ulps(grad_, 2);
  EXPECT_TRUE(same("matmul_bwd_dgelu dw", dw, gtol));
  EXPECT_TRUE(same("matmul_bwd_dgelu dbias", dbias, grad_ == DType::F32 ? 1e-4 : ulps(grad_, 4)));
}

// Both CUDA attention paths (cuDNN flash attention where the build and head size allow it, and the
// materialised one) against the CPU, for every mask variant.
TEST_P(MixedParity, Attention) {
  struct S {
    int B, T, C, NH;
  };
  for (const char* impl : {"auto", "materialized"}) {
    setenv("ANVIL_ATTENTION", impl, 1);
    for (const S s :
         {S{2, 67, 48, 4}, S{2, 67, 64, 4}, S{4, 256, 384, 6}, S{3, 1, 32, 2}, S{2, 1024, 768, 12}}) {
      for (int mask_kind = 0; mask_kind < 4; ++mask_kind) {
        const bool causal = mask_kind % 2 == 0, padded = mask_kind >= 2;
        if (s.T == 1024 && mask_kind != 0) continue;  // the GPT-2 shape: causal only (CPU time)
        SCOPED_TRACE(std::string(cuda_attention_implementation(act_, s.C, s.NH)) +
                     " B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C) +
                     " NH=" + std::to_string(s.NH) + (causal ? " causal" : " bidirectional") +
                     (padded ? " padded" : ""));
        std::vector<int32_t> len_host(size_t(s.B), s.T);
        for (size_t b = 1; b < len_host.size(); ++b) len_host[b] = 1 + int(rng_() % uint32_t(s.T));
        Buf lengths = ints(len_host);
        const AttentionMask cpu_mask{causal, padded ? static_cast<const int32_t*>(lengths.cpu()) : nullptr};
        const AttentionMask gpu_mask{causal, padded ? static_cast<const int32_t*>(lengths.gpu()) : nullptr};
        const size_t BTC = size_t(s.B) * s.T * s.C, R = size_t(s.B) * s.NH * s.T;
        Buf qkv = act(randn(3 * BTC)), out = act(randn(BTC, 100.f)), lse = f32(randn(R, 100.f));
        DeviceBuffer cs(*cpu_dev_, std::max<size_t>(1, cpu_->attention_scratch_bytes(s.B, s.T, s.C, s.NH)));
        DeviceBuffer gs(*gpu_dev_, gpu_->attention_scratch_bytes(s.B, s.T, s.C, s.NH));
        cpu_->attention_fwd(out.cpu(), static_cast<float*>(lse.cpu()), qkv.cpu(), cs.get(), s.B, s.T, s.C,
                            s.NH, cpu_mask);
        gpu_->attention_fwd(out.gpu(), static_cast<float*>(lse.gpu()), qkv.gpu(), gs.get(), s.B, s.T, s.C,
                            s.NH, gpu_mask);
        EXPECT_TRUE(same("attention_fwd lse", lse, 1e-5));
        EXPECT_TRUE(same("attention_fwd out", out, ulps(act_, 4)));
        // Both backwards from the CPU's forward outputs.
        copy_cpu_to_gpu(out);
        copy_cpu_to_gpu(lse);
        Buf dout = act(randn(BTC)), dqkv = act(randn(3 * BTC, 100.f));
        cpu_->attention_bwd(dqkv.cpu(), dout.cpu(), qkv.cpu(), out.cpu(),
                            static_cast<const float*>(lse.cpu()), cs.get(), s.B, s.T, s.C, s.NH, cpu_mask);
        gpu_->attention_bwd(dqkv.gpu(), dout.gpu(), qkv.gpu(), out.gpu(),
                            static_cast<const float*>(lse.gpu()), gs.get(), s.B, s.T, s.C, s.NH, gpu_mask);
        const std::vector<float> ref = read(dqkv, false), got = read(dqkv, true);
        for (int part = 0; part < 3; ++part) {
          std::vector<float> r, g;
          for (size_t bt = 0; bt < size_t(s.B) * s.T; ++bt)
            for (int c = 0; c < s.C; ++c)
              r.push_back(ref[bt * 3 * s.C + part * s.C + c]),
                  g.push_back(got[bt * 3 * s.C + part * s.C + c]);
          EXPECT_TRUE(close(std::string("attention_bwd d") + "qkv"[part], r, g, ulps(act_, 6)));
        }
      }
    }
  }
  unsetenv("ANVIL_ATTENTION");
}

TEST_P(MixedParity, GeluResidualLoss) {
  const size_t n = 100003;
  Buf x = act(randn(n, 3.f)), y = act(randn(n, 100.f));
  cpu_->gelu_fwd(y.cpu(), x.cpu(), n);
  gpu_->gelu_fwd(y.gpu(), x.gpu(), n);
  EXPECT_TRUE(same("gelu_fwd", y, ulps(act_, 1)));
  Buf dout = act(randn(n)), dinp = act(randn(n, 100.f));
  cpu_->gelu_bwd(dinp.cpu(), x.cpu(), dout.cpu(), n);
  gpu_->gelu_bwd(dinp.gpu(), x.gpu(), dout.gpu(), n);
  EXPECT_TRUE(same("gelu_bwd", dinp, ulps(act_, 1)));
  Buf a = act(randn(n)), b = act(randn(n));
  cpu_->residual_fwd(a.cpu(), a.cpu(), b.cpu(), n);
  gpu_->residual_fwd(a.gpu(), a.gpu(), b.gpu(), n);
  EXPECT_TRUE(same("residual_fwd", a, 0.0));  // one rounding of an exact fp32 sum: identical

  // Vocabulary widths: whole 16-byte vectors; vectors plus a scalar tail below V; rows not 16-byte aligned.
  for (const auto& [V, Vp] : {std::pair{1000, 1024}, std::pair{1003, 1008}, std::pair{1003, 1005}}) {
    SCOPED_TRACE("V=" + std::to_string(V) + " Vp=" + std::to_string(Vp));
    const int N = 24;
    std::vector<float> lh = randn(size_t(N) * Vp, 3.f);
    std::vector<int32_t> th(N);
    std::uniform_int_distribution<int32_t> tok(0, V - 1);
    for (int i = 0; i < N; ++i) th[i] = i % 5 == 2 ? kIgnoreIndex : tok(rng_);
    th[0] = V - 1;  // the last real column as a target
    Buf targets = ints(th), logits = act(lh), losses = f32(randn(N));
    const float scale = act_ == DType::F16 ? 1024.f : 1.f;  // fp16 gradients carry a loss scale
    cpu_->softmax_xent_fwd_bwd(static_cast<float*>(losses.cpu()), logits.cpu(),
                               static_cast<int32_t*>(targets.cpu()), N, V, Vp, scale, true);
    gpu_->softmax_xent_fwd_bwd(static_cast<float*>(losses.gpu()), logits.gpu(),
                               static_cast<int32_t*>(targets.gpu()), N, V, Vp, scale, true);
    EXPECT_TRUE(same("softmax_xent losses", losses, 1e-5));
    EXPECT_TRUE(same("softmax_xent grad", logits, ulps(act_, 2)));
  }
}

TEST_P(MixedParity, ReductionCastAdamW) {
  const size_t n = (size_t{1} << 20) + 3;
  Buf g = grad(randn(n, 0.1f));
  const double c = cpu_->sum_squares(g.cpu(), grad_, n), d = gpu_->sum_squares(g.gpu(), grad_, n);
  EXPECT_NEAR(c, d, 1e-9 * c);
  // An infinity anywhere makes the norm non-finite (the fp16 overflow check).
  const uint16_t inf16 = grad_ == DType::BF16 ? 0x7f80 : 0x7c00;
  const float inf32 = INFINITY;
  gpu_dev_->copy_to_device(static_cast<char*>(g.gpu()) + (n / 2) * dtype_bytes(grad_, 1),
                           grad_ == DType::F32 ? static_cast<const void*>(&inf32) : &inf16,
                           dtype_bytes(grad_, 1));
  EXPECT_FALSE(std::isfinite(gpu_->sum_squares(g.gpu(), grad_, n)));

  // Master weights to the compute type: round to nearest on both is bit-identical; so is stochastic
  // rounding (the same counter hash on both backends).
  const std::vector<float> master_h = randn(n, 0.05f);
  Buf master = f32(master_h), w = act(randn(n));
  for (const uint64_t rseed : {uint64_t{0}, uint64_t{0x1234567}}) {
    cpu_->cast_weights(w.cpu(), static_cast<float*>(master.cpu()), n, rseed, nullptr);
    gpu_->cast_weights(w.gpu(), static_cast<float*>(master.gpu()), n, rseed, nullptr);
    EXPECT_TRUE(same(rseed ? "cast_weights stochastic" : "cast_weights", w, 0.0));
  }

  Buf p = f32(randn(n)), m = f32(randn(n, 0.1f)), gr = grad(randn(n, 3.f));
  std::vector<float> vh = randn(n, 0.01f);
  for (float& x : vh) x = std::fabs(x);
  Buf v = f32(vh);
  // One range in group 0, on each device.
  Buf begins = make(std::vector<float>(2, 0.f), DType::F32);  // 8 zero bytes: begins[0] = 0, groups[0] = 0
  const ParamGroupTable cpu_t{static_cast<uint64_t*>(begins.cpu()), static_cast<uint8_t*>(begins.cpu()),
                              nullptr, 1};
  const ParamGroupTable gpu_t{static_cast<uint64_t*>(begins.gpu()), static_cast<uint8_t*>(begins.gpu()),
                              nullptr, 1};
  FusedAdamWArgs a;
  a.lr[0] = 3e-4f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.weight_decay[0] = 0.1f, a.step = 7, a.grad_scale = 0.5f;
  cpu_->adamw_fused_step(static_cast<float*>(p.cpu()), gr.cpu(), m.cpu(), v.cpu(), DType::F32, n, cpu_t, a);
  gpu_->adamw_fused_step(static_cast<float*>(p.gpu()), gr.gpu(), m.gpu(), v.gpu(), DType::F32, n, gpu_t, a);
  EXPECT_TRUE(same("adamw param", p, 1e-5));
  EXPECT_TRUE(same("adamw m", m, 1e-5));
  EXPECT_TRUE(same("adamw v", v, 1e-5));
}

// convert_grads: one fp32 operation rounded once into the destination type, so both backends agree bit for
// bit, in every pairing of the three types (the gradient type with bf16 and fp16: communication_data_type),
// copying and adding; an odd length covers the kernels' tails.
TEST_P(MixedParity, ConvertGrads) {
  const size_t n = 100003;
  const auto rounded = [](DType t, float v) {
    return t == DType::F32    ? v
           : t == DType::BF16 ? bf16_to_float(float_to_bf16(v))
                              : fp16_to_float(float_to_fp16(v));
  };
  for (const DType other : {DType::F32, DType::BF16, DType::F16})
    for (const bool accumulate : {false, true})
      for (const bool into_grad : {false, true}) {
        const DType dt = into_grad ? grad_ : other, st = into_grad ? other : grad_;
        Buf dst = make(randn(n), dt), src = make(randn(n), st);
        const std::vector<float> before = read(dst, false), moved = read(src, false);
        cpu_->convert_grads(dst.cpu(), dt, src.cpu(), st, n, accumulate);
        gpu_->convert_grads(dst.gpu(), dt, src.gpu(), st, n, accumulate);
        const std::string what = fmt::format("convert_grads {} <- {}{}", dtype_name(dt), dtype_name(st),
                                             accumulate ? " (accumulate)" : "");
        EXPECT_TRUE(same(what, dst, 0.0));
        const std::vector<float> got = read(dst, false);
        for (size_t i = 0; i < n; i += 9973)
          EXPECT_EQ(got[i], rounded(dt, accumulate ? before[i] + moved[i] : moved[i]))
              << what << ", element " << i;
      }
  gpu_->convert_grads(nullptr, grad_, nullptr, DType::BF16, 0, true);  // nothing to convert: no launch
}

// convert_grads_sum_squares: the conversion of convert_grads, bit for bit, and the squares of what it wrote
// added into an fp64 value (the CPU reference: convert_grads then sum_squares) to 1e-12 relative; on the GPU
// also with the destination in pinned host memory, written by the kernel over the bus (offloaded gradients).
TEST_P(MixedParity, ConvertGradsSumSquares) {
  const size_t n = 300007;
  for (const DType st : {grad_, act_})
    for (const bool accumulate : {false, true}) {
      const std::string what = fmt::format("convert_grads_sum_squares {} <- {}{}", dtype_name(grad_),
                                           dtype_name(st), accumulate ? " (accumulate)" : "");
      Buf dst = make(randn(n), grad_), src = make(randn(n), st);
      const size_t bytes = dtype_bytes(grad_, n);
      PinnedBuffer host(*gpu_dev_, bytes);  // the same start as dst
      gpu_dev_->copy_to_host(host.get(), dst.gpu(), bytes);
      double cpu_sum = 0.5;  // accumulates into what is there
      cpu_->convert_grads_sum_squares(dst.cpu(), grad_, src.cpu(), st, n, accumulate, &cpu_sum);
      DeviceBuffer sums(*gpu_dev_, 2 * sizeof(double));
      const double start[2] = {0.5, 0.5};
      gpu_dev_->copy_to_device(sums.get(), start, sizeof(start));
      double* gpu_sums = static_cast<double*>(sums.get());
      gpu_->convert_grads_sum_squares(dst.gpu(), grad_, src.gpu(), st, n, accumulate, gpu_sums);
      gpu_->convert_grads_sum_squares(host.get(), grad_, src.gpu(), st, n, accumulate, gpu_sums + 1);
      double got[2];
      gpu_dev_->copy_to_host(got, sums.get(), sizeof(got));
      EXPECT_TRUE(same(what, dst, 0.0));
      std::vector<unsigned char> device_bytes(bytes);
      gpu_dev_->copy_to_host(device_bytes.data(), dst.gpu(), bytes);
      EXPECT_EQ(std::memcmp(device_bytes.data(), host.get(), bytes), 0) << what << ": pinned destination";
      double reference = 0.5;
      cpu_->sum_squares_to(&reference, dst.cpu(), grad_, n);
      EXPECT_NEAR(cpu_sum, 0.5 + reference, 1e-15 * reference) << what;
      EXPECT_NEAR(got[0], cpu_sum, 1e-12 * cpu_sum) << what;
      EXPECT_EQ(got[1], got[0]) << what << ": pinned destination";
    }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MixedParity,
                         ::testing::Values(Case{DType::BF16, false}, Case{DType::BF16, true},
                                           Case{DType::F16, false}, Case{DType::F16, true}),
                         case_name);

}  // namespace
}  // namespace anvil
