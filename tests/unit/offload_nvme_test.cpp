// NVMe offload (offload_optimizer nvme, src/offload/paged_state.hpp): the swap file moves bytes exactly (in
// order, on several threads, direct or buffered, through a mapping too) and leaves nothing behind; the
// sub-groups are cut where the optimizer's state allows; a run whose optimizer state is swapped through the
// file, in many sub-groups, is the run without offload bit for bit (every optimizer, ZeRO stage 2 with one
// and two processes), its checkpoints are the same files, and each resumes the other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "anvil/trainer.hpp"
#include "dist/communicator.hpp"
#include "dist/zero_partition.hpp"
#include "model/param_layout.hpp"
#include "offload/paged_state.hpp"
#include "offload/swap_file.hpp"
#include "offload_run_config.hpp"
#include "optim/adamw_8bit.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {
using json = nlohmann::json;
namespace fs = std::filesystem;

void fill_pattern(offload::AlignedBuffer& b, unsigned seed) {
  auto* p = static_cast<unsigned char*>(b.get());
  for (size_t i = 0; i < b.size(); ++i)
    p[i] = static_cast<unsigned char>((i * 131 + seed * 7 + i / 4096) & 0xff);
}

TEST(SwapFile, MovesBytesInOrderAndLeavesNothingBehind) {
  test::TempDir t;
  const std::string dir = t.str();
  // Direct I/O where the filesystem allows it, and buffered.
  for (bool try_direct : {true, false}) {
    SCOPED_TRACE(try_direct ? "direct where allowed" : "buffered");
    constexpr size_t kRegion =
        5 * offload::kSwapAlign * 3;  // 15 pages: blocks of 2 pages leave a short last one
    offload::SwapFile f(dir, "anvil-test.swap", 2 * kRegion, 2 * offload::kSwapAlign, 3, try_direct);
    // The file's name is gone at once (nothing left even after a crash); its space is reserved.
    EXPECT_TRUE(fs::is_empty(dir));
    EXPECT_EQ(f.bytes(), 2 * kRegion);
    if (!try_direct) {
      EXPECT_FALSE(f.direct());
    }

    offload::AlignedBuffer a(kRegion), b(kRegion), back(kRegion);
    fill_pattern(a, 1);
    fill_pattern(b, 2);
    f.write_async(a.get(), kRegion, 0);
    f.write_async(b.get(), kRegion, kRegion);
    // Queued behind the write of `a`: reading region 1 into `a` waits for `a` to be written out.
    const uint64_t read_into_a = f.read_async(a.get(), kRegion, kRegion);
    f.wait(read_into_a);
    EXPECT_EQ(std::memcmp(a.get(), b.get(), kRegion), 0);
    f.wait(f.read_async(back.get(), kRegion, 0));
    fill_pattern(a, 1);
    EXPECT_EQ(std::memcmp(back.get(), a.get(), kRegion), 0);

    // A mapping reads what was written, and what is written through it is read back.
    {
      const std::unique_ptr<offload::SwapFile::Mapping> m = f.map(true);
      EXPECT_EQ(std::memcmp(m->data() + kRegion, b.get(), kRegion), 0);
      std::memset(m->data(), 0x5a, kRegion);
      m->sync();
    }
    f.wait(f.read_async(back.get(), kRegion, 0));
    const auto* p = static_cast<const unsigned char*>(back.get());
    EXPECT_TRUE(std::all_of(p, p + kRegion, [](unsigned char ch) { return ch == 0x5a; }));
    const offload::SwapFile::Totals totals = f.totals();
    EXPECT_EQ(totals.write_bytes, 2 * kRegion);
    EXPECT_EQ(totals.read_bytes, 3 * kRegion);
  }
}

TEST(SwapFile, BadDirectoryOrFullDiskSaysWhatToDo) {
  test::TempDir t;
  test::expect_error([&] { offload::SwapFile(t / "missing", "x.swap", 4096, 4096, 1); },
                     {"offload_nvme_path", "missing", "not a directory", "create it"});
  // More than any disk holds: the reservation fails at start, naming what is needed and free.
  test::expect_error([&] { offload::SwapFile(t.str(), "x.swap", size_t(1) << 62, 4096, 1); },
                     {"offload_nvme_path", "cannot reserve", "free there"});
}

