// Parameter offload to NVMe (offload_param nvme, src/offload/paged_weights.hpp): the weight shard's pieces
// go to the swap file and come back rounded as the optimizer rounds; each gather gets its unit's piece, and
// after one pass the read-ahead has every piece of a repeated order read before it is asked for; a run whose
// weights are paged from the file is the run with them in host memory (offload_param cpu) bit for bit, with
// one and two processes, and each resumes the other's checkpoint; the host holds the buffers, not the shard.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/trainer.hpp"
#include "core/half.hpp"
#include "dist/communicator.hpp"
#include "model/param_layout.hpp"
#include "offload/paged_weights.hpp"
#include "offload_run_config.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {
using json = nlohmann::json;
namespace fs = std::filesystem;

offload::NvmeOptions options(const std::string& dir) {
  offload::NvmeOptions o;
  o.path = dir;
  o.block_bytes = 8192;
  o.io_threads = 3;
  return o;
}

// A shard of llama-tiny that starts and ends inside units, in bf16: write, read back, and every piece.
TEST(PagedWeights, PiecesRoundTripThroughTheFile) {
  test::TempDir t;
  const ParamLayout layout = ParamLayout::decoder(TransformerConfig::preset("llama-tiny"));
  const auto& units = layout.units();
  ASSERT_GE(units.size(), 4u);
  const ParamRange shard{units[0].offset + 1000, units[3].offset + 17};
  const std::unique_ptr<Device> dev = make_cpu_device();
  offload::PagedWeights pages(*dev, layout, shard, DType::BF16, options(t.str()), 3);
  EXPECT_EQ(pages.numel(), shard.numel());
  EXPECT_EQ(pages.size().buffers, 3u);
  std::vector<float> values(shard.numel());
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(0.001f * float(i)) * 3.0f + 1e-3f;
  pages.write(values.data());
  std::vector<float> back(values.size(), -1.0f);
  pages.read(back.data());
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_EQ(back[i], bf16_to_float(float_to_bf16(values[i]))) << "element " << i;
  // Units 0-3 have pieces (unit 3's is 17 elements), the rest none.
  for (int u = 0; u < 4; ++u) {
    const size_t lo = std::max(units[size_t(u)].offset, shard.begin);
    const size_t hi = std::min(units[size_t(u)].offset + units[size_t(u)].numel, shard.end);
    const auto* p = static_cast<const uint16_t*>(pages.piece(u));
    for (size_t i = lo; i < hi; ++i)
      ASSERT_EQ(p[i - lo], float_to_bf16(values[i - shard.begin])) << "unit " << u << " element " << i;
    pages.queued(u);
  }
  test::expect_error([&] { pages.piece(4); }, {"unit 4 has no piece"});
}

// A step's order (forward, the head's second use of the embedding, backward), repeated: after the first
// pass nothing is read on demand, whatever the buffers; an update written back keeps it so.
TEST(PagedWeights, ReadAheadLearnsTheOrderOfTheGathers) {
  test::TempDir t;
  const ParamLayout layout = ParamLayout::decoder(TransformerConfig::preset("llama-tiny"));
  const int U = int(layout.units().size());
  const std::unique_ptr<Device> dev = make_cpu_device();
  std::vector<int> order;
  for (int u = 0; u < U; ++u) order.push_back(u);
  order.push_back(0);
  for (int u = U - 1; u >= 0; --u) order.push_back(u);
  for (int buffers : {2, 3, 5}) {
    SCOPED_TRACE(buffers);
    offload::PagedWeights pages(*dev, layout, layout.all(), DType::F32, options(t.str()), buffers);
    std::vector<float> values(layout.total_numel());
    for (size_t i = 0; i < values.size(); ++i) values[i] = float(i % 1000);
    pages.write(values.data());
    const auto pass = [&] {
      for (int u : order) {
        const auto* p = static_cast<const float*>(pages.piece(u));
        const ParamUnit& unit = layout.units()[size_t(u)];
        ASSERT_EQ(p[0], values[unit.offset]) << "unit " << u;
        ASSERT_EQ(p[unit.numel - 1], values[unit.offset + unit.numel - 1]) << "unit " << u;
        pages.queued(u);
      }
    };
    pass();
    const uint64_t first = pages.counts().read_on_demand;
    EXPECT_GT(first, 0u);
    pass();
    pass();
    EXPECT_EQ(pages.counts().read_on_demand, first);
    EXPECT_EQ(pages.counts().served, 3 * order.size());
    for (float& v : values) v += 0.5f;  // an update
    pages.write(values.data());
    pass();
    EXPECT_EQ(pages.counts().read_on_demand, first);
  }
  test::expect_error(
      [&] { offload::PagedWeights(*dev, layout, layout.all(), DType::F32, options(t.str()), 1); },
      {"offload_param_buffer_count", "at least 2"});
}

