// Data parallelism on the CPU (Gloo), 2 and 3 processes started by `anvil launch`: the same global batch
// gives what one process gives (SGD: the weights within 1e-6 relative; AdamW: the loss curve within 1e-5),
// also with gradient accumulation; only rank 0 reports; the loader splits every global batch among ranks.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "data/loader.hpp"
#include "dist/communicator.hpp"
#include "dist/launcher.hpp"
#include "io/safetensors.hpp"
#include "runtime/device.hpp"
#include "safetensors_util.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

TEST(DataParallelLoader, RanksSplitEveryGlobalBatch) {
  test::ByteCorpus c;
  auto shard = std::make_shared<const data::TokenShard>(c.dir / "data/train.bin");
  auto dev = make_cpu_device();
  const int B = 3, T = 16, R = 3;
  data::DataLoader whole(shard, data::LoaderConfig{B * R, T, 11, true, 2, 1, false}, *dev);
  std::vector<std::unique_ptr<data::DataLoader>> ranks;
  for (int r = 0; r < R; ++r)
    ranks.push_back(std::make_unique<data::DataLoader>(
        shard, data::LoaderConfig{B, T, 11, true, 2, 1, false, R, r}, *dev));
  EXPECT_EQ(ranks[0]->batches_per_epoch(), whole.batches_per_epoch());
  for (int b = 0; b < 5; ++b) {
    const data::HostBatch& w = whole.next();
    for (int r = 0; r < R; ++r) {
      const data::HostBatch& mine = ranks[size_t(r)]->next();
      EXPECT_EQ(mine.pos.batch, w.pos.batch);
      const size_t n = size_t(B) * T;
      EXPECT_EQ(0, std::memcmp(mine.inputs, w.inputs + size_t(r) * n, n * sizeof(int32_t))) << "batch " << b;
      EXPECT_EQ(0, std::memcmp(mine.targets, w.targets + size_t(r) * n, n * sizeof(int32_t)))
          << "batch " << b;
    }
  }
}

// A tiny GPT-2 run of 20 steps, configured by `extra`.
std::string write_config(const test::ByteCorpus& c, const std::string& name, const json& extra) {
  json j = {
      {"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 256}, {"block_size", 32}}},
      {"train_data", c.dir / "data/train.bin"},
      {"max_steps", 20},
      {"learning_rate", 3e-3},
      {"warmup_steps", 2},
      {"logging_steps", 1},
      {"save_steps", 0},
      {"device", "cpu"},
      {"seed", 5},
      {"dataloader_pin_memory", false},
      {"output_dir", c.dir / name}};
  j.update(extra);
  const std::string path = c.dir / (name + ".json");
  test::write_file(path, j.dump());
  return path;
}

std::vector<double> losses_of(const std::string& metrics_path) {
  return test::metrics_losses(metrics_path);
}

double weights_rel_diff(const std::string& a_path, const std::string& b_path) {
  return test::max_rel_diff(a_path, b_path);
}

test::CommandResult launch(int ranks, const std::string& config, const std::string& flags = "") {
  return test::launch_anvil(ranks, config, flags);
}

class DataParallel : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  }
};

