// Profiling of training steps (`--profile_steps A:B`): labelled ranges for each profiled step, written as
// a Chrome trace (JSON; opens in Perfetto or chrome://tracing), with NVTX ranges at the same places for
// Nsight Systems.
//
// Three tracks. "device": the step as a sequence of phases (data, forward per block, forward head,
// backward head, recompute and backward per block, backward embedding, optimizer), each the time between
// consecutive timing marks on the compute stream (GPU time on CUDA, from events; the host clock on the
// CPU, which computes synchronously). "host": the host thread's step, including waits for the loader.
// "kernels" (CUDA, when built with CUPTI): every kernel, memcpy and memset of the step, one row per CUDA
// stream, on the device track's clock (runtime/kernel_activity.hpp), and a table of the kernels that took
// the most GPU time, printed by finish(). With several processes two more on each rank's step track,
// "communication" (each collective, from the communicator's clock stamps) and "compute waiting for
// communication" (the exposed part); each rank writes its own trace and rank 0 joins them into one file,
// one process group of tracks per rank (join_ranks).
// The marks come from a pool made when the profiler is, and so do the kernel recorder's buffers, so
// profiling allocates nothing on the device in the step loop; a step's marks and kernel records are read
// back at its end (one synchronisation, profiled steps only). Kernel recording is on only during profiled
// steps.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/device.hpp"
#include "runtime/kernel_activity.hpp"

namespace anvil {

class StepProfiler {
 public:
  // Profiles global steps first..last (1-based, inclusive); `path` is written by finish(). `rank` of
  // `world` processes names the trace's tracks (and their place among the ranks' in a joined trace).
  StepProfiler(Device& dev, std::string path, int64_t first, int64_t last, int rank = 0, int world = 1);
  ~StepProfiler();

  bool profiling(int64_t step) const { return step >= first_ && step <= last_; }
  // The step's device track starts (a timing mark), its kernel recording and its host clock start.
  void begin_step(int64_t step);
  // Ends the current phase (if any) and starts `name` (of block `layer`, -1: none); no-op outside a
  // profiled step.
  void phase(std::string_view name, int layer = -1);
  // A collective (or, `wait`, compute waiting for collectives) of the current step, in milliseconds from
  // the step's start on the device (its first mark); no-op outside a profiled step.
  void communication(const char* name, double begin_ms, double end_ms, bool wait, size_t bytes);
  // Synchronises, reads the marks and the kernel records and appends the step's events.
  void end_step();
  // Writes the trace (atomically), prints the top kernels (when there is a kernel track) and returns the
  // number of events.
  size_t finish();
  bool in_step() const { return in_step_; }
  const std::string& path() const { return path_; }

  // The kernel track: what records it, or "none: " and why there is none (the CPU backend, a build
  // without CUPTI, a CUPTI error).
  const std::string& kernel_track() const { return kernel_track_; }
  // GPU time by kernel (and by memcpy / memset kind) over the profiled steps so far, longest first.
  struct KernelTotal {
    std::string name;  // demangled kernel name, or "memcpy HtoD", "memset", ...
    GpuActivity::Kind kind = GpuActivity::Kind::kernel;
    int64_t calls = 0;
    double total_ms = 0;
    double share = 0;  // of the GPU time of every activity recorded
  };
  std::vector<KernelTotal> top_kernels(size_t n) const;
  // The table finish() prints: the `n` longest, with totals; "" when no kernel was recorded.
  std::string kernel_summary(size_t n = 10) const;

  // Marks per step: enough for every phase of a model with this many blocks and micro-batches.
  static int marks_needed(int n_layer, int micro_batches);

  // Rank 0 of several processes, after every rank's finish() (a barrier between): reads the traces the
  // other ranks wrote (rank_path) and adds their events to this one's file, each rank's clock placed on
  // rank 0's (the same host's steady clock; on another host, by the start of the first profiled step), then
  // removes them. Returns the ranks whose trace was not found (a node whose output_dir is not shared: its
  // trace stays on that node).
  std::vector<int> join_ranks(int world);
  // Where rank `rank` writes its trace beside rank 0's `path`.
  static std::string rank_path(const std::string& path, int rank);

 private:
  struct Phase {
    std::string name;
    int layer;
  };
  struct Total {
    GpuActivity::Kind kind = GpuActivity::Kind::kernel;
    int64_t calls = 0, ns = 0;
  };
  // Runs `f` on the kernel recorder; on an anvil::Error the kernel track stops (with a warning), the
  // rest of the profile goes on.
  template <class F>
  void with_kernels(F&& f);
  nlohmann::json append_kernel_events(const std::vector<double>& mark_ms);

  Device& dev_;
  std::string path_;
  int64_t first_, last_, step_ = 0;
  int rank_, world_;
  bool comm_tracks_ = false;  // communication() was called
  // The trace's process ids of this rank's step tracks and kernel track (see the layout in the .cpp).
  int steps_pid() const { return 2 * rank_; }
  int kernels_pid() const { return 2 * rank_ + 1; }
  bool in_step_ = false, range_open_ = false;
  int capacity_ = 0;
  std::vector<Phase> phases_;  // of the current step; phase i spans marks i .. i+1
  double host_origin_ms_ = -1, step_host_start_ms_ = 0, device_offset_ms_ = 0;
  std::string events_;  // the trace's event objects so far, comma-separated
  size_t count_ = 0;

  // The kernel track.
  std::unique_ptr<KernelActivity> kernels_;  // null: no kernel track (kernel_track_ says why)
  std::string kernel_track_;
  KernelActivity::StepRecords records_;    // the current step's (reused)
  std::vector<std::string> kernel_names_;  // kernels_->names(), kept should the recorder stop
  std::vector<Total> totals_;              // by name id, over the profiled steps
  std::map<uint32_t, unsigned> streams_;   // stream id -> bit (1 << kind) of each kind seen on it
  int64_t compute_stream_ = -1;
  int64_t activities_ = 0, activity_ns_ = 0, busy_ns_ = 0;
  double device_ms_ = 0;  // the profiled steps' device tracks, summed
  int kernel_steps_ = 0, unanchored_steps_ = 0;
  size_t dropped_ = 0;
};

}  // namespace anvil
