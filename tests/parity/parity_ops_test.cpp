// Parity of the CUDA ops with the CPU reference ops: each test makes fresh random inputs (seeded from
// std::random_device, or from ANVIL_PARITY_SEED to replay a failure), runs both backends on the same
// data and compares. Errors are measured relative to the largest |value| of the CPU result. Skipped when
// no GPU is visible. ANVIL_PARITY_VERBOSE=1 prints every comparison's error.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "kernels/ops.hpp"
#include "parity_fixture.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

// Tolerances (max |cpu - cuda| / max |cpu|): exact fp32 arithmetic, elementwise math with transcendental
// functions, and results of long dot products (GEMMs, attention) whose summation order differs.
constexpr double kExactTol = 1e-6;
constexpr double kElementwiseTol = 1e-5;
constexpr double kRowReductionTol = 1e-4;
constexpr double kGemmTol = 2e-4;
constexpr double kAttentionTol = 5e-4;
constexpr double kTf32Tol = 1e-2;  // TF32 keeps 10 mantissa bits of each input

// One tensor with the same initial contents on the CPU device and the CUDA device.
template <class T>
struct Mirrored {
  DeviceBuffer cpu_buf, gpu_buf;
  size_t n = 0;
  T* cpu() const { return static_cast<T*>(cpu_buf.get()); }
  T* gpu() const { return static_cast<T*>(gpu_buf.get()); }
};

class ParityTest : public parity::ParityFixture<> {
 protected:
  template <class T>
  Mirrored<T> mirror(const std::vector<T>& host) {
    Mirrored<T> m;
    m.n = host.size();
    const size_t bytes = host.size() * sizeof(T);
    m.cpu_buf = DeviceBuffer(*cpu_dev_, bytes);
    m.gpu_buf = DeviceBuffer(*gpu_dev_, bytes);
    cpu_dev_->copy_to_device(m.cpu_buf.get(), host.data(), bytes);
    gpu_dev_->copy_to_device(m.gpu_buf.get(), host.data(), bytes);
    return m;
  }
  // Output buffers start as garbage (not zeros), so an op that fails to overwrite shows up.
  Mirrored<float> output(size_t n) { return mirror(randn(n, 100.f)); }

  template <class T>
  std::vector<T> read_cpu(const Mirrored<T>& m) {
    std::vector<T> v(m.n);
    cpu_dev_->copy_to_host(v.data(), m.cpu(), m.n * sizeof(T));
    return v;
  }
  template <class T>
  std::vector<T> read_gpu(const Mirrored<T>& m) {
    std::vector<T> v(m.n);
    gpu_dev_->copy_to_host(v.data(), m.gpu(), m.n * sizeof(T));
    return v;
  }

  // The GPU copy takes the CPU copy's contents (so both sides of a backward start from the same inputs).
  template <class T>
  void copy_cpu_to_gpu(Mirrored<T>& m) {
    const std::vector<T> v = read_cpu(m);
    gpu_dev_->copy_to_device(m.gpu(), v.data(), m.n * sizeof(T));
  }

  ::testing::AssertionResult same(const std::string& what, const Mirrored<float>& m, double tol) {
    return close(what, read_cpu(m), read_gpu(m), tol);
  }

  void check_fused_adamw(size_t n, const std::vector<uint64_t>& begins, const std::vector<uint8_t>& groups,
                         size_t skip_begin, size_t skip_end, const std::vector<uint64_t>& state_begins = {});
};

// --- embedding -------------------------------------------------------------------------------------

TEST_F(ParityTest, Embedding) {
  const int B = 3, T = 17, C = 40, V = 50, maxT = 32;
  auto tokens = mirror(rand_ints(size_t(B) * T, 0, V));  // repeated tokens exercise dwte accumulation
  auto wte = mirror(randn(size_t(V) * C));
  auto wpe = mirror(randn(size_t(maxT) * C));
  auto out = output(size_t(B) * T * C);
  cpu_->embedding_fwd(out.cpu(), tokens.cpu(), wte.cpu(), wpe.cpu(), B, T, C);
  gpu_->embedding_fwd(out.gpu(), tokens.gpu(), wte.gpu(), wpe.gpu(), B, T, C);
  EXPECT_TRUE(same("embedding_fwd out", out, kExactTol));

  auto dout = mirror(randn(size_t(B) * T * C));
  auto dwte = mirror(randn(size_t(V) * C));  // nonzero: the gradients accumulate
  auto dwpe = mirror(randn(size_t(maxT) * C));
  cpu_->embedding_bwd(dwte.cpu(), dwpe.cpu(), dout.cpu(), tokens.cpu(), B, T, C);
  gpu_->embedding_bwd(dwte.gpu(), dwpe.gpu(), dout.gpu(), tokens.gpu(), B, T, C);
  EXPECT_TRUE(same("embedding_bwd dwte", dwte, kElementwiseTol));
  EXPECT_TRUE(same("embedding_bwd dwpe", dwpe, kElementwiseTol));
}

// The padding_idx form (Llama-family decoders): the pad token's row gets nothing, the others as before.
TEST_F(ParityTest, EmbeddingBwdSkip) {
  const int B = 3, T = 17, C = 40, V = 50;
  auto tokens = mirror(rand_ints(size_t(B) * T, 0, 4));  // few ids: the pad id 2 surely occurs
  auto dout = mirror(randn(size_t(B) * T * C));
  auto dwte = mirror(randn(size_t(V) * C));
  const std::vector<float> before(dwte.cpu(), dwte.cpu() + size_t(V) * C);
  cpu_->embedding_bwd_skip(dwte.cpu(), dout.cpu(), tokens.cpu(), B, T, C, 2);
  gpu_->embedding_bwd_skip(dwte.gpu(), dout.gpu(), tokens.gpu(), B, T, C, 2);
  EXPECT_TRUE(same("embedding_bwd_skip dwte", dwte, kElementwiseTol));
  for (int c = 0; c < C; ++c) ASSERT_EQ(dwte.cpu()[2 * C + c], before[size_t(2 * C + c)]);
}

// --- layernorm -------------------------------------------------------------------------------------