// SGD: the update is linear in the gradient, so the weights of R processes with micro-batch B equal one
// process's with R x B up to the order of the sums.
TEST_P(DataParallel, SgdWeightsEqualOneProcess) {
  const int R = GetParam();
  test::ByteCorpus c;
  const json sgd = {{"optim", "sgd"}, {"learning_rate", 0.3}, {"save_steps", 20}};
  json one = sgd, many = sgd;
  one["per_device_train_batch_size"] = 2 * R;
  many["per_device_train_batch_size"] = 2;
  const test::CommandResult single = test::run_anvil("train --config " + write_config(c, "one", one));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const test::CommandResult dp = launch(R, write_config(c, "many", many));
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  EXPECT_NE(dp.output.find(fmt::format("processes: {}", R)), std::string::npos) << dp.output;
  // Only rank 0 reports: one summary, one progress line per step.
  size_t summaries = 0;
  for (size_t p = dp.output.find("***** train metrics"); p != std::string::npos;
       p = dp.output.find("***** train metrics", p + 1))
    ++summaries;
  EXPECT_EQ(summaries, 1u) << dp.output;
  const double rel = weights_rel_diff(c.dir / "one/checkpoint-20/model.safetensors",
                                      c.dir / "many/checkpoint-20/model.safetensors");
  EXPECT_LT(rel, 1e-6);
  const std::vector<double> a = losses_of(c.dir / "one/metrics.jsonl"),
                            b = losses_of(c.dir / "many/metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::fabs(a[i])) << "step " << i + 1;
  // The world's throughput is reported, and the summary says how many processes made it.
  const json summary = json::parse(test::read_file(c.dir / "many/summary.json"));
  EXPECT_EQ(summary["world_size"], R);
  // Communication is reported: per step in the progress line and metrics, in total in the summary (Gloo
  // runs collectives on the calling thread: all of it is exposed). One process reports none.
  EXPECT_NE(dp.output.find("| comm "), std::string::npos) << dp.output;
  EXPECT_NE(dp.output.find("communication (rank 0): "), std::string::npos) << dp.output;
  ASSERT_TRUE(summary["comm_seconds"].is_number());
  EXPECT_GT(summary["comm_seconds"].get<double>(), 0.0);
  EXPECT_EQ(summary["comm_exposed_seconds"], summary["comm_seconds"]);
  std::istringstream lines(test::read_file(c.dir / "many/metrics.jsonl"));
  int timed = 0;
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line);
    if (!j.contains("loss")) continue;
    ASSERT_TRUE(j.contains("comm_seconds")) << line;
    EXPECT_GE(j["comm_seconds"].get<double>(), j["comm_exposed_seconds"].get<double>());
    ++timed;
  }
  EXPECT_EQ(timed, 20);
  const json one_summary = json::parse(test::read_file(c.dir / "one/summary.json"));
  EXPECT_TRUE(one_summary["comm_seconds"].is_null());
  EXPECT_EQ(single.output.find("| comm "), std::string::npos);
}

// AdamW, with gradient accumulation: the loss curve of R processes x micro-batch 2 x 2 micro-batches
// equals one process's with micro-batch 2R x 2 micro-batches.
TEST_P(DataParallel, AdamWAccumulationLossCurveEqualsOneProcess) {
  const int R = GetParam();
  test::ByteCorpus c;
  json one = {{"per_device_train_batch_size", 2 * R}, {"gradient_accumulation_steps", 2}};
  json many = {{"per_device_train_batch_size", 2}, {"gradient_accumulation_steps", 2}};
  const test::CommandResult single = test::run_anvil("train --config " + write_config(c, "one", one));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const test::CommandResult dp = launch(R, write_config(c, "many", many));
  ASSERT_EQ(dp.exit_code, 0) << dp.output;
  const std::vector<double> a = losses_of(c.dir / "one/metrics.jsonl"),
                            b = losses_of(c.dir / "many/metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::fabs(a[i])) << "step " << i + 1;
  EXPECT_LT(b.back(), b.front() - 1.0) << "the loss did not fall";
}

INSTANTIATE_TEST_SUITE_P(Ranks, DataParallel, ::testing::Values(2, 3));

// Two "nodes" of one process each, as two process groups of this machine (anvil launch --nnodes 2, once per
// node): the same run as one node with two processes.
TEST(DataParallelNodes, TwoNodesEqualOneNode) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  const json sgd = {{"optim", "sgd"}, {"learning_rate", 0.3}, {"per_device_train_batch_size", 2}};
  const test::CommandResult one_node = launch(2, write_config(c, "one_node", sgd));
  ASSERT_EQ(one_node.exit_code, 0) << one_node.output;
  const std::string cfg = write_config(c, "two_nodes", sgd);
  const int port = dist::free_tcp_port();
  const std::string node = fmt::format(
      "{} launch --nnodes 2 --nproc_per_node 1 --master_addr 127.0.0.1 "
      "--master_port {} --node_rank",
      ANVIL_BINARY, port);
  const std::string script = fmt::format(
      "export OMP_NUM_THREADS=1\n"
      "{} 1 train --config {} > {}/node1.log 2>&1 &\n"
      "p1=$!\n"
      "{} 0 train --config {} > {}/node0.log 2>&1; e0=$?\n"
      "wait $p1; e1=$?\n"
      "exit $((e0 + e1))\n",
      node, cfg, c.dir.str(), node, cfg, c.dir.str());
  test::write_file(c.dir / "nodes.sh", script);
  ASSERT_EQ(std::system(("sh " + (c.dir / "nodes.sh")).c_str()), 0)
      << test::read_file(c.dir / "node0.log") << test::read_file(c.dir / "node1.log");
  EXPECT_NE(test::read_file(c.dir / "node0.log").find("processes: 2 on 2 node(s)"), std::string::npos)
      << test::read_file(c.dir / "node0.log");
  // (Each node's launcher gives its process every core: CPU sums may round differently.)
  EXPECT_LT(weights_rel_diff(c.dir / "one_node/checkpoint-20/model.safetensors",
                             c.dir / "two_nodes/checkpoint-20/model.safetensors"),
            1e-6);
}

