// Hugging Face model directories: sharded weights (model.safetensors.index.json), bf16 weights,
// `anvil convert` and `anvil logits` against the logits transformers recorded (tests/golden/gpt2_tiny).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "io/checkpoint.hpp"
#include "io/safetensors.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const std::string kGolden = std::string(ANVIL_SOURCE_DIR) + "/tests/golden/gpt2_tiny";

// Copies the golden model into `dir` as two shards (tensors alternate), optionally as bf16.
void write_sharded(const std::string& dir, bool bf16) {
  fs::create_directories(dir);
  fs::copy_file(kGolden + "/config.json", dir + "/config.json");
  const io::SafeTensorsReader src(kGolden + "/model.safetensors");
  io::SafeTensorsWriter shards[2];
  json map = json::object();
  for (size_t i = 0; i < src.tensors().size(); ++i) {
    const io::SafeTensorInfo& t = src.tensors()[i];
    const std::string file = i % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    if (bf16) {
      std::vector<float> f(size_t(t.numel()));
      std::memcpy(f.data(), src.data(t), f.size() * 4);
      std::vector<uint16_t> h(f.size());
      for (size_t k = 0; k < f.size(); ++k) {
        uint32_t bits;
        std::memcpy(&bits, &f[k], 4);
        h[k] = uint16_t((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);  // round to nearest even
      }
      shards[i % 2].add(t.name, DType::BF16, t.shape, h.data());
    } else {
      shards[i % 2].add(t.name, t.dtype, t.shape, src.data(t));
    }
    map[t.name] = file;
  }
  shards[0].write(dir + "/model-00001-of-00002.safetensors");
  shards[1].write(dir + "/model-00002-of-00002.safetensors");
  test::write_file(dir + "/model.safetensors.index.json",
                   json{{"metadata", json::object()}, {"weight_map", map}}.dump());
}

std::vector<float> load_params(const std::string& dir) {
  const TransformerConfig cfg = io::read_model_config(dir);
  Engine e(cfg, EngineOptions{});
  io::load_model_weights(dir, e.model(), e.device());
  std::vector<float> p(e.model().layout().total_numel());
  e.device().copy_to_host(p.data(), e.model().params(), p.size() * sizeof(float));
  return p;
}

std::string load_error(const std::string& dir) {
  try {
    load_params(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfCheckpoint, ShardedWeightsLoadLikeOneFile) {
  test::TempDir tmp;
  write_sharded(tmp / "sharded", false);
  EXPECT_EQ(load_params(tmp / "sharded"), load_params(kGolden));
}

TEST(HfCheckpoint, Bf16WeightsLoadRounded) {
  test::TempDir tmp;
  write_sharded(tmp / "bf16", true);
  const std::vector<float> a = load_params(tmp / "bf16"), b = load_params(kGolden);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], std::fabs(b[i]) * 4e-3 + 1e-30) << i;
}

TEST(HfCheckpoint, MalformedIndexAndMissingWeights) {
  test::TempDir tmp;
  write_sharded(tmp / "s", false);
  test::write_file(tmp / "s/model.safetensors.index.json", "{\"metadata\": {}}");
  EXPECT_NE(load_error(tmp / "s").find("weight_map"), std::string::npos) << load_error(tmp / "s");
  write_sharded(tmp / "t", false);
  json idx = json::parse(test::read_file(tmp / "t/model.safetensors.index.json"));
  json& entry = idx["weight_map"]["transformer.h.0.ln_1.weight"];  // point it at the other shard
  entry = entry == "model-00001-of-00002.safetensors" ? "model-00002-of-00002.safetensors"
                                                      : "model-00001-of-00002.safetensors";
  test::write_file(tmp / "t/model.safetensors.index.json", idx.dump());
  EXPECT_NE(load_error(tmp / "t").find("is listed in"), std::string::npos) << load_error(tmp / "t");
  fs::create_directories(tmp / "bin");
  fs::copy_file(kGolden + "/config.json", tmp / "bin/config.json");
  test::write_file(tmp / "bin/pytorch_model.bin", "x");
  EXPECT_NE(load_error(tmp / "bin").find("pytorch_model.bin is not supported"), std::string::npos);
}

TEST(HfCheckpoint, ConvertThenLogitsMatchTransformers) {
  if (!fs::exists(kGolden + "/golden.safetensors")) GTEST_SKIP() << "fixture missing";
  test::TempDir tmp;
  write_sharded(tmp / "sharded", false);
  test::write_file(tmp / "sharded/tokenizer.json", "{}");
  test::CommandResult r =
      test::run_anvil("convert --input " + (tmp / "sharded") + " --output " + (tmp / "hf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json"})
    EXPECT_TRUE(fs::exists(tmp / ("hf/" + std::string(f)))) << f;
  EXPECT_FALSE(fs::exists(tmp / "hf/model.safetensors.index.json"));

  const io::SafeTensorsReader golden(kGolden + "/golden.safetensors");
  io::SafeTensorsWriter ids;
  const io::SafeTensorInfo& t = golden.at("input_ids");
  ids.add("input_ids", DType::I32, t.shape, golden.data(t));
  ids.write(tmp / "ids.safetensors");
  r = test::run_anvil("logits --checkpoint " + (tmp / "hf") + " --input_ids " + (tmp / "ids.safetensors") +
                      " --output " + (tmp / "logits.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const io::SafeTensorsReader got(tmp / "logits.safetensors");
  const io::SafeTensorInfo& gl = got.at("logits");
  const io::SafeTensorInfo& wl = golden.at("logits");
  ASSERT_EQ(gl.shape, wl.shape);
  std::vector<float> a(size_t(gl.numel())), b(a.size());
  std::memcpy(a.data(), got.data(gl), a.size() * 4);
  std::memcpy(b.data(), golden.data(wl), b.size() * 4);
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_ref = std::max(max_ref, double(std::fabs(b[i])));
    max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
  }
  EXPECT_LT(max_diff / max_ref, 1e-4);
}

TEST(HfCheckpoint, LogitsRejectsBadInput) {
  test::TempDir tmp;
  io::SafeTensorsWriter w;
  const int32_t bad[4] = {1, 2, 300, 4};
  w.add("input_ids", DType::I32, {1, 4}, bad);
  w.write(tmp / "ids.safetensors");
  const test::CommandResult r =
      test::run_anvil("logits --checkpoint " + kGolden + " --input_ids " + (tmp / "ids.safetensors") +
                      " --output " + (tmp / "o.safetensors"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("input_ids[2] = 300"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp / "o.safetensors"));
}

}  // namespace
}  // namespace anvil
