// The kernel track of --profile_steps on a GPU (runtime/kernel_activity.hpp, CUPTI): a profiled step of
// known ops must show each of its kernels, memcpys and memsets with its name, grid, stream and GPU times
// that fall inside the device-track phase that queued it; steps outside the range record nothing; a
// training run's trace and printed summary carry the top kernels, and the run goes on (CUDA graphs
// included) after the recorder is detached. Skipped without a GPU; fails if this build has CUPTI but
// CUPTI records nothing (e.g. when run under another CUPTI client such as Nsight Systems).
#include "runtime/kernel_activity.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "anvil/trainer.hpp"
#include "data/byte_corpus.hpp"
#include "kernels/ops.hpp"
#include "runtime/device.hpp"
#include "runtime/step_profiler.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Alignment tolerance between a kernel's CUPTI times and its phase's CUDA-event span, in microseconds:
// both are GPU timestamps and the phases' origin is the anchor kernel that completes mark 0 (about a
// microsecond of error); the pre-phase memset below is 64 MiB, tens of microseconds, so aligning to the
// wrong origin would fail this by far.
constexpr double kAlignTolUs = 10.0;

class ScratchDir {
 public:
  ScratchDir() {
    path_ = fs::temp_directory_path() / ("anvil_kernel_activity_" + std::to_string(std::random_device{}()));
    fs::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string& rel) const { return (path_ / rel).string(); }

 private:
  fs::path path_;
};

json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return json::parse(s.str());
}

struct Span {
  double ts = 0, end = 0;
};

class KernelActivityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
    if (!kernel_activity_compiled()) GTEST_SKIP() << "this build has no CUPTI: no kernel track to test";
    dev_ = make_cuda_device(0);
  }
  std::unique_ptr<Device> dev_;
};