// Resume: a data-parallel run resumed from its checkpoint on the same world size continues bit for bit; on
// another world size with the same global batch (1 process x 4 after 2 x 2) it continues as one process
// would (same windows, sums in another order).
TEST(DataParallelResume, SameAndOtherWorldSize) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  const std::string cfg = write_config(c, "full", {{"per_device_train_batch_size", 2}, {"save_steps", 10}});
  const test::CommandResult full = launch(2, cfg);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const std::string ckpt = c.dir / "full/checkpoint-10";
  const test::CommandResult resumed =
      launch(2, cfg, "--output_dir " + (c.dir / "resumed") + " --resume_from_checkpoint " + ckpt);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<double> a = losses_of(c.dir / "full/metrics.jsonl"),
                            b = losses_of(c.dir / "resumed/metrics.jsonl");
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 10u);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(a[10 + i], b[i]) << "step " << i + 11;
  EXPECT_EQ(weights_rel_diff(c.dir / "full/checkpoint-20/model.safetensors",
                             c.dir / "resumed/checkpoint-20/model.safetensors"),
            0.0);

  const test::CommandResult other =
      test::run_anvil("train --config " + cfg + " --per_device_train_batch_size 4 --output_dir " +
                      (c.dir / "other") + " --resume_from_checkpoint " + ckpt);
  ASSERT_EQ(other.exit_code, 0) << other.output;
  const std::vector<double> o = losses_of(c.dir / "other/metrics.jsonl");
  ASSERT_EQ(o.size(), 10u);
  for (size_t i = 0; i < o.size(); ++i)
    EXPECT_NEAR(o[i], a[10 + i], 1e-5 * std::fabs(a[10 + i])) << "step " << i + 11;

  // One process keeping the checkpoint's micro-batch would halve the global batch: refused, saying what to
  // set.
  const test::CommandResult halved = test::run_anvil(
      "train --config " + cfg + " --output_dir " + (c.dir / "halved") + " --resume_from_checkpoint " + ckpt);
  EXPECT_NE(halved.exit_code, 0);
  EXPECT_NE(halved.output.find("global batch of 4"), std::string::npos) << halved.output;
}

// ZeRO stages 1-3 (each rank keeps its shard of the master weights and optimizer state; stage 2 also
// reduce-scatters the gradients and keeps its shard of them; stage 3 also keeps only its shard of the
// weights, gathering each unit when forward and backward reach it) give stage 0's run: every optimizer,
// with gradient accumulation, 2 and 3 ranks. Stage 1 reduces as stage 0 and updates each element as one
// process does, so it matches bit for bit; stages 2-3's gradient norm is a sum of per-shard partial sums
// (fp64, in another order), so within 1e-6.
struct ZeroCase {
  std::string optim;
  int ranks;
  int accumulation;
  bool bf16 = false;  // bf16 weights with stochastic rounding, AdamW's moments in bf16 too
};

class ZeroStages : public ::testing::TestWithParam<ZeroCase> {
 protected:
  void SetUp() override {
    if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  }
};