TEST_F(ParityTest, ResidualLayerNorm) {
  struct Shape {
    int N, C;
  };
  // Dropout on a (BERT's post-LayerNorm blocks): the mask of kernels/dropout.hpp, also with rows that are
  // every third row of a bigger tensor (index pitch 3C).
  const DropoutState state{0x5eed5eedull, 3, 0};
  DeviceBuffer cpu_state(*cpu_dev_, sizeof(state)), gpu_state(*gpu_dev_, sizeof(state));
  cpu_dev_->copy_to_device(cpu_state.get(), &state, sizeof(state));
  gpu_dev_->copy_to_device(gpu_state.get(), &state, sizeof(state));
  for (const Shape s : {Shape{37, 200}, Shape{64, 768}, Shape{5, 7}, Shape{1030, 96}}) {
    for (const int variant : {0, 1, 2, 3}) {  // out written over a (as the op allows) from 1; dropout from 2
      const bool alias = variant >= 1, drop = variant >= 2;
      SCOPED_TRACE("N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) + (alias ? " out = a" : "") +
                   (drop ? variant == 3 ? " dropout, pitch 3C" : " dropout" : ""));
      const size_t NC = size_t(s.N) * s.C;
      auto a = mirror(randn(NC, 2.f, 3.f));
      auto b = mirror(randn(NC, 0.5f));
      auto w = mirror(randn(s.C, 0.5f, 1.f));
      auto bias = mirror(randn(s.C, 0.5f));
      auto sum = output(NC), ln = output(NC), mean = output(s.N), rstd = output(s.N);
      auto& out = alias ? a : sum;
      RowDropout cd, gd;
      if (drop) {
        cd = {0.2f, static_cast<const DropoutState*>(cpu_state.get()), 17,
              size_t(s.C) * (variant == 3 ? 3 : 1)};
        gd = cd;
        gd.state = static_cast<const DropoutState*>(gpu_state.get());
      }
      cpu_->residual_layernorm_fwd(out.cpu(), ln.cpu(), mean.cpu(), rstd.cpu(), a.cpu(), b.cpu(), w.cpu(),
                                   bias.cpu(), s.N, s.C, 1e-5f, cd);
      gpu_->residual_layernorm_fwd(out.gpu(), ln.gpu(), mean.gpu(), rstd.gpu(), a.gpu(), b.gpu(), w.gpu(),
                                   bias.gpu(), s.N, s.C, 1e-5f, gd);
      if (drop) {  // the CPU result is the ops in sequence (dropout_rows, residual, LayerNorm): some dropped
        const std::vector<float> bh = read_cpu(b), oh = read_cpu(out);
        size_t dropped = 0;
        for (size_t i = 0; i < NC; ++i) dropped += oh[i] == bh[i];
        EXPECT_GT(dropped, 0u);
        EXPECT_LT(dropped, NC);
      }
      EXPECT_TRUE(same("residual_layernorm_fwd out", out, kRowReductionTol));
      EXPECT_TRUE(same("residual_layernorm_fwd ln", ln, kRowReductionTol));
      EXPECT_TRUE(same("residual_layernorm_fwd mean", mean, kRowReductionTol));
      EXPECT_TRUE(same("residual_layernorm_fwd rstd", rstd, kRowReductionTol));
    }
  }
}

TEST_F(ParityTest, LayerNorm) {
  struct Shape {
    int N, C;
  };
  for (const Shape s : {Shape{37, 200}, Shape{64, 768}, Shape{5, 7}, Shape{1030, 96}}) {
    SCOPED_TRACE("N=" + std::to_string(s.N) + " C=" + std::to_string(s.C));
    const size_t NC = size_t(s.N) * s.C;
    auto inp = mirror(randn(NC, 2.f, 3.f));  // an offset mean exercises the centring
    auto w = mirror(randn(s.C, 0.5f, 1.f));
    auto b = mirror(randn(s.C, 0.5f));
    auto out = output(NC), mean = output(s.N), rstd = output(s.N);
    cpu_->layernorm_fwd(out.cpu(), mean.cpu(), rstd.cpu(), inp.cpu(), w.cpu(), b.cpu(), s.N, s.C);
    gpu_->layernorm_fwd(out.gpu(), mean.gpu(), rstd.gpu(), inp.gpu(), w.gpu(), b.gpu(), s.N, s.C);
    EXPECT_TRUE(same("layernorm_fwd out", out, kRowReductionTol));
    EXPECT_TRUE(same("layernorm_fwd mean", mean, kRowReductionTol));
    EXPECT_TRUE(same("layernorm_fwd rstd", rstd, kRowReductionTol));

    // Each backend differentiates through its own saved statistics, as in training.
    auto dout = mirror(randn(NC));
    auto dinp = mirror(randn(NC));  // all three accumulate
    auto dw = mirror(randn(s.C));
    auto db = mirror(randn(s.C));
    cpu_->layernorm_bwd(dinp.cpu(), dw.cpu(), db.cpu(), dout.cpu(), inp.cpu(), w.cpu(), mean.cpu(),
                        rstd.cpu(), s.N, s.C);
    gpu_->layernorm_bwd(dinp.gpu(), dw.gpu(), db.gpu(), dout.gpu(), inp.gpu(), w.gpu(), mean.gpu(),
                        rstd.gpu(), s.N, s.C);
    EXPECT_TRUE(same("layernorm_bwd dinp", dinp, kRowReductionTol));
    EXPECT_TRUE(same("layernorm_bwd dw", dw, kRowReductionTol));
    EXPECT_TRUE(same("layernorm_bwd db", db, kRowReductionTol));
  }
}

