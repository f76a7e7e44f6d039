// The Device base: counted allocation around the backends' allocators.
#include "runtime/device.hpp"

#include <algorithm>

namespace anvil {

void* Device::alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = device_alloc(bytes);
  std::lock_guard<std::mutex> lock(stats_mutex_);
  device_sizes_[p] = bytes;
  stats_.allocated_bytes += bytes;
  stats_.allocations += 1;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  return p;
}

void Device::free(void* p) noexcept {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    auto it = device_sizes_.find(p);
    if (it != device_sizes_.end()) {
      stats_.allocated_bytes -= it->second;
      stats_.allocations -= 1;
      device_sizes_.erase(it);
    }
  }
  device_free(p);
}

void* Device::alloc_host_pinned(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = host_pinned_alloc(bytes);
  std::lock_guard<std::mutex> lock(stats_mutex_);
  pinned_sizes_[p] = bytes;
  stats_.pinned_bytes += bytes;
  stats_.peak_pinned_bytes = std::max(stats_.peak_pinned_bytes, stats_.pinned_bytes);
  return p;
}

void Device::free_host_pinned(void* p) noexcept {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(stats_mutex_);
    auto it = pinned_sizes_.find(p);
    if (it != pinned_sizes_.end()) {
      stats_.pinned_bytes -= it->second;
      pinned_sizes_.erase(it);
    }
  }
  host_pinned_free(p);
}

Device::MemoryStats Device::memory_stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return stats_;
}

std::unique_ptr<Device> make_device(DeviceKind kind) {
  return kind == DeviceKind::CUDA ? make_cuda_device() : make_cpu_device();
}

}  // namespace anvil

namespace anvil {

void Device::make_time_marks(int count) {
  host_marks_.assign(size_t(std::max(count, 0)), {});
}

void Device::record_time_mark(int i) {
  ANVIL_ASSERT(i >= 0 && size_t(i) < host_marks_.size(), "time mark {} outside the pool of {}", i,
               host_marks_.size());
  host_marks_[size_t(i)] = std::chrono::steady_clock::now();
}

double Device::time_mark_ms(int i) {
  ANVIL_ASSERT(i >= 0 && size_t(i) < host_marks_.size(), "time mark {} outside the pool of {}", i,
               host_marks_.size());
  return std::chrono::duration<double, std::milli>(host_marks_[size_t(i)] - host_marks_[0]).count();
}

namespace {
class PassedFence final : public Device::Fence {
 public:
  void record() override {}
  void wait() override {}
};
}  // namespace

std::unique_ptr<Device::Fence> Device::make_fence() {
  return std::make_unique<PassedFence>();
}

}  // namespace anvil