TEST_P(ZeroStages, EqualStageZero) {
  const ZeroCase z = GetParam();
  test::ByteCorpus c;
  json base = {{"optim", z.optim},
               {"max_steps", 8},
               {"save_steps", 8},
               {"per_device_train_batch_size", 2},
               {"gradient_accumulation_steps", z.accumulation},
               {"optim_8bit_min_size", 256},  // the tiny model's matrices get 8-bit states
               {"adafactor_relative_step", false}};
  if (z.optim == "sgd") base["learning_rate"] = 0.3;
  if (z.bf16) base.update({{"bf16", true}, {"stochastic_rounding", true}, {"adamw_bf16_moments", true}});
  std::vector<std::string> runs;
  for (int stage : {0, 1, 2, 3}) {
    json j = base;
    j["zero_stage"] = stage;
    const std::string name = "stage" + std::to_string(stage);
    const test::CommandResult r = launch(z.ranks, write_config(c, name, j));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    if (stage > 0) {
      EXPECT_NE(r.output.find(fmt::format("ZeRO stage {}", stage)), std::string::npos) << r.output;
    }
    runs.push_back(name);
  }
  const std::vector<double> ref = losses_of(c.dir / "stage0/metrics.jsonl");
  ASSERT_EQ(ref.size(), 8u);
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string& name = runs[size_t(stage)];
    const std::vector<double> got = losses_of(c.dir / (name + "/metrics.jsonl"));
    ASSERT_EQ(got.size(), 8u);
    for (size_t i = 0; i < ref.size(); ++i) {
      if (stage == 1)
        EXPECT_EQ(got[i], ref[i]) << "step " << i + 1;
      else
        EXPECT_NEAR(got[i], ref[i], 1e-6 * std::fabs(ref[i])) << "step " << i + 1;
    }
    // The checkpoint's model holds the gathered master weights; each rank wrote its optimizer shard.
    const double rel = weights_rel_diff(c.dir / "stage0/checkpoint-8/model.safetensors",
                                        c.dir / (name + "/checkpoint-8/model.safetensors"));
    // Stage 2 reduces each unit in a collective of its own (and, with accumulation, each micro-batch): with
    // 3 ranks or accumulation the fp32 sums round in another order, which AdamW turns into lr-sized steps
    // on near-zero gradients (why the issue compares AdamW by its loss curve) and 8-bit states into
    // requantized blocks. The same order (2 ranks, one micro-batch) or SGD: within 1e-6.
    const bool same_order = z.ranks == 2 && z.accumulation == 1;
    if (stage == 1)
      EXPECT_EQ(rel, 0.0);
    else
      EXPECT_LT(rel, same_order || z.optim == "sgd" ? 1e-6 : z.optim == "adamw_8bit" ? 2e-2 : 1e-3);
    for (int r = 0; r < z.ranks; ++r)
      EXPECT_TRUE(
          fs::exists(c.dir / fmt::format("{}/checkpoint-8/zero/optimizer-rank-{:05d}-of-{:05d}.safetensors",
                                         name, r, z.ranks)));
    EXPECT_FALSE(fs::exists(c.dir / (name + "/checkpoint-8/optimizer.safetensors")));
    const json state = json::parse(test::read_file(c.dir / (name + "/checkpoint-8/trainer_state.json")));
    EXPECT_EQ(state["zero_stage"], stage);
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ZeroStages,
                         ::testing::Values(ZeroCase{"adamw_torch_fused", 2, 2},
                                           ZeroCase{"adamw_torch_fused", 3, 1},
                                           ZeroCase{"adamw_torch_fused", 2, 1, true}, ZeroCase{"sgd", 2, 1},
                                           ZeroCase{"adamw_8bit", 3, 1}, ZeroCase{"adafactor", 2, 1}),
                         [](const auto& info) {
                           return info.param.optim + "_" + std::to_string(info.param.ranks) + "ranks_accum" +
                                  std::to_string(info.param.accumulation) + (info.param.bf16 ? "_bf16" : "");
                         });

// --profile_steps with several processes: every rank profiles, and rank 0 joins the traces into one file
// with a group of tracks per rank, each holding its collectives ("communication") and the waits of compute
// for them (Gloo runs collectives on the calling thread: each one is waited for); the ranks' parts go.
TEST(DataParallelProfile, OneTraceWithATrackGroupPerRank) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  const test::CommandResult r =
      launch(2, write_config(c, "prof", {{"max_steps", 4}, {"profile_steps", "2:3"}, {"save_steps", 0}}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("one group of tracks per rank"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(c.dir / "prof/profile_steps_2-3.rank-1.json"));
  const json trace = json::parse(test::read_file(c.dir / "prof/profile_steps_2-3.json"));
  std::set<std::string> names;
  std::map<int, int> collectives, waits, phases;  // by pid
  std::set<int64_t> steps;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "process_name")
      names.insert(e.at("args").at("name").get<std::string>());
    if (e.at("ph") != "X") continue;
    const int pid = e.at("pid");
    if (e.at("cat") == "communication") {
      ++collectives[pid];
      EXPECT_GT(e.at("args").at("bytes").get<int64_t>(), 0) << e.dump();
      steps.insert(e.at("args").at("step").get<int64_t>());
    }
    if (e.at("cat") == "exposed communication") ++waits[pid];
    if (e.at("cat") == "device") ++phases[pid];
  }
  EXPECT_TRUE(names.count("rank 0: steps") && names.count("rank 1: steps")) << trace.dump().substr(0, 2000);
  for (int pid : {0, 2}) {
    EXPECT_GT(collectives[pid], 0) << "pid " << pid;
    EXPECT_GT(waits[pid], 0) << "pid " << pid;
    EXPECT_GT(phases[pid], 0) << "pid " << pid;
  }
  EXPECT_EQ(steps, (std::set<int64_t>{2, 3}));
  EXPECT_EQ(trace.at("otherData").at("ranks").size(), 2u);
}

