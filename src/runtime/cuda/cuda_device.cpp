// The CUDA device: one compute stream for all kernels and synchronous copies, one copy stream for
// host-to-device batch uploads that overlap compute, and an event that orders the two.
#include "runtime/cuda/cuda_device.hpp"

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <memory>
#include <optional>
#include <type_traits>

#include "runtime/cuda/cuda_check.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

struct StreamDestroyer {
  void operator()(cudaStream_t s) const noexcept { ANVIL_CUDA_WARN(cudaStreamDestroy(s)); }
};
using StreamHandle = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroyer>;

struct EventDestroyer {
  void operator()(cudaEvent_t e) const noexcept { ANVIL_CUDA_WARN(cudaEventDestroy(e)); }
};
using EventHandle = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDestroyer>;

StreamHandle make_stream() {
  cudaStream_t s = nullptr;
  // Non-blocking: no implicit ordering with the legacy default stream, which nothing here uses.
  ANVIL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return StreamHandle(s);
}

EventHandle make_event() {
  cudaEvent_t e = nullptr;
  ANVIL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return EventHandle(e);
}

int visible_gpu_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later calls don't report it
    return 0;
  }
  return count;
}

// Device memory the CUDA runtime takes after the device is made, as kernel modules and cuBLASLt state
// load lazily during the first steps (6-8 MiB measured on an H100 80GB, CUDA 13, driver 580, for GPT-2
// 124M and the tiny model; docs/memory.md), with headroom. Counted in the overhead, kept free by the
// start-up check.
constexpr size_t kCudaLazyLoadReserveBytes = 32ull << 20;

