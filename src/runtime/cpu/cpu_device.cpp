// The CPU device: host memory, synchronous copies. Allocations are 64-byte aligned for vector loads.
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>

#include "runtime/device.hpp"

namespace anvil {
namespace {

void* aligned_host_alloc(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!p) ANVIL_THROW("out of host memory: could not allocate {} bytes", bytes);
  return p;
}

class CpuDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::CPU; }
  std::string name() const override { return fmt::format("cpu ({} threads)", omp_get_max_threads()); }
  void copy_to_device(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void copy_to_host(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void copy_on_device(void* dst, const void* src, size_t n) override { std::memmove(dst, src, n); }
  void fill_zero(void* dst, size_t n) override { std::memset(dst, 0, n); }
  void upload_on_compute(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void copy_to_device_async(void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void wait_for_copies() override {}
  void sync_copies() override {}
  void synchronize() override {}
  size_t driver_used_bytes() const override { return 0; }
  size_t total_memory_bytes() const override { return 0; }
  // No reliable figure: /proc/meminfo's MemAvailable ignores container (cgroup) limits and, on VMs whose
  // memory grows as it is used, reports far less than a run can get; Linux overcommits anyway, so an
  // arena too large fails when touched, not when allocated. The start-up check is skipped on the CPU.
  std::optional<size_t> available_memory_bytes() const override { return std::nullopt; }

 protected:
  void* device_alloc(size_t bytes) override { return aligned_host_alloc(bytes); }
  void device_free(void* p) noexcept override { std::free(p); }
  void* host_pinned_alloc(size_t bytes) override { return aligned_host_alloc(bytes); }
  void host_pinned_free(void* p) noexcept override { std::free(p); }
};

}  // namespace

std::unique_ptr<Device> make_cpu_device() {
  return std::make_unique<CpuDevice>();
}

}  // namespace anvil