// communication_data_type bf16 with fp32 gradients: each rank's gradients are rounded to bf16 for the
// reduction and the sums widened back, so the run follows the fp32-reduced one closely but not exactly. With
// 2 ranks every stage reduces the same bf16 sums (a + b, rounded once), so stages 0, 2 and 3 agree with one
// another as they do in fp32, also with gradient accumulation (stage 2 adds each micro-batch's bf16 sums
// into fp32 gradients; stage 0 accumulates in fp32 and reduces once, so there the two differ slightly).
TEST(DataParallelCommType, Bf16ReductionOfFp32Gradients) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  const json base = {{"optim", "sgd"},
                     {"learning_rate", 0.3},
                     {"max_steps", 8},
                     {"save_steps", 8},
                     {"per_device_train_batch_size", 2}};
  auto run = [&](const std::string& name, int stage, const std::string& comm, int accumulation) {
    json j = base;
    j["zero_stage"] = stage;
    j["gradient_accumulation_steps"] = accumulation;
    if (!comm.empty()) j["communication_data_type"] = comm;
    const test::CommandResult r = launch(2, write_config(c, name, j));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const std::vector<double> l = losses_of(c.dir / (name + "/metrics.jsonl"));
    EXPECT_EQ(l.size(), 8u) << name;
    return l;
  };
  const std::vector<double> fp32 = run("fp32", 0, "", 1), bf16 = run("bf16", 0, "bf16", 1),
                            bf16_2 = run("bf16_2", 2, "bf16", 1), bf16_3 = run("bf16_3", 3, "bf16", 1);
  ASSERT_EQ(fp32.size(), 8u);
  ASSERT_EQ(bf16.size(), 8u);
  const double rel = weights_rel_diff(c.dir / "fp32/checkpoint-8/model.safetensors",
                                      c.dir / "bf16/checkpoint-8/model.safetensors");
  EXPECT_GT(rel, 0.0) << "reducing in bf16 changed nothing";
  EXPECT_LT(rel, 1e-2);
  for (size_t i = 0; i < fp32.size(); ++i) {
    EXPECT_NEAR(bf16[i], fp32[i], 1e-3 * fp32[i]) << "step " << i + 1;
    EXPECT_NEAR(bf16_2.at(i), bf16[i], 1e-6 * bf16[i]) << "stage 2, step " << i + 1;
    EXPECT_NEAR(bf16_3.at(i), bf16[i], 1e-6 * bf16[i]) << "stage 3, step " << i + 1;
  }
  EXPECT_LT(weights_rel_diff(c.dir / "bf16/checkpoint-8/model.safetensors",
                             c.dir / "bf16_2/checkpoint-8/model.safetensors"),
            1e-6);
  // Accumulation: stage 2 reduces each micro-batch in bf16 and adds in fp32; both follow fp32 closely.
  const std::vector<double> acc = run("acc", 0, "", 2), acc_2 = run("acc_2", 2, "bf16", 2);
  ASSERT_EQ(acc.size(), 8u);
  ASSERT_EQ(acc_2.size(), 8u);
  for (size_t i = 0; i < acc.size(); ++i) EXPECT_NEAR(acc_2[i], acc[i], 1e-3 * acc[i]) << "step " << i + 1;
}

// backward_grad_dtype bf16 under ZeRO 2-3 (bf16 training, fp32 accumulation): each micro-batch's gradients
// are written and reduced in bf16 and added into fp32; the run follows the fp32-gradient one closely, and
// stages 2 and 3 (the same sums) agree with each other as with fp32 gradients. With stage 1 the setting is
// refused at start (no unit slots).
TEST(DataParallelCommType, Bf16UnitGradientsUnderZero) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  const json base = {{"bf16", true},
                     {"max_steps", 8},
                     {"save_steps", 0},
                     {"per_device_train_batch_size", 2},
                     {"gradient_accumulation_steps", 2}};
  auto run = [&](const std::string& name, int stage, bool bf16_grads) {
    json j = base;
    j["zero_stage"] = stage;
    if (bf16_grads) j["backward_grad_dtype"] = "bf16";
    const test::CommandResult r = launch(2, write_config(c, name, j));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return losses_of(c.dir / (name + "/metrics.jsonl"));
  };
  const std::vector<double> fp32 = run("fp32", 2, false), two = run("bf16_2", 2, true),
                            three = run("bf16_3", 3, true);
  ASSERT_EQ(fp32.size(), 8u);
  ASSERT_EQ(two.size(), 8u);
  ASSERT_EQ(three.size(), 8u);
  EXPECT_NE(fp32, two) << "writing bf16 gradients changed nothing";
  for (size_t i = 0; i < fp32.size(); ++i) {
    EXPECT_NEAR(two[i], fp32[i], 1e-2 * fp32[i]) << "step " << i + 1;
    EXPECT_NEAR(three[i], two[i], 1e-6 * two[i]) << "step " << i + 1;
  }
  json j = base;
  j.update({{"zero_stage", 1}, {"backward_grad_dtype", "bf16"}});
  const test::CommandResult refused = launch(2, write_config(c, "stage1", j));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("set zero_stage 2"), std::string::npos) << refused.output;
}

