// --memory_trace on a real training run: the trace of the chosen step parses, lists every arena buffer,
// has each layer's saved activations live from its forward to its backward (recompute buffers only for
// checkpointed blocks), peaks within the plan, and renders with `anvil memory-report`.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "anvil/trainer.hpp"
#include "data/byte_corpus.hpp"
#include "memory/memory_trace.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

TEST(MemoryTraceTrain, TraceOfAStepWithCheckpointingAndAccumulation) {
  test::TempDir dir;
  test::write_file(dir / "corpus.txt", test::small_corpus(30000));
  data::prepare_byte_corpus({dir / "corpus.txt"}, dir / "data", 0.1);
  json j = {
      {"model", {{"n_layer", 4}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 256}, {"block_size", 32}}},
      {"train_data", dir / "data/train.bin"},
      {"per_device_train_batch_size", 4},
      {"gradient_accumulation_steps", 2},
      {"gradient_checkpointing", true},
      {"gradient_checkpointing_every", 2},
      {"max_steps", 3},
      {"device", "cpu"},
      {"memory_trace", dir / "trace.jsonl"},
      {"memory_trace_step", 2},
      {"output_dir", dir / "run"}};
  const TrainSummary s = train(TrainConfig::from_json(j, "test"));
  const MemoryTraceData t = read_memory_trace(dir / "trace.jsonl");
  EXPECT_EQ(t.step, 2);
  EXPECT_EQ(t.plan_bytes, s.planned_memory_bytes);
  size_t buffer_bytes = 0;
  for (const auto& b : t.buffers) buffer_bytes += b.bytes;
  EXPECT_LE(buffer_bytes, t.plan_bytes);
  EXPECT_GT(t.peak_live_bytes, t.persistent_bytes);
  EXPECT_LE(t.peak_live_bytes, t.plan_bytes);

  // Two micro-batches: each layer's "qkv" is written twice; recompute allocations only for the
  // checkpointed blocks (every 2nd), and everything written in a step is dead by its end.
  std::map<int, int> qkv_by_layer;
  std::set<int> recompute_layers;
  for (const auto& a : t.allocs) {
    if (a.name == "qkv" && a.phase == "forward") ++qkv_by_layer[a.layer];
    if (a.category == MemoryCategory::Recompute && a.phase == "recompute") recompute_layers.insert(a.layer);
    if (a.name != "losses") {
      EXPECT_GE(a.t_free, 0) << a.name << " layer " << a.layer << " never freed";
    }
    if (a.t_free >= 0) {
      EXPECT_GT(a.t_free, a.t_alloc);
    }
  }
  for (int l = 0; l < 4; ++l) EXPECT_EQ(qkv_by_layer[l], 2) << "layer " << l;
  EXPECT_EQ(recompute_layers.size(), 2u);
  std::set<std::string> phases;
  for (const auto& p : t.phases) phases.insert(p.name);
  for (const char* p : {"forward", "backward", "recompute", "optimizer"}) EXPECT_TRUE(phases.count(p)) << p;

  const test::CommandResult r =
      test::run_anvil("memory-report " + (dir / "trace.jsonl") + " -o " + (dir / "report.html"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(test::read_file(dir / "report.html").find("<svg"), std::string::npos);
}

TEST(MemoryTraceTrain, BadTraceStepIsAnError) {
  test::expect_error(
      [] {
        TrainConfig::from_json({{"memory_trace", "x.jsonl"}, {"memory_trace_step", 0}}, "cfg");
      },
      {"cfg", "memory_trace_step", "0"});
}

}  // namespace
}  // namespace anvil
