// GPU activity of profiled steps (`--profile_steps A:B`): every kernel, memcpy and memset the device ran
// during a step, with GPU start and end times, for the "kernels" track of StepProfiler's trace and its
// summary of the top kernels. On CUDA this is CUPTI's activity API (runtime/cuda/kernel_activity.cpp);
// the CPU backend runs no kernels and builds without CUPTI have no recorder (make_kernel_activity says
// why).
//
// The recorder follows StepProfiler's step: start() on the idle device before the step's first timing mark
// (it turns recording on), mark_origin() immediately before each recording of mark 0 (it queues a time
// origin on the compute stream; StepProfiler records mark 0 at begin_step and again at the first phase,
// and the last one counts), stop() once the step's last mark has completed and the device is synchronised
// (it turns recording off and collects the records), close() after the last profiled step. Between stop()
// and the next start() nothing is recorded, so steps outside the profiled range pay nothing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/device.hpp"

namespace anvil {

// One GPU activity of a step.
struct GpuActivity {
  enum class Kind : uint8_t { kernel, memcpy, memset };
  Kind kind = Kind::kernel;
  uint32_t name = 0;         // index into KernelActivity::names()
  uint32_t stream = 0;       // the recorder's stream id (CUPTI's on CUDA)
  uint32_t correlation = 0;  // links the activity to the API call that queued it (CUPTI correlation id)
  // GPU time in nanoseconds after the step's origin, which is the device track's mark 0 (see
  // KernelActivity::StepRecords::anchored for how exact that is).
  int64_t start_ns = 0, end_ns = 0;
  int32_t grid[3] = {0, 0, 0}, block[3] = {0, 0, 0};  // kernels
  int32_t registers = 0;                              // kernels: registers per thread
  int32_t shared_bytes = 0;                           // kernels: static + dynamic shared memory per block
  uint64_t bytes = 0;                                 // memcpy, memset
};

class KernelActivity {
 public:
  // What stop() collects for one step.
  struct StepRecords {
    std::vector<GpuActivity> activities;  // in the order the recorder delivered them (not sorted)
    // True when the origin is the GPU end time of an anchor kernel queued right before mark 0 on the
    // compute stream (exact to about a microsecond); false when its record was missing and the origin is
    // the host's CUPTI clock when mark 0 was queued (activities then appear late by mark 0's launch
    // latency, a few microseconds).
    bool anchored = false;
    int64_t compute_stream = -1;  // the compute stream's id (the anchor's stream), -1 if unknown
    size_t dropped = 0;           // records the recorder lost (no buffer space, or no timestamps)
  };

  virtual ~KernelActivity() = default;
  // Starts recording (the first call also attaches the recorder, e.g. CUPTI). Throws anvil::Error.
  virtual void start() = 0;
  // Queues a time origin on the compute stream; StepProfiler records mark 0 right after it. The step's
  // last origin is the one its activities are timed from.
  virtual void mark_origin() = 0;
  // The step's work is complete (the caller synchronised the device): stops recording and replaces
  // `out` with the step's activities (from its first origin on; work queued between the first and the last
  // origin gets negative times).
  virtual void stop(StepRecords& out) = 0;
  // No more profiled steps: detaches the recorder so later steps run without it. Never throws.
  virtual void close() noexcept = 0;
  // Names of the activities, indexed by GpuActivity::name: kernels demangled where the name is a
  // mangled C++ name, "memcpy HtoD" and the like, "memset". Ids stay valid for the recorder's life.
  virtual const std::vector<std::string>& names() const = 0;
  // For the trace's metadata: what records the kernel track, e.g. "CUPTI 13.0 activity API (...)".
  virtual std::string describe() const = 0;
};

// The device's recorder, made outside the step loop (it allocates its record buffers), or nullptr with
// the reason in `why_not` (the CPU backend; a build without CUDA or without CUPTI).
std::unique_ptr<KernelActivity> make_kernel_activity(Device& dev, std::string& why_not);
// Whether this build records kernel activity on CUDA devices (it was built with CUPTI).
bool kernel_activity_compiled();

// A kernel's name for one line of a table: without the return type and the parameter list, and at
// most `max_chars` characters ("..." marks a cut). The trace keeps the full names.
std::string short_kernel_name(std::string_view name, size_t max_chars = 96);

}  // namespace anvil
