// Memory history: a JSON-lines trace of one training step's memory, written while the step runs and
// rendered by `anvil memory-report` (docs/memory.md, "Memory history"). The arena is planned up front,
// so the trace records (a) the arena's buffers and (b) when data inside the activation and recompute
// buffers is live during the traced step; nothing here allocates device memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "anvil/memory_plan.hpp"
#include "io/atomic_dir.hpp"

namespace anvil {

constexpr int kMemoryTraceVersion = 1;
// The largest size a trace holds (8 PiB): sums of any number of sizes then fit in 64 bits.
constexpr size_t kMemoryTraceMaxBytes = size_t{1} << 53;

// The category as the trace spells it: the `anvil estimate --json` keys (weights, master_weights,
// gradients, optimizer_states, activations, recompute, workspace, communication, data).
// memory_category_name() gives the human label ("optimizer state") the report shows.
const char* memory_category_key(MemoryCategory c);
std::optional<MemoryCategory> memory_category_from_key(std::string_view key);
// Activations and recompute buffers hold the step's live data (the alloc/free events); every other
// category is persistent for the whole run.
constexpr bool memory_category_is_persistent(MemoryCategory c) {
  return c != MemoryCategory::Activations && c != MemoryCategory::Recompute;
}

// Writes a trace. Lines go to "<path>.tmp-<pid>"; finish() writes the summary and renames the file
// into place, so a trace that exists is complete. Destroyed without finish() (an error part way), it
// removes the temporary file. Errors (open, write, rename) throw anvil::Error naming the path; misuse
// (free of an id that is not live, a call after finish) throws too. Not thread-safe.
class MemoryTrace {
 public:
  MemoryTrace(std::string path, std::string_view device_name, size_t plan_bytes,
              size_t context_overhead_bytes, int64_t traced_step);
  MemoryTrace(const MemoryTrace&) = delete;
  MemoryTrace& operator=(const MemoryTrace&) = delete;
  ~MemoryTrace();

  // An arena buffer. Persistent unless `persistent` says otherwise (default: by category, see
  // memory_category_is_persistent); the persistent ones form the bottom of the picture and the peak.
  void buffer(std::string_view name, MemoryCategory category, size_t bytes);
  void buffer(std::string_view name, MemoryCategory category, size_t bytes, bool persistent);
  // Data of `bytes` becomes live (layer -1: not a layer's). Returns the id to free it with.
  int alloc(std::string_view name, MemoryCategory category, size_t bytes, int layer, std::string_view phase);
  void free(int id, std::string_view phase);
  // From here on the step is in `name` (forward, backward, recompute, optimizer, ...) of `layer`.
  void phase(std::string_view name, int layer = -1);
  // Writes the summary line, fsyncs and renames the trace into place.
  void finish();

  const std::string& path() const { return path_; }
  size_t persistent_bytes() const { return persistent_bytes_; }
  size_t live_bytes() const { return live_bytes_; }
  // persistent_bytes() + the most step data live at once so far.
  size_t peak_live_bytes() const { return persistent_bytes_ + max_live_bytes_; }

 private:
  void line(const std::string& json);
  void flush();
  void require_open(const char* what) const;

  std::string path_, temp_path_;
  size_t plan_bytes_ = 0, buffer_bytes_ = 0;
  std::optional<io::SyncedFileWriter> out_;
  std::string pending_;  // lines not yet written: one write per ~1 MiB, not per event
  bool finished_ = false;
  int64_t t_ = 0;
  int next_id_ = 0;
  std::unordered_map<int, size_t> live_;  // id -> bytes
  size_t persistent_bytes_ = 0, live_bytes_ = 0, max_live_bytes_ = 0;
  int64_t peak_t_ = -1;
};

// A parsed trace. Times are the events' `t`; an allocation never freed stays live to `end_t`.
struct MemoryTraceData {
  struct Buffer {
    std::string name;
    MemoryCategory category;
    size_t bytes = 0;
    bool persistent = true;
  };
  struct Alloc {
    int id = 0;
    std::string name;
    MemoryCategory category;
    size_t bytes = 0;
    int layer = -1;
    std::string phase, free_phase;  // free_phase empty while never freed
    int64_t t_alloc = 0;
    int64_t t_free = -1;  // -1: live to the end of the step
  };
  struct Phase {
    int64_t t = 0;
    std::string name;
    int layer = -1;
  };

  std::string source;  // the file it was read from
  std::string device;
  size_t plan_bytes = 0, context_overhead_bytes = 0;
  int64_t step = 0;
  std::vector<Buffer> buffers;  // in file order
  std::vector<Alloc> allocs;    // in allocation order
  std::vector<Phase> phases;
  int64_t end_t = 0;  // one past the last event's t (0 with no events)
  // From the events (and checked against the summary line).
  size_t persistent_bytes = 0, peak_live_bytes = 0;
  int64_t peak_t = -1;  // the event at which live step data first reached its maximum; -1: no allocations

  // The end of an allocation's life: t_free, or end_t when never freed.
  int64_t alloc_end(const Alloc& a) const { return a.t_free >= 0 ? a.t_free : end_t; }
};

// Parses and validates a trace; any problem throws anvil::Error "<source>:<line>: <what>".
MemoryTraceData parse_memory_trace(std::string_view text, const std::string& source);
// Reads `path` (error naming it if unreadable) and parses it.
MemoryTraceData read_memory_trace(const std::string& path);

}  // namespace anvil
