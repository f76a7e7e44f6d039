// 3xTF32 GEMMs against an fp64 reference, next to native fp32 and single-pass TF32 GEMMs on the same inputs:
// every layout (transposes, row strides, batches), the bias and GELU epilogues, accumulation into C, and the
// chunked paths (a split scratch too small for the whole GEMM). The error of an element is measured against
// the sum of |a_ik b_kj| over k (what rounding in any summation order is proportional to); 3xTF32 must stay
// within a small factor of native fp32's error and far below TF32's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/ops.hpp"
#include "kernels/split_gemm_plan.hpp"
#include "runtime/cuda/cuda_device.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

struct Case {
  std::string name;
  int m, n, k;
  bool trans_a = false, trans_b = false;
  int batch = 1;
  int64_t lda = 0, ldb = 0;  // row strides of the stored operands (0: contiguous)
  bool bias = false;
  float beta = 0.f;
  bool gelu = false;
  float scale_spread = 0.f;  // > 0: entries scaled by exp(spread * normal), a wide dynamic range
};

double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

class Gemm3xTf32 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
    dev_ = make_cuda_device(0);
    stream_ = cuda_compute_stream(*dev_);
    ws_ = DeviceBuffer(*dev_, kCudaGemmWorkspaceBytes);
  }

  struct Errors {
    double fp32 = 0, tf32 = 0, x3 = 0, x3_chunked = 0;
  };

  // Stored element counts of A and B per batch, and their batch strides.
  static int64_t rows_a(const Case& c) { return c.trans_a ? c.k : c.m; }
  static int64_t cols_a(const Case& c) { return c.trans_a ? c.m : c.k; }
  static int64_t rows_b(const Case& c) { return c.trans_b ? c.n : c.k; }
  static int64_t cols_b(const Case& c) { return c.trans_b ? c.k : c.n; }

  Errors run(const Case& c, size_t chunked_scratch_bytes) {
    std::mt19937 rng(1234);
    std::normal_distribution<double> normal(0, 1);
    const int64_t lda = c.lda ? c.lda : cols_a(c), ldb = c.ldb ? c.ldb : cols_b(c);
    const int64_t sa = rows_a(c) * lda, sb = rows_b(c) * ldb, sc = int64_t(c.m) * c.n;
    auto fill = [&](std::vector<float>& v) {
      for (float& x : v)
        x = float(normal(rng) * (c.scale_spread > 0 ? std::exp(c.scale_spread * normal(rng)) : 1));
    };
    std::vector<float> A(size_t(sa * c.batch)), B(size_t(sb * c.batch)), C0(size_t(sc * c.batch)), bias(c.n);
    fill(A), fill(B), fill(C0), fill(bias);
    auto a_at = [&](int b, int i, int kk) {
      return double(c.trans_a ? A[size_t(b * sa + kk * lda + i)] : A[size_t(b * sa + i * lda + kk)]);
    };
    auto b_at = [&](int b, int kk, int j) {
      return double(c.trans_b ? B[size_t(b * sb + j * ldb + kk)] : B[size_t(b * sb + kk * ldb + j)]);
    };
    // fp64 reference of the pre-activation, and the scale of each element's rounding.
    std::vector<double> ref(C0.size()), mag(C0.size());
    for (int b = 0; b < c.batch; ++b)
      for (int i = 0; i < c.m; ++i)
        for (int j = 0; j < c.n; ++j) {
          double s = 0, sa_ = 0;
          for (int kk = 0; kk < c.k; ++kk) {
            const double p = a_at(b, i, kk) * b_at(b, kk, j);
            s += p, sa_ += std::fabs(p);
          }
          const size_t o = size_t(b * sc + int64_t(i) * c.n + j);
          s += c.beta * double(C0[o]) + (c.bias ? double(bias[size_t(j)]) : 0.0);
          sa_ += std::fabs(c.beta * double(C0[o])) + (c.bias ? std::fabs(double(bias[size_t(j)])) : 0.0);
          ref[o] = s, mag[o] = sa_;
        }

    DeviceBuffer dA(*dev_, A.size() * 4), dB(*dev_, B.size() * 4), dC(*dev_, C0.size() * 4),
        dBias(*dev_, bias.size() * 4), dAux(*dev_, C0.size() * 4);
    dev_->copy_to_device(dA.get(), A.data(), A.size() * 4);
    dev_->copy_to_device(dB.get(), B.data(), B.size() * 4);
    dev_->copy_to_device(dBias.get(), bias.data(), bias.size() * 4);

    auto max_error = [&](Fp32Matmul mode, size_t scratch_bytes) {
      DeviceBuffer scratch;
      if (scratch_bytes) scratch = DeviceBuffer(*dev_, scratch_bytes);
      cuda::Gemm gemm(mode, ws_.get(), ws_.size(), static_cast<float*>(scratch.get()), scratch_bytes);
      dev_->copy_to_device(dC.get(), C0.data(), C0.size() * 4);
      cuda::GemmArgs g;
      g.a = dA.get(), g.trans_a = c.trans_a, g.b = dB.get(), g.trans_b = c.trans_b, g.c = dC.get();
      g.m = c.m, g.n = c.n, g.k = c.k, g.beta = c.beta, g.batch = c.batch;
      g.stride_a = c.batch > 1 ? sa : 0, g.stride_b = c.batch > 1 ? sb : 0, g.stride_c = c.batch > 1 ? sc : 0;
      g.lda = c.lda, g.ldb = c.ldb;
      if (c.bias) g.bias = dBias.get();
      if (c.gelu) g.gelu = cuda::GemmArgs::kGeluAux, g.aux = dAux.get();
      gemm.run(stream_, g);
      dev_->synchronize();
      std::vector<float> out(C0.size()), aux(c.gelu ? C0.size() : 0);
      dev_->copy_to_host(out.data(), dC.get(), out.size() * 4);
      if (c.gelu) dev_->copy_to_host(aux.data(), dAux.get(), aux.size() * 4);
      double worst = 0;
      for (size_t o = 0; o < out.size(); ++o) {
        const double pre = c.gelu ? double(aux[o]) : double(out[o]);
        worst = std::max(worst, std::fabs(pre - ref[o]) / mag[o]);
        // The epilogue's GELU of the pre-activation, against the reference's (its slope is at most ~1.13).
        if (c.gelu) worst = std::max(worst, std::fabs(double(out[o]) - gelu_tanh(ref[o])) / (1.13 * mag[o]));
        if (!std::isfinite(out[o])) worst = INFINITY;
      }
      return worst;
    };
    Errors e;
    e.fp32 = max_error(Fp32Matmul::Native, 0);
    e.tf32 = max_error(Fp32Matmul::TF32, 0);
    e.x3 = max_error(Fp32Matmul::TF32x3, 64ull << 20);
    e.x3_chunked = max_error(Fp32Matmul::TF32x3, chunked_scratch_bytes);
    return e;
  }

  void check(const Case& c, size_t chunked_scratch_bytes) {
    const Errors e = run(c, chunked_scratch_bytes);
    std::printf("%-28s max error / sum|ab|: fp32 %.3g  tf32 %.3g  3xtf32 %.3g  3xtf32 chunked %.3g\n",
                c.name.c_str(), e.fp32, e.tf32, e.x3, e.x3_chunked);
    ::testing::Test::RecordProperty(c.name, std::to_string(e.x3 / e.fp32));
    // Native fp32's own error here is a few 2^-24; 3xTF32 adds ~2^-22 per product at most.
    const double bound = 4 * e.fp32 + 0x1p-22;
    EXPECT_LE(e.x3, bound) << c.name;
    EXPECT_LE(e.x3_chunked, bound) << c.name;
    EXPECT_LT(e.x3 * 50, e.tf32) << c.name << ": single-pass TF32 should be far less accurate";
  }

  std::unique_ptr<Device> dev_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer ws_;
};

