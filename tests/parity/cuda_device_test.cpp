// The CUDA device's memory, copy and ordering contract (runtime/device.hpp). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "anvil/error.hpp"
#include "kernels/ops.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
    dev_ = make_cuda_device(0);
  }
  std::unique_ptr<Device> dev_;
};

TEST_F(CudaDeviceTest, Describes) {
  EXPECT_EQ(dev_->kind(), DeviceKind::CUDA);
  EXPECT_FALSE(dev_->name().empty());
  EXPECT_GT(dev_->total_memory_bytes(), size_t{0});
  DeviceBuffer buf(*dev_, 64 << 20);
  EXPECT_GE(dev_->driver_used_bytes(), size_t{64} << 20);
}

TEST_F(CudaDeviceTest, CopiesRoundTrip) {
  const size_t n = 1 << 20;
  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 0.f);
  DeviceBuffer a(*dev_, n * sizeof(float)), b(*dev_, n * sizeof(float));
  dev_->copy_to_device(a.get(), host.data(), n * sizeof(float));
  dev_->copy_on_device(b.get(), a.get(), n * sizeof(float));
  dev_->fill_zero(a.get(), n * sizeof(float));
  std::vector<float> back(n, -1.f), zeros(n, -1.f);
  dev_->copy_to_host(back.data(), b.get(), n * sizeof(float));  // ordered after the queued copy
  dev_->copy_to_host(zeros.data(), a.get(), n * sizeof(float));
  EXPECT_EQ(back, host);
  EXPECT_EQ(zeros, std::vector<float>(n, 0.f));
}

TEST_F(CudaDeviceTest, AsyncCopiesOrderBeforeCompute) {
  const size_t n = 1 << 22;
  PinnedBuffer pinned(*dev_, n * sizeof(float));
  auto* p = static_cast<float*>(pinned.get());
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(i % 1000);
  DeviceBuffer staged(*dev_, n * sizeof(float)), copy(*dev_, n * sizeof(float));
  dev_->copy_to_device_async(staged.get(), p, n * sizeof(float));
  dev_->wait_for_copies();
  dev_->copy_on_device(copy.get(), staged.get(), n * sizeof(float));  // compute stream, after the upload
  dev_->sync_copies();
  std::memset(p, 0, n * sizeof(float));  // the host buffer may be reused now
  std::vector<float> back(n);
  dev_->copy_to_host(back.data(), copy.get(), n * sizeof(float));
  for (size_t i = 0; i < n; ++i)
    if (back[i] != static_cast<float>(i % 1000)) FAIL() << "mismatch at " << i << ": " << back[i];
  dev_->synchronize();
}

// A fence recorded after an upload from pinned memory: once waited for, the host may refill the buffer (the
// paged weights' contract, offload/paged_weights.hpp). Long compute is queued before the upload so that the
// fence is not passed at once.
TEST_F(CudaDeviceTest, FenceReleasesAnUploadsHostBuffer) {
  const size_t n = 1 << 24;
  PinnedBuffer pinned(*dev_, n * sizeof(float));
  auto* p = static_cast<float*>(pinned.get());
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<float>(i % 977);
  DeviceBuffer busy(*dev_, n * sizeof(float)), dst(*dev_, n * sizeof(float));
  std::unique_ptr<Device::Fence> fence = dev_->make_fence();
  fence->wait();  // never recorded: passed
  for (int r = 0; r < 20; ++r) dev_->fill_zero(busy.get(), n * sizeof(float));
  dev_->upload_on_compute(dst.get(), p, n * sizeof(float));
  fence->record();
  fence->wait();
  std::memset(p, 0, n * sizeof(float));
  std::vector<float> back(n);
  dev_->copy_to_host(back.data(), dst.get(), n * sizeof(float));
  for (size_t i = 0; i < n; ++i)
    if (back[i] != static_cast<float>(i % 977)) FAIL() << "mismatch at " << i << ": " << back[i];
}

TEST_F(CudaDeviceTest, RejectsBadOrdinalsAndForeignDevices) {
  EXPECT_THROW(make_cuda_device(1 << 20), Error);
  auto cpu = make_cpu_device();
  EXPECT_THROW(make_cuda_ops(*cpu, false, nullptr, 0), Error);
}

}  // namespace
}  // namespace anvil
