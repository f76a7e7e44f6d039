// Fixture code shared by the GPU parity tests, which run the CPU reference ops and the CUDA ops on the same
// random inputs and compare. ParityFixture: the seeded RNG (ANVIL_PARITY_SEED replays a run; the seed is
// recorded as the test property "seed"), both devices, the cuBLASLt workspace and both Ops, random inputs,
// and the comparison relative to the largest |CPU value| (ANVIL_PARITY_VERBOSE=1 prints every error).
// TypedParityFixture adds tensors stored in a dtype on both backends (Buf), for tests parameterised over the
// storage precision. Both skip the test when no GPU is visible.
#pragma once

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

#include "core/half.hpp"
#include "kernels/ops.hpp"
#include "runtime/device.hpp"

namespace anvil::parity {

// The run's seed: ANVIL_PARITY_SEED, or fresh from std::random_device.
inline uint32_t choose_seed() {
  const char* env = std::getenv("ANVIL_PARITY_SEED");
  return env ? uint32_t(std::stoul(env)) : std::random_device{}();
}

// Raw storage on both backends for one tensor of `dtype`.
struct Buf {
  DType dtype = DType::F32;
  size_t n = 0;
  DeviceBuffer cpu_buf, gpu_buf;
  void* cpu() const { return cpu_buf.get(); }
  void* gpu() const { return gpu_buf.get(); }
  template <class T>
  T* cpu_as() const {
    return static_cast<T*>(cpu_buf.get());
  }
  template <class T>
  T* gpu_as() const {
    return static_cast<T*>(gpu_buf.get());
  }
};

// The CPU and CUDA backends of one test, set up in SetUp. TestBase: ::testing::Test or TestWithParam<P>.
template <class TestBase = ::testing::Test>
class ParityFixture : public TestBase {
 protected:
  // The precision both Ops are made with (default fp32), and whether CUDA fp32 GEMMs may use TF32.
  virtual OpsPrecision precision() const { return {}; }
  virtual bool tf32() const { return false; }
  // Printed after the name of each comparison with ANVIL_PARITY_VERBOSE (the storage type, say).
  virtual std::string verbose_tag() const { return {}; }

  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
    seed_ = choose_seed();
    rng_.seed(seed_);
    ::testing::Test::RecordProperty("seed", std::to_string(seed_));
    cpu_dev_ = make_cpu_device();
    gpu_dev_ = make_cuda_device(0);
    workspace_ = DeviceBuffer(*gpu_dev_, kCudaGemmWorkspaceBytes);
    cpu_ = make_cpu_ops(*cpu_dev_, precision());
    gpu_ = make_cuda_ops(*gpu_dev_, tf32(), workspace_.get(), workspace_.size(), precision());
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

  // max |ref - got| / max |ref| within tol (a NaN anywhere fails).
  ::testing::AssertionResult close(const std::string& what, const std::vector<float>& ref,
                                   const std::vector<float>& got, double tol) const {
    if (ref.size() != got.size()) return ::testing::AssertionFailure() << what << ": size mismatch";
    double max_err = 0, max_ref = 0;
    size_t worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      double err = std::fabs(double(ref[i]) - got[i]);
      if (std::isnan(err)) err = INFINITY;
      if (err > max_err) max_err = err, worst = i;
      max_ref = std::max(max_ref, std::fabs(double(ref[i])));
    }
    const double rel = max_err / std::max(max_ref, 1e-30);
    if (std::getenv("ANVIL_PARITY_VERBOSE")) {
      const std::string tag = verbose_tag();
      std::printf("  %-44s %s%srelative error %.3g (tolerance %.3g)\n", what.c_str(), tag.c_str(),
                  tag.empty() ? "" : " ", rel, tol);
    }
    if (rel <= tol) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << what << ": max |cpu - cuda| = " << max_err << " at [" << worst << "] (cpu " << ref[worst]
           << ", cuda " << got[worst] << "), " << rel << " of max |cpu| " << max_ref << " > " << tol
           << "; seed " << seed_ << " (replay with ANVIL_PARITY_SEED=" << seed_ << ")";
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
  // Declaration order matters: the ops and buffers must go before the devices they live on (members of a
  // derived fixture go before all of these).
  std::unique_ptr<Device> cpu_dev_, gpu_dev_;
  DeviceBuffer workspace_;
  std::unique_ptr<Ops> cpu_, gpu_;
};

// A ParityFixture over TestWithParam<Param> whose tensors are Bufs in the compute type act_ (precision()
// .compute), the gradient type grad_ (precision().grad) or fp32. 16-bit values are rounded once on the host
// and the same bytes go to both backends; reads widen them back to fp32.
template <class Param>
class TypedParityFixture : public ParityFixture<::testing::TestWithParam<Param>> {
 protected:
  using Base = ParityFixture<::testing::TestWithParam<Param>>;
  using Buf = parity::Buf;

