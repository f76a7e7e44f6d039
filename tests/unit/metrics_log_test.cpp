// metrics.jsonl through MetricsLog: every write is checked (a full device is an error naming the file, not a
// silently truncated record), and a resumed run's file keeps only the records up to its checkpoint.
#include "train/metrics_log.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "test_util.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

TEST(MetricsLog, WritesOneCompleteLinePerRecord) {
  test::TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  MetricsLog log = MetricsLog::create(path);
  log.write({{"step", 1}, {"loss", 2.5}});
  log.write({{"step", 2}, {"loss", nullptr}});
  EXPECT_EQ(test::read_file(path), "{\"loss\":2.5,\"step\":1}\n{\"loss\":null,\"step\":2}\n");
  log.close();
}

TEST(MetricsLog, AFullDeviceIsAnErrorNamingTheFile) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  MetricsLog log = MetricsLog::create("/dev/full");
  test::expect_error(
      [&] {
        log.write({{"step", 1}, {"loss", 2.5}});
      },
      {"/dev/full: cannot write a metrics record (No space left on device)",
       "the file keeps the complete records before it"});
  EXPECT_TRUE(fs::exists("/dev/full"));
}

TEST(MetricsLog, AFileThatCannotBeCreatedIsAnErrorNamingIt) {
  test::TempDir dir;
  test::expect_error([&] { MetricsLog::create(dir / "missing/metrics.jsonl"); },
                     {dir / "missing/metrics.jsonl", "cannot open for writing"});
}

// A run resumed at step 3 drops what the interrupted run logged after its checkpoint (steps 4, 5, and the
// half line a kill left), so the file never holds two runs' step 4.
TEST(MetricsLog, ResumeKeepsTheRecordsUpToTheCheckpoint) {
  test::TempDir dir;
  const std::string path = dir / "metrics.jsonl";
  test::write_file(path,
                   "{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4}\n{\"step\":2,\"eval_loss\":4.5}\n"
                   "{\"step\":3,\"loss\":3}\n{\"step\":4,\"loss\":2}\n{\"step\":5,\"lo");
  MetricsLog log = MetricsLog::resume(path, 3);
  log.write({{"step", 4}, {"loss", 2.25}});
  log.close();
  EXPECT_EQ(test::read_file(path),
            "{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4}\n{\"step\":2,\"eval_loss\":4.5}\n"
            "{\"step\":3,\"loss\":3}\n{\"loss\":2.25,\"step\":4}\n");
  for (const auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename(), "metrics.jsonl") << "left behind: " << e.path();
}

TEST(MetricsLog, ResumeWithoutAFileStartsOne) {
  test::TempDir dir;
  MetricsLog log = MetricsLog::resume(dir / "metrics.jsonl", 7);
  log.write({{"step", 8}});
  EXPECT_EQ(test::read_file(dir / "metrics.jsonl"), "{\"step\":8}\n");
}

}  // namespace
}  // namespace anvil
