#include "runtime/step_profiler.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "io/atomic_dir.hpp"

namespace anvil {
namespace {

// Trace layout: pid 2r holds rank r's step tracks (tid 1 device, tid 2 host, tid 3 communication, tid 4
// compute waiting for communication), pid 2r + 1 its kernel track with one row per CUDA stream (tid
// kStreamTidBase + stream id, distinct from the step tracks' tids: some viewers key threads by tid alone).
// One process: pids 0 and 1.
constexpr int64_t kStreamTidBase = 1000;
constexpr int kDeviceTid = 1, kHostTid = 2, kCommTid = 3, kWaitTid = 4;
constexpr size_t kStepTopKernels = 5;      // per step, in the host track's step event
constexpr size_t kTraceTopKernels = 20;    // over all steps, in the trace's otherData
constexpr size_t kPrintedTopKernels = 10;  // printed by finish()

double host_now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string event(const std::string& name, const char* track, int pid, int tid, double ts_ms, double dur_ms,
                  int64_t step, int layer, const nlohmann::json* extra_args = nullptr) {
  nlohmann::json args = {{"step", step}};
  if (layer >= 0) args["layer"] = layer;
  if (extra_args) args.update(*extra_args);
  const nlohmann::json e = {{"name", name},         {"cat", track}, {"ph", "X"},
                            {"pid", pid},           {"tid", tid},   {"ts", ts_ms * 1000},
                            {"dur", dur_ms * 1000}, {"args", args}};
  return e.dump();
}

std::string host_name() {
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string();
}

const char* kind_name(GpuActivity::Kind k) {
  switch (k) {
    case GpuActivity::Kind::memcpy:
      return "memcpy";
    case GpuActivity::Kind::memset:
      return "memset";
    default:
      return "kernel";
  }
}

std::string dims(const int32_t (&d)[3]) {
  return fmt::format("({}, {}, {})", d[0], d[1], d[2]);
}

// Total length of the union of [start, end) intervals (sorted in place), clipped to [0, limit).
int64_t union_ns(std::vector<std::pair<int64_t, int64_t>>& spans, int64_t limit) {
  std::sort(spans.begin(), spans.end());
  int64_t total = 0, cur_start = 0, cur_end = -1;
  for (auto [s, e] : spans) {
    s = std::clamp<int64_t>(s, 0, limit), e = std::clamp<int64_t>(e, 0, limit);
    if (e <= s) continue;
    if (s > cur_end) {
      if (cur_end > cur_start) total += cur_end - cur_start;
      cur_start = s, cur_end = e;
    } else {
      cur_end = std::max(cur_end, e);
    }
  }
  if (cur_end > cur_start) total += cur_end - cur_start;
  return total;
}

}  // namespace

int StepProfiler::marks_needed(int n_layer, int micro_batches) {
  // Per micro-batch: forward (1 + blocks + head), backward (head + 2 per block + embedding), data; plus
  // the optimizer, the end and slack.
  return micro_batches * (3 * n_layer + 8) + 8;
}

std::string StepProfiler::rank_path(const std::string& path, int rank) {
  std::filesystem::path p(path);
  return (p.parent_path() / fmt::format("{}.rank-{}.json", p.stem().string(), rank)).string();
}

StepProfiler::StepProfiler(Device& dev, std::string path, int64_t first, int64_t last, int rank, int world)
    : dev_(dev),
      path_(rank > 0 ? rank_path(path, rank) : std::move(path)),
      first_(first),
      last_(last),
      rank_(rank),
      world_(world) {
  ANVIL_REQUIRE(first >= 1 && last >= first, "profile_steps: need 1 <= A <= B, got {}:{}", first, last);
  std::string why_not;
  try {
    kernels_ = make_kernel_activity(dev_, why_not);
  } catch (const Error& e) {
    why_not = e.what();
  }
  kernel_track_ = kernels_ ? kernels_->describe() : "none: " + why_not;
}

// The kernel recorder's destructor stops recording and detaches it (runtime/kernel_activity.hpp).
StepProfiler::~StepProfiler() = default;

template <class F>
void StepProfiler::with_kernels(F&& f) {
  if (!kernels_) return;
  try {
    f(*kernels_);
  } catch (const Error& e) {
    fmt::print(stderr, "anvil: warning: profile_steps: kernel timings stop at step {}: {}\n", step_,
               e.what());
    kernel_track_ = fmt::format("none from step {} on: {} (before: {})", step_, e.what(), kernel_track_);
    records_.activities.clear();
    kernels_.reset();  // its destructor stops recording and detaches
  }
}

void StepProfiler::begin_step(int64_t step) {
  if (!profiling(step)) return;
  if (capacity_ == 0) {
    capacity_ = 4096;
    dev_.make_time_marks(capacity_);
  }
  step_ = step;
  in_step_ = true;
  phases_.clear();
  range_open_ = false;
  dev_.synchronize();  // the device track starts when the device is idle, aligned with the host clock
  with_kernels([](KernelActivity& k) { k.start(); });  // nothing is queued: the step's work only is recorded
  step_host_start_ms_ = host_now_ms();
  if (host_origin_ms_ < 0) host_origin_ms_ = step_host_start_ms_;
  device_offset_ms_ = step_host_start_ms_ - host_origin_ms_;
  // The kernel records' origin goes on the compute stream immediately before mark 0 (kernel_activity.hpp).
  with_kernels([](KernelActivity& k) { k.mark_origin(); });
  dev_.record_time_mark(0);
}

void StepProfiler::phase(std::string_view name, int layer) {
  if (!in_step_) return;
  ANVIL_REQUIRE(int(phases_.size()) + 2 < capacity_,
                "profile_steps: more than {} phases in one step (too many blocks x micro-batches to profile)",
                capacity_ - 2);
  if (range_open_) dev_.range_pop();
  // The first phase records mark 0 again (the device track starts there), so the kernel records' origin
  // moves with it.
  if (phases_.empty()) with_kernels([](KernelActivity& k) { k.mark_origin(); });
  phases_.push_back({std::string(name), layer});
  dev_.record_time_mark(int(phases_.size()) - 1);
  const std::string label = layer >= 0 ? fmt::format("{} {}", name, layer) : std::string(name);
  dev_.range_push(label.c_str());
  range_open_ = true;
}

void StepProfiler::communication(const char* name, double begin_ms, double end_ms, bool wait, size_t bytes) {
  if (!in_step_) return;
  comm_tracks_ = true;
  nlohmann::json args = nlohmann::json::object();
  if (!wait) args["bytes"] = bytes;
  if (count_++) events_ += ",\n";
  events_ += event(wait ? "waiting for communication" : name,
                   wait ? "exposed communication" : "communication", steps_pid(), wait ? kWaitTid : kCommTid,
                   device_offset_ms_ + begin_ms, std::max(0.0, end_ms - begin_ms), step_, -1, &args);
}

void StepProfiler::end_step() {
  if (!in_step_) return;
  const int end_mark = int(phases_.size());
  dev_.record_time_mark(end_mark);
  if (range_open_) dev_.range_pop();
  range_open_ = false;
  dev_.synchronize();
  const double host_end_ms = host_now_ms();
  with_kernels([&](KernelActivity& k) { k.stop(records_); });
  if (step_ >= last_) with_kernels([](KernelActivity& k) { k.close(); });  // later steps run without it
  std::vector<double> mark_ms(size_t(end_mark) + 1);
  for (int i = 0; i <= end_mark; ++i) mark_ms[size_t(i)] = dev_.time_mark_ms(i);
  // Phase 0 starts at mark 0 (begin_step); the first phase() records mark 0 again, so phases run from
  // their own mark to the next one.
  for (size_t i = 0; i < phases_.size(); ++i) {
    const double t0 = mark_ms[i], t1 = mark_ms[i + 1];
    const Phase& p = phases_[i];
    const std::string name = p.layer >= 0 ? fmt::format("{} {}", p.name, p.layer) : p.name;
    if (count_++) events_ += ",\n";
    events_ += event(name, "device", steps_pid(), kDeviceTid, device_offset_ms_ + t0, std::max(0.0, t1 - t0),
                     step_, p.layer);
  }
  const nlohmann::json host_args = kernels_ ? append_kernel_events(mark_ms) : nlohmann::json::object();
  if (count_++) events_ += ",\n";
  events_ +=
      event(fmt::format("step {}", step_), "host", steps_pid(), kHostTid,
            step_host_start_ms_ - host_origin_ms_, host_end_ms - step_host_start_ms_, step_, -1, &host_args);
  in_step_ = false;
}

// The step's GPU activities as events of the kernel track, each with the device phase it ran in,
// and the step's kernel statistics for the host track's step event.
nlohmann::json StepProfiler::append_kernel_events(const std::vector<double>& mark_ms) {
  const std::vector<std::string>& names = kernels_->names();
  for (size_t i = kernel_names_.size(); i < names.size(); ++i) kernel_names_.push_back(names[i]);
  if (totals_.size() < kernel_names_.size()) totals_.resize(kernel_names_.size());
  if (records_.compute_stream >= 0) compute_stream_ = records_.compute_stream;
  dropped_ += records_.dropped;
  unanchored_steps_ += records_.anchored ? 0 : 1;
  ++kernel_steps_;

  const double device_step_ms = mark_ms.back();
  device_ms_ += device_step_ms;
  std::vector<std::pair<int64_t, int64_t>> spans;
  spans.reserve(records_.activities.size());
  std::unordered_map<uint32_t, Total> step_totals;
  for (const GpuActivity& a : records_.activities) {
    const double start_ms = double(a.start_ns) * 1e-6, dur_ms = double(a.end_ns - a.start_ns) * 1e-6;
    // The phase the activity ran in: the last mark at or before its midpoint (the midpoint, not the start,
    // so that the sub-microsecond error of the two clocks' alignment cannot move an activity that starts
    // right at a mark into the phase before). None before mark 0 (e.g. the step's first memsets, queued
    // before its first phase) or after the last mark.
    const auto mark = std::upper_bound(mark_ms.begin(), mark_ms.end(), start_ms + dur_ms / 2);
    const size_t phase = mark == mark_ms.begin() ? phases_.size() : size_t(mark - mark_ms.begin()) - 1;
    nlohmann::json args = {{"step", step_},
                           {"stream", a.stream},
                           {"correlation", a.correlation},
                           {"start_us_in_step", start_ms * 1000}};
    if (phase < phases_.size()) {
      const Phase& p = phases_[phase];
      args["phase"] = p.layer >= 0 ? fmt::format("{} {}", p.name, p.layer) : p.name;
    }
    if (a.kind == GpuActivity::Kind::kernel) {
      args["grid"] = dims(a.grid);
      args["block"] = dims(a.block);
      args["registers_per_thread"] = a.registers;
      args["shared_memory_bytes"] = a.shared_bytes;
    } else {
      args["bytes"] = a.bytes;
    }
    const nlohmann::json e = {{"name", kernel_names_.at(a.name)},
                              {"cat", kind_name(a.kind)},
                              {"ph", "X"},
                              {"pid", kernels_pid()},
                              {"tid", kStreamTidBase + a.stream},
                              {"ts", (device_offset_ms_ + start_ms) * 1000},
                              {"dur", dur_ms * 1000},
                              {"args", args}};
    if (count_++) events_ += ",\n";
    events_ += e.dump();

    streams_[a.stream] |= 1u << unsigned(a.kind);
    const int64_t ns = a.end_ns - a.start_ns;
    Total& t = totals_[a.name];
    t.kind = a.kind, t.calls += 1, t.ns += ns;
    Total& st = step_totals[a.name];
    st.kind = a.kind, st.calls += 1, st.ns += ns;
    activity_ns_ += ns;
    spans.push_back({a.start_ns, a.end_ns});
  }
  activities_ += int64_t(records_.activities.size());
  const int64_t busy = union_ns(spans, int64_t(device_step_ms * 1e6));
  busy_ns_ += busy;

  std::vector<std::pair<uint32_t, Total>> ranked(step_totals.begin(), step_totals.end());
  std::sort(ranked.begin(), ranked.end(),
            [](const auto& x, const auto& y) { return x.second.ns > y.second.ns; });
  nlohmann::json top = nlohmann::json::array();
  for (size_t i = 0; i < std::min(kStepTopKernels, ranked.size()); ++i)
    top.push_back(fmt::format("{}: {} x, {:.3f} ms", short_kernel_name(kernel_names_.at(ranked[i].first)),
                              ranked[i].second.calls, double(ranked[i].second.ns) * 1e-6));
  return {{"gpu_activities", records_.activities.size()},
          {"gpu_busy_ms", double(busy) * 1e-6},
          {"gpu_busy_share", device_step_ms > 0 ? double(busy) * 1e-6 / device_step_ms : 0.0},
          {"top_kernels", top},
          {"kernel_alignment", records_.anchored ? "anchor kernel before mark 0 (exact to ~1 us)"
                                                 : "host CUPTI clock at mark 0 (late by its launch latency)"},
          {"dropped_records", records_.dropped}};
}

std::vector<StepProfiler::KernelTotal> StepProfiler::top_kernels(size_t n) const {
  std::vector<KernelTotal> out;
  for (size_t id = 0; id < totals_.size(); ++id) {
    const Total& t = totals_[id];
    if (t.calls == 0) continue;
    out.push_back({kernel_names_[id], t.kind, t.calls, double(t.ns) * 1e-6,
                   activity_ns_ > 0 ? double(t.ns) / double(activity_ns_) : 0.0});
  }
  std::sort(out.begin(), out.end(), [](const KernelTotal& a, const KernelTotal& b) {
    return a.total_ms != b.total_ms ? a.total_ms > b.total_ms : a.name < b.name;
  });
  if (out.size() > n) out.resize(n);
  return out;
}

std::string StepProfiler::kernel_summary(size_t n) const {
  if (activities_ == 0) return "";
  const size_t distinct =
      size_t(std::count_if(totals_.begin(), totals_.end(), [](const Total& t) { return t.calls > 0; }));
  std::string s = fmt::format(
      "GPU time of the profiled steps ({} step(s), CUPTI): {} kernels and copies, {:.3f} ms; GPU busy "
      "{:.1f}% "
      "of the device phases ({:.3f} ms)\n",
      kernel_steps_, activities_, double(activity_ns_) * 1e-6,
      device_ms_ > 0 ? 100.0 * double(busy_ns_) * 1e-6 / device_ms_ : 0.0, device_ms_);
  s += fmt::format("  {:>10} {:>6} {:>7} {:>9}  {}\n", "total ms", "share", "calls", "mean us", "name");
  for (const KernelTotal& k : top_kernels(n))
    s += fmt::format("  {:>10.3f} {:>5.1f}% {:>7} {:>9.1f}  {}\n", k.total_ms, 100 * k.share, k.calls,
                     1000 * k.total_ms / double(k.calls), short_kernel_name(k.name));
  if (distinct > n)
    s += fmt::format("  ... {} more (every one is in the trace's kernel track)\n", distinct - n);
  if (dropped_)
    s += fmt::format("  warning: CUPTI dropped {} record(s); the totals above miss them\n", dropped_);
  return s;
}

size_t StepProfiler::finish() {
  auto name_meta = [](const char* what, int pid, int64_t tid, const std::string& name) {
    nlohmann::json m = {{"name", what}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", name}}}};
    if (tid >= 0) m["tid"] = tid;
    return m.dump();
  };
  auto sort_meta = [](int pid, int index) {
    return nlohmann::json{
        {"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", index}}}}
        .dump();
  };
  // Metadata first: otherData must come before the events for Perfetto's streaming JSON reader.
  nlohmann::json other = {{"profile_steps", fmt::format("{}:{}", first_, last_)},
                          {"device", dev_.name()},
                          {"kernel_track", kernel_track_},
                          {"rank", rank_},
                          {"world_size", world_},
                          {"host", host_name()},
                          {"host_clock_origin_ms", host_origin_ms_}};
  if (activities_ > 0) {
    nlohmann::json top = nlohmann::json::array();
    for (const KernelTotal& k : top_kernels(kTraceTopKernels))
      top.push_back({{"name", k.name},
                     {"kind", kind_name(k.kind)},
                     {"calls", k.calls},
                     {"total_ms", k.total_ms},
                     {"share", k.share}});
    other["top_kernels"] = top;
    other["gpu_activities"] = activities_;
    other["gpu_busy_share"] = device_ms_ > 0 ? double(busy_ns_) * 1e-6 / device_ms_ : 0.0;
    if (unanchored_steps_)
      other["kernel_alignment_note"] =
          fmt::format("{} step(s) placed by the host CUPTI clock (the anchor kernel's record was missing)",
                      unanchored_steps_);
    if (dropped_) other["dropped_records"] = dropped_;
  }
  std::string text =
      "{\"displayTimeUnit\": \"ms\", \"otherData\": " + other.dump() + ", \"traceEvents\": [\n";
  const std::string who = world_ > 1 ? fmt::format("rank {}: ", rank_) : std::string();
  text += name_meta("process_name", steps_pid(), -1, who + "steps") + ",\n" +
          sort_meta(steps_pid(), steps_pid()) + ",\n";
  text += name_meta("thread_name", steps_pid(), kDeviceTid, "device (compute stream)") + ",\n";
  text += name_meta("thread_name", steps_pid(), kHostTid, "host");
  if (comm_tracks_) {
    text += ",\n" + name_meta("thread_name", steps_pid(), kCommTid, "communication (collectives)");
    text += ",\n" + name_meta("thread_name", steps_pid(), kWaitTid, "compute waiting for communication");
  }
  if (!streams_.empty()) {
    text += ",\n" + name_meta("process_name", kernels_pid(), -1, who + "kernels") + ",\n" +
            sort_meta(kernels_pid(), kernels_pid());
    for (const auto& [stream, kinds] : streams_) {
      std::string label = fmt::format("stream {}", stream);
      if (int64_t(stream) == compute_stream_)
        label = fmt::format("compute stream ({})", stream);
      else if (kinds == 1u << unsigned(GpuActivity::Kind::memcpy))
        label += " (copies)";
      text += ",\n" + name_meta("thread_name", kernels_pid(), kStreamTidBase + stream, label);
    }
  }
  if (count_) text += ",\n" + events_;
  text += "\n]}\n";
  io::write_text_file_synced(path_, text);
  if (activities_ > 0) {
    fmt::print("{}", kernel_summary(kPrintedTopKernels));
  } else if (dev_.kind() != DeviceKind::CPU) {
    if (kernels_)
      fmt::print("profile_steps: CUPTI recorded no GPU activity in the profiled steps\n");
    else
      fmt::print("profile_steps: no kernel track in the trace ({})\n", kernel_track_);
  }
  std::fflush(stdout);
  return count_;
}