  void SetUp() override {
    const OpsPrecision p = this->precision();
    act_ = p.compute, grad_ = p.grad;
    Base::SetUp();
  }
  std::string verbose_tag() const override { return std::string(dtype_name(act_)); }

  // Relative tolerance in units of the storage type's precision (2^-8 bf16, 2^-11 fp16, ~1e-6 fp32).
  static double ulps(DType t, double k) {
    return t == DType::BF16 ? k * 0.00390625 : t == DType::F16 ? k * 0.00048828125 : k * 1e-6;
  }

  Buf make(const std::vector<float>& host, DType t) {
    Buf b;
    b.dtype = t, b.n = host.size();
    const size_t bytes = dtype_bytes(t, host.size());
    b.cpu_buf = DeviceBuffer(*this->cpu_dev_, std::max<size_t>(bytes, 1));
    b.gpu_buf = DeviceBuffer(*this->gpu_dev_, std::max<size_t>(bytes, 1));
    if (t == DType::F32) {
      this->cpu_dev_->copy_to_device(b.cpu(), host.data(), bytes);
      this->gpu_dev_->copy_to_device(b.gpu(), host.data(), bytes);
    } else {
      std::vector<uint16_t> h(host.size());
      for (size_t i = 0; i < host.size(); ++i)
        h[i] = t == DType::BF16 ? float_to_bf16(host[i]) : float_to_fp16(host[i]);
      this->cpu_dev_->copy_to_device(b.cpu(), h.data(), bytes);
      this->gpu_dev_->copy_to_device(b.gpu(), h.data(), bytes);
    }
    return b;
  }
  Buf act(const std::vector<float>& v) { return make(v, act_); }
  Buf grad(const std::vector<float>& v) { return make(v, grad_); }
  Buf f32(const std::vector<float>& v) { return make(v, DType::F32); }
  Buf ints(const std::vector<int32_t>& host) {
    Buf b;
    b.dtype = DType::I32, b.n = host.size();
    b.cpu_buf = DeviceBuffer(*this->cpu_dev_, host.size() * 4);
    b.gpu_buf = DeviceBuffer(*this->gpu_dev_, host.size() * 4);
    this->cpu_dev_->copy_to_device(b.cpu(), host.data(), host.size() * 4);
    this->gpu_dev_->copy_to_device(b.gpu(), host.data(), host.size() * 4);
    return b;
  }
  // The GPU copy takes the CPU copy's bytes (both sides of a backward then start from the same inputs).
  void copy_cpu_to_gpu(Buf& b) {
    std::vector<unsigned char> h(dtype_bytes(b.dtype, b.n));
    this->cpu_dev_->copy_to_host(h.data(), b.cpu(), h.size());
    this->gpu_dev_->copy_to_device(b.gpu(), h.data(), h.size());
  }

  // Elements [offset, offset + count) of b (all of it by default), widened to fp32.
  std::vector<float> read(const Buf& b, bool gpu, size_t offset = 0, size_t count = size_t(-1)) {
    count = std::min(count, b.n - offset);
    const char* src = static_cast<const char*>(gpu ? b.gpu() : b.cpu()) + dtype_bytes(b.dtype, offset);
    Device& d = gpu ? *this->gpu_dev_ : *this->cpu_dev_;
    std::vector<float> out(count);
    if (b.dtype == DType::F32) {
      d.copy_to_host(out.data(), src, count * 4);
    } else {
      std::vector<uint16_t> h(count);
      d.copy_to_host(h.data(), src, count * 2);
      for (size_t i = 0; i < count; ++i)
        out[i] = b.dtype == DType::BF16 ? bf16_to_float(h[i]) : fp16_to_float(h[i]);
    }
    return out;
  }

  // b's CPU and CUDA contents agree (see close).
  ::testing::AssertionResult same(const std::string& what, const Buf& b, double tol) {
    return this->close(what, read(b, false), read(b, true), tol);
  }

  DType act_ = DType::F32, grad_ = DType::F32;
};

}  // namespace anvil::parity
