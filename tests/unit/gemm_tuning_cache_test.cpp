// The GEMM tuning cache file (kernels/gemm_tuning_cache.hpp): round trip, merging with entries another
// process wrote, malformed files, and the CPU backend refusing gemm_tuning.
#include "kernels/gemm_tuning_cache.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "anvil/train_config.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

GemmTuningEntry entry(int64_t id, double heuristic_us, double tuned_us, int candidates) {
  GemmTuningEntry e;
  e.config = {id, 18, 31, 2, 2, 1, 0, 0, 0};
  e.heuristic_us = heuristic_us;
  e.tuned_us = tuned_us;
  e.candidates = candidates;
  return e;
}

void expect_same(const GemmTuningEntry& a, const GemmTuningEntry& b) {
  EXPECT_EQ(a.config, b.config);
  EXPECT_NEAR(a.heuristic_us, b.heuristic_us, 0.005);
  EXPECT_NEAR(a.tuned_us, b.tuned_us, 0.005);
  EXPECT_EQ(a.candidates, b.candidates);
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string error_of(const std::string& path) {
  try {
    GemmTuningCache cache(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(GemmTuningCache, MissingFileIsEmptyAndPutWritesIt) {
  test::TempDir dir;
  const std::string path = dir / "sub/dir/gemm_tuning.txt";  // parents are created on the first put
  GemmTuningCache cache(path);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.find("k"), nullptr);
  cache.put("H100|cublasLt 130100|M=2048 N=1024 K=4096 f32->f32 key 0 1 2048", entry(55, 344.41, 331.52, 39));
  ASSERT_TRUE(std::filesystem::exists(path));
  const GemmTuningCache reread(path);
  ASSERT_EQ(reread.size(), 1u);
  const GemmTuningEntry* e = reread.find("H100|cublasLt 130100|M=2048 N=1024 K=4096 f32->f32 key 0 1 2048");
  ASSERT_NE(e, nullptr);
  expect_same(*e, entry(55, 344.41, 331.52, 39));
  // No temporary file is left beside it.
  int files = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir / "sub/dir")) files += f.is_regular_file();
  EXPECT_EQ(files, 1);
}

TEST(GemmTuningCache, FormatParseRoundTripAndReplace) {
  std::map<std::string, GemmTuningEntry> entries{{"a b|c", entry(20, 1.5, 1.25, 3)},
                                                 {"z", entry(55, 0, 0, 0)}};
  entries["neg"] = entry(7, 2, 2, 1);
  entries["neg"].config[8] = -1;  // any integer survives
  const auto back = GemmTuningCache::parse(GemmTuningCache::format(entries), "mem");
  ASSERT_EQ(back.size(), entries.size());
  for (const auto& [k, e] : entries) expect_same(back.at(k), e);
  // A later line with the same key wins.
  const auto twice = GemmTuningCache::parse(
      "anvil-gemm-tuning 1\nk\t1,2,3,4,5,6,7,8,9\t1\t1\t1\nk\t9,8,7,6,5,4,3,2,1\t2\t2\t2\n", "mem");
  ASSERT_EQ(twice.size(), 1u);
  EXPECT_EQ(twice.at("k").config[0], 9);
}

TEST(GemmTuningCache, PutMergesEntriesAnotherProcessAdded) {
  test::TempDir dir;
  const std::string path = dir / "gemm_tuning.txt";
  GemmTuningCache first(path), second(path);  // both read the empty cache
  first.put("one", entry(1, 10, 9, 5));
  second.put("two", entry(2, 20, 18, 6));  // must keep "one", written after `second` was read
  const GemmTuningCache reread(path);
  EXPECT_EQ(reread.size(), 2u);
  EXPECT_NE(reread.find("one"), nullptr);
  EXPECT_NE(reread.find("two"), nullptr);
}

TEST(GemmTuningCache, MalformedFilesNameTheFileAndLine) {
  test::TempDir dir;
  const std::string path = dir / "gemm_tuning.txt";
  struct Case {
    std::string text, expect;
  };
  const std::vector<Case> cases{
      {"", "line 1: not an Anvil GEMM tuning cache"},
      {"anvil-gemm-tuning 2\n", "line 1: not an Anvil GEMM tuning cache"},
      {"{\"json\": true}\n", "line 1: not an Anvil GEMM tuning cache"},
      {"anvil-gemm-tuning 1\nkey\t1,2,3,4,5,6,7,8,9\t1\t1\n", "line 2: expected 5 tab-separated fields"},
      {"anvil-gemm-tuning 1\n\nkey\t1,2,3\t1\t1\t1\n",
       "line 3: the algorithm config has 3 values, expected 9"},
      {"anvil-gemm-tuning 1\nkey\t1,2,x,4,5,6,7,8,9\t1\t1\t1\n",
       "line 2: config value 'x' is not an integer"},
      {"anvil-gemm-tuning 1\nkey\t1,2,3,4,5,6,7,8,9\tfast\t1\t1\n", "line 2: heuristic time 'fast'"},
      {"anvil-gemm-tuning 1\nkey\t1,2,3,4,5,6,7,8,9\t1\t-3\t1\n", "line 2: tuned time '-3'"},
      {"anvil-gemm-tuning 1\nkey\t1,2,3,4,5,6,7,8,9\t1\tnan\t1\n", "line 2: tuned time 'nan'"},
      {"anvil-gemm-tuning 1\nkey\t1,2,3,4,5,6,7,8,9\t1\t1\t-1\n",
       "line 2: candidate count -1 is out of range"},
      {"anvil-gemm-tuning 1\n\t1,2,3,4,5,6,7,8,9\t1\t1\t1\n", "line 2: empty key"},
  };
  for (const Case& c : cases) {
    write(path, c.text);
    const std::string err = error_of(path);
    EXPECT_NE(err.find(path), std::string::npos) << c.text << " -> " << err;
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.text << " -> " << err;
  }
  // A file that cannot be read (a directory in its place) names the path too.
  std::filesystem::remove(path);
  std::filesystem::create_directories(path);
  EXPECT_NE(error_of(path).find(path), std::string::npos);
}

TEST(GemmTuningCache, DefaultPathFollowsTheEnvironment) {
  const char* old = std::getenv("ANVIL_CACHE_DIR");
  const std::string saved = old ? old : "";
  ::setenv("ANVIL_CACHE_DIR", "/tmp/anvil-cache-test", 1);
  EXPECT_EQ(GemmTuningCache::default_path(), "/tmp/anvil-cache-test/gemm_tuning.txt");
  ::unsetenv("ANVIL_CACHE_DIR");
  EXPECT_NE(GemmTuningCache::default_path().find("anvil/gemm_tuning.txt"), std::string::npos);
  if (old) ::setenv("ANVIL_CACHE_DIR", saved.c_str(), 1);
}

TEST(GemmTuningCache, TrainConfigKeysAndTheCpuBackend) {
  TrainConfig cfg =
      TrainConfig::from_json({{"gemm_tuning", true}, {"gemm_tuning_cache", "/x/cache.txt"}}, "t");
  EXPECT_TRUE(cfg.gemm_tuning);
  EXPECT_EQ(TrainConfig::from_json(cfg.to_json(), "u").gemm_tuning_cache, "/x/cache.txt");
  const EngineOptions cuda = training_engine_options(cfg, DeviceKind::CUDA);
  EXPECT_TRUE(cuda.gemm_tuning.enabled);
  EXPECT_EQ(cuda.gemm_tuning.cache_path, "/x/cache.txt");
  try {
    training_engine_options(cfg, DeviceKind::CPU);
    ADD_FAILURE() << "gemm_tuning on the CPU must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not supported on the CPU"), std::string::npos) << e.what();
  }
  cfg.gemm_tuning = false;
  EXPECT_FALSE(training_engine_options(cfg, DeviceKind::CPU).gemm_tuning.enabled);
}

}  // namespace
}  // namespace anvil
