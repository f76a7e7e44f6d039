// Parity of the CUDA Llama-family ops with the CPU reference: RMSNorm (and residual_rmsnorm_fwd), RoPE,
// SwiGLU and the embedding without learned positions, in fp32, bf16 and fp16 storage (16-bit with fp32 and
// with 16-bit gradients). Fresh random inputs each run (ANVIL_PARITY_SEED replays one), compared relative to
// the largest |CPU value| (ANVIL_PARITY_VERBOSE=1 prints every error). Shapes cover Llama's (C = 2048 and
// 4096, I = 8192 and 11008, head sizes 64 and 128, grouped-query heads, positions up to 8192 with rope_theta
// 500000 and a nonzero pos_offset) and the kernels' other paths: rows that are not whole 16-byte vectors,
// rows too wide for registers, more rows than the backward's resident blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

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
  const DType c = info.param.compute;
  return std::string(c == DType::F32    ? "Fp32"
                     : c == DType::BF16 ? "Bf16"
                                        : "Fp16") +
         (info.param.half_grads ? "Grads16" : "Grads32");
}

// Hugging Face's inverse frequencies: 1 / theta^(2i / HS).
std::vector<float> inv_freq_for(int HS, double theta) {
  std::vector<float> f(size_t(HS / 2));
  for (int i = 0; i < HS / 2; ++i) f[i] = float(1.0 / std::pow(theta, 2.0 * i / HS));
  return f;
}

class DecoderParity : public parity::TypedParityFixture<Case> {
 protected:
  OpsPrecision precision() const override {
    const DType c = GetParam().compute;
    return {c, GetParam().half_grads ? c : DType::F32};
  }
  // Tolerances relative to max |cpu|: fp32 results of row reductions (the CPU sums in fp64, CUDA in fp32),
  // else a few units in the last place of the storage type (the two backends round slightly different fp32
  // values).
  double row_tol(double ulp_count) const { return act_ == DType::F32 ? 1e-4 : ulps(act_, ulp_count); }
  double elementwise_tol(double ulp_count) const { return act_ == DType::F32 ? 1e-5 : ulps(act_, ulp_count); }
  // dw: fp32 gradients are fp32 sums in another order; 16-bit ones are rounded once per chunk of 256 rows
  // on CUDA (once in all on the CPU).
  double dw_tol(int N) const {
    if (grad_ == DType::F32) return 1e-4;
    return ulps(grad_, N <= 256 ? 4 : 8);
  }
  static float* fp(const Buf& b, bool gpu) { return static_cast<float*>(gpu ? b.gpu() : b.cpu()); }
};

struct NormShape {
  int N, C;
};
// Llama's widths, one not a whole number of 16-byte vectors (element by element), one too wide to keep in
// registers (two passes), and enough rows that the fused fp32 backward loops over rows in each block.
const NormShape kNormShapes[] = {{67, 2048}, {129, 4096}, {37, 100}, {3, 20000}, {4099, 2048}, {1000, 64}};

TEST_P(DecoderParity, RmsNorm) {
  for (const NormShape s : kNormShapes) {
    SCOPED_TRACE("N=" + std::to_string(s.N) + " C=" + std::to_string(s.C));
    const size_t NC = size_t(s.N) * s.C;
    const float eps = 1e-5f;
    Buf inp = act(randn(NC, 2.f, 0.5f)), w = act(randn(s.C, 0.3f, 1.f));
    Buf out = act(randn(NC, 100.f)), rstd = f32(randn(s.N, 100.f));
    cpu_->rmsnorm_fwd(out.cpu(), fp(rstd, false), inp.cpu(), w.cpu(), s.N, s.C, eps);
    gpu_->rmsnorm_fwd(out.gpu(), fp(rstd, true), inp.gpu(), w.gpu(), s.N, s.C, eps);
    EXPECT_TRUE(same("rmsnorm_fwd out", out, row_tol(2)));
    EXPECT_TRUE(same("rmsnorm_fwd rstd", rstd, 1e-5));

    // The backward from the same statistics on both sides; dinp and dw accumulate onto nonzero values.
    copy_cpu_to_gpu(rstd);
    Buf dout = act(randn(NC)), dinp = act(randn(NC)), dw = grad(randn(s.C));
    cpu_->rmsnorm_bwd(dinp.cpu(), dw.cpu(), dout.cpu(), inp.cpu(), w.cpu(), fp(rstd, false), s.N, s.C);
    gpu_->rmsnorm_bwd(dinp.gpu(), dw.gpu(), dout.gpu(), inp.gpu(), w.gpu(), fp(rstd, true), s.N, s.C);
    EXPECT_TRUE(same("rmsnorm_bwd dinp", dinp, row_tol(2)));
    EXPECT_TRUE(same("rmsnorm_bwd dw", dw, dw_tol(s.N)));
  }
}