TEST_F(KernelActivityTest, OpsOfAProfiledStepAreOnTheKernelTrack) {
  DeviceBuffer workspace(*dev_, kCudaGemmWorkspaceBytes);
  auto ops = make_cuda_ops(*dev_, false, workspace.get(), workspace.size());
  const size_t n = size_t{1} << 24, bytes = n * sizeof(float);  // 64 MiB per buffer
  DeviceBuffer a(*dev_, bytes), b(*dev_, bytes), out(*dev_, bytes);
  dev_->fill_zero(a.get(), bytes);
  dev_->fill_zero(b.get(), bytes);
  ScratchDir dir;
  StepProfiler prof(*dev_, dir / "trace.json", 1, 2);
  ASSERT_NE(prof.kernel_track().rfind("none", 0), 0u) << prof.kernel_track();
  for (int64_t step = 1; step <= 3; ++step) {  // step 3 is outside the range: nothing is recorded
    prof.begin_step(step);
    dev_->fill_zero(out.get(), bytes);  // before the first phase: on the track, in no phase
    prof.phase("gelu");
    for (int i = 0; i < 3; ++i) ops->gelu_fwd(out.get(), a.get(), n);
    prof.phase("residual", 0);
    for (int i = 0; i < 2; ++i) ops->residual_fwd(out.get(), a.get(), b.get(), n);
    prof.phase("copies");
    dev_->copy_on_device(b.get(), a.get(), bytes);
    dev_->fill_zero(out.get(), bytes);
    prof.end_step();
  }
  dev_->synchronize();
  prof.finish();

  const json trace = read_json(dir / "trace.json");
  const json& other = trace.at("otherData");
  EXPECT_NE(other.at("kernel_track").get<std::string>().rfind("none", 0), 0u) << other.dump();
  EXPECT_FALSE(other.contains("kernel_alignment_note")) << other.dump();
  EXPECT_FALSE(other.contains("dropped_records")) << other.dump();

  std::map<int64_t, std::map<std::string, Span>> phases;  // step -> device phase -> span (us)
  std::map<int64_t, json> host_steps;
  std::vector<json> kernel_events;
  std::map<int64_t, std::string> thread_names;  // kernel-track tid -> row name
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") {
      if (e.at("pid") == 1 && e.at("name") == "thread_name")
        thread_names[e.at("tid")] = e.at("args").at("name");
      continue;
    }
    const int64_t step = e.at("args").at("step");
    EXPECT_TRUE(step == 1 || step == 2) << e.dump();
    const double ts = e.at("ts"), dur = e.at("dur");
    if (e.at("pid") == 0 && e.at("tid") == 1) phases[step][e.at("name")] = {ts, ts + dur};
    if (e.at("pid") == 0 && e.at("tid") == 2) host_steps[step] = e;
    if (e.at("pid") == 1) kernel_events.push_back(e);
  }
  ASSERT_EQ(phases.size(), 2u);

  std::map<int64_t, std::map<std::string, int>> counts;  // step -> what -> how many
  std::map<int64_t, std::vector<Span>> compute_spans;
  for (const json& e : kernel_events) {
    const int64_t step = e.at("args").at("step");
    const std::string name = e.at("name"), cat = e.at("cat");
    const double ts = e.at("ts"), dur = e.at("dur");
    EXPECT_EQ(name.find("anvil_profiler_anchor"), std::string::npos)
        << "the anchor is not an activity of the step";
    EXPECT_GE(dur, 0.0) << e.dump();
    EXPECT_TRUE(thread_names.count(e.at("tid"))) << "no row name for " << e.dump();
    std::string what;
    if (cat == "kernel") {
      if (name.find("gelu_fwd_kernel") != std::string::npos) what = "gelu";
      if (name.find("residual_fwd_kernel") != std::string::npos) what = "residual";
      EXPECT_NE(e.at("args").at("grid").get<std::string>(), "(0, 0, 0)") << e.dump();
      EXPECT_NE(e.at("args").at("block").get<std::string>(), "(0, 0, 0)") << e.dump();
      EXPECT_GT(dur, 0.0) << e.dump();
    } else if (cat == "memcpy") {
      EXPECT_EQ(name, "memcpy DtoD");
      EXPECT_EQ(e.at("args").at("bytes"), bytes);
      what = "memcpy";
    } else {
      EXPECT_EQ(cat, "memset");
      EXPECT_EQ(e.at("args").at("bytes"), bytes);
      what = e.at("args").contains("phase") ? "memset" : "memset before the first phase";
    }
    ASSERT_FALSE(what.empty()) << "unexpected activity " << e.dump();
    ++counts[step][what];
    compute_spans[step].push_back({ts, ts + dur});
    // Inside the phase that queued it, on the device track's clock.
    const std::map<std::string, std::string> phase_of = {
        {"gelu", "gelu"}, {"residual", "residual 0"}, {"memcpy", "copies"}, {"memset", "copies"}};
    if (what == "memset before the first phase") {
      EXPECT_LE(ts + dur, phases[step].at("gelu").ts + kAlignTolUs) << e.dump();
      continue;
    }
    const std::string phase = phase_of.at(what);
    EXPECT_EQ(e.at("args").at("phase"), phase) << e.dump();
    const Span p = phases[step].at(phase);
    EXPECT_GE(ts, p.ts - kAlignTolUs)
        << e.dump() << " phase " << phase << " [" << p.ts << ", " << p.end << "]";
    EXPECT_LE(ts + dur, p.end + kAlignTolUs)
        << e.dump() << " phase " << phase << " [" << p.ts << ", " << p.end << "]";
  }
  for (int64_t step : {1, 2}) {
    auto& c = counts[step];
    EXPECT_EQ(c["gelu"], 3) << "step " << step;
    EXPECT_EQ(c["residual"], 2);
    EXPECT_EQ(c["memcpy"], 1);
    EXPECT_EQ(c["memset"], 1);
    EXPECT_EQ(c["memset before the first phase"], 1);
    // One stream, in order: the activities follow one another.
    auto& spans = compute_spans[step];
    std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) { return x.ts < y.ts; });
    for (size_t i = 1; i < spans.size(); ++i)
      EXPECT_LE(spans[i - 1].end, spans[i].ts + 1.0) << "activity " << i;
    const json& args = host_steps.at(step).at("args");
    EXPECT_EQ(args.at("gpu_activities"), 8);
    EXPECT_EQ(args.at("kernel_alignment").get<std::string>().rfind("anchor", 0), 0u) << args.dump();
    // How busy the GPU was depends on host launch gaps (0.45-0.6 measured on an H100), so only its range is
    // checked: some GPU time, never more than the phases.
    EXPECT_GT(args.at("gpu_busy_share").get<double>(), 0.0) << args.dump();
    EXPECT_LE(args.at("gpu_busy_share").get<double>(), 1.0 + 1e-6) << args.dump();
  }
  ASSERT_EQ(thread_names.size(), 1u);  // everything ran on the compute stream
  EXPECT_EQ(thread_names.begin()->second.rfind("compute stream", 0), 0u) << thread_names.begin()->second;

  // The totals over both steps.
  std::map<std::string, int64_t> calls;
  double share = 0;
  for (const StepProfiler::KernelTotal& k : prof.top_kernels(100)) {
    calls[k.name.find("gelu_fwd_kernel") != std::string::npos       ? "gelu"
          : k.name.find("residual_fwd_kernel") != std::string::npos ? "residual"
                                                                    : k.name] += k.calls;
    EXPECT_GT(k.total_ms, 0.0) << k.name;
    share += k.share;
  }
  EXPECT_EQ(calls["gelu"], 6);
  EXPECT_EQ(calls["residual"], 4);
  EXPECT_EQ(calls["memcpy DtoD"], 2);
  EXPECT_EQ(calls["memset"], 4);
  EXPECT_NEAR(share, 1.0, 1e-9);
  EXPECT_EQ(other.at("top_kernels").size(), 4u) << other.dump();
  const std::string summary = prof.kernel_summary();
  EXPECT_NE(summary.find("gelu_fwd_kernel"), std::string::npos) << summary;
  EXPECT_NE(summary.find("2 step(s)"), std::string::npos) << summary;
}