std::vector<int> StepProfiler::join_ranks(int world) {
  using json = nlohmann::json;
  auto read = [](const std::string& path) {  // null when missing, discarded when malformed
    return std::filesystem::exists(path) ? json::parse(io::read_text_file(path), nullptr, false) : json();
  };
  json joined = read(path_);
  ANVIL_REQUIRE(joined.is_object() && joined.contains("traceEvents"),
                "profile_steps: cannot read back the trace {} to join the ranks' traces", path_);
  const json& mine = joined["otherData"];
  json ranks = json::array({mine});
  std::vector<int> missing;
  for (int r = 1; r < world; ++r) {
    const std::string part = rank_path(path_, r);
    json t = read(part);
    if (!t.is_object() || !t.contains("traceEvents") || !t.contains("otherData")) {
      missing.push_back(r);
      continue;
    }
    const json& other = t["otherData"];
    // Rank 0's clock: on the same host the steady clocks are one clock; elsewhere the first profiled steps
    // start together (the ranks' collectives keep their steps in step).
    const double shift_us =
        other.value("host", "") == mine.value("host", "")
            ? (other.value("host_clock_origin_ms", 0.0) - mine.value("host_clock_origin_ms", 0.0)) * 1000
            : 0.0;
    for (json& e : t["traceEvents"]) {
      if (e.contains("ts")) e["ts"] = e["ts"].get<double>() + shift_us;
      joined["traceEvents"].push_back(std::move(e));
    }
    ranks.push_back(other);
    std::error_code ec;
    std::filesystem::remove(part, ec);
  }
  joined["otherData"]["ranks"] = ranks;
  if (!missing.empty()) joined["otherData"]["ranks_missing"] = missing;
  io::write_text_file_synced(path_, joined.dump() + "\n");
  return missing;
}

}  // namespace anvil