// Sets the device current on construction; the streams, event and all later calls belong to it.
struct CurrentDevice {
  explicit CurrentDevice(int ordinal) { ANVIL_CUDA_CHECK(cudaSetDevice(ordinal)); }
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal)
      : ordinal_(ordinal),
        current_(ordinal),
        compute_(make_stream()),
        copy_(make_stream()),
        copies_done_(make_event()) {
    ANVIL_CUDA_CHECK(cudaGetDeviceProperties(&props_, ordinal));
    // The context, the streams and the event exist now and nothing is allocated yet: what the driver
    // reports in use is the runtime's own overhead (plus any other process on this GPU).
    ANVIL_CUDA_CHECK(cudaFree(nullptr));
    context_overhead_ = driver_used_bytes();
  }

  ~CudaDevice() override {
    // Let queued work finish before the streams go away; errors here can only be reported.
    ANVIL_CUDA_WARN(cudaStreamSynchronize(copy_.get()));
    ANVIL_CUDA_WARN(cudaStreamSynchronize(compute_.get()));
  }

  DeviceKind kind() const override { return DeviceKind::CUDA; }
  std::string name() const override { return props_.name; }

  size_t driver_used_bytes() const override {
    size_t free_bytes = 0, total_bytes = 0;
    ANVIL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return total_bytes - free_bytes;
  }
  size_t total_memory_bytes() const override { return props_.totalGlobalMem; }
  size_t context_overhead_bytes() const override { return context_overhead_ + kCudaLazyLoadReserveBytes; }
  std::optional<size_t> available_memory_bytes() const override {
    size_t free_bytes = 0, total_bytes = 0;
    ANVIL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return free_bytes > kCudaLazyLoadReserveBytes ? free_bytes - kCudaLazyLoadReserveBytes : 0;
  }

  cudaStream_t compute_stream() const { return compute_.get(); }

  void make_time_marks(int count) override {
    timing_marks_.clear();
    for (int i = 0; i < count; ++i) {
      cudaEvent_t e = nullptr;
      ANVIL_CUDA_CHECK(cudaEventCreate(&e));  // timing enabled
      timing_marks_.emplace_back(e);
    }
  }
  void record_time_mark(int i) override { ANVIL_CUDA_CHECK(cudaEventRecord(timing_mark(i), compute_.get())); }
  double time_mark_ms(int i) override {
    float ms = 0;
    ANVIL_CUDA_CHECK(cudaEventElapsedTime(&ms, timing_mark(0), timing_mark(i)));
    return ms;
  }
  void range_push(const char* name) override { nvtxRangePushA(name); }
  void range_pop() override { nvtxRangePop(); }
  int ordinal() const { return ordinal_; }

  // Queued on the compute stream so they are ordered after the kernels that produce/consume the data.
  void copy_to_device(void* dst, const void* src, size_t bytes) override {
    copy_sync(dst, src, bytes, cudaMemcpyHostToDevice);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    copy_sync(dst, src, bytes, cudaMemcpyDeviceToHost);
  }
  void copy_on_device(void* dst, const void* src, size_t bytes) override {
    if (bytes) ANVIL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_.get()));
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes) ANVIL_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, compute_.get()));
  }
  void upload_on_compute(void* dst, const void* src, size_t bytes) override {
    if (bytes) ANVIL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_.get()));
  }

  void copy_to_device_async(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    if (inputs_released_) {  // the copy must not overwrite a buffer that queued compute still reads
      ANVIL_CUDA_CHECK(cudaStreamWaitEvent(copy_.get(), inputs_released_event_.get(), 0));
      inputs_released_ = false;
    }
    ANVIL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_.get()));
  }
  void release_inputs_to_copies() override {
    ANVIL_CUDA_CHECK(cudaEventRecord(inputs_released_event_.get(), compute_.get()));
    inputs_released_ = true;
  }
  std::unique_ptr<Graph> capture(const std::function<void()>& record) override;
  void wait_for_copies() override {
    ANVIL_CUDA_CHECK(cudaEventRecord(copies_done_.get(), copy_.get()));
    ANVIL_CUDA_CHECK(cudaStreamWaitEvent(compute_.get(), copies_done_.get(), 0));
  }
  void sync_copies() override { ANVIL_CUDA_CHECK(cudaStreamSynchronize(copy_.get())); }

  void synchronize() override {
    ANVIL_CUDA_CHECK(cudaStreamSynchronize(copy_.get()));
    ANVIL_CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
  }

  // An event on the compute stream (no timing).
  class EventFence final : public Fence {
   public:
    explicit EventFence(cudaStream_t stream) : stream_(stream), event_(make_event()) {}
    void record() override { ANVIL_CUDA_CHECK(cudaEventRecord(event_.get(), stream_)); }
    void wait() override { ANVIL_CUDA_CHECK(cudaEventSynchronize(event_.get())); }

   private:
    cudaStream_t stream_;
    EventHandle event_;
  };
  std::unique_ptr<Fence> make_fence() override { return std::make_unique<EventFence>(compute_.get()); }

 protected:
  void* device_alloc(size_t bytes) override {
    void* p = nullptr;
    if (bytes == 0) return nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // out-of-memory is not sticky; clear it
      ANVIL_THROW("out of GPU memory on {}: cudaMalloc of {} bytes failed: {} ({} bytes in use)", name(),
                  bytes, cudaGetErrorString(err), driver_used_bytes());
    }
    return p;
  }
  // Never throws: it runs from DeviceBuffer's destructor.
  void device_free(void* p) noexcept override {
    if (p) ANVIL_CUDA_WARN(cudaFree(p));
  }
  void* host_pinned_alloc(size_t bytes) override {
    void* p = nullptr;
    if (bytes == 0) return nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      ANVIL_THROW("cudaHostAlloc of {} bytes of pinned host memory failed: {}", bytes,
                  cudaGetErrorString(err));
    }
    return p;
  }
  void host_pinned_free(void* p) noexcept override {
    if (p) ANVIL_CUDA_WARN(cudaFreeHost(p));
  }

 private:
  void copy_sync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (!bytes) return;
    ANVIL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, compute_.get()));
    ANVIL_CUDA_CHECK(cudaStreamSynchronize(compute_.get()));
  }

  int ordinal_;
  CurrentDevice current_;  // before the streams: they are created on this device
  cudaDeviceProp props_{};
  cudaEvent_t timing_mark(int i) const {
    if (i < 0 || size_t(i) >= timing_marks_.size())
      detail::raise_at(
          __FILE__, __LINE__,
          "time mark " + std::to_string(i) + " outside the pool of " + std::to_string(timing_marks_.size()));
    return timing_marks_[size_t(i)].get();
  }

  StreamHandle compute_;
  StreamHandle copy_;
  std::vector<EventHandle> timing_marks_;  // profiling (StepProfiler)
  EventHandle copies_done_;
  EventHandle inputs_released_event_ = make_event();
  bool inputs_released_ = false;  // recorded since the last async copy
  size_t context_overhead_ = 0;
};

