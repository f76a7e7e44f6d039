// Profiling of training steps (`--profile_steps A:B`): labelled ranges for each profiled step, written as
// a Chrome trace (JSON; opens in Perfetto or chrome://tracing), with NVTX ranges at the same places for
// Nsight Systems.
//
// Two tracks. "device": the step as a sequence of phases (data, forward per block, forward head,
// backward head, recompute and backward per block, backward embedding, optimizer), each the time between
// consecutive timing marks on the compute stream (GPU time on CUDA, from events; the host clock on the
// CPU, which computes synchronously). "host": the host thread's step, including waits for the loader.
// The marks come from a pool made when the profiler is, so profiling allocates nothing in the step loop;
// a step's marks are read back at its end (one synchronisation, profiled steps only).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/device.hpp"

namespace anvil {

class StepProfiler {
 public:
  // Profiles global steps first..last (1-based, inclusive); `path` is written by finish().
  StepProfiler(Device& dev, std::string path, int64_t first, int64_t last);

  bool profiling(int64_t step) const { return step >= first_ && step <= last_; }
  // The step's device track starts (a timing mark) and its host clock starts.
  void begin_step(int64_t step);
  // Ends the current phase (if any) and starts `name` (of block `layer`, -1: none); no-op outside a
  // profiled step.
  void phase(std::string_view name, int layer = -1);
  // Synchronises, reads the marks and appends the step's events.
  void end_step();
  // Writes the trace (atomically) and returns the number of events.
  size_t finish();
  bool in_step() const { return in_step_; }
  const std::string& path() const { return path_; }

  // Marks per step: enough for every phase of a model with this many blocks and micro-batches.
  static int marks_needed(int n_layer, int micro_batches);

 private:
  struct Phase {
    std::string name;
    int layer;
  };
  Device& dev_;
  std::string path_;
  int64_t first_, last_, step_ = 0;
  bool in_step_ = false, range_open_ = false;
  int capacity_ = 0;
  std::vector<Phase> phases_;  // of the current step; phase i spans marks i .. i+1
  double host_origin_ms_ = -1, step_host_start_ms_ = 0, device_offset_ms_ = 0;
  std::string events_;  // the trace's event objects so far, comma-separated
  size_t count_ = 0;
};

}  // namespace anvil