// A ZeRO checkpoint resumes on any partition: the same stage and world bit for bit; stage 0 on one process
// with the same global batch, and stage 1 on 2 ranks from it, as the uninterrupted run within 1e-5; and a
// stage-0 checkpoint resumes under ZeRO-2.
TEST(ZeroResume, AnyWorldSizeAndStage) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  for (const std::string optim : {"adamw_torch_fused", "adamw_8bit", "adafactor"}) {
    SCOPED_TRACE(optim);
    test::ByteCorpus c;
    const std::string cfg = write_config(c, "full",
                                         {{"per_device_train_batch_size", 2},
                                          {"save_steps", 10},
                                          {"zero_stage", 2},
                                          {"optim", optim},
                                          {"optim_8bit_min_size", 256}});
    const test::CommandResult full = launch(2, cfg);
    ASSERT_EQ(full.exit_code, 0) << full.output;
    const std::string ckpt = c.dir / "full/checkpoint-10";
    const std::vector<double> a = losses_of(c.dir / "full/metrics.jsonl");
    ASSERT_EQ(a.size(), 20u);
    auto resume = [&](const std::string& name, const std::string& how) {
      const test::CommandResult r =
          test::run_anvil(how + " --output_dir " + (c.dir / name) + " --resume_from_checkpoint " + ckpt);
      EXPECT_EQ(r.exit_code, 0) << r.output;
      return losses_of(c.dir / (name + "/metrics.jsonl"));
    };
    const std::string launch2 =
        fmt::format("launch --nproc_per_node 2 --master_port 0 train --config {}", cfg);
    const std::vector<double> same = resume("same", launch2);
    ASSERT_EQ(same.size(), 10u);
    for (size_t i = 0; i < same.size(); ++i) EXPECT_EQ(same[i], a[10 + i]) << "step " << i + 11;
    EXPECT_EQ(weights_rel_diff(c.dir / "full/checkpoint-20/model.safetensors",
                               c.dir / "same/checkpoint-20/model.safetensors"),
              0.0);
    for (const auto& [name, how] : std::vector<std::pair<std::string, std::string>>{
             {"one", "train --config " + cfg + " --per_device_train_batch_size 4 --zero_stage 0"},
             {"stage1", launch2 + " --zero_stage 1"}}) {
      SCOPED_TRACE(name);
      const std::vector<double> o = resume(name, how);
      ASSERT_EQ(o.size(), 10u);
      for (size_t i = 0; i < o.size(); ++i)
        EXPECT_NEAR(o[i], a[10 + i], 1e-5 * std::fabs(a[10 + i])) << "step " << i + 11;
    }
    // From the one-process checkpoint of that run (stage 0, optimizer.safetensors) back to ZeRO-2 on 2 ranks.
    const test::CommandResult back =
        test::run_anvil(launch2 + " --output_dir " + (c.dir / "back") + " --resume_from_checkpoint " +
                        (c.dir / "one/checkpoint-20") + " --max_steps 24");
    EXPECT_EQ(back.exit_code, 0) << back.output;
    EXPECT_EQ(losses_of(c.dir / "back/metrics.jsonl").size(), 4u);
  }
}