TrainConfig run_config(const test::ByteCorpus& c, const std::string& out, const json& extra) {
  return test::offload_run_config(c, out, extra);
}

json param_nvme(const std::string& dir) {
  return {{"offload_param", "nvme"},
          {"offload_nvme_path", dir},
          {"offload_param_buffer_count", 3},
          {"aio_block_size", 8192},
          {"aio_threads", 2}};
}

// One process (stage 3 on one rank): offload_param nvme is offload_param cpu, losses and files, with the
// optimizer on the host or its state on NVMe too; each resumes the other's step-3 checkpoint.
class ParamNvme : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(ParamNvme, EqualsTheShardInHostMemory) {
  const auto [precision, optimizer] = GetParam();
  test::ByteCorpus c;
  fs::create_directories(c.dir / "swap");
  json host = {{"zero_stage", 3},
               {"offload_optimizer", "cpu"},
               {"offload_param", "cpu"},
               {"gradient_accumulation_steps", 2}};
  if (precision != "fp32") host[precision] = true;
  test::quietly([&] { return train(run_config(c, c.dir / "host", host)); });
  json nvme = host;
  nvme.update(param_nvme(c.dir / "swap"));
  nvme["offload_optimizer"] = optimizer;
  if (optimizer == "nvme") nvme["sub_group_size"] = 50000;
  test::quietly([&] { return train(run_config(c, c.dir / "nvme", nvme)); });
  EXPECT_TRUE(fs::is_empty(c.dir / "swap"));
  const std::vector<double> a = test::metrics_losses(c.dir / "host/metrics.jsonl"),
                            b = test::metrics_losses(c.dir / "nvme/metrics.jsonl");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
  for (const std::string f : {"model.safetensors", "zero/optimizer-rank-00000-of-00001.safetensors"})
    EXPECT_TRUE(test::read_file(c.dir / ("host/checkpoint-6/" + f)) ==
                test::read_file(c.dir / ("nvme/checkpoint-6/" + f)))
        << f << " differs";
  // The summary counts the pieces: after the first step every gather found its piece read ahead.
  const json summary = json::parse(test::read_file(c.dir / "nvme/summary.json"));
  const json& w = summary.at("offload_param_nvme");
  EXPECT_GT(w.at("pieces_served").get<int64_t>(), 0);
  EXPECT_LT(w.at("pieces_read_on_demand").get<int64_t>() * 4, w.at("pieces_served").get<int64_t>());
  EXPECT_GT(w.at("write_gib").get<double>(), 0.0);
  for (const auto& [from, cfg] : {std::pair{"host", nvme}, std::pair{"nvme", host}}) {
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

INSTANTIATE_TEST_SUITE_P(Precisions, ParamNvme,
                         ::testing::Values(std::tuple{"bf16", "cpu"}, std::tuple{"fp32", "cpu"},
                                           std::tuple{"bf16", "nvme"}),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_optimizer_" + std::get<1>(info.param);
                         });

// Two processes: each rank pages its own shard; the run is offload_param cpu's, file for file.
TEST(ParamNvmeZero, TwoRanksEqualTheShardInHostMemory) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  fs::create_directories(c.dir / "swap");
  const auto launch = [&](const std::string& name, const json& extra) {
    test::write_file(c.dir / (name + ".json"), run_config(c, c.dir / name, extra).to_json().dump());
    return test::launch_anvil(2, c.dir / (name + ".json"));
  };
  json host = {{"zero_stage", 3},
               {"bf16", true},
               {"per_device_train_batch_size", 2},
               {"offload_optimizer", "cpu"},
               {"offload_param", "cpu"}};
  const test::CommandResult a = launch("host", host);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  json nvme = host;
  nvme.update(param_nvme(c.dir / "swap"));
  const test::CommandResult b = launch("nvme", nvme);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("weights: offloaded (offload_param nvme)"), std::string::npos) << b.output;
  EXPECT_NE(b.output.find("NVMe weights (rank 0)"), std::string::npos) << b.output;
  EXPECT_TRUE(fs::is_empty(c.dir / "swap"));
  EXPECT_EQ(test::metrics_losses(c.dir / "host/metrics.jsonl"),
            test::metrics_losses(c.dir / "nvme/metrics.jsonl"));
  for (const std::string f : {"model.safetensors", "zero/optimizer-rank-00000-of-00002.safetensors",
                              "zero/optimizer-rank-00001-of-00002.safetensors"})
    EXPECT_TRUE(test::read_file(c.dir / ("host/checkpoint-6/" + f)) ==
                test::read_file(c.dir / ("nvme/checkpoint-6/" + f)))
        << f << " differs";
}

