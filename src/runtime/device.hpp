// A compute device: memory, copies and ordering. The CPU device is plain host memory; the CUDA device
// owns a compute stream and a copy stream (host-to-device batch copies overlap compute on it).
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "anvil/tensor.hpp"

namespace anvil {

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // e.g. "cpu (2 threads)" or "NVIDIA H100 80GB HBM3"

  // Device memory. Only the arena and start-up code call these: never inside the step loop. Counted in
  // memory_stats(). free() never throws (it runs from destructors).
  void* alloc(size_t bytes);
  void free(void* p) noexcept;
  // Page-locked host memory for staging batches (plain aligned memory on the CPU device); counted
  // separately from device memory.
  void* alloc_host_pinned(size_t bytes);
  void free_host_pinned(void* p) noexcept;

  // What alloc() / alloc_host_pinned() hand out, as requested (the allocator's own rounding, e.g.
  // cudaMalloc's 2 MiB granularity, is not counted).
  struct MemoryStats {
    size_t allocated_bytes = 0;       // device memory held now
    size_t peak_allocated_bytes = 0;  // the most device memory held at once
    size_t allocations = 0;           // device allocations held now
    size_t pinned_bytes = 0;          // pinned host staging memory held now
    size_t peak_pinned_bytes = 0;
  };
  MemoryStats memory_stats() const;

  // Synchronous copies (ordered after all work queued on the compute stream).
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t bytes) = 0;  // async on compute stream
  virtual void fill_zero(void* dst, size_t bytes) = 0;                        // async on compute stream
  // Host-to-device copy queued on the compute stream from pinned `src`, which is read when the copy runs:
  // recorded into a Graph, every replay copies what `src` holds then (how per-step values reach a graph).
  virtual void upload_on_compute(void* dst, const void* src, size_t bytes) = 0;

  // Host-to-device copy on the copy stream; `src` must be pinned. The next call of
  // wait_for_copies() makes later compute work wait for every copy queued so far.
  virtual void copy_to_device_async(void* dst, const void* src, size_t bytes) = 0;
  virtual void wait_for_copies() = 0;
  // Blocks until the host buffer of the last async copy may be reused.
  virtual void sync_copies() = 0;
  // Copies queued by copy_to_device_async after this call wait for the compute work queued before it: the
  // device buffers that work reads may then be overwritten by the next batch (double-buffered inputs).
  virtual void release_inputs_to_copies() {}

  // Work recorded once and replayed with one launch (a CUDA graph). The recorded work keeps every pointer
  // and every host-side scalar it was queued with; it must not synchronise, allocate or copy to the host.
  class Graph {
   public:
    virtual ~Graph() = default;
    virtual void launch() = 0;  // queued on the compute stream like any other work
  };
  // Records the compute work that `record` queues (nothing runs while recording) into a Graph; nullptr on
  // backends without graphs (the CPU). If `record` throws, the recording is abandoned and the error
  // propagates.
  virtual std::unique_ptr<Graph> capture(const std::function<void()>& record) { return nullptr; }

  virtual void synchronize() = 0;  // wait for all queued work

  // A point in the compute stream: record() marks the work queued so far, wait() blocks the host until that
  // work has run (a pinned buffer that a queued upload_on_compute reads may then be refilled). A fence never
  // recorded is passed. The CPU backend runs its work as it is queued: its fences are always passed.
  class Fence {
   public:
    virtual ~Fence() = default;
    virtual void record() = 0;
    virtual void wait() = 0;
  };
  virtual std::unique_ptr<Fence> make_fence();

  // Bytes of device memory in use as the driver sees it (0 on the CPU). On CUDA this counts every
  // process on the GPU.
  virtual size_t driver_used_bytes() const = 0;
  virtual size_t total_memory_bytes() const = 0;
  // Device memory the runtime itself holds outside alloc() (0 on the CPU). On CUDA: what the driver
  // reports in use once the context and streams exist, measured when the device is made (it counts
  // other processes on the GPU too), plus a reserve for the kernel modules and cuBLASLt state that load
  // lazily at the first steps. See docs/memory.md.
  virtual size_t context_overhead_bytes() const { return 0; }
  // Device memory this process's allocations can still get (CUDA: cudaMemGetInfo's free bytes less the
  // lazy-loading reserve), or nullopt where no reliable figure exists (the CPU: see docs/memory.md).
  virtual std::optional<size_t> available_memory_bytes() const = 0;

  // Profiling (StepProfiler). Timing marks on the compute stream: make_time_marks(n) creates a pool of n
  // (outside the step loop), record_time_mark(i) queues mark i, and after synchronize() time_mark_ms(i)
  // is mark i's time in milliseconds after mark 0. The CPU backend computes synchronously on the calling
  // thread, so its marks are the host clock at the call; CUDA uses events (GPU time).
  virtual void make_time_marks(int count);
  virtual void record_time_mark(int i);
  virtual double time_mark_ms(int i);
  // Named ranges for external profilers (NVTX on CUDA, for Nsight Systems); no-ops on the CPU.
  virtual void range_push(const char* name) {}
  virtual void range_pop() {}

 protected:
  // The backend's allocators behind alloc() / alloc_host_pinned(); the free functions never throw.
  virtual void* device_alloc(size_t bytes) = 0;
  virtual void device_free(void* p) noexcept = 0;
  virtual void* host_pinned_alloc(size_t bytes) = 0;
  virtual void host_pinned_free(void* p) noexcept = 0;

 private:
  std::vector<std::chrono::steady_clock::time_point> host_marks_;  // the CPU's timing marks
  mutable std::mutex stats_mutex_;
  std::unordered_map<const void*, size_t> device_sizes_, pinned_sizes_;  // live allocations
  MemoryStats stats_;
};

// The device of `kind` (make_cpu_device or make_cuda_device).
std::unique_ptr<Device> make_device(DeviceKind kind);

std::unique_ptr<Device> make_cpu_device();
// Throws anvil::Error when Anvil was built without CUDA or no GPU is visible.
std::unique_ptr<Device> make_cuda_device(int ordinal = 0);
bool cuda_available();  // built with CUDA and at least one GPU visible
bool cuda_compiled();   // built with CUDA (a GPU may or may not be visible)

// RAII owner of one allocation from a Device.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device& dev, size_t bytes)
      : dev_(&dev), bytes_(bytes), ptr_(bytes ? dev.alloc(bytes) : nullptr) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = o.dev_, bytes_ = o.bytes_, ptr_ = o.ptr_;
      o.ptr_ = nullptr, o.bytes_ = 0;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void reset() {
    if (ptr_) dev_->free(ptr_);
    ptr_ = nullptr, bytes_ = 0;
  }
  void* get() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  Device* dev_ = nullptr;
  size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

// RAII owner of pinned host memory.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(Device& dev, size_t bytes) : dev_(&dev), bytes_(bytes), ptr_(dev.alloc_host_pinned(bytes)) {}
  ~PinnedBuffer() {
    if (ptr_) dev_->free_host_pinned(ptr_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : dev_(o.dev_), bytes_(o.bytes_), ptr_(o.ptr_) { o.ptr_ = nullptr; }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  Device* dev_ = nullptr;
  size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

}  // namespace anvil