// Every sub-group is at most the size asked (unless one tensor is longer and cannot be cut), the cuts are
// ones the ZeRO partition allows for the optimizer, and together they cover the range.
TEST(SubGroupCuts, FollowTheOptimizersCuttingRules) {
  const ParamLayout layout = ParamLayout::decoder(TransformerConfig::preset("llama-tiny"));
  const ParamRange all = layout.all();
  for (OptimizerKind kind : {OptimizerKind::AdamW, OptimizerKind::AdamW8bit, OptimizerKind::Adafactor}) {
    SCOPED_TRACE(optimizer_name(kind));
    const size_t max = 9000;
    const std::vector<size_t> cuts = dist::sub_group_cuts(layout, all, max, dist::shard_cuts(kind));
    ASSERT_GE(cuts.size(), 3u);
    EXPECT_EQ(cuts.front(), all.begin);
    EXPECT_EQ(cuts.back(), all.end);
    for (size_t i = 1; i < cuts.size(); ++i) {
      ASSERT_LT(cuts[i - 1], cuts[i]);
      const size_t c = cuts[i];
      if (c == all.end) continue;
      EXPECT_EQ(c % dist::kShardAlign, 0u);
      const ParamTensor* in = nullptr;  // the tensor the cut falls in (or starts)
      for (const ParamTensor& t : layout.tensors())
        if (t.offset <= c && c < t.offset + t.numel()) in = &t;
      ASSERT_NE(in, nullptr);
      if (kind == OptimizerKind::Adafactor) {
        EXPECT_EQ(c, in->offset) << "Adafactor cuts between tensors";
      }
      if (kind == OptimizerKind::AdamW8bit) {
        EXPECT_EQ((c - in->offset) % kAdamW8bitBlockSize, 0u);
      }
      if (cuts[i] - cuts[i - 1] > max) {  // only a tensor that cannot be cut
        EXPECT_NE(kind, OptimizerKind::AdamW);
      }
    }
  }
  // One sub-group when the range fits.
  EXPECT_EQ(dist::sub_group_cuts(layout, all, all.numel(), dist::ShardCuts::Anywhere),
            (std::vector<size_t>{all.begin, all.end}));
}

// Start-up writes only the pages the reset makes nonzero (the tables) to the new file, which reads as zeros:
// every state tensor then reads back as reset() left it.
TEST(PagedOptimizerState, ResetWritesTheTablesOnly) {
  test::TempDir t;
  const ParamLayout layout = ParamLayout::decoder(TransformerConfig::preset("llama-tiny"));
  for (OptimizerKind kind : {OptimizerKind::AdamW, OptimizerKind::AdamW8bit, OptimizerKind::Adafactor}) {
    SCOPED_TRACE(optimizer_name(kind));
    OptimizerHyper h;
    h.min_8bit_size = 64;
    offload::PagedOptimizerState paged(kind, layout, h, layout.all(), {t.str(), 7000, 8192, 2});
    const std::unique_ptr<Device> host = make_cpu_device();
    paged.reset(*host);
    EXPECT_GT(paged.size().groups, 10u);
    // (Adafactor's state is small row and column statistics beside its tables, and 8-bit AdamW's zero codes
    // are not zero bytes: little to skip there.)
    if (kind == OptimizerKind::AdamW) {
      EXPECT_LT(paged.file().totals().write_bytes, paged.size().file_bytes / 4);
    }
    const std::unique_ptr<Optimizer> whole = make_optimizer(kind, layout, h);
    const OptimizerStateParts parts = paged.map(*whole, false);
    size_t n = 0;
    for (const Optimizer* part : parts.parts())
      for (const OptimizerStateTensor& st : part->state_tensors()) {
        const auto* b = static_cast<const unsigned char*>(st.data);
        const size_t bytes = dtype_bytes(st.dtype, st.count);
        // 8-bit codes: zero is the map's code for 0, the same byte everywhere; the rest: zero bytes.
        const unsigned char zero = st.dtype == DType::I8 ? b[0] : 0;
        EXPECT_TRUE(std::all_of(b, b + bytes, [&](unsigned char ch) { return ch == zero; })) << st.name;
        n += st.count;
      }
    EXPECT_GT(n, 0u);
  }
}

TrainConfig run_config(const test::ByteCorpus& c, const std::string& out, const json& extra) {
  return test::offload_run_config(c, out, extra);
}

