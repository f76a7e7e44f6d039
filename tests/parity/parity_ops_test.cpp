// Parity of the CUDA ops with the CPU reference ops: each test makes fresh random inputs (seeded from
// std::random_device, or from ANVIL_PARITY_SEED to replay a failure), runs both backends on the same
// data and compares. Errors are measured relative to the largest |value| of the CPU result. Skipped when
// no GPU is visible. ANVIL_PARITY_VERBOSE=1 prints every comparison's error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.hpp"
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

uint32_t choose_seed() {
  if (const char* s = std::getenv("ANVIL_PARITY_SEED")) return static_cast<uint32_t>(std::stoul(s));
  return std::random_device{}();
}

// One tensor with the same initial contents on the CPU device and the CUDA device.
template <class T>
struct Mirrored {
  DeviceBuffer cpu_buf, gpu_buf;
  size_t n = 0;
  T* cpu() const { return static_cast<T*>(cpu_buf.get()); }
  T* gpu() const { return static_cast<T*>(gpu_buf.get()); }
};

class ParityTest : public ::testing::Test {
 protected:
  virtual bool tf32() const { return false; }

  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
    seed_ = choose_seed();
    rng_.seed(seed_);
    RecordProperty("seed", std::to_string(seed_));
    cpu_dev_ = make_cpu_device();
    gpu_dev_ = make_cuda_device(0);
    workspace_ = DeviceBuffer(*gpu_dev_, kCudaGemmWorkspaceBytes);
    cpu_ = make_cpu_ops(*cpu_dev_);
    gpu_ = make_cuda_ops(*gpu_dev_, tf32(), workspace_.get(), workspace_.size());
  }

  std::vector<float> randn(size_t n, float scale = 1.f, float offset = 0.f) {
    std::normal_distribution<float> dist(0.f, 1.f);
    std::vector<float> v(n);
    for (float& x : v) x = offset + scale * dist(rng_);
    return v;
  }
  std::vector<int32_t> rand_ints(size_t n, int32_t lo, int32_t hi_exclusive) {
    std::uniform_int_distribution<int32_t> dist(lo, hi_exclusive - 1);
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = dist(rng_);
    return v;
  }

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

  ::testing::AssertionResult close(const std::string& what, const std::vector<float>& ref,
                                   const std::vector<float>& got, double tol) const {
    if (ref.size() != got.size()) return ::testing::AssertionFailure() << what << ": size mismatch";
    double max_err = 0, max_ref = 0;
    size_t worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      double err = std::fabs(static_cast<double>(ref[i]) - got[i]);
      if (std::isnan(err)) err = INFINITY;
      if (err > max_err) max_err = err, worst = i;
      max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
    }
    const double rel = max_err / std::max(max_ref, 1e-30);
    if (std::getenv("ANVIL_PARITY_VERBOSE"))
      std::printf("  %-40s relative error %.3g (tolerance %.3g)\n", what.c_str(), rel, tol);
    if (rel <= tol) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << what << ": max |cpu - cuda| = " << max_err << " at [" << worst << "] (cpu " << ref[worst]
           << ", cuda " << got[worst] << "), " << rel << " of max |cpu| " << max_ref << " > " << tol
           << "; seed " << seed_ << " (replay with ANVIL_PARITY_SEED=" << seed_ << ")";
  }
  ::testing::AssertionResult same(const std::string& what, const Mirrored<float>& m, double tol) {
    return close(what, read_cpu(m), read_gpu(m), tol);
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
  // Declaration order matters: the ops and buffers must go before the devices they live on.
  std::unique_ptr<Device> cpu_dev_, gpu_dev_;
  DeviceBuffer workspace_;
  std::unique_ptr<Ops> cpu_, gpu_;
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

// --- layernorm -------------------------------------------------------------------------------------

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

// --- matmul ----------------------------------------------------------------------------------------

struct MatmulShape {
  int N, K, OC;
};

class MatmulParity : public ParityTest {
 protected:
  void check(const MatmulShape& s, bool with_bias, bool with_dinp, double tol) {
    SCOPED_TRACE("N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) + " OC=" + std::to_string(s.OC) +
                 (with_bias ? " bias" : " no bias") + (with_dinp ? "" : " no dinp"));
    const size_t NK = size_t(s.N) * s.K, NOC = size_t(s.N) * s.OC, OCK = size_t(s.OC) * s.K;
    auto inp = mirror(randn(NK));
    auto w = mirror(randn(OCK, 0.2f));
    auto bias = mirror(randn(s.OC));
    auto out = output(NOC);
    cpu_->matmul_fwd(out.cpu(), inp.cpu(), w.cpu(), with_bias ? bias.cpu() : nullptr, s.N, s.K, s.OC);
    gpu_->matmul_fwd(out.gpu(), inp.gpu(), w.gpu(), with_bias ? bias.gpu() : nullptr, s.N, s.K, s.OC);
    EXPECT_TRUE(same("matmul_fwd out", out, tol));

    auto dout = mirror(randn(NOC));
    auto dinp = output(NK);            // overwritten
    auto dw = mirror(randn(OCK));      // accumulates
    auto dbias = mirror(randn(s.OC));  // accumulates
    cpu_->matmul_bwd(with_dinp ? dinp.cpu() : nullptr, dw.cpu(), with_bias ? dbias.cpu() : nullptr,
                     dout.cpu(), inp.cpu(), w.cpu(), s.N, s.K, s.OC);
    gpu_->matmul_bwd(with_dinp ? dinp.gpu() : nullptr, dw.gpu(), with_bias ? dbias.gpu() : nullptr,
                     dout.gpu(), inp.gpu(), w.gpu(), s.N, s.K, s.OC);
    EXPECT_TRUE(same("matmul_bwd dinp", dinp, tol));  // untouched on both when skipped
    EXPECT_TRUE(same("matmul_bwd dw", dw, tol));
    EXPECT_TRUE(same("matmul_bwd dbias", dbias, kRowReductionTol));
  }
};

TEST_F(MatmulParity, Fp32) {
  for (const MatmulShape s : {MatmulShape{37, 29, 51}, MatmulShape{64, 128, 96}, MatmulShape{1, 5, 3},
                              MatmulShape{300, 768, 2304}, MatmulShape{1031, 64, 257}}) {
    for (const bool with_bias : {false, true}) check(s, with_bias, /*with_dinp=*/true, kGemmTol);
  }
  check({37, 29, 51}, /*with_bias=*/true, /*with_dinp=*/false, kGemmTol);
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

class AttentionParity : public ParityTest {
 protected:
  void check(int B, int T, int C, int NH) {
    SCOPED_TRACE("B=" + std::to_string(B) + " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                 " NH=" + std::to_string(NH));
    const size_t BTC = size_t(B) * T * C;
    auto qkv = mirror(randn(3 * BTC));
    auto out = output(BTC);
    auto probs = output(size_t(B) * NH * T * T);
    DeviceBuffer cpu_scratch(*cpu_dev_, std::max<size_t>(1, cpu_->attention_scratch_bytes(B, T, C, NH)));
    DeviceBuffer gpu_scratch(*gpu_dev_, gpu_->attention_scratch_bytes(B, T, C, NH));
    auto* cs = static_cast<float*>(cpu_scratch.get());
    auto* gs = static_cast<float*>(gpu_scratch.get());
    cpu_->attention_fwd(out.cpu(), probs.cpu(), qkv.cpu(), cs, B, T, C, NH);
    gpu_->attention_fwd(out.gpu(), probs.gpu(), qkv.gpu(), gs, B, T, C, NH);
    EXPECT_TRUE(same("attention_fwd out", out, kAttentionTol));
    EXPECT_TRUE(same("attention_fwd probs", probs, kAttentionTol));
    // Above the diagonal the probabilities must be exactly zero.
    const std::vector<float> gpu_probs = read_gpu(probs);
    size_t nonzero_above = 0;
    for (size_t bh = 0; bh < size_t(B) * NH; ++bh)
      for (int t = 0; t < T; ++t)
        for (int j = t + 1; j < T; ++j) nonzero_above += gpu_probs[(bh * T + t) * T + j] != 0.f;
    EXPECT_EQ(nonzero_above, 0u) << "seed " << seed_;

    auto dout = mirror(randn(BTC));
    auto dqkv = output(3 * BTC);  // overwritten
    cpu_->attention_bwd(dqkv.cpu(), dout.cpu(), qkv.cpu(), probs.cpu(), cs, B, T, C, NH);
    gpu_->attention_bwd(dqkv.gpu(), dout.gpu(), qkv.gpu(), probs.gpu(), gs, B, T, C, NH);
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

// Fused multi-range optimizers: five ranges in three groups plus a skipped one, compact states for the
// SGD case (state_begins), fp32 and bf16 AdamW moments.
TEST_F(ParityTest, FusedAdamWAndSgd) {
  const size_t n = 100003;
  const std::vector<uint64_t> begins = {0, 20000, 20011, 50000, 70000};
  const std::vector<uint8_t> groups = {0, 1, 2, kSkipGroup, 0};
  const std::vector<uint64_t> state_begins = {0, 20000, 20011, 50000, 50000};  // the skipped range has none
  auto b = mirror(begins);
  auto g = mirror(groups);
  auto sb = mirror(state_begins);
  const ParamGroupTable cpu_t{b.cpu(), g.cpu(), nullptr, int(begins.size())};
  const ParamGroupTable gpu_t{b.gpu(), g.gpu(), nullptr, int(begins.size())};
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16 moments" : "fp32 moments");
    const std::vector<float> p0 = randn(n), grad_h = randn(n, 3.f);
    std::vector<float> v_h = randn(n, 0.01f);
    for (float& x : v_h) x = std::fabs(x);
    auto param = mirror(p0), grad = mirror(grad_h);
    auto m = mirror(bf16 ? std::vector<float>(n / 2 + 1, 0.f) : randn(n, 0.1f));
    auto v = mirror(bf16 ? std::vector<float>(n / 2 + 1, 0.f) : v_h);
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
    for (size_t i = 50000; i < 70000; ++i) ASSERT_EQ(pg[i], p0[i]) << "skipped range updated at " << i;
    if (!bf16) {
      EXPECT_TRUE(same("fused adamw m", m, kElementwiseTol));
      EXPECT_TRUE(same("fused adamw v", v, kElementwiseTol));
    }
  }
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

}  // namespace
}  // namespace anvil
