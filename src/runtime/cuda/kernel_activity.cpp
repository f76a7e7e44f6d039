// Kernel activity of profiled steps through CUPTI's activity API (runtime/kernel_activity.hpp).
//
// CUPTI writes one record per kernel (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: kernels keep running
// concurrently, unlike CUPTI_ACTIVITY_KIND_KERNEL), memcpy and memset into buffers that this recorder
// hands out through CUPTI's asynchronous buffer callbacks, and hands them back when they are full or
// flushed. The buffers come from a pool allocated when the recorder is made (outside the step loop); the
// pool only grows when one step fills all of it, and keeps what it grew for the next steps. A completed
// buffer is queued as it is; its records are decoded after the step, on the profiler's thread.
//
// CUPTI is attached at the first profiled step, recording is on only from start() to stop() of each
// profiled step, and close() (after the last profiled step) detaches CUPTI with cuptiFinalize so the
// rest of the run pays nothing for it (kept attached with ANVIL_CUPTI_DETACH=0, in case detaching misbehaves
// with some driver).
//
// Alignment with the device track: the device track's phases are CUDA event times relative to mark 0,
// CUPTI's records carry their own nanosecond clock. mark_origin() queues an empty anchor kernel on the
// compute stream immediately before each time StepProfiler records mark 0 there (at begin_step, on the idle
// device, and again at the step's first phase), so mark 0 completes when the anchor does (stream order; the
// event's own cost is well under a microsecond). The last anchor's CUPTI end time is therefore mark 0 on
// CUPTI's clock, and every record of the step is placed at (record time - that end) after mark 0. Both are
// GPU timestamps (CUPTI maps them linearly onto its clock), so the two cannot drift apart within a step by
// more than parts per million. Should the anchors' records be missing, the origin falls back to
// cuptiGetTimestamp() taken when the last anchor was queued: CUPTI's clock read on the host, early by the
// launch latency.
#ifdef ANVIL_WITH_CUPTI
#include "runtime/kernel_activity.hpp"

#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <unordered_map>

#include "anvil/error.hpp"
#include "runtime/cuda/cuda_device.hpp"
#include "runtime/cuda/cupti_check.hpp"
#include "runtime/cuda/profiler_anchor.hpp"

namespace anvil {
namespace {

// 8 MiB holds about 30,000 kernel records; two of them cover a typical step (GPT-2 124M with
// accumulation runs a few thousand kernels).
constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kInitialBuffers = 2;
constexpr std::align_val_t kBufferAlignment{8};  // CUPTI requires 8-byte aligned buffers

constexpr CUpti_ActivityKind kRecordedKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                                 CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

struct BufferDelete {
  void operator()(uint8_t* p) const noexcept { ::operator delete[](p, kBufferAlignment); }
};
using Buffer = std::unique_ptr<uint8_t[], BufferDelete>;

Buffer new_buffer() {
  return Buffer(static_cast<uint8_t*>(::operator new[](kBufferBytes, kBufferAlignment)));
}

std::string demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> text(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                                   &std::free);
  return status == 0 && text ? std::string(text.get()) : std::string(name);
}

const char* memcpy_name(uint8_t copy_kind) {
  switch (copy_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOH:
      return "memcpy HtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "memcpy PtoP";
    default:
      return "memcpy";
  }
}

bool detach_on_close() {
  const char* v = std::getenv("ANVIL_CUPTI_DETACH");
  return !v || std::strcmp(v, "0") != 0;
}

class CuptiKernelActivity;
// CUPTI's buffer callbacks take no user data: they reach the attached recorder through this pointer.
// One recorder at a time may be attached in a process.
std::atomic<CuptiKernelActivity*> g_attached{nullptr};

class CuptiKernelActivity final : public KernelActivity {
 public:
  explicit CuptiKernelActivity(cudaStream_t compute) : compute_(compute) {
    for (size_t i = 0; i < kInitialBuffers; ++i) {
      buffers_.push_back(new_buffer());
      free_.push_back(buffers_.back().get());
    }
    load_profiler_anchor();
    ANVIL_CUPTI_CHECK(cuptiGetVersion(&cupti_version_));
  }

  ~CuptiKernelActivity() override {
    close();
    // A buffer CUPTI never handed back must outlive this recorder (CUPTI may still write to it): leak it
    // rather than free memory in use. close() flushed, so this does not happen in practice.
    std::lock_guard<std::mutex> lock(mutex_);
    for (Buffer& b : buffers_) {
      const bool returned = std::find(free_.begin(), free_.end(), b.get()) != free_.end() ||
                            std::any_of(completed_.begin(), completed_.end(),
                                        [&](const Completed& c) { return c.buffer == b.get(); });
      if (!returned) (void)b.release();
    }
  }

  CuptiKernelActivity(const CuptiKernelActivity&) = delete;
  CuptiKernelActivity& operator=(const CuptiKernelActivity&) = delete;

  void start() override {
    if (!attached_) attach();
    for (CUpti_ActivityKind kind : kRecordedKinds) ANVIL_CUPTI_CHECK(cuptiActivityEnable(kind));
    recording_ = true;
    origin_marked_ = false;
  }