// anvil zero-to-fp32: a ZeRO-2 checkpoint of 2 ranks becomes a Hugging Face directory holding the
// checkpoint's fp32 weights exactly, which a new run starts from; an incomplete checkpoint (a rank's file
// missing) and a directory that is no checkpoint are refused, saying what to do.
TEST(ZeroToFp32, WritesTheCheckpointsWeights) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  const std::string cfg =
      write_config(c, "run", {{"per_device_train_batch_size", 2}, {"max_steps", 4}, {"zero_stage", 2}});
  const test::CommandResult run = launch(2, cfg);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string ckpt = c.dir / "run/checkpoint-4";
  test::CommandResult r = test::run_anvil("zero-to-fp32 " + ckpt + " " + (c.dir / "hf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("fp32 weights"), std::string::npos) << r.output;
  EXPECT_TRUE(fs::exists(c.dir / "hf/config.json"));
  EXPECT_FALSE(fs::exists(c.dir / "hf/zero"));
  EXPECT_EQ(weights_rel_diff(ckpt + "/model.safetensors", c.dir / "hf/model.safetensors"), 0.0);
  const test::CommandResult from =
      test::run_anvil("train --config " + cfg + " --init_from " + (c.dir / "hf") +
                      " --zero_stage 0 --output_dir " + (c.dir / "from"));
  EXPECT_EQ(from.exit_code, 0) << from.output;

  fs::remove(ckpt + "/zero/optimizer-rank-00001-of-00002.safetensors");
  r = test::run_anvil("zero-to-fp32 " + ckpt + " " + (c.dir / "hf2"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("optimizer-rank-00001-of-00002.safetensors is missing"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(c.dir / "hf2"));
  r = test::run_anvil("zero-to-fp32 " + (c.dir / "hf") + " " + (c.dir / "hf3"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("not a checkpoint of `anvil train`"), std::string::npos) << r.output;
}

// A BERT classifier (bert-tiny on a WordPiece vocabulary, texts labelled by whether they hold "zebra"): 2
// processes at micro-batch 4 follow one process at micro-batch 8 (AdamW, loss curve within 1e-5).
TEST(DataParallelClassification, TwoProcessesEqualOne) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::TempDir dir;
  const char* words[] = {"apple", "river", "stone", "cloud", "green", "quick", "table", "light"};
  std::string vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nzebra\n", csv = "text,label\n";
  for (const char* w : words) vocab += std::string(w) + "\n";
  std::mt19937 rng(3);
  for (int i = 0; i < 400; ++i) {
    const bool zebra = rng() % 2;
    std::string text;
    for (int k = 0; k < 3 + int(rng() % 10); ++k) text += std::string(k ? " " : "") + words[rng() % 8];
    if (zebra) text += " zebra";
    csv += text + "," + (zebra ? "yes" : "no") + "\n";
  }
  test::write_file(dir / "vocab.txt", vocab);
  test::write_file(dir / "data.csv", csv);
  const test::CommandResult prep =
      test::run_anvil("prepare-data --input " + (dir / "data.csv") + " --tokenizer " + (dir / "vocab.txt") +
                      " --output " + (dir / "data"));
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  auto config = [&](const std::string& name, int batch) {
    // No dropout: its masks are drawn per process, so with dropout the two runs differ by their masks.
    const json model = {{"family", "bert"},
                        {"n_layer", 2},
                        {"n_head", 2},
                        {"n_embd", 32},
                        {"block_size", 64},
                        {"hidden_dropout_prob", 0},
                        {"attention_probs_dropout_prob", 0},
                        {"classifier_dropout", 0}};
    const json j = {{"model", model},
                    {"tokenizer", dir / "vocab.txt"},
                    {"train_data", dir / "data/train.cls"},
                    {"per_device_train_batch_size", batch},
                    {"max_steps", 15},
                    {"learning_rate", 1e-3},
                    {"logging_steps", 1},
                    {"save_strategy", "no"},
                    {"device", "cpu"},
                    {"seed", 7},
                    {"dataloader_pin_memory", false},
                    {"output_dir", dir / name}};
    test::write_file(dir / (name + ".json"), j.dump());
    return dir / (name + ".json");
  };
  const test::CommandResult one = test::run_anvil("train --config " + config("one", 8));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const test::CommandResult two = launch(2, config("two", 4));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const std::vector<double> a = losses_of(dir / "one/metrics.jsonl"),
                            b = losses_of(dir / "two/metrics.jsonl");
  ASSERT_EQ(a.size(), 15u);
  ASSERT_EQ(b.size(), 15u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::fabs(a[i])) << "step " << i + 1;
}

// Every rank must run the same config: one rank given another learning rate stops every rank at start-up
// with a message naming the rank and the differing line.
TEST(DataParallelErrors, DifferentConfigsAreRefused) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  const std::string cfg = write_config(c, "run", {{"per_device_train_batch_size", 2}});
  const test::CommandResult r =
      test::run_anvil(fmt::format("launch --nproc_per_node 2 --master_port 0 -- sh -c '{} train --config {} "
                                  "--learning_rate $((RANK + 1))e-3'",
                                  ANVIL_BINARY, cfg));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank 1 of 2 runs another config than rank 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("learning_rate"), std::string::npos) << r.output;
}

// A rank that dies mid-run (SIGKILL, no launcher to stop the others) makes the other rank stop with an error
// naming the step and the collective, well within ddp_timeout, instead of hanging.
TEST(DataParallelErrors, KilledRankStopsTheOthers) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  const std::string cfg = write_config(c, "run",
                                       {{"per_device_train_batch_size", 2},
                                        {"max_steps", 1000000},
                                        {"logging_steps", 1},
                                        {"save_strategy", "no"}});
  // Rank 1 is killed once rank 0 (the one that logs) has logged a step, not after a fixed time, which a
  // loaded machine may spend starting up: rank 0 is then inside the training loop's collectives. The seconds
  // from the kill to rank 0's exit are written beside its exit code.
  const std::string script = fmt::format(
      "export MASTER_ADDR=127.0.0.1 MASTER_PORT={0} WORLD_SIZE=2 OMP_NUM_THREADS=1\n"
      "RANK=0 LOCAL_RANK=0 {1} train --config {2} --ddp_timeout 60 > {3}/r0.log 2>&1 &\n"
      "p0=$!\n"
      "RANK=1 LOCAL_RANK=1 {1} train --config {2} --ddp_timeout 60 > {3}/r1.log 2>&1 &\n"
      "p1=$!\n"
      "i=0; while ! grep -q '^step' {3}/r0.log && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done\n"
      "t=$(date +%s)\n"
      "kill -9 $p1\n"
      "wait $p0\n"
      "echo $? > {3}/r0.exit\n"
      "echo $(($(date +%s) - t)) > {3}/r0.seconds\n",
      dist::free_tcp_port(), ANVIL_BINARY, cfg, c.dir.str());
  test::write_file(c.dir / "kill.sh", script);
  ASSERT_EQ(std::system(("sh " + (c.dir / "kill.sh")).c_str()), 0);
  EXPECT_LT(std::stoi(test::read_file(c.dir / "r0.seconds")), 30) << "rank 0 took too long to notice";
  EXPECT_NE(test::read_file(c.dir / "r0.exit"), "0\n");
  const std::string log = test::read_file(c.dir / "r0.log");
  EXPECT_NE(log.find("step "), std::string::npos) << log;
  EXPECT_NE(log.find("rank 0 of 2"), std::string::npos) << log;
  EXPECT_NE(log.find("all_reduce"), std::string::npos) << log;
}