// Offload to NVMe in sub-groups of 7000 parameters (llama-tiny's ~0.9M: over a hundred of them).
json nvme(const std::string& dir) {
  return {{"offload_optimizer", "nvme"},
          {"offload_nvme_path", dir},
          {"sub_group_size", 7000},
          {"aio_block_size", 8192},
          {"aio_threads", 3}};
}

struct NvmeCase {
  std::string optim, precision;
  int zero_stage = 0;
};
class NvmeOffload : public ::testing::TestWithParam<NvmeCase> {};

TEST_P(NvmeOffload, EqualsTheRunWithoutOffload) {
  const NvmeCase p = GetParam();
  test::ByteCorpus c;
  fs::create_directories(c.dir / "swap");
  json extra = {{"optim", p.optim}, {"gradient_accumulation_steps", 2}, {"optim_8bit_min_size", 64}};
  if (p.precision != "fp32") extra[p.precision] = true;
  // ZeRO-2 with one process (the gradients in host memory too) runs with optimizer offload only, and writes
  // its state as a rank file: the reference is then offload to the CPU at that stage (offload_test.cpp
  // shows it equals the run without offload).
  if (p.zero_stage) extra.update({{"zero_stage", p.zero_stage}, {"offload_optimizer", "cpu"}});
  test::quietly([&] { return train(run_config(c, c.dir / "device", extra)); });
  json off = extra;
  off.update(nvme(c.dir / "swap"));
  test::quietly([&] { return train(run_config(c, c.dir / "nvme", off)); });
  EXPECT_TRUE(fs::is_empty(c.dir / "swap"));
  const std::vector<double> a = test::metrics_losses(c.dir / "device/metrics.jsonl"),
                            b = test::metrics_losses(c.dir / "nvme/metrics.jsonl");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
  const std::string state =
      p.zero_stage ? "zero/optimizer-rank-00000-of-00001.safetensors" : "optimizer.safetensors";
  for (const std::string& f : {std::string("model.safetensors"), state}) {
    const std::string x = test::read_file(c.dir / ("device/checkpoint-6/" + f)),
                      y = test::read_file(c.dir / ("nvme/checkpoint-6/" + f));
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == y) << f << " differs";
  }
  // The NVMe run resumes from the other's step 3, and the other from the NVMe run's: steps 4-6 again.
  for (const auto& [from, cfg] : {std::pair{"device", off}, std::pair{"nvme", extra}}) {
    SCOPED_TRACE(std::string("resumed from ") + from);
    json resumed = cfg;
    resumed["resume_from_checkpoint"] = c.dir / (std::string(from) + "/checkpoint-3");
    const std::string out = c.dir / (std::string("resumed_") + from);
    test::quietly([&] { return train(run_config(c, out, resumed)); });
    const std::vector<double> r = test::metrics_losses(out + "/metrics.jsonl");
    ASSERT_EQ(r.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r[i], a[3 + i]) << "step " << 4 + i;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, NvmeOffload,
    ::testing::Values(NvmeCase{"adamw_torch_fused", "fp32"}, NvmeCase{"adamw_torch_fused", "bf16", 2},
                      NvmeCase{"adamw_torch_fused", "fp16"}, NvmeCase{"adamw_8bit", "bf16"},
                      NvmeCase{"adafactor", "bf16", 2}, NvmeCase{"sgd", "bf16"}),
    [](const auto& info) {
      return info.param.optim + "_" + info.param.precision + (info.param.zero_stage ? "_zero2" : "");
    });

// Two processes, ZeRO-2: each rank swaps its shard's state; the rank files are those of the run without
// offload.
TEST(NvmeOffloadZero, TwoRanksEqualTheStageWithoutIt) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  fs::create_directories(c.dir / "swap");
  const auto launch = [&](const std::string& name, const json& extra) {
    json j = run_config(c, c.dir / name, extra).to_json();
    test::write_file(c.dir / (name + ".json"), j.dump());
    return test::run_anvil("launch --nproc_per_node 2 --master_port 0 train --config " +
                           c.dir / (name + ".json"));
  };
  const json extra = {{"zero_stage", 2},
                      {"bf16", true},
                      {"per_device_train_batch_size", 2},
                      {"optim", "adamw_8bit"},
                      {"optim_8bit_min_size", 64}};
  const test::CommandResult device = launch("device", extra);
  ASSERT_EQ(device.exit_code, 0) << device.output;
  json off = extra;
  off.update(nvme(c.dir / "swap"));
  const test::CommandResult r = launch("nvme", off);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("offloaded (offload_optimizer nvme)"), std::string::npos) << r.output;
  EXPECT_EQ(test::metrics_losses(c.dir / "device/metrics.jsonl"),
            test::metrics_losses(c.dir / "nvme/metrics.jsonl"));
  for (const std::string f : {"model.safetensors", "zero/optimizer-rank-00000-of-00002.safetensors",
                              "zero/optimizer-rank-00001-of-00002.safetensors"})
    EXPECT_TRUE(test::read_file(c.dir / ("device/checkpoint-6/" + f)) ==
                test::read_file(c.dir / ("nvme/checkpoint-6/" + f)))
        << f << " differs";
}