// One CUDA kernel against the CPU's residual_fwd then rmsnorm_fwd, also with out written over a or b.
TEST_P(DecoderParity, ResidualRmsNorm) {
  for (const NormShape s : kNormShapes) {
    for (const int variant : {0, 1, 2}) {  // 1: out = a, 2: out = b
      SCOPED_TRACE("N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + " variant " +
                   std::to_string(variant));
      const size_t NC = size_t(s.N) * s.C;
      Buf a = act(randn(NC, 2.f, 1.f)), b = act(randn(NC, 0.5f)), w = act(randn(s.C, 0.3f, 1.f));
      Buf sum = act(randn(NC, 100.f)), ln = act(randn(NC, 100.f)), rstd = f32(randn(s.N, 100.f));
      Buf& out = variant == 1 ? a : variant == 2 ? b : sum;
      cpu_->residual_rmsnorm_fwd(out.cpu(), ln.cpu(), fp(rstd, false), a.cpu(), b.cpu(), w.cpu(), s.N, s.C,
                                 1e-6f);
      gpu_->residual_rmsnorm_fwd(out.gpu(), ln.gpu(), fp(rstd, true), a.gpu(), b.gpu(), w.gpu(), s.N, s.C,
                                 1e-6f);
      EXPECT_TRUE(same("residual_rmsnorm_fwd out", out, elementwise_tol(1)));
      EXPECT_TRUE(same("residual_rmsnorm_fwd ln", ln, row_tol(2)));
      EXPECT_TRUE(same("residual_rmsnorm_fwd rstd", rstd, 1e-5));
    }
  }
}

// RoPE forward and backward in place, v heads untouched. The large positions check the accuracy of cos and
// sin at big angles (the CUDA build's fast-math sin would be off there).
TEST_P(DecoderParity, Rope) {
  struct S {
    AttentionShape s;
    int pos_offset;
    double theta;
  };
  const S shapes[] = {
      {{2, 67, 8, 2, 64}, 0, 10000.0},        // GQA, HS 64, T not a multiple of anything
      {{1, 8192, 4, 1, 128}, 1, 500000.0},    // Llama 3 heads: positions 1..8192
      {{2, 256, 8, 8, 128}, 7937, 500000.0},  // decoding-style offset: positions up to 8192
      {{1, 64, 4, 2, 64}, 100000, 500000.0},  // angles ~1e5 radians
      {{3, 5, 3, 1, 6}, 11, 10000.0},         // half heads of 3: element by element
      {{2, 9, 2, 2, 16}, 0, 10000.0},         // 16-bit: one vector per half head
  };
  for (const S& k : shapes) {
    const AttentionShape& s = k.s;
    SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
                 " NKV=" + std::to_string(s.NKV) + " HS=" + std::to_string(s.HS) +
                 " pos_offset=" + std::to_string(k.pos_offset));
    const size_t n = size_t(s.B) * s.T * s.qkv_width();
    Buf inv_freq = f32(inv_freq_for(s.HS, k.theta));
    const std::vector<float> init = randn(n);
    Buf qkv = act(init);
    const std::vector<float> stored = read(qkv, false);
    cpu_->rope_fwd(qkv.cpu(), fp(inv_freq, false), s, k.pos_offset);
    gpu_->rope_fwd(qkv.gpu(), fp(inv_freq, true), s, k.pos_offset);
    EXPECT_TRUE(same("rope_fwd", qkv, elementwise_tol(1)));
    // v: untouched on the GPU too.
    const std::vector<float> g = read(qkv, true);
    const size_t W = size_t(s.qkv_width()), v0 = size_t(s.NH + s.NKV) * s.HS;
    size_t v_changed = 0;
    for (size_t row = 0; row < size_t(s.B) * s.T; ++row)
      for (size_t c = v0; c < W; ++c) v_changed += g[row * W + c] != stored[row * W + c];
    EXPECT_EQ(v_changed, 0u);

    Buf dqkv = act(randn(n));
    cpu_->rope_bwd(dqkv.cpu(), fp(inv_freq, false), s, k.pos_offset);
    gpu_->rope_bwd(dqkv.gpu(), fp(inv_freq, true), s, k.pos_offset);
    EXPECT_TRUE(same("rope_bwd", dqkv, elementwise_tol(1)));
  }
}