// A rank that hangs (stopped with SIGSTOP) makes the other rank stop once ddp_timeout has passed, with an
// error that says so, instead of waiting forever.
TEST(DataParallelErrors, HangingRankStopsTheOthersAfterTheTimeout) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  const std::string cfg = write_config(c, "run",
                                       {{"per_device_train_batch_size", 2},
                                        {"max_steps", 1000000},
                                        {"logging_steps", 1000},
                                        {"save_strategy", "no"},
                                        {"ddp_timeout", 3}});
  const std::string script = fmt::format(
      "export MASTER_ADDR=127.0.0.1 MASTER_PORT={} WORLD_SIZE=2 OMP_NUM_THREADS=1\n"
      "RANK=0 LOCAL_RANK=0 {} train --config {} > {}/r0.log 2>&1 &\n"
      "p0=$!\n"
      "RANK=1 LOCAL_RANK=1 {} train --config {} > {}/r1.log 2>&1 &\n"
      "p1=$!\n"
      "sleep 2; kill -STOP $p1\n"
      "wait $p0; echo $? > {}/r0.exit\n"
      "kill -KILL $p1; wait $p1 2>/dev/null; true\n",
      dist::free_tcp_port(), ANVIL_BINARY, cfg, c.dir.str(), ANVIL_BINARY, cfg, c.dir.str(), c.dir.str());
  test::write_file(c.dir / "hang.sh", script);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(std::system(("sh " + (c.dir / "hang.sh")).c_str()), 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 20) << "rank 0 did not stop after the timeout";
  EXPECT_NE(test::read_file(c.dir / "r0.exit"), "0\n");
  const std::string log = test::read_file(c.dir / "r0.log");
  EXPECT_NE(log.find("rank 0 of 2"), std::string::npos) << log;
  EXPECT_NE(log.find("3 s"), std::string::npos) << log;
}

}  // namespace
}  // namespace anvil