TEST_F(Gemm3xTf32, EveryTransposeMatchesFp32Accuracy) {
  for (const bool ta : {false, true})
    for (const bool tb : {false, true}) {
      Case c{std::string("transposes ") + (ta ? "T" : "N") + (tb ? "T" : "N"), 256, 384, 1024, ta, tb};
      check(c, 256 << 10);  // chunks of K, M and N
    }
}

TEST_F(Gemm3xTf32, WideDynamicRange) {
  Case c{"dynamic range e^(2N(0,1))", 192, 160, 2048};
  c.scale_spread = 2.f;
  check(c, 1 << 20);
}

TEST_F(Gemm3xTf32, BiasAndAccumulation) {
  Case c{"bias, beta 1", 200, 136, 777, false, true};
  c.bias = true, c.beta = 1.f;
  check(c, 128 << 10);  // K chunks: only the first scales C and adds the bias
}

TEST_F(Gemm3xTf32, BatchedWithRowStrides) {
  // Heads inside wider rows, as attention reads them: batch 6, each [64, 48] a column block of [.., 96].
  Case c{"batched, strided rows", 64, 80, 48, false, true, 6};
  c.lda = 96, c.ldb = 112;
  check(c, 2 * 2 * 48 * (64 + 80) * 4 + 4096);  // two batches per chunk
  Case t{"batched, A^T", 96, 64, 128, true, false, 5};
  check(t, 16 << 10);  // a batch at a time, in chunks
}

TEST_F(Gemm3xTf32, GeluEpilogueSeesTheWholeSum) {
  Case c{"gelu epilogue (3 pieces)", 128, 512, 768, false, true};
  c.bias = true, c.gelu = true;
  check(c, 3 * 768 * (32 + 512) * 4 + 4096);  // M chunks only
}

}  // namespace
}  // namespace anvil
