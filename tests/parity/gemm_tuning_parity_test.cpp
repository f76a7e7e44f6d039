// GEMM tuning (kernels/cuda/gemm_tuner.hpp): a tuned GEMM computes what the heuristic's algorithm computes
// (to fp32 rounding), an accumulating GEMM adds its product exactly once however many candidates were timed,
// the cache file gets one entry per distinct GEMM, and a second run reuses the entries without timing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/gemm_tuning_cache.hpp"
#include "kernels/ops.hpp"
#include "runtime/cuda/cuda_device.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

// A fresh directory for one test's cache file, removed afterwards.
struct TempDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("anvil_gemm_tuning_" + std::to_string(std::random_device{}()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

struct Case {
  std::string name;
  int m, n, k;
  bool trans_a = false, trans_b = false;
  float beta = 0.f;
  bool bias = false;
  int batch = 1;
};

class GemmTuning : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
    dev_ = make_cuda_device(0);
    stream_ = cuda_compute_stream(*dev_);
    ws_ = DeviceBuffer(*dev_, kCudaGemmWorkspaceBytes);
  }

  // C after one run of `c` (C starts as C0) with the given Gemm; also the bound on rounding differences:
  // 1e-5 of sum_k |a_ik b_kj| (+ |beta c0|), with fp64 magnitudes.
  std::vector<float> run(cuda::Gemm& gemm, const Case& c, std::vector<double>* bound = nullptr) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.f, 1.f);
    const int64_t sa = int64_t(c.m) * c.k, sb = int64_t(c.k) * c.n, sc = int64_t(c.m) * c.n;
    std::vector<float> A(size_t(sa * c.batch)), B(size_t(sb * c.batch)), C0(size_t(sc * c.batch)), bias(c.n);
    for (auto* v : {&A, &B, &C0, &bias})
      for (float& x : *v) x = normal(rng);
    DeviceBuffer dA(*dev_, A.size() * 4), dB(*dev_, B.size() * 4), dC(*dev_, C0.size() * 4),
        dBias(*dev_, bias.size() * 4);
    dev_->copy_to_device(dA.get(), A.data(), A.size() * 4);
    dev_->copy_to_device(dB.get(), B.data(), B.size() * 4);
    dev_->copy_to_device(dC.get(), C0.data(), C0.size() * 4);
    dev_->copy_to_device(dBias.get(), bias.data(), bias.size() * 4);
    cuda::GemmArgs g;
    g.a = dA.get(), g.b = dB.get(), g.c = dC.get();
    g.trans_a = c.trans_a, g.trans_b = c.trans_b;
    g.m = c.m, g.n = c.n, g.k = c.k, g.beta = c.beta;
    g.batch = c.batch, g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
    if (c.bias) g.bias = dBias.get();
    gemm.run(stream_, g);
    dev_->synchronize();
    std::vector<float> out(C0.size());
    dev_->copy_to_host(out.data(), dC.get(), out.size() * 4);
    if (bound) {
      bound->assign(out.size(), 0.0);
      for (int b = 0; b < c.batch; ++b)
        for (int i = 0; i < c.m; ++i)
          for (int j = 0; j < c.n; ++j) {
            double s = std::abs(double(c.beta) * C0[size_t(b * sc + i * c.n + j)]) +
                       (c.bias ? std::abs(bias[j]) : 0);
            for (int kk = 0; kk < c.k; ++kk) {
              const float a = c.trans_a ? A[size_t(b * sa + kk * c.m + i)] : A[size_t(b * sa + i * c.k + kk)];
              const float bb =
                  c.trans_b ? B[size_t(b * sb + j * c.k + kk)] : B[size_t(b * sb + kk * c.n + j)];
              s += std::abs(double(a) * bb);
            }
            (*bound)[size_t(b * sc + i * c.n + j)] = 1e-5 * s;
          }
    }
    return out;
  }

  std::unique_ptr<Device> dev_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer ws_;
};

TEST_F(GemmTuning, TunedGemmsMatchTheHeuristicsAndAccumulateOnce) {
  TempDir dir;
  const std::string cache = dir / "gemm_tuning.txt";
  const std::vector<Case> cases{
      {"overwrite", 512, 384, 256},
      {"overwrite A^T B^T", 384, 512, 320, true, true},
      {"accumulate", 512, 256, 384, false, true, 1.f},
      {"accumulate half", 256, 512, 256, true, false, 0.5f},
      {"bias", 512, 384, 256, false, false, 0.f, true},
      {"strided batch", 128, 192, 64, false, true, 0.f, false, 6},
  };
  cuda::Gemm plain(Fp32Matmul::Native, ws_.get(), ws_.size());
  {
    cuda::Gemm tuned(Fp32Matmul::Native, ws_.get(), ws_.size(), nullptr, 0, {true, cache});
    for (const Case& c : cases) {
      std::vector<double> bound;
      const std::vector<float> want = run(plain, c, &bound);
      const std::vector<float> got = run(tuned, c);
      ASSERT_EQ(got.size(), want.size());
      size_t bad = 0;
      for (size_t i = 0; i < got.size(); ++i) bad += !(std::abs(double(got[i]) - want[i]) <= bound[i]);
      EXPECT_EQ(bad, 0u) << c.name << ": " << bad << " of " << got.size()
                         << " elements differ beyond rounding";
    }
  }
  const GemmTuningCache written(cache);
  EXPECT_EQ(written.size(), cases.size());
  // A second process (here: a second Gemm) reuses every entry: same results, and the file is not rewritten.
  const auto mtime = std::filesystem::last_write_time(cache);
  cuda::Gemm again(Fp32Matmul::Native, ws_.get(), ws_.size(), nullptr, 0, {true, cache});
  for (const Case& c : cases) {
    std::vector<double> bound;
    const std::vector<float> want = run(plain, c, &bound);
    const std::vector<float> got = run(again, c);
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += !(std::abs(double(got[i]) - want[i]) <= bound[i]);
    EXPECT_EQ(bad, 0u) << c.name << " (from the cache)";
  }
  EXPECT_EQ(std::filesystem::last_write_time(cache), mtime);
  EXPECT_EQ(GemmTuningCache(cache).size(), cases.size());
}

TEST_F(GemmTuning, CapturedGemmsAreNotTimed) {
  // Inside a graph capture nothing can be timed: the heuristic's choice runs and nothing is cached.
  TempDir dir;
  const std::string cache = dir / "gemm_tuning.txt";
  cuda::Gemm tuned(Fp32Matmul::Native, ws_.get(), ws_.size(), nullptr, 0, {true, cache});
  DeviceBuffer dA(*dev_, 256 * 256 * 4), dB(*dev_, 256 * 256 * 4), dC(*dev_, 256 * 256 * 4);
  cuda::GemmArgs g;
  g.a = dA.get(), g.b = dB.get(), g.c = dC.get(), g.m = 256, g.n = 256, g.k = 256;
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  tuned.run(s, g);
  ASSERT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  EXPECT_EQ(GemmTuningCache(cache).size(), 0u);
}

}  // namespace
}  // namespace anvil
