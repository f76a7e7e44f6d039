// --profile_steps: a Chrome trace of the chosen steps with a range per phase (data, forward and backward
// per block, recompute, head, gradient norm, optimizer) on the device track and the step on the host
// track (the CPU has no kernel track, and the trace says so); MFU's FLOPs per token and peak figures. The
// kernel track itself is tested on a GPU (tests/parity/kernel_activity_test.cpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "anvil/trainer.hpp"
#include "data/byte_corpus.hpp"
#include "runtime/kernel_activity.hpp"
#include "test_util.hpp"
#include "train/mfu.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

TEST(Profiler, ChromeTraceOfTheChosenSteps) {
  test::TempDir dir;
  test::write_file(dir / "corpus.txt", test::small_corpus(30000));
  data::prepare_byte_corpus({dir / "corpus.txt"}, dir / "data", 0.1);
  const int L = 3;
  json j = {
      {"model", {{"n_layer", L}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 256}, {"block_size", 32}}},
      {"train_data", dir / "data/train.bin"},
      {"per_device_train_batch_size", 4},
      {"gradient_accumulation_steps", 2},
      {"gradient_checkpointing", true},
      {"max_steps", 4},
      {"device", "cpu"},
      {"profile_steps", "2:3"},
      {"peak_flops", 1e12},
      {"output_dir", dir / "run"}};
  train(TrainConfig::from_json(j, "test"));
  const json trace = json::parse(test::read_file(dir / "run/profile_steps_2-3.json"));
  std::map<int64_t, std::map<std::string, int>> names;  // step -> phase name -> count
  std::map<int64_t, std::vector<std::pair<double, double>>> device_spans;
  // The CPU backend runs no kernels: no kernel track, and the metadata says why.
  const std::string kernel_track = trace.at("otherData").at("kernel_track");
  EXPECT_EQ(kernel_track.rfind("none: the CPU backend", 0), 0u) << kernel_track;
  EXPECT_FALSE(trace.at("otherData").contains("top_kernels"));
  for (const json& e : trace.at("traceEvents")) {
    EXPECT_EQ(e.at("pid"), 0) << e.dump();
    if (e.at("ph") != "X") continue;
    const int64_t step = e.at("args").at("step");
    EXPECT_TRUE(step == 2 || step == 3) << e.dump();
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    names[step][e.at("name")]++;
    if (e.at("tid") == 1) device_spans[step].push_back({e.at("ts").get<double>(), e.at("dur").get<double>()});
  }
  for (int64_t step : {2, 3}) {
    auto& n = names[step];
    for (int l = 0; l < L; ++l) {
      EXPECT_EQ(n["forward " + std::to_string(l)], 2)
          << "step " << step << " layer " << l;  // 2 micro-batches
      EXPECT_EQ(n["backward " + std::to_string(l)], 2);
      EXPECT_EQ(n["recompute " + std::to_string(l)], 2);
    }
    for (const char* p : {"forward", "forward head", "backward head", "backward embedding"})
      EXPECT_EQ(n[p], 2) << p;
    EXPECT_EQ(n["data (wait for the batch)"], 2);
    EXPECT_EQ(n["gradient norm"], 1);
    EXPECT_EQ(n["optimizer"], 1);
    EXPECT_EQ(n["step " + std::to_string(step)], 1);
    // The device phases follow one another without overlapping.
    const auto& spans = device_spans[step];
    for (size_t i = 1; i < spans.size(); ++i)
      EXPECT_LE(spans[i - 1].first + spans[i - 1].second, spans[i].first + 1.0) << "phase " << i;
  }
  const json summary = json::parse(test::read_file(dir / "run/summary.json"));
  EXPECT_GT(summary.at("mfu").get<double>(), 0.0);
  EXPECT_EQ(summary.at("peak_flops").get<double>(), 1e12);
  std::istringstream metrics(test::read_file(dir / "run/metrics.jsonl"));
  std::string line;
  std::getline(metrics, line);
  EXPECT_TRUE(json::parse(line).contains("mfu")) << line;
}

TEST(Profiler, ShortKernelNames) {
  EXPECT_EQ(
      short_kernel_name("void anvil::(anonymous namespace)::gelu_fwd_kernel<float>(float*, const float*, "
                        "unsigned long)"),
      "anvil::gelu_fwd_kernel<float>");
  // Parentheses inside template arguments stay; only the trailing parameter list goes.
  EXPECT_EQ(short_kernel_name("void k<(anvil::DType)2, 4>(int)"), "k<(anvil::DType)2, 4>");
  EXPECT_EQ(short_kernel_name("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"),
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n");
  EXPECT_EQ(short_kernel_name("memcpy HtoD"), "memcpy HtoD");
  EXPECT_EQ(short_kernel_name(std::string(200, 'k'), 20), std::string(17, 'k') + "...");
}

TEST(Profiler, NoKernelRecorderOnTheCpu) {
  auto dev = make_cpu_device();
  std::string why_not;
  EXPECT_EQ(make_kernel_activity(*dev, why_not), nullptr);
  EXPECT_NE(why_not.find("CPU backend"), std::string::npos) << why_not;
}

TEST(Profiler, BadRangesAreErrors) {
  for (const char* bad : {"5", "3:2", "0:1", "a:b", "2:"})
    test::expect_error(
        [&] {
          TrainConfig::from_json({{"profile_steps", bad}}, "cfg");
        },
        {"cfg", "profile_steps", bad});
}

TEST(Mfu, FlopsPerTokenAndPeaks) {
  const TransformerConfig d12 = TransformerConfig::preset("d12");
  // 6 N + 12 L C T for GPT-2 124M at T = 1024.
  EXPECT_DOUBLE_EQ(training_flops_per_token(d12, 1024),
                   6.0 * double(d12.num_parameters()) + 12.0 * 12 * 768 * 1024);
  // The H100 SXM's measured bf16 GEMM peak; its tf32 figure (not measured) is the data sheet's.
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H100 80GB HBM3", "bf16", 0).flops, 795.8e12);
  EXPECT_NE(peak_flops("NVIDIA H100 80GB HBM3", "bf16", 0).source.find("measured"), std::string::npos);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H100 SXM5", "bf16", 0).flops, 989.4e12);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H100 80GB HBM3", "tf32", 0).flops, 494.7e12);
  EXPECT_DOUBLE_EQ(peak_flops("NVIDIA H100 PCIe", "fp16", 0).flops, 756e12);
  EXPECT_EQ(peak_flops("cpu (2 threads)", "fp32", 0).flops, 0.0);
  EXPECT_DOUBLE_EQ(peak_flops("cpu (2 threads)", "fp32", 5e10).flops, 5e10);
}

TEST(BenchCommands, GemmAndOptimizerOnTheCpu) {
  test::CommandResult r =
      test::run_anvil("bench-gemm --device cpu --size 128 --iters 2 --precision bf16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json g = json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(g.at("size"), 128);
  EXPECT_GT(g.at("flops").get<double>(), 0.0);
  r = test::run_anvil("bench-optimizer --model tiny --device cpu --optim sgd --steps 2 --warmup 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json o = json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(o.at("optim"), "sgd");
  EXPECT_EQ(o.at("state_bytes").get<size_t>() % 4, 0u);
  EXPECT_GT(o.at("step_ms").get<double>(), 0.0);
  r = test::run_anvil("bench-gemm --precision int4");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("--precision"), std::string::npos) << r.output;
  r = test::run_anvil("bench-optimizer --optim lion --device cpu --model tiny");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("lion"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace anvil