struct GraphDestroyer {
  void operator()(cudaGraph_t g) const noexcept { ANVIL_CUDA_WARN(cudaGraphDestroy(g)); }
};
using GraphHandle = std::unique_ptr<std::remove_pointer_t<cudaGraph_t>, GraphDestroyer>;

class CudaGraph final : public Device::Graph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { ANVIL_CUDA_WARN(cudaGraphExecDestroy(exec_)); }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  void launch() override { ANVIL_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

std::unique_ptr<Device::Graph> CudaDevice::capture(const std::function<void()>& record) {
  // Thread-local mode: the loader's threads (pinned staging) may make CUDA calls while this one records.
  ANVIL_CUDA_CHECK(cudaStreamBeginCapture(compute_.get(), cudaStreamCaptureModeThreadLocal));
  try {
    record();
  } catch (...) {
    cudaGraph_t partial = nullptr;
    (void)cudaStreamEndCapture(compute_.get(), &partial);  // ends the capture whatever its state
    if (partial) ANVIL_CUDA_WARN(cudaGraphDestroy(partial));
    (void)cudaGetLastError();  // an invalidated capture leaves its error behind; the original one propagates
    throw;
  }
  cudaGraph_t raw = nullptr;
  ANVIL_CUDA_CHECK(cudaStreamEndCapture(compute_.get(), &raw));
  const GraphHandle graph(raw);
  cudaGraphExec_t exec = nullptr;
  ANVIL_CUDA_CHECK(cudaGraphInstantiate(&exec, graph.get(), 0));
  return std::make_unique<CudaGraph>(exec, compute_.get());
}

}  // namespace

bool cuda_available() {
  return visible_gpu_count() > 0;
}

bool cuda_compiled() {
  return true;
}

std::unique_ptr<Device> make_cuda_device(int ordinal) {
  const int count = visible_gpu_count();
  if (count == 0)
    ANVIL_THROW("--device cuda: no CUDA GPU is visible (check the driver and CUDA_VISIBLE_DEVICES)");
  if (ordinal < 0 || ordinal >= count)
    ANVIL_THROW("--device cuda: GPU ordinal {} is out of range: {} GPU(s) visible", ordinal, count);
  return std::make_unique<CudaDevice>(ordinal);
}

cudaStream_t cuda_compute_stream(Device& dev) {
  auto* cuda_dev = dynamic_cast<CudaDevice*>(&dev);
  if (!cuda_dev)
    ANVIL_THROW("the CUDA ops need a CUDA device, got the {} device '{}'", device_name(dev.kind()),
                dev.name());
  return cuda_dev->compute_stream();
}

int cuda_device_ordinal(Device& dev) {
  auto* cuda_dev = dynamic_cast<CudaDevice*>(&dev);
  if (!cuda_dev)
    ANVIL_THROW("a CUDA device was expected, got the {} device '{}'", device_name(dev.kind()), dev.name());
  return cuda_dev->ordinal();
}

}  // namespace anvil
