#include "train/step_instruments.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

namespace anvil {

StepInstruments::StepInstruments(const TrainConfig& cfg, const ResolvedTrainConfig& rc, Engine& e,
                                 int64_t start_step, int64_t total_steps, dist::Communicator* comm)
    : cfg_(cfg),
      e_(e),
      comm_(comm),
      start_step_(start_step),
      total_steps_(total_steps),
      // The first step at or after memory_trace_step (a resumed run may start later).
      trace_step_(std::max<int64_t>(cfg.memory_trace_step, start_step + 1)),
      profile_first_(rc.profile_first),
      profile_last_(rc.profile_last) {
  if (!cfg.memory_trace.empty() && trace_step_ > total_steps)
    fmt::print("  memory_trace: step {} is past the run's last step {}; no trace written\n", trace_step_,
               total_steps);
  if (profile_first_ > 0) {
    const std::string path = (std::filesystem::path(cfg.output_dir) /
                              fmt::format("profile_steps_{}-{}.json", profile_first_, profile_last_))
                                 .string();
    profiler_ = std::make_unique<StepProfiler>(e.device(), path, profile_first_, profile_last_,
                                               comm ? comm->rank() : 0, comm ? comm->world_size() : 1);
    e.model().set_profiler(profiler_.get());
  }
}

void StepInstruments::begin_step(int64_t step) {
  if (profiler_) profiler_->begin_step(step);
  if (cfg_.memory_trace.empty() || step != trace_step_) return;
  Device& dev = e_.device();
  const MemoryPlan& plan = e_.plan();
  trace_ = std::make_unique<MemoryTrace>(cfg_.memory_trace, dev.name(), plan.total_bytes(),
                                         dev.context_overhead_bytes(), step);
  for (const PlannedBuffer& b : plan.buffers()) {
    if (b.shared_bytes == 0) {
      trace_->buffer(b.name, b.category, b.bytes);
      continue;
    }
    // The part over other buffers is their memory (already listed): only the rest is this buffer's own.
    trace_->buffer(
        fmt::format("{} (a further {} reuses activation memory)", b.name, format_bytes(b.shared_bytes)),
        b.category, b.bytes - std::min(b.bytes, b.shared_bytes));
  }
  e_.model().set_memory_trace(trace_.get());
}

void StepInstruments::end_step(int64_t step) {
  if (profiler_ && profiler_->in_step()) profiler_->end_step();
  if (!trace_) return;
  e_.model().set_memory_trace(nullptr);
  trace_->finish();
  fmt::print("memory trace of step {} -> {} (peak of live data {}; render: anvil memory-report {})\n", step,
             trace_->path(), format_bytes(trace_->peak_live_bytes()), trace_->path());
  trace_.reset();
}

void StepInstruments::finish() {
  if (!profiler_) return;
  e_.model().set_profiler(nullptr);
  if (profile_first_ > total_steps_ || profile_last_ <= start_step_) {
    fmt::print("profile_steps {}: outside this run's steps {}..{}; no profile written\n", cfg_.profile_steps,
               start_step_ + 1, total_steps_);
    return;
  }
  const size_t events = profiler_->finish();
  if (comm_ && comm_->world_size() > 1) {
    comm_->barrier();  // every rank's trace is written
    if (comm_->rank() != 0) return;
    const std::vector<int> missing = profiler_->join_ranks(comm_->world_size());
    fmt::print(
        "profile of steps {} -> {} (rank 0: {} ranges; one group of tracks per rank; open in "
        "https://ui.perfetto.dev or chrome://tracing)\n",
        cfg_.profile_steps, profiler_->path(), events);
    if (!missing.empty())
      fmt::print(
          "  the traces of ranks {} were not found beside it (each rank writes {} into its output_dir; "
          "on a node whose output_dir is not shared it stays there)\n",
          fmt::join(missing, ", "), StepProfiler::rank_path(profiler_->path(), missing.front()));
    return;
  }
  fmt::print("profile of steps {} -> {} ({} ranges; open in https://ui.perfetto.dev or chrome://tracing)\n",
             cfg_.profile_steps, profiler_->path(), events);
}

}  // namespace anvil