// The host holds the master weights and two sub-groups' swap buffers, not the state; the estimate says so.
TEST(NvmeOffloadPlan, HostHoldsTwoSubGroupsNotTheState) {
  test::ByteCorpus c;
  json cfg = nvme(c.dir.str());
  cfg["bf16"] = true;
  const std::optional<MemoryPlan> host =
      host_optimizer_plan(TransformerConfig::preset("llama-tiny"),
                          training_engine_options(run_config(c, c.dir / "a", cfg), DeviceKind::CPU));
  ASSERT_TRUE(host.has_value());
  const std::optional<MemoryPlan> cpu = host_optimizer_plan(
      TransformerConfig::preset("llama-tiny"),
      training_engine_options(run_config(c, c.dir / "b", {{"bf16", true}, {"offload_optimizer", "cpu"}}),
                              DeviceKind::CPU));
  ASSERT_TRUE(cpu.has_value());
  size_t swap = 0;
  for (const PlannedBuffer& b : host->buffers()) {
    EXPECT_EQ(b.name.find("adamw exp_avg"), std::string::npos) << b.name;
    if (b.name.find("swap buffers") != std::string::npos) swap = b.bytes;
  }
  // Two sub-groups of 7000 parameters' fp32 moments (8 bytes each), page-aligned, with their tables.
  EXPECT_GE(swap, 2 * 7000 * 8u);
  EXPECT_LT(swap, 2 * 7000 * 8u + 2 * 3 * offload::kSwapAlign);
  EXPECT_LT(host->total_bytes() + 4 * 7000 * 8u, cpu->total_bytes());
  // One sub-group (the whole shard): one buffer, not two.
  cfg["sub_group_size"] = 1000000000;
  const std::optional<MemoryPlan> one =
      host_optimizer_plan(TransformerConfig::preset("llama-tiny"),
                          training_engine_options(run_config(c, c.dir / "c", cfg), DeviceKind::CPU));
  ASSERT_TRUE(one.has_value());
  size_t state = 0;
  for (const PlannedBuffer& b : cpu->buffers())
    if (b.category == MemoryCategory::OptimizerState) state += b.bytes;
  for (const PlannedBuffer& b : one->buffers())
    if (b.name.find("swap buffers") != std::string::npos) {
      EXPECT_GE(b.bytes, state - 2 * offload::kSwapAlign);
      EXPECT_LE(b.bytes, state + offload::kSwapAlign);
    }
}

TEST(NvmeOffloadErrors, SayWhatToDo) {
  test::ByteCorpus c;
  const std::string out = c.dir / "e";
  test::expect_error(
      [&] {
        run_config(c, out, {{"offload_optimizer", "nvme"}});
      },
      {"offload_nvme_path", "set offload_nvme_path"});
  test::expect_error(
      [&] {
        run_config(c, out, {{"offload_optimizer", "cpu"}, {"offload_nvme_path", "/tmp"}});
      },
      {"offload_nvme_path", "set either to nvme"});
  test::expect_error(
      [&] {
        json j = nvme(c.dir.str());
        j["aio_block_size"] = 1000;
        run_config(c, out, j);
      },
      {"aio_block_size", "multiple of 4096"});
  test::expect_error(
      [&] {
        json j = nvme(c.dir.str());
        j["sub_group_size"] = 0;
        run_config(c, out, j);
      },
      {"sub_group_size", ">= 1"});
  test::expect_error(
      [&] {
        json j = nvme(c.dir / "no_such_dir");
        test::quietly([&] { return train(run_config(c, out, j)); });
      },
      {"offload_nvme_path", "no_such_dir", "not a directory"});
}

}  // namespace
}  // namespace anvil
