// What watches the train step from outside: the profiler of profile_steps (a Chrome trace of the profiled
// steps, docs/performance.md) and the memory history of memory_trace (one step's trace for `anvil
// memory-report`, docs/memory.md). Steps either of them watches run eagerly (no CUDA graphs), so every
// phase is seen.
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>

#include "anvil/train_config.hpp"
#include "dist/communicator.hpp"
#include "memory/memory_trace.hpp"
#include "runtime/step_profiler.hpp"
#include "train/engine.hpp"
#include "train/resolved_config.hpp"

namespace anvil {

class StepInstruments {
 public:
  // Steps start_step + 1 .. total_steps (1-based) are to run. Says when the memory trace step is past the
  // run's last step; makes the profiler and hands it to the model. With several processes `comm` is the
  // job's communicator (null: one process): every rank profiles, rank 0 joins the traces.
  StepInstruments(const TrainConfig& cfg, const ResolvedTrainConfig& rc, Engine& e, int64_t start_step,
                  int64_t total_steps, dist::Communicator* comm = nullptr);

  // Global step `step` (1-based) starts: the profiler's step, and the memory trace when it is its step.
  void begin_step(int64_t step);
  // Whether `step` is profiled or traced (it must run eagerly).
  bool watching(int64_t step) const { return profiling(step) || trace_; }
  bool profiling(int64_t step) const { return profiler_ && profiler_->profiling(step); }
  // The step's collectives and waits (CommTimes::spans), for the profiler's communication tracks.
  void communication(const std::vector<dist::CommSpan>& spans) {
    if (profiler_)
      for (const dist::CommSpan& s : spans)
        profiler_->communication(s.name, s.begin_ms, s.end_ms, s.wait, s.bytes);
  }
  // The profiler's phase; the memory trace's phase.
  void phase(std::string_view name) {
    if (profiler_) profiler_->phase(name);
  }
  void trace_phase(std::string_view name) {
    if (trace_) trace_->phase(name);
  }
  // After the step's final synchronisation: the profiled step's events are read, the trace is written.
  void end_step(int64_t step);
  // After the last step: writes the profile (or says the profiled steps were outside the run); with several
  // processes every rank writes its own, then rank 0 joins them (a barrier: every rank calls it).
  void finish();

 private:
  const TrainConfig& cfg_;
  Engine& e_;
  dist::Communicator* const comm_;
  int64_t start_step_, total_steps_, trace_step_;
  int64_t profile_first_, profile_last_;
  std::unique_ptr<StepProfiler> profiler_;
  std::unique_ptr<MemoryTrace> trace_;
};

}  // namespace anvil
