// `anvil estimate --gpu NAME`: a CUDA plan for a named GPU, with its memory as the budget and the typical
// CUDA context overhead, on any machine (a CUDA build is needed to plan for CUDA; a GPU is not).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "runtime/device.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

constexpr size_t kH100Bytes = 85'017'493'504;          // what CUDA reports as an H100 80GB's total
constexpr size_t kTypicalOverheadBytes = 588'054'528;  // measured on an H100 (docs/memory.md)

std::string small_config(const test::TempDir& dir) {
  const std::string path = dir / "config.json";
  test::write_file(path, R"({"model": {"n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 256,
                             "block_size": 64}, "per_device_train_batch_size": 4})");
  return " --config " + path;
}

TEST(EstimateGpu, PlansForTheNamedGpu) {
  test::TempDir dir;
  const std::string cfg = small_config(dir);
  test::CommandResult r = test::run_anvil("estimate" + cfg + " --gpu h100 --json");
  if (!cuda_compiled()) {
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.output.find("built without CUDA"), std::string::npos) << r.output;
    return;
  }
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json j = json::parse(r.output);
  EXPECT_EQ(j.at("device"), "cuda");
  EXPECT_EQ(j.at("gpu"), "h100");
  EXPECT_EQ(j.at("device_name"), "cuda (NVIDIA H100 80GB HBM3, --gpu h100)");
  EXPECT_EQ(j.at("budget_bytes").get<size_t>(), kH100Bytes);
  EXPECT_EQ(j.at("overhead").get<size_t>(), kTypicalOverheadBytes);
  EXPECT_EQ(j.at("overhead_source"), "gpu");
  EXPECT_EQ(j.at("fits"), true);
  // The text says which assumptions it made.
  r = test::run_anvil("estimate" + cfg + " --gpu h100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(assumed: typical, measured on an H100"), std::string::npos) << r.output;
  EXPECT_NE(
      r.output.find("fits in 79.18 GiB (85017493504 bytes: the memory of an NVIDIA H100 80GB HBM3, --gpu "
                    "h100)"),
      std::string::npos)
      << r.output;
  // --gpu_memory and --overhead_bytes still override the named GPU's figures.
  r = test::run_anvil("estimate" + cfg + " --gpu a100-40gb --gpu_memory 1MiB --overhead_bytes 100MiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  j = json::parse(r.output);
  EXPECT_EQ(j.at("budget_bytes").get<size_t>(), size_t(1) << 20);
  EXPECT_EQ(j.at("overhead").get<size_t>(), size_t(100) << 20);
  EXPECT_EQ(j.at("overhead_source"), "flag");
  EXPECT_EQ(j.at("fits"), false);
}

TEST(EstimateGpu, WithoutAGpuTheTypicalOverheadIsAssumed) {
  if (!cuda_compiled() || cuda_available()) GTEST_SKIP() << "needs a CUDA build on a machine without a GPU";
  test::TempDir dir;
  const test::CommandResult r = test::run_anvil("estimate" + small_config(dir) + " --device cuda --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  EXPECT_EQ(j.at("device_name"), "cuda (no GPU here)");
  EXPECT_EQ(j.at("overhead").get<size_t>(), kTypicalOverheadBytes);
  EXPECT_EQ(j.at("overhead_source"), "assumed");
  EXPECT_TRUE(j.at("budget_bytes").is_null());
}

// The first line names the model's family and its grouped-query attention.
TEST(EstimateGpu, NamesTheFamily) {
  const test::CommandResult r = test::run_anvil("estimate --model llama-tiny --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("Memory estimate for training llama (4 layers, 4 heads (2 key/value), 128 dims"),
            std::string::npos)
      << r.output;
}

TEST(EstimateGpu, BadGpuFlags) {
  test::TempDir dir;
  const std::string cfg = small_config(dir);
  test::CommandResult r = test::run_anvil("estimate" + cfg + " --gpu b300");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(
      r.output,
      "error: --gpu b300: not a GPU this estimate knows (h100, h200, a100-80gb, a100-40gb, rtx4090); for "
      "another GPU give --device cuda --gpu_memory SIZE [--overhead_bytes SIZE]\n");
  r = test::run_anvil("estimate" + cfg + " --device cpu --gpu h100");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.output, "error: --gpu h100 plans a CUDA run, but device is cpu: drop one of them\n");
}

}  // namespace
}  // namespace anvil