TEST_P(DecoderParity, Swiglu) {
  struct S {
    int N, I;
  };
  for (const S s : {S{67, 8192}, S{5, 11008}, S{37, 100}, S{3, 13}}) {
    SCOPED_TRACE("N=" + std::to_string(s.N) + " I=" + std::to_string(s.I));
    const size_t NI = size_t(s.N) * s.I;
    std::vector<float> init = randn(2 * NI, 3.f);
    init[0] = -120.f, init[1] = 120.f;  // saturated gates
    Buf inp = act(init), out = act(randn(NI, 100.f));
    cpu_->swiglu_fwd(out.cpu(), inp.cpu(), s.N, s.I);
    gpu_->swiglu_fwd(out.gpu(), inp.gpu(), s.N, s.I);
    EXPECT_TRUE(same("swiglu_fwd", out, elementwise_tol(2)));
    Buf dout = act(randn(NI)), dinp = act(randn(2 * NI, 100.f));  // overwritten
    cpu_->swiglu_bwd(dinp.cpu(), inp.cpu(), dout.cpu(), s.N, s.I);
    gpu_->swiglu_bwd(dinp.gpu(), inp.gpu(), dout.gpu(), s.N, s.I);
    EXPECT_TRUE(same("swiglu_bwd", dinp, elementwise_tol(2)));
  }
}

// Llama's embedding: wte only (wpe and dwpe null).
TEST_P(DecoderParity, EmbeddingWithoutPositions) {
  const int B = 3, T = 17, C = 40, V = 50;
  std::uniform_int_distribution<int32_t> tok(0, V - 1);
  std::vector<int32_t> ids(size_t(B) * T);
  for (int32_t& t : ids) t = tok(rng_);
  Buf tokens = ints(ids);
  Buf wte = act(randn(size_t(V) * C)), out = act(randn(size_t(B) * T * C, 100.f));
  cpu_->embedding_fwd(out.cpu(), static_cast<int32_t*>(tokens.cpu()), wte.cpu(), nullptr, B, T, C);
  gpu_->embedding_fwd(out.gpu(), static_cast<int32_t*>(tokens.gpu()), wte.gpu(), nullptr, B, T, C);
  EXPECT_TRUE(same("embedding_fwd without wpe", out, 0.0));  // copies of stored rows
  Buf dout = act(randn(size_t(B) * T * C)), dwte = grad(randn(size_t(V) * C));
  cpu_->embedding_bwd(dwte.cpu(), nullptr, dout.cpu(), static_cast<int32_t*>(tokens.cpu()), B, T, C);
  gpu_->embedding_bwd(dwte.gpu(), nullptr, dout.gpu(), static_cast<int32_t*>(tokens.gpu()), B, T, C);
  EXPECT_TRUE(same("embedding_bwd without dwpe", dwte, grad_ == DType::F32 ? 1e-5 : ulps(grad_, 8)));
}

INSTANTIATE_TEST_SUITE_P(DecoderOps, DecoderParity,
                         ::testing::Values(Case{DType::F32, false}, Case{DType::BF16, false},
                                           Case{DType::BF16, true}, Case{DType::F16, false},
                                           Case{DType::F16, true}),
                         case_name);

}  // namespace
}  // namespace anvil
