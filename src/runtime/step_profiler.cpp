#include "runtime/step_profiler.hpp"

#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "io/atomic_dir.hpp"

namespace anvil {
namespace {

double host_now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string event(const std::string& name, const char* track, int tid, double ts_ms, double dur_ms,
                  int64_t step, int layer) {
  nlohmann::json args = {{"step", step}};
  if (layer >= 0) args["layer"] = layer;
  const nlohmann::json e = {
      {"name", name},       {"cat", track},         {"ph", "X"},   {"pid", 0}, {"tid", tid},
      {"ts", ts_ms * 1000}, {"dur", dur_ms * 1000}, {"args", args}};
  return e.dump();
}

}  // namespace

int StepProfiler::marks_needed(int n_layer, int micro_batches) {
  // Per micro-batch: forward (1 + blocks + head), backward (head + 2 per block + embedding), data; plus
  // the optimizer, the end and slack.
  return micro_batches * (3 * n_layer + 8) + 8;
}

StepProfiler::StepProfiler(Device& dev, std::string path, int64_t first, int64_t last)
    : dev_(dev), path_(std::move(path)), first_(first), last_(last) {
  ANVIL_REQUIRE(first >= 1 && last >= first, "profile_steps: need 1 <= A <= B, got {}:{}", first, last);
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
  step_host_start_ms_ = host_now_ms();
  if (host_origin_ms_ < 0) host_origin_ms_ = step_host_start_ms_;
  device_offset_ms_ = step_host_start_ms_ - host_origin_ms_;
  dev_.record_time_mark(0);
}

void StepProfiler::phase(std::string_view name, int layer) {
  if (!in_step_) return;
  ANVIL_REQUIRE(int(phases_.size()) + 2 < capacity_,
                "profile_steps: more than {} phases in one step (too many blocks x micro-batches to profile)",
                capacity_ - 2);
  if (range_open_) dev_.range_pop();
  phases_.push_back({std::string(name), layer});
  dev_.record_time_mark(int(phases_.size()) - 1);
  const std::string label = layer >= 0 ? fmt::format("{} {}", name, layer) : std::string(name);
  dev_.range_push(label.c_str());
  range_open_ = true;
}

void StepProfiler::end_step() {
  if (!in_step_) return;
  const int end_mark = int(phases_.size());
  dev_.record_time_mark(end_mark);
  if (range_open_) dev_.range_pop();
  range_open_ = false;
  dev_.synchronize();
  const double host_end_ms = host_now_ms();
  // Phase 0 starts at mark 0 (begin_step); the first phase() records mark 0 again, so phases run from
  // their own mark to the next one.
  for (size_t i = 0; i < phases_.size(); ++i) {
    const double t0 = dev_.time_mark_ms(int(i)), t1 = dev_.time_mark_ms(int(i) + 1);
    const Phase& p = phases_[i];
    const std::string name = p.layer >= 0 ? fmt::format("{} {}", p.name, p.layer) : p.name;
    if (count_++) events_ += ",\n";
    events_ += event(name, "device", 1, device_offset_ms_ + t0, std::max(0.0, t1 - t0), step_, p.layer);
  }
  if (count_++) events_ += ",\n";
  events_ += event(fmt::format("step {}", step_), "host", 2, step_host_start_ms_ - host_origin_ms_,
                   host_end_ms - step_host_start_ms_, step_, -1);
  in_step_ = false;
}

size_t StepProfiler::finish() {
  auto track = [](int tid, const char* name) {
    return nlohmann::json{
        {"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", tid}, {"args", {{"name", name}}}}
        .dump();
  };
  std::string text = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n" +
                     track(1, "device (compute stream)") + ",\n" + track(2, "host");
  if (count_) text += ",\n" + events_;
  text += "\n]}\n";
  io::write_text_file_synced(path_, text);
  return count_;
}

}  // namespace anvil