  void mark_origin() override {
    ANVIL_CUPTI_CHECK(cuptiGetTimestamp(&origin_host_ns_));
    if (!origin_marked_) first_origin_host_ns_ = origin_host_ns_;
    origin_marked_ = true;
    launch_profiler_anchor(compute_);
  }

  void stop(StepRecords& out) override {
    out.activities.clear();
    out.anchored = false;
    out.compute_stream = -1;
    out.dropped = 0;
    if (!recording_) return;
    // The caller synchronised the device, so every record of the step is complete: turn recording off,
    // then have CUPTI hand back every buffer, the partly filled one included.
    recording_ = false;
    for (CUpti_ActivityKind kind : kRecordedKinds) ANVIL_CUPTI_CHECK(cuptiActivityDisable(kind));
    ANVIL_CUPTI_CHECK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    size_t dropped = 0;
    ANVIL_CUPTI_CHECK(cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped));
    std::vector<Completed> completed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      completed.assign(completed_.begin(), completed_.end());
      completed_.clear();  // keeps its capacity, which take_back relies on
      out.dropped = dropped + declined_;
      declined_ = 0;
    }
    // The buffers go back to the pool however decoding ends.
    struct ReturnToPool {
      CuptiKernelActivity& self;
      const std::vector<Completed>& buffers;
      ~ReturnToPool() {
        std::lock_guard<std::mutex> lock(self.mutex_);
        for (const Completed& c : buffers) self.free_.push_back(c.buffer);  // capacity reserved: no throw
      }
    } return_to_pool{*this, completed};
    raw_.clear();
    for (const Completed& c : completed) decode(c.buffer, c.valid_bytes, out.dropped);
    place(out);
  }

  void close() noexcept override {
    if (!attached_) return;
    if (recording_) {
      for (CUpti_ActivityKind kind : kRecordedKinds) ANVIL_CUPTI_WARN(cuptiActivityDisable(kind));
      recording_ = false;
    }
    ANVIL_CUPTI_WARN(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    // Detaching is safe here: the device is synchronised, the buffers are flushed, and Anvil makes CUDA
    // calls from one thread only (the loader threads do host work).
    if (detach_on_close()) ANVIL_CUPTI_WARN(cuptiFinalize());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const Completed& c : completed_) free_.push_back(c.buffer);
      completed_.clear();
    }
    g_attached.store(nullptr);
    attached_ = false;
  }

  const std::vector<std::string>& names() const override { return names_; }

  std::string describe() const override {
    return fmt::format(
        "CUPTI activity API (CUPTI API version {}): kernels (CONCURRENT_KERNEL), memcpy and memset records, "
        "one row per CUDA stream; placed after the device track's mark 0 by an anchor kernel queued right "
        "before it on the compute stream",
        cupti_version_);
  }

  // CUPTI's callbacks (any thread). They must not throw.
  void hand_out(uint8_t** buffer, size_t* size) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      if (free_.empty()) {
        buffers_.push_back(new_buffer());  // one step filled the whole pool: grow it, keep it for later
        free_.push_back(buffers_.back().get());
      }
      // Room for every buffer in each list, so that taking one back never allocates.
      free_.reserve(buffers_.size());
      completed_.reserve(buffers_.size());
    } catch (const std::bad_alloc&) {
      ++declined_;  // CUPTI drops the records it has no buffer for; counted as (at least one) dropped
      return;
    }
    *buffer = free_.back();
    *size = kBufferBytes;
    free_.pop_back();
  }
  void take_back(uint8_t* buffer, size_t valid_bytes) noexcept {
    if (!buffer) return;
    std::lock_guard<std::mutex> lock(mutex_);
    completed_.push_back({buffer, valid_bytes});  // capacity reserved in hand_out: no throw
  }

 private:
  struct Completed {
    uint8_t* buffer;
    size_t valid_bytes;
  };
  // A record as CUPTI timed it, before placement on the step's clock.
  struct Raw {
    GpuActivity a;
    uint64_t start, end;
    bool anchor;
  };

  void attach() {
    CuptiKernelActivity* expected = nullptr;
    ANVIL_REQUIRE(g_attached.compare_exchange_strong(expected, this),
                  "another profiler in this process is recording kernels with CUPTI");
    try {
      ANVIL_CUPTI_CHECK(cuptiActivityRegisterCallbacks(&on_buffer_requested, &on_buffer_completed));
    } catch (...) {
      g_attached.store(nullptr);
      throw;
    }
    attached_ = true;
  }

  static void CUPTIAPI on_buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = nullptr;
    *size = 0;
    *max_records = 0;  // as many as fit
    if (CuptiKernelActivity* self = g_attached.load()) self->hand_out(buffer, size);
  }
  static void CUPTIAPI on_buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
    if (CuptiKernelActivity* self = g_attached.load()) self->take_back(buffer, valid_bytes);
  }

  uint32_t intern(std::string_view key, const char* mangled) {
    auto it = name_ids_.find(std::string(key));
    if (it != name_ids_.end()) return it->second;
    const auto id = uint32_t(names_.size());
    names_.push_back(mangled ? demangle(mangled) : std::string(key));
    name_ids_.emplace(std::string(key), id);
    return id;
  }

  void decode(uint8_t* buffer, size_t valid_bytes, size_t& dropped) {
    CUpti_Activity* record = nullptr;
    for (;;) {
      const CUptiResult r = cuptiActivityGetNextRecord(buffer, valid_bytes, &record);
      if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;
      if (r == CUPTI_ERROR_INVALID_KIND) {  // an incomplete record ends the buffer
        ++dropped;
        break;
      }
      if (r != CUPTI_SUCCESS) detail::raise_cupti_error("cuptiActivityGetNextRecord", __FILE__, __LINE__, r);
      Raw raw{};
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_KERNEL:
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          const char* name = k->name ? k->name : "(unnamed kernel)";
          raw.anchor = std::strcmp(name, kProfilerAnchorKernelName) == 0;
          raw.a.kind = GpuActivity::Kind::kernel;
          raw.a.name = intern(name, name);
          raw.a.stream = k->streamId;
          raw.a.correlation = k->correlationId;
          raw.a.grid[0] = k->gridX, raw.a.grid[1] = k->gridY, raw.a.grid[2] = k->gridZ;
          raw.a.block[0] = k->blockX, raw.a.block[1] = k->blockY, raw.a.block[2] = k->blockZ;
          raw.a.registers = k->registersPerThread;
          raw.a.shared_bytes = k->staticSharedMemory + k->dynamicSharedMemory;
          raw.start = k->start, raw.end = k->end;
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
          raw.a.kind = GpuActivity::Kind::memcpy;
          raw.a.name = intern(memcpy_name(m->copyKind), nullptr);
          raw.a.stream = m->streamId;
          raw.a.correlation = m->correlationId;
          raw.a.bytes = m->bytes;
          raw.start = m->start, raw.end = m->end;
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
          raw.a.kind = GpuActivity::Kind::memset;
          raw.a.name = intern("memset", nullptr);
          raw.a.stream = m->streamId;
          raw.a.correlation = m->correlationId;
          raw.a.bytes = m->bytes;
          raw.start = m->start, raw.end = m->end;
          break;
        }
        default:
          continue;  // no other kind is enabled
      }
      if (raw.start == 0 && raw.end == 0) {  // CUPTI could not time it (no device memory for timestamps)
        ++dropped;
        continue;
      }
      raw_.push_back(raw);
    }
  }

  // Puts the decoded records on the step's clock (see the top of this file).
  void place(StepRecords& out) {
    // The step's first anchor starts its records; its last (the latest launched: the highest correlation
    // id) is mark 0 as the device track finally records it.
    const Raw *first_anchor = nullptr, *anchor = nullptr;
    for (const Raw& r : raw_) {
      if (!r.anchor) continue;
      if (!first_anchor || r.a.correlation < first_anchor->a.correlation) first_anchor = &r;
      if (!anchor || r.a.correlation > anchor->a.correlation) anchor = &r;
    }
    // Without anchors: the host clock read of the first and the last mark_origin() (start() runs on an
    // idle device, so nothing recorded started earlier than the first but the step's own work).
    const uint64_t first = first_anchor ? first_anchor->start : first_origin_host_ns_;
    const uint64_t origin = anchor ? anchor->end : origin_host_ns_;
    out.anchored = anchor != nullptr;
    out.compute_stream = anchor ? int64_t(anchor->a.stream) : -1;
    out.activities.reserve(raw_.size());
    for (const Raw& r : raw_) {
      if (r.anchor || r.start < first) continue;
      GpuActivity a = r.a;
      a.start_ns = int64_t(r.start - origin);
      a.end_ns = int64_t(std::max(r.end, r.start) - origin);
      out.activities.push_back(a);
    }
  }

  cudaStream_t compute_;
  uint32_t cupti_version_ = 0;
  bool attached_ = false, recording_ = false, origin_marked_ = false;
  uint64_t first_origin_host_ns_ = 0, origin_host_ns_ = 0;  // cuptiGetTimestamp at this step's origins

  std::mutex mutex_;                  // guards the pool below (CUPTI calls back from its own threads)
  std::vector<Buffer> buffers_;       // every buffer, owned
  std::vector<uint8_t*> free_;        // those not with CUPTI and not awaiting decoding
  std::vector<Completed> completed_;  // handed back by CUPTI, not decoded yet
  size_t declined_ = 0;               // buffer requests that could not be met

  std::vector<Raw> raw_;  // the step's records (reused)
  std::vector<std::string> names_;
  std::unordered_map<std::string, uint32_t> name_ids_;
};

}  // namespace

bool kernel_activity_compiled() {
  return true;
}

std::unique_ptr<KernelActivity> make_kernel_activity(Device& dev, std::string& why_not) {
  if (dev.kind() == DeviceKind::CPU) {
    why_not = "the CPU backend runs no GPU kernels";
    return nullptr;
  }
  return std::make_unique<CuptiKernelActivity>(cuda_compute_stream(dev));
}

}  // namespace anvil
#endif  // ANVIL_WITH_CUPTI