// The output gradient as a pair (dout + dout2, or dout alone), dinp overwritten, and dinp written over dout2
// (BERT's blocks); dw, db accumulate onto nonzero values.
TEST_F(ParityTest, LayerNormBwdSum) {
  struct Shape {
    int N, C;
  };
  for (const Shape s : {Shape{37, 200}, Shape{64, 768}, Shape{5, 7}, Shape{1030, 96}}) {
    const size_t NC = size_t(s.N) * s.C;
    auto inp = mirror(randn(NC, 2.f, 3.f));
    auto w = mirror(randn(s.C, 0.5f, 1.f));
    auto b = mirror(randn(s.C, 0.5f));
    auto out = output(NC), mean = output(s.N), rstd = output(s.N);
    cpu_->layernorm_fwd(out.cpu(), mean.cpu(), rstd.cpu(), inp.cpu(), w.cpu(), b.cpu(), s.N, s.C);
    gpu_->layernorm_fwd(out.gpu(), mean.gpu(), rstd.gpu(), inp.gpu(), w.gpu(), b.gpu(), s.N, s.C);
    for (const int variant : {0, 1, 2}) {  // 0: dout only, 1: dout + dout2, 2: dinp = dout2 (aliased)
      SCOPED_TRACE("N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) +
                   (variant == 0   ? " dout only"
                    : variant == 1 ? " dout + dout2"
                                   : " dout + dout2, dinp = dout2"));
      auto dout = mirror(randn(NC));
      auto dout2 = mirror(randn(NC, 0.5f));
      auto dinp = output(NC);  // garbage: overwritten
      auto dw = mirror(randn(s.C));
      auto db = mirror(randn(s.C));
      auto& di = variant == 2 ? dout2 : dinp;
      const bool sum = variant >= 1;
      cpu_->layernorm_bwd_sum(di.cpu(), dw.cpu(), db.cpu(), dout.cpu(), sum ? dout2.cpu() : nullptr,
                              inp.cpu(), w.cpu(), mean.cpu(), rstd.cpu(), s.N, s.C);
      gpu_->layernorm_bwd_sum(di.gpu(), dw.gpu(), db.gpu(), dout.gpu(), sum ? dout2.gpu() : nullptr,
                              inp.gpu(), w.gpu(), mean.gpu(), rstd.gpu(), s.N, s.C);
      EXPECT_TRUE(same("layernorm_bwd_sum dinp", di, kRowReductionTol));
      EXPECT_TRUE(same("layernorm_bwd_sum dw", dw, kRowReductionTol));
      EXPECT_TRUE(same("layernorm_bwd_sum db", db, kRowReductionTol));
      EXPECT_TRUE(same("layernorm_bwd_sum dout (read only)", dout, kExactTol));
      if (variant == 1) {
        EXPECT_TRUE(same("layernorm_bwd_sum dout2 (read only)", dout2, kExactTol));
      }
    }
  }
}

// --- matmul ----------------------------------------------------------------------------------------

struct MatmulShape {
  int N, K, OC;
};

class MatmulParity : public ParityTest {
 protected:
  void check(const MatmulShape& s, bool with_bias, bool with_dinp, double tol,
             GradWrite dw_write = GradWrite::Accumulate) {
    const bool overwrite = dw_write == GradWrite::Overwrite;
    SCOPED_TRACE("N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) + " OC=" + std::to_string(s.OC) +
                 (with_bias ? " bias" : " no bias") + (with_dinp ? "" : " no dinp") +
                 (overwrite ? " dw overwritten" : ""));
    const size_t NK = size_t(s.N) * s.K, NOC = size_t(s.N) * s.OC, OCK = size_t(s.OC) * s.K;
    auto inp = mirror(randn(NK));
    auto w = mirror(randn(OCK, 0.2f));
    auto bias = mirror(randn(s.OC));
    auto out = output(NOC);
    cpu_->matmul_fwd(out.cpu(), inp.cpu(), w.cpu(), with_bias ? bias.cpu() : nullptr, s.N, s.K, s.OC);
    gpu_->matmul_fwd(out.gpu(), inp.gpu(), w.gpu(), with_bias ? bias.gpu() : nullptr, s.N, s.K, s.OC);
    EXPECT_TRUE(same("matmul_fwd out", out, tol));

    auto dout = mirror(randn(NOC));
    auto dinp = output(NK);  // overwritten
    // Accumulates, or (overwritten) starts as NaN: none of it may reach the result.
    auto dw = mirror(overwrite ? std::vector<float>(OCK, std::nanf("")) : randn(OCK));
    auto dbias = mirror(randn(s.OC));  // accumulates
    cpu_->matmul_bwd(with_dinp ? dinp.cpu() : nullptr, dw.cpu(), with_bias ? dbias.cpu() : nullptr,
                     dout.cpu(), inp.cpu(), w.cpu(), s.N, s.K, s.OC, dw_write);
    gpu_->matmul_bwd(with_dinp ? dinp.gpu() : nullptr, dw.gpu(), with_bias ? dbias.gpu() : nullptr,
                     dout.gpu(), inp.gpu(), w.gpu(), s.N, s.K, s.OC, dw_write);
    EXPECT_TRUE(same("matmul_bwd dinp", dinp, tol));  // untouched on both when skipped
    EXPECT_TRUE(same("matmul_bwd dw", dw, tol));
    EXPECT_TRUE(same("matmul_bwd dbias", dbias, kRowReductionTol));
  }
};

TEST_F(MatmulParity, Fp32) {
  // {1536, 256, 3072}: 1.09 waves of 256 x 128 tiles on a 132-SM GPU, so the forward and the weight
  // gradient run as two GEMMs over [2/3 | 1/3] of the outputs (CudaOps::split_outputs).
  for (const MatmulShape s :
       {MatmulShape{37, 29, 51}, MatmulShape{64, 128, 96}, MatmulShape{1, 5, 3}, MatmulShape{300, 768, 2304},
        MatmulShape{1031, 64, 257}, MatmulShape{1536, 256, 3072}}) {
    for (const bool with_bias : {false, true}) check(s, with_bias, /*with_dinp=*/true, kGemmTol);
  }
  check({37, 29, 51}, /*with_bias=*/true, /*with_dinp=*/false, kGemmTol);
}

// Weight gradients written over a buffer that was not zeroed (BERT's gradients in activation memory),
// including the two-GEMM split of the weight gradient.
TEST_F(MatmulParity, OverwrittenWeightGradient) {
  for (const MatmulShape s :
       {MatmulShape{37, 29, 51}, MatmulShape{300, 768, 2304}, MatmulShape{1536, 256, 3072}})
    check(s, /*with_bias=*/true, /*with_dinp=*/true, kGemmTol, GradWrite::Overwrite);
  check({64, 128, 96}, /*with_bias=*/false, /*with_dinp=*/false, kGemmTol, GradWrite::Overwrite);
}