TEST_F(KernelActivityTest, OneRecorderAtATime) {
  DeviceBuffer buf(*dev_, 1 << 20);
  ScratchDir dir;
  StepProfiler first(*dev_, dir / "first.json", 1, 2), second(*dev_, dir / "second.json", 1, 1);
  first.begin_step(1);
  first.phase("fill");
  dev_->fill_zero(buf.get(), 1 << 20);
  first.end_step();  // `first` still holds CUPTI: its range goes on to step 2
  second.begin_step(1);
  second.phase("fill");
  dev_->fill_zero(buf.get(), 1 << 20);
  second.end_step();
  EXPECT_EQ(second.kernel_track().rfind("none from step 1", 0), 0u) << second.kernel_track();
  EXPECT_NE(second.kernel_track().find("another profiler"), std::string::npos) << second.kernel_track();
  first.begin_step(2);
  first.phase("fill");
  dev_->fill_zero(buf.get(), 1 << 20);
  first.end_step();
  second.finish();
  first.finish();
  // The traces are named: a range-for over read_json(...).at(...) would iterate a destroyed temporary (C++20
  // extends the lifetime of read_json's result only up to the end of the range's initialisation).
  const json first_trace = read_json(dir / "first.json"), second_trace = read_json(dir / "second.json");
  std::map<int64_t, int> memsets;  // step -> memsets on `first`'s kernel track: its own, one per step
  for (const json& e : first_trace.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("pid") == 1 && e.at("cat") == "memset")
      ++memsets[e.at("args").at("step").get<int64_t>()];
  EXPECT_EQ(memsets, (std::map<int64_t, int>{{1, 1}, {2, 1}})) << first_trace.at("otherData").dump();
  const json& second_events = second_trace.at("traceEvents");
  EXPECT_FALSE(second_events.empty());
  for (const json& e : second_events) EXPECT_EQ(e.at("pid"), 0) << e.dump();
}

TEST_F(KernelActivityTest, TrainingRunTraceAndSummary) {
  ScratchDir dir;
  {
    std::ofstream f(dir / "corpus.txt");
    std::mt19937 rng(3);
    const char* words[] = {"the ", "slings ", "and ", "arrows ", "of ", "outrageous ", "fortune\n"};
    for (int i = 0; i < 12000; ++i) f << words[rng() % 7];
  }
  data::prepare_byte_corpus({dir / "corpus.txt"}, dir / "data", 0.1);
  const int L = 2;
  const json j = {
      {"model", {{"n_layer", L}, {"n_head", 2}, {"n_embd", 64}, {"vocab_size", 256}, {"block_size", 64}}},
      {"train_data", dir / "data/train.bin"},
      {"per_device_train_batch_size", 4},
      {"gradient_accumulation_steps", 2},
      {"max_steps", 6},
      {"device", "cuda"},
      {"profile_steps", "2:3"},  // steps 4..6 run after the recorder is detached (with CUDA graphs)
      {"output_dir", dir / "run"}};
  ::testing::internal::CaptureStdout();
  train(TrainConfig::from_json(j, "test"));
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(printed.find("GPU time of the profiled steps (2 step(s), CUPTI)"), std::string::npos) << printed;
  EXPECT_NE(printed.find("profile of steps 2:3"), std::string::npos) << printed;

  const json trace = read_json(dir / "run/profile_steps_2-3.json");
  ASSERT_TRUE(trace.at("otherData").contains("top_kernels")) << trace.at("otherData").dump();
  EXPECT_GE(trace.at("otherData").at("top_kernels").size(), 5u);
  std::map<int64_t, Span> step_device;  // the device track's extent per step
  std::map<int64_t, int> kernels, in_phase;
  std::map<std::string, int> phase_names;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const int64_t step = e.at("args").at("step");
    EXPECT_TRUE(step == 2 || step == 3) << e.dump();
    const double ts = e.at("ts"), end = ts + e.at("dur").get<double>();
    if (e.at("pid") == 0 && e.at("tid") == 1) {
      Span& s = step_device.try_emplace(step, Span{ts, end}).first->second;
      s.ts = std::min(s.ts, ts), s.end = std::max(s.end, end);
    }
    if (e.at("pid") == 1 && e.at("cat") == "kernel") {
      ++kernels[step];
      if (e.at("args").contains("phase")) {
        ++in_phase[step];
        phase_names[e.at("args").at("phase")]++;
      }
    }
  }
  for (int64_t step : {2, 3}) {
    EXPECT_GT(kernels[step], 20) << "step " << step;
    EXPECT_EQ(in_phase[step], kernels[step]) << "every kernel is queued inside a phase (step " << step << ")";
  }
  for (const char* p : {"forward 0", "forward 1", "backward 0", "backward 1", "optimizer"})
    EXPECT_GT(phase_names[p], 0) << p;
  // The kernels lie within their step's device track.
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") != "X" || e.at("pid") != 1 || !e.at("args").contains("phase")) continue;
    const Span s = step_device.at(e.at("args").at("step"));
    const double ts = e.at("ts");
    EXPECT_GE(ts, s.ts - kAlignTolUs) << e.dump();
    EXPECT_LE(ts + e.at("dur").get<double>(), s.end + kAlignTolUs) << e.dump();
  }
}

}  // namespace
}  // namespace anvil