// The host plan holds the buffers instead of the shard; the estimate names the file; the DeepSpeed guide's
// ZeRO-3 NVMe example plans it.
TEST(ParamNvmePlan, HostHoldsTheBuffersNotTheShard) {
  test::ByteCorpus c;
  json nvme = param_nvme(c.dir.str());
  nvme.update({{"bf16", true}, {"zero_stage", 3}, {"offload_optimizer", "cpu"}});
  const TrainConfig on = run_config(c, c.dir / "a", nvme);
  const EngineOptions o = training_engine_options(on, DeviceKind::CPU);
  const std::optional<MemoryPlan> host = host_optimizer_plan(on.model, o);
  ASSERT_TRUE(host.has_value());
  const std::optional<offload::PagedWeights::Sizes> pages = weight_pages_sizes(on.model, o);
  ASSERT_TRUE(pages.has_value());
  EXPECT_EQ(pages->buffers, 3u);
  size_t buffers = 0;
  for (const PlannedBuffer& b : host->buffers()) {
    EXPECT_EQ(b.name.find("weights (offload_param, pinned)"), std::string::npos) << b.name;
    if (b.name.find("offload_param nvme") != std::string::npos) buffers = b.bytes;
  }
  EXPECT_EQ(buffers, 3 * (pages->buffer_bytes + offload::kSwapAlign));
  // One process: the file holds the whole model in bf16; the buffers less than half of it.
  const size_t model_bytes = 2 * ParamLayout::decoder(TransformerConfig::preset("llama-tiny")).total_numel();
  EXPECT_GE(pages->file_bytes, model_bytes);
  EXPECT_LT(buffers, model_bytes);
  const test::CommandResult r = test::run_anvil(
      "estimate --model llama-tiny --device cpu --bf16 --zero_stage 3 --offload_optimizer cpu "
      "--offload_param "
      "nvme --offload_nvme_path " +
      c.dir.str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* needle :
       {"weights (offload_param nvme, 5 buffers)", "of weights, paged through 5 buffers"})
    EXPECT_NE(r.output.find(needle), std::string::npos) << needle << "\n" << r.output;
  const test::CommandResult ds = test::run_anvil(
      "estimate --model llama-tiny --device cpu --per_device_train_batch_size 2 --deepspeed " +
      std::string(ANVIL_SOURCE_DIR) + "/examples/deepspeed_zero3_nvme.json");
  ASSERT_EQ(ds.exit_code, 0) << ds.output;
  EXPECT_NE(ds.output.find("weights (offload_param nvme, 5 buffers)"), std::string::npos) << ds.output;
}

TEST(ParamNvmeErrors, SayWhatToDo) {
  test::ByteCorpus c;
  const std::string out = c.dir / "e";
  const json base = {{"zero_stage", 3}, {"offload_optimizer", "cpu"}};
  test::expect_error(
      [&] {
        json j = base;
        j["offload_param"] = "nvme";
        run_config(c, out, j);
      },
      {"offload_param", "keeps the weights in a swap file", "set offload_nvme_path"});
  test::expect_error(
      [&] {
        json j = base;
        j.update(param_nvme(c.dir.str()));
        j["offload_param_buffer_count"] = 1;
        run_config(c, out, j);
      },
      {"offload_param_buffer_count", "2..1024", "got 1"});
  test::expect_error(
      [&] {
        json j = param_nvme(c.dir.str());
        j.update({{"zero_stage", 2}, {"offload_optimizer", "cpu"}});
        run_config(c, out, j);
      },
      {"offload_param nvme", "set zero_stage 3"});
  test::expect_error(
      [&] {
        json j = param_nvme(c.dir.str());
        j["zero_stage"] = 3;
        run_config(c, out, j);
      },
      {"offload_param nvme", "set offload_optimizer cpu too"});
  test::expect_error(
      [&] {
        json j = base;
        j.update(param_nvme(c.dir / "no_such_dir"));
        test::quietly([&] { return train(run_config(c, out, j)); });
      },
      {"offload_nvme_path", "no_such_dir", "not a directory", "the weights"});
}

}  // namespace
}  // namespace anvil