// The MLP's fused GEMM + GELU (cuBLASLt epilogues on CUDA, the unfused ops on the CPU), forward and backward.
TEST_F(MatmulParity, GeluEpilogues) {
  for (const MatmulShape s : {MatmulShape{37, 29, 56}, MatmulShape{256, 768, 3072}}) {
    SCOPED_TRACE("N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) + " OC=" + std::to_string(s.OC));
    const size_t NK = size_t(s.N) * s.K, NOC = size_t(s.N) * s.OC, OCK = size_t(s.OC) * s.K;
    auto inp = mirror(randn(NK));
    auto w = mirror(randn(OCK, 0.1f));
    auto bias = mirror(randn(s.OC));
    auto out = output(NOC), pre = output(NOC);
    cpu_->matmul_gelu_fwd(out.cpu(), pre.cpu(), inp.cpu(), w.cpu(), bias.cpu(), s.N, s.K, s.OC);
    gpu_->matmul_gelu_fwd(out.gpu(), pre.gpu(), inp.gpu(), w.gpu(), bias.gpu(), s.N, s.K, s.OC);
    EXPECT_TRUE(same("matmul_gelu_fwd pre", pre, kGemmTol));
    EXPECT_TRUE(same("matmul_gelu_fwd out", out, kGemmTol));

    // Backward of a GEMM y = gelu(pre2) @ w2^T: [N, OC] -> [N, K2] with K2 = OC.
    const int K2 = s.OC, OC2 = s.K;
    auto w2 = mirror(randn(size_t(OC2) * K2, 0.1f));
    auto dout = mirror(randn(size_t(s.N) * OC2));
    auto dinp = output(NOC);                    // overwritten
    auto dw = mirror(randn(size_t(OC2) * K2));  // accumulates
    auto dbias = mirror(randn(size_t(OC2)));    // accumulates
    copy_cpu_to_gpu(out);
    copy_cpu_to_gpu(pre);
    cpu_->matmul_bwd_dgelu(dinp.cpu(), dw.cpu(), dbias.cpu(), dout.cpu(), out.cpu(), w2.cpu(), pre.cpu(), s.N,
                           K2, OC2);
    gpu_->matmul_bwd_dgelu(dinp.gpu(), dw.gpu(), dbias.gpu(), dout.gpu(), out.gpu(), w2.gpu(), pre.gpu(), s.N,
                           K2, OC2);
    EXPECT_TRUE(same("matmul_bwd_dgelu dinp", dinp, kGemmTol));
    EXPECT_TRUE(same("matmul_bwd_dgelu dw", dw, kGemmTol));
    EXPECT_TRUE(same("matmul_bwd_dgelu dbias", dbias, kRowReductionTol));
  }
}

class MatmulTf32Parity : public MatmulParity {
 protected:
  bool tf32() const override { return true; }
};

TEST_F(MatmulTf32Parity, Tf32) {
  for (const MatmulShape s :
       {MatmulShape{37, 29, 51}, MatmulShape{256, 768, 768}, MatmulShape{128, 64, 50304}})
    for (const bool with_bias : {false, true}) check(s, with_bias, /*with_dinp=*/true, kTf32Tol);
}

// --- attention -------------------------------------------------------------------------------------

// Mask variants: causal (GPT), bidirectional (encoders), and each with per-sequence padding lengths.
enum class MaskKind { Causal, Bidirectional, CausalPadded, BidirectionalPadded };

class AttentionParity : public ParityTest {
 protected:
  void check(int B, int T, int C, int NH, MaskKind kind = MaskKind::Causal) {
    SCOPED_TRACE("B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                 " NH=" + std::to_string(NH) + " mask=" + std::to_string(int(kind)));
    const bool causal = kind == MaskKind::Causal || kind == MaskKind::CausalPadded;
    const bool padded = kind == MaskKind::CausalPadded || kind == MaskKind::BidirectionalPadded;
    std::vector<int32_t> len_host = rand_ints(size_t(B), 1, T + 1);
    len_host[0] = T;  // one full sequence
    auto lengths = mirror(len_host);
    const AttentionMask cpu_mask{causal, padded ? lengths.cpu() : nullptr};
    const AttentionMask gpu_mask{causal, padded ? lengths.gpu() : nullptr};
    const size_t BTC = size_t(B) * T * C;
    auto qkv = mirror(randn(3 * BTC));
    auto out = output(BTC);
    auto lse = output(size_t(B) * NH * T);
    DeviceBuffer cpu_scratch(*cpu_dev_, std::max<size_t>(1, cpu_->attention_scratch_bytes(B, T, C, NH)));
    DeviceBuffer gpu_scratch(*gpu_dev_, gpu_->attention_scratch_bytes(B, T, C, NH));
    cpu_->attention_fwd(out.cpu(), lse.cpu(), qkv.cpu(), cpu_scratch.get(), B, T, C, NH, cpu_mask);
    gpu_->attention_fwd(out.gpu(), lse.gpu(), qkv.gpu(), gpu_scratch.get(), B, T, C, NH, gpu_mask);
    EXPECT_TRUE(same("attention_fwd out", out, kAttentionTol));
    EXPECT_TRUE(same("attention_fwd lse", lse, kAttentionTol));

    auto dout = mirror(randn(BTC));
    auto dqkv = output(3 * BTC);  // overwritten
    // Both backwards from the CPU's forward outputs (the GPU's are equal within the tolerance above).
    copy_cpu_to_gpu(out);
    copy_cpu_to_gpu(lse);
    cpu_->attention_bwd(dqkv.cpu(), dout.cpu(), qkv.cpu(), out.cpu(), lse.cpu(), cpu_scratch.get(), B, T, C,
                        NH, cpu_mask);
    gpu_->attention_bwd(dqkv.gpu(), dout.gpu(), qkv.gpu(), out.gpu(), lse.gpu(), gpu_scratch.get(), B, T, C,
                        NH, gpu_mask);
    // Compare q, k and v parts separately: their magnitudes differ.
    const std::vector<float> ref = read_cpu(dqkv), got = read_gpu(dqkv);
    const char* part_names[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; ++part) {
      std::vector<float> ref_part, got_part;
      for (size_t bt = 0; bt < size_t(B) * T; ++bt)
        for (int c = 0; c < C; ++c) {
          ref_part.push_back(ref[bt * 3 * C + part * C + c]);
          got_part.push_back(got[bt * 3 * C + part * C + c]);
        }
      if (T == 1 && part < 2) {
        // One key: the probabilities are exactly 1, so dq and dk are 0 up to rounding noise of
        // dout.v - dout.out, which a relative comparison against 0 cannot judge.
        for (size_t i = 0; i < got_part.size(); ++i)
          EXPECT_NEAR(got_part[i], 0.0f, 1e-4f) << part_names[part] << " [" << i << "] seed " << seed_;
        continue;
      }
      EXPECT_TRUE(close(std::string("attention_bwd ") + part_names[part], ref_part, got_part, kAttentionTol));
    }
  }
};

TEST_F(AttentionParity, Small) {
  check(2, 67, 48, 4);
}
TEST_F(AttentionParity, Larger) {
  check(4, 256, 384, 6);
}
TEST_F(AttentionParity, SingleToken) {
  check(3, 1, 32, 2);
}
// A head size that is not a multiple of 4: the backward's unfused kernels (attention.cu) instead of the fused
// scores kernel (attention_bwd_scores.cu) that the other shapes run.
TEST_F(AttentionParity, HeadSizeOutsideTheFusedBackward) {
  for (MaskKind k : {MaskKind::Causal, MaskKind::BidirectionalPadded}) check(2, 37, 54, 3, k);
}
// Several query and key tiles of the fused backward, with ragged edges.
TEST_F(AttentionParity, ManyTiles) {
  for (MaskKind k : {MaskKind::Causal, MaskKind::BidirectionalPadded}) check(2, 301, 128, 2, k);
}
TEST_F(AttentionParity, MaskVariants) {
  for (MaskKind k : {MaskKind::Bidirectional, MaskKind::CausalPadded, MaskKind::BidirectionalPadded})
    check(3, 45, 64, 4, k);
}

// --- activation ------------------------------------------------------------------------------------

TEST_F(ParityTest, Gelu) {
  const size_t n = 100003;
  auto inp = mirror(randn(n, 3.f));
  auto out = output(n);
  cpu_->gelu_fwd(out.cpu(), inp.cpu(), n);
  gpu_->gelu_fwd(out.gpu(), inp.gpu(), n);
  EXPECT_TRUE(same("gelu_fwd", out, kElementwiseTol));

  const std::vector<float> dout_host = randn(n);
  auto dout = mirror(dout_host);
  auto dinp = output(n);
  cpu_->gelu_bwd(dinp.cpu(), inp.cpu(), dout.cpu(), n);
  gpu_->gelu_bwd(dinp.gpu(), inp.gpu(), dout.gpu(), n);
  EXPECT_TRUE(same("gelu_bwd", dinp, kElementwiseTol));
  // In place: dinp aliases dout.
  cpu_->gelu_bwd(dout.cpu(), inp.cpu(), dout.cpu(), n);
  gpu_->gelu_bwd(dout.gpu(), inp.gpu(), dout.gpu(), n);
  EXPECT_TRUE(same("gelu_bwd in place", dout, kElementwiseTol));
  EXPECT_TRUE(close("gelu_bwd in place vs out of place", read_gpu(dinp), read_gpu(dout), kExactTol));
}

TEST_F(ParityTest, Residual) {
  const size_t n = 12345;
  auto a = mirror(randn(n)), b = mirror(randn(n));
  auto out = output(n);
  cpu_->residual_fwd(out.cpu(), a.cpu(), b.cpu(), n);
  gpu_->residual_fwd(out.gpu(), a.gpu(), b.gpu(), n);
  EXPECT_TRUE(same("residual_fwd", out, kExactTol));
  // In place: out aliases a.
  cpu_->residual_fwd(a.cpu(), a.cpu(), b.cpu(), n);
  gpu_->residual_fwd(a.gpu(), a.gpu(), b.gpu(), n);
  EXPECT_TRUE(same("residual_fwd in place", a, kExactTol));
}

// --- loss ------------------------------------------------------------------------------------------

TEST_F(ParityTest, SoftmaxCrossEntropy) {
  struct Shape {
    int N, V, Vp;
  };
  for (const Shape s : {Shape{45, 1000, 1024}, Shape{13, 37, 40}, Shape{8, 50257, 50304}, Shape{6, 64, 64}}) {
    SCOPED_TRACE("N=" + std::to_string(s.N) + " V=" + std::to_string(s.V) + " Vp=" + std::to_string(s.Vp));
    std::vector<float> logits_host = randn(size_t(s.N) * s.Vp, 3.f);
    // Large values in the padded columns: they must not leak into the softmax.
    for (int i = 0; i < s.N; ++i)
      for (int j = s.V; j < s.Vp; ++j) logits_host[size_t(i) * s.Vp + j] = 50.f;
    std::vector<int32_t> targets_host = rand_ints(s.N, 0, s.V);
    int valid = 0;
    for (int i = 0; i < s.N; ++i) {
      if (i % 4 == 1) targets_host[i] = kIgnoreIndex;
      valid += targets_host[i] != kIgnoreIndex;
    }
    targets_host[0] = s.V - 1;  // the last real column as a target
    auto targets = mirror(targets_host);
    const float grad_scale = 1.f / static_cast<float>(valid);

    // Loss only: logits stay untouched.
    auto logits = mirror(logits_host);
    auto losses = output(s.N);
    cpu_->softmax_xent_fwd_bwd(losses.cpu(), logits.cpu(), targets.cpu(), s.N, s.V, s.Vp, grad_scale, false);
    gpu_->softmax_xent_fwd_bwd(losses.gpu(), logits.gpu(), targets.gpu(), s.N, s.V, s.Vp, grad_scale, false);
    EXPECT_TRUE(same("softmax_xent losses (no grad)", losses, kElementwiseTol));
    EXPECT_TRUE(close("softmax_xent logits untouched", logits_host, read_gpu(logits), 0.0));

    auto losses2 = output(s.N);
    cpu_->softmax_xent_fwd_bwd(losses2.cpu(), logits.cpu(), targets.cpu(), s.N, s.V, s.Vp, grad_scale, true);
    gpu_->softmax_xent_fwd_bwd(losses2.gpu(), logits.gpu(), targets.gpu(), s.N, s.V, s.Vp, grad_scale, true);
    EXPECT_TRUE(same("softmax_xent losses", losses2, kElementwiseTol));
    EXPECT_TRUE(same("softmax_xent grad", logits, kElementwiseTol));
    const std::vector<float> gpu_losses = read_gpu(losses2), gpu_grad = read_gpu(logits);
    for (int i = 0; i < s.N; ++i) {
      if (targets_host[i] == kIgnoreIndex) {
        EXPECT_EQ(gpu_losses[i], 0.f) << "ignored row " << i;
      }
      for (int j = 0; j < s.Vp; ++j) {
        const bool must_be_zero = targets_host[i] == kIgnoreIndex || j >= s.V;
        if (must_be_zero && gpu_grad[size_t(i) * s.Vp + j] != 0.f) {
          ADD_FAILURE() << "nonzero gradient at row " << i << " column " << j << "; seed " << seed_;
          break;
        }
      }
    }
  }
}

// --- reduction -------------------------------------------------------------------------------------

TEST_F(ParityTest, SumAndSumSquares) {
  const size_t n = (size_t{1} << 22) + 7;
  const std::vector<float> host = randn(n, 1.f, 0.1f);
  auto x = mirror(host);
  // Also from an address that is not 16-byte aligned and an odd length (the scalar path).
  for (const size_t offset : {size_t{0}, size_t{1}}) {
    const size_t len = n - offset;
    double abs_sum = 0, sq_sum = 0;
    for (size_t i = offset; i < n; ++i)
      abs_sum += std::fabs(double(host[i])), sq_sum += double(host[i]) * host[i];
    const double cpu_sum = cpu_->sum(x.cpu() + offset, len), gpu_sum = gpu_->sum(x.gpu() + offset, len);
    const double cpu_sq = cpu_->sum_squares(x.cpu() + offset, DType::F32, len),
                 gpu_sq = gpu_->sum_squares(x.gpu() + offset, DType::F32, len);
    // Both accumulate in fp64: only the summation order differs.
    EXPECT_NEAR(gpu_sum, cpu_sum, 1e-10 * abs_sum) << "offset " << offset << "; seed " << seed_;
    EXPECT_NEAR(gpu_sq, cpu_sq, 1e-10 * sq_sum) << "offset " << offset << "; seed " << seed_;
    EXPECT_NEAR(gpu_sq, sq_sum, 1e-10 * sq_sum) << "offset " << offset << "; seed " << seed_;
  }
  EXPECT_EQ(gpu_->sum(x.gpu(), 0), 0.0);
  EXPECT_EQ(gpu_->sum_squares(x.gpu(), DType::F32, 1), double(host[0]) * host[0]);
}

// More than 2^31 elements: indices must not overflow. GPU only (the CPU copy would take minutes).
TEST_F(ParityTest, SumBeyond32BitIndices) {
  const size_t n = (size_t{1} << 31) + 37;
  if (gpu_dev_->total_memory_bytes() < 2 * n * sizeof(float)) GTEST_SKIP() << "not enough GPU memory";
  DeviceBuffer buf(*gpu_dev_, n * sizeof(float));
  auto* x = static_cast<float*>(buf.get());
  gpu_dev_->fill_zero(x, n * sizeof(float));
  const float ones[1] = {1.f}, twos[1] = {2.f}, fours[1] = {4.f};
  gpu_dev_->copy_to_device(x + 5, ones, sizeof(float));
  gpu_dev_->copy_to_device(x + (size_t{1} << 31) + 3, twos, sizeof(float));
  gpu_dev_->copy_to_device(x + n - 1, fours, sizeof(float));
  EXPECT_EQ(gpu_->sum(x, n), 7.0);
  EXPECT_EQ(gpu_->sum_squares(x, DType::F32, n), 21.0);
  EXPECT_EQ(gpu_->sum(x + 1, n - 1), 7.0);  // unaligned: the scalar path walks every index
  EXPECT_EQ(gpu_->sum_squares(x + 1, DType::F32, n - 1), 21.0);
}

// The device-result reductions a training step uses instead of host reads: the same kernels as sum /
// sum_squares (so the same value on the GPU, bit for bit), fp64 like the CPU's (so within summation-order
// noise of it), and the clip factor exactly the CPU's (explicitly rounded fp64 on both).
TEST_F(ParityTest, DeviceResultReductions) {
  const size_t n = (size_t{1} << 22) + 7;
  const std::vector<float> host = randn(n, 1.f, 0.1f);
  std::vector<uint16_t> bf(n), hf(n);
  for (size_t i = 0; i < n; ++i) bf[i] = float_to_bf16(host[i]), hf[i] = float_to_fp16(host[i]);
  auto x = mirror(host);
  auto xb = mirror(bf);
  auto xh = mirror(hf);
  for (const size_t offset : {size_t{0}, size_t{1}}) {  // the vector and the scalar load paths
    SCOPED_TRACE("offset " + std::to_string(offset) + "; seed " + std::to_string(seed_));
    const size_t len = n - offset;
    double abs_sum = 0, sq_sum = 0;
    for (size_t i = offset; i < n; ++i)
      abs_sum += std::fabs(double(host[i])), sq_sum += double(host[i]) * host[i];
    // Two micro-batches accumulated onto a nonzero start, as the trainer sums a step's loss.
    auto acc = mirror(std::vector<double>{0.5});
    for (int k = 0; k < 2; ++k) {
      cpu_->accumulate_sum(acc.cpu(), x.cpu() + offset, len);
      gpu_->accumulate_sum(acc.gpu(), x.gpu() + offset, len);
    }
    const double gpu_sum = gpu_->sum(x.gpu() + offset, len);
    EXPECT_EQ(read_gpu(acc)[0], 0.5 + gpu_sum + gpu_sum);
    EXPECT_NEAR(read_gpu(acc)[0], read_cpu(acc)[0], 2e-10 * abs_sum);
    struct Input {
      DType t;
      const void* cpu;
      const void* gpu;
    };
    for (const Input in : {Input{DType::F32, x.cpu() + offset, x.gpu() + offset},
                           Input{DType::BF16, xb.cpu() + offset, xb.gpu() + offset},
                           Input{DType::F16, xh.cpu() + offset, xh.gpu() + offset}}) {
      SCOPED_TRACE(dtype_name(in.t));
      auto out = mirror(std::vector<double>{123.0});  // overwritten
      cpu_->sum_squares_to(out.cpu(), in.cpu, in.t, len);
      gpu_->sum_squares_to(out.gpu(), in.gpu, in.t, len);
      const double g = read_gpu(out)[0], c = read_cpu(out)[0];
      EXPECT_EQ(g, gpu_->sum_squares(in.gpu, in.t, len));
      EXPECT_EQ(c, cpu_->sum_squares(in.cpu, in.t, len));
      EXPECT_NEAR(g, c, 1e-10 * c);
      if (in.t == DType::F32) {
        EXPECT_NEAR(g, sq_sum, 1e-10 * sq_sum);
      }
    }
  }
  // n == 0: the sum of nothing is written (sum_squares_to) or adds nothing (accumulate_sum).
  auto zero = mirror(std::vector<double>{7.0, 7.0});
  gpu_->sum_squares_to(zero.gpu(), x.gpu(), DType::F32, 0);
  gpu_->accumulate_sum(zero.gpu() + 1, x.gpu(), 0);
  EXPECT_EQ(read_gpu(zero), (std::vector<double>{0.0, 7.0}));
  // Non-finite input: non-finite result (the trainer's overflow and non-finite checks rely on it).
  std::vector<float> with_inf(1000, 1.f);
  with_inf[517] = INFINITY;
  auto xi = mirror(with_inf);
  auto out = mirror(std::vector<double>{0.0});
  gpu_->sum_squares_to(out.gpu(), xi.gpu(), DType::F32, xi.n);
  EXPECT_FALSE(std::isfinite(read_gpu(out)[0]));

  // grad_clip_scale: bit for bit the CPU's on clipped, unclipped, boundary and non-finite norms.
  const double inf = INFINITY, nan = NAN;
  // {sum of squares, unscale, max_norm}
  const std::vector<std::array<double, 3>> cases = {{4.0, 1.0, 1.0},
                                                    {0.25, 1.0, 1.0},
                                                    {1.0, 1.0, 1.0},
                                                    {4.0, 1.0, 0.0},
                                                    {1e6, 1.0 / 3, 0.5},
                                                    {3.7e9, 2.0 / 65536, 1.0},
                                                    {123.456, 1.0 / 4096, 1.0},
                                                    {0.0, 0.01, 1.0},
                                                    {inf, 1.0, 1.0},
                                                    {nan, 1.0, 1.0}};
  for (const auto& [ss, unscale, max_norm] : cases) {
    SCOPED_TRACE("ss " + std::to_string(ss) + " unscale " + std::to_string(unscale) + " max_norm " +
                 std::to_string(max_norm));
    auto ssm = mirror(std::vector<double>{ss});
    auto norm = mirror(std::vector<double>{-1.0});
    auto scale = mirror(std::vector<float>{-1.f});
    cpu_->grad_clip_scale(scale.cpu(), norm.cpu(), ssm.cpu(), unscale, max_norm, nullptr);
    gpu_->grad_clip_scale(scale.gpu(), norm.gpu(), ssm.gpu(), unscale, max_norm, nullptr);
    const double nc = read_cpu(norm)[0], ng = read_gpu(norm)[0];
    const float sc = read_cpu(scale)[0], sg = read_gpu(scale)[0];
    // (NaN payloads may differ: the GPU returns its canonical NaN.)
    EXPECT_TRUE((std::isnan(nc) && std::isnan(ng)) || std::memcmp(&nc, &ng, sizeof nc) == 0)
        << "norm: cpu " << nc << ", cuda " << ng;
    EXPECT_EQ(std::memcmp(&sc, &sg, sizeof sc), 0) << "scale: cpu " << sc << ", cuda " << sg;
  }
}

// --- optimizer -------------------------------------------------------------------------------------

TEST_F(ParityTest, AdamW) {
  const size_t n = 100003;
  auto begin0 = mirror(std::vector<uint64_t>{0});
  auto group0 = mirror(std::vector<uint8_t>{0});
  const ParamGroupTable cpu_t{begin0.cpu(), group0.cpu(), nullptr, 1};
  const ParamGroupTable gpu_t{begin0.gpu(), group0.gpu(), nullptr, 1};
  for (const int64_t step : {int64_t{1}, int64_t{7}, int64_t{10000}}) {
    SCOPED_TRACE("step " + std::to_string(step));
    auto param = mirror(randn(n));
    auto grad = mirror(randn(n, 3.f));
    auto m = mirror(randn(n, 0.1f));
    std::vector<float> v_host = randn(n, 0.01f);
    for (float& x : v_host) x = std::fabs(x);
    auto v = mirror(v_host);
    FusedAdamWArgs a;
    a.lr[0] = 3e-4f, a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay[0] = 0.1f, a.step = step;
    a.grad_scale = 0.5f;
    cpu_->adamw_fused_step(param.cpu(), grad.cpu(), m.cpu(), v.cpu(), DType::F32, n, cpu_t, a);
    gpu_->adamw_fused_step(param.gpu(), grad.gpu(), m.gpu(), v.gpu(), DType::F32, n, gpu_t, a);
    EXPECT_TRUE(same("adamw param", param, kElementwiseTol));
    EXPECT_TRUE(same("adamw m", m, kElementwiseTol));
    EXPECT_TRUE(same("adamw v", v, kElementwiseTol));
  }
}

// Fused multi-range AdamW over n parameters in `begins` / `groups` (one group kSkipGroup, whose range
// [skip_begin, skip_end) must stay untouched), with fp32 and bf16 moments, three steps.
void ParityTest::check_fused_adamw(size_t n, const std::vector<uint64_t>& begins,
                                   const std::vector<uint8_t>& groups, size_t skip_begin, size_t skip_end,
                                   const std::vector<uint64_t>& state_begins) {
  auto b = mirror(begins);
  auto g = mirror(groups);
  // Compact states (state_begins given): the skipped range holds none.
  auto sb = mirror(state_begins.empty() ? std::vector<uint64_t>{0} : state_begins);
  const uint64_t* sb_cpu = state_begins.empty() ? nullptr : sb.cpu();
  const uint64_t* sb_gpu = state_begins.empty() ? nullptr : sb.gpu();
  const ParamGroupTable cpu_t{b.cpu(), g.cpu(), sb_cpu, int(begins.size())};
  const ParamGroupTable gpu_t{b.gpu(), g.gpu(), sb_gpu, int(begins.size())};
  const size_t ns = state_begins.empty() ? n : n - (skip_end - skip_begin);
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 moments" : "fp32 moments");
    const std::vector<float> p0 = randn(n), grad_h = randn(n, 3.f);
    std::vector<float> v_h = randn(ns, 0.01f);
    for (float& x : v_h) x = std::fabs(x);
    auto param = mirror(p0), grad = mirror(grad_h);
    auto m = mirror(bf16 ? std::vector<float>(ns / 2 + 1, 0.f) : randn(ns, 0.1f));
    auto v = mirror(bf16 ? std::vector<float>(ns / 2 + 1, 0.f) : v_h);
    FusedAdamWArgs a;
    a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.grad_scale = 0.5f, a.rounding_seed = 77;
    a.lr[0] = 1e-3f, a.lr[1] = 2e-3f, a.lr[2] = 5e-4f, a.weight_decay[0] = 0.1f, a.weight_decay[2] = 0.05f;
    const DType md = bf16 ? DType::BF16 : DType::F32;
    for (int64_t step = 1; step <= 3; ++step) {
      a.step = step;
      cpu_->adamw_fused_step(param.cpu(), grad.cpu(), m.cpu(), v.cpu(), md, n, cpu_t, a);
      gpu_->adamw_fused_step(param.gpu(), grad.gpu(), m.gpu(), v.gpu(), md, n, gpu_t, a);
    }
    EXPECT_TRUE(same("fused adamw param", param, bf16 ? 1e-3 : kElementwiseTol));
    const std::vector<float> pg = read_gpu(param);
    for (size_t i = skip_begin; i < skip_end; ++i)
      ASSERT_EQ(pg[i], p0[i]) << "skipped range updated at " << i;
    if (!bf16) {
      EXPECT_TRUE(same("fused adamw m", m, kElementwiseTol));
      EXPECT_TRUE(same("fused adamw v", v, kElementwiseTol));
    }
  }
}

// Fused multi-range optimizers: five ranges in three groups plus a skipped one, compact states for the
// SGD case (state_begins), fp32 and bf16 AdamW moments.
TEST_F(ParityTest, FusedAdamWAndSgd) {
  const size_t n = 100003;
  const std::vector<uint64_t> begins = {0, 20000, 20011, 50000, 70000};
  const std::vector<uint8_t> groups = {0, 1, 2, kSkipGroup, 0};
  const std::vector<uint64_t> state_begins = {0, 20000, 20011, 50000, 50000};  // the skipped range has none
  check_fused_adamw(n, begins, groups, 50000, 70000);
  check_fused_adamw(n, begins, groups, 50000, 70000, state_begins);  // compact moments (frozen tensors)
  auto b = mirror(begins);
  auto g = mirror(groups);
  auto sb = mirror(state_begins);
  // SGD with Nesterov momentum and compact momentum state.
  const ParamGroupTable cpu_s{b.cpu(), g.cpu(), sb.cpu(), int(begins.size())};
  const ParamGroupTable gpu_s{b.gpu(), g.gpu(), sb.gpu(), int(begins.size())};
  auto param = mirror(randn(n)), grad = mirror(randn(n));
  auto buf = mirror(std::vector<float>(n - 20000, 0.f));
  SgdArgs s;
  s.momentum = 0.9f, s.nesterov = true, s.grad_scale = 2.f;
  s.lr[0] = 0.1f, s.lr[1] = 0.05f, s.lr[2] = 0.2f, s.weight_decay[0] = 0.01f;
  for (int step = 1; step <= 3; ++step) {
    s.first_step = step == 1;
    cpu_->sgd_step(param.cpu(), grad.cpu(), buf.cpu(), n, cpu_s, s);
    gpu_->sgd_step(param.gpu(), grad.gpu(), buf.gpu(), n, gpu_s, s);
  }
  EXPECT_TRUE(same("sgd param", param, kElementwiseTol));
  EXPECT_TRUE(same("sgd momentum buffer", buf, kElementwiseTol));
}

// A buffer large enough that the CUDA launch is capped (two blocks an SM): each block walks a long chunk
// whose threads cross range boundaries at odd offsets, and ranges straddle the chunks.
TEST_F(ParityTest, FusedAdamWOverLongChunks) {
  const size_t n = 3000003;
  check_fused_adamw(n, {0, 1000001, 1000002, 1500003, 2000001}, {0, 1, 2, kSkipGroup, 0}, 1500003, 2000001);
}

// The gradient scale read from device memory (grad_scale_device: the trainer's clip factor): on the GPU,
// host 1 x device s is the update of host s bit for bit, and both match the CPU given s on the host.
TEST_F(ParityTest, OptimizersTakeTheGradScaleFromTheDevice) {
  const size_t n = 100003;
  const std::vector<uint64_t> begins = {0, 20000, 50000};
  const std::vector<uint8_t> groups = {0, 1, 2};
  auto b = mirror(begins);
  auto g = mirror(groups);
  const ParamGroupTable cpu_t{b.cpu(), g.cpu(), nullptr, int(begins.size())};
  const ParamGroupTable gpu_t{b.gpu(), g.gpu(), nullptr, int(begins.size())};
  const float s = 0.37f;
  auto device_s = mirror(std::vector<float>{s});
  const std::vector<float> p0 = randn(n), grad_h = randn(n, 3.f), m0 = randn(n, 0.1f);
  std::vector<float> v0 = randn(n, 0.01f);
  for (float& x : v0) x = std::fabs(x);
  auto grad = mirror(grad_h);

  // AdamW: `param`, m, v updated on the CPU (host s) and on the GPU (host s, and host 1 x device s).
  FusedAdamWArgs a;
  a.beta1 = 0.9f, a.beta2 = 0.95f, a.eps = 1e-8f, a.step = 3;
  a.lr[0] = 1e-3f, a.lr[1] = 2e-3f, a.lr[2] = 5e-4f, a.weight_decay[0] = 0.1f;
  FusedAdamWArgs a_host = a, a_dev = a;
  a_host.grad_scale = s;
  a_dev.grad_scale = 1.f, a_dev.grad_scale_device = device_s.gpu();
  auto p = mirror(p0), m = mirror(m0), v = mirror(v0);
  auto p2 = mirror(p0), m2 = mirror(m0), v2 = mirror(v0);
  cpu_->adamw_fused_step(p.cpu(), grad.cpu(), m.cpu(), v.cpu(), DType::F32, n, cpu_t, a_host);
  gpu_->adamw_fused_step(p.gpu(), grad.gpu(), m.gpu(), v.gpu(), DType::F32, n, gpu_t, a_dev);
  gpu_->adamw_fused_step(p2.gpu(), grad.gpu(), m2.gpu(), v2.gpu(), DType::F32, n, gpu_t, a_host);
  EXPECT_TRUE(same("adamw param (device scale)", p, kElementwiseTol));
  EXPECT_TRUE(same("adamw m (device scale)", m, kElementwiseTol));
  EXPECT_TRUE(same("adamw v (device scale)", v, kElementwiseTol));
  EXPECT_EQ(read_gpu(p), read_gpu(p2));
  EXPECT_EQ(read_gpu(m), read_gpu(m2));
  EXPECT_EQ(read_gpu(v), read_gpu(v2));

  // SGD with momentum, the same three ways.
  SgdArgs sa;
  sa.momentum = 0.9f, sa.first_step = false, sa.lr[0] = 0.1f, sa.lr[1] = 0.05f, sa.lr[2] = 0.2f;
  sa.weight_decay[0] = 0.01f;
  SgdArgs s_host = sa, s_dev = sa;
  s_host.grad_scale = s;
  s_dev.grad_scale = 1.f, s_dev.grad_scale_device = device_s.gpu();
  auto q = mirror(p0), buf = mirror(m0);
  auto q2 = mirror(p0), buf2 = mirror(m0);
  cpu_->sgd_step(q.cpu(), grad.cpu(), buf.cpu(), n, cpu_t, s_host);
  gpu_->sgd_step(q.gpu(), grad.gpu(), buf.gpu(), n, gpu_t, s_dev);
  gpu_->sgd_step(q2.gpu(), grad.gpu(), buf2.gpu(), n, gpu_t, s_host);
  EXPECT_TRUE(same("sgd param (device scale)", q, kElementwiseTol));
  EXPECT_TRUE(same("sgd momentum buffer (device scale)", buf, kElementwiseTol));
  EXPECT_EQ(read_gpu(q), read_gpu(q2));
  EXPECT_EQ(read_gpu(buf), read_gpu(buf2));
}

}  // namespace
}  // namespace anvil
