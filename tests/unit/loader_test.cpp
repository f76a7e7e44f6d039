#include "data/loader.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "anvil/error.hpp"
#include "data/token_shard.hpp"
#include "runtime/device.hpp"
#include "test_util.hpp"

namespace anvil::data {
namespace {

// A copied batch, so it can be compared after the loader has reused its buffers.
struct BatchCopy {
  std::vector<int32_t> inputs, targets;
  LoaderPosition pos;
  bool operator==(const BatchCopy&) const = default;
};

BatchCopy copy_of(const HostBatch& b) {
  const size_t n = static_cast<size_t>(b.batch_size) * static_cast<size_t>(b.seq_len);
  return {{b.inputs, b.inputs + n}, {b.targets, b.targets + n}, b.pos};
}

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { dev_ = make_cpu_device(); }

  // Token i is i itself, so a window's id can be read back from its first input token.
  std::shared_ptr<const TokenShard> counting_shard(uint64_t n, const std::string& name = "shard.bin") {
    std::vector<uint32_t> tokens(n);
    std::iota(tokens.begin(), tokens.end(), 0u);
    const std::string path = dir_ / name;
    write_token_shard(path, tokens, n);
    return std::make_shared<const TokenShard>(path);
  }

  std::unique_ptr<DataLoader> make_loader(std::shared_ptr<const TokenShard> shard, int batch, int seq,
                                          uint64_t seed, bool shuffle = true, int prefetch = 4) {
    return std::make_unique<DataLoader>(std::move(shard), LoaderConfig{batch, seq, seed, shuffle, prefetch},
                                        *dev_);
  }

  test::TempDir dir_;
  std::unique_ptr<Device> dev_;
};

// The window ids of a batch drawn from a counting shard.
std::vector<uint64_t> windows_of(const HostBatch& b) {
  std::vector<uint64_t> ids;
  for (int row = 0; row < b.batch_size; ++row)
    ids.push_back(static_cast<uint64_t>(b.inputs[static_cast<size_t>(row) * b.seq_len]) / b.seq_len);
  return ids;
}

std::vector<BatchCopy> take(DataLoader& loader, int n) {
  std::vector<BatchCopy> batches;
  for (int i = 0; i < n; ++i) batches.push_back(copy_of(loader.next()));
  return batches;
}

TEST_F(LoaderTest, GeometryAndTargetsAreInputsShiftedByOne) {
  auto shard = counting_shard(1001);  // 1000 windows of seq_len 10 (+1 token for the last target)
  auto loader = make_loader(shard, 8, 10, 1);
  EXPECT_EQ(loader->num_windows(), 100u);
  EXPECT_EQ(loader->batches_per_epoch(), 12u);  // 100 / 8, the partial batch dropped
  for (int i = 0; i < 30; ++i) {
    const HostBatch& b = loader->next();
    ASSERT_EQ(b.batch_size, 8);
    ASSERT_EQ(b.seq_len, 10);
    for (int row = 0; row < 8; ++row) {
      const int32_t* in = b.inputs + row * 10;
      const int32_t* tg = b.targets + row * 10;
      ASSERT_EQ(in[0] % 10, 0) << "windows start at multiples of seq_len";
      for (int t = 0; t < 10; ++t) {
        ASSERT_EQ(in[t], in[0] + t);
        ASSERT_EQ(tg[t], in[t] + 1);
        ASSERT_EQ(static_cast<uint32_t>(tg[t]), shard->at(static_cast<uint64_t>(in[t]) + 1));
      }
    }
  }
}

TEST_F(LoaderTest, SameSeedSameBatchesDifferentSeedDifferentOrder) {
  auto shard = counting_shard(4097);
  auto a = make_loader(shard, 4, 16, 42);
  auto b = make_loader(shard, 4, 16, 42, true, 1);  // the prefetch depth must not change the data
  auto c = make_loader(shard, 4, 16, 43);
  const int n = 2 * static_cast<int>(a->batches_per_epoch()) + 3;
  const auto batches_a = take(*a, n), batches_b = take(*b, n), batches_c = take(*c, n);
  EXPECT_EQ(batches_a, batches_b);
  int same = 0;
  for (int i = 0; i < n; ++i) same += batches_a[i].inputs == batches_c[i].inputs;
  EXPECT_LT(same, n / 4);
}

TEST_F(LoaderTest, EveryWindowExactlyOncePerEpochAndEpochsReshuffle) {
  auto shard = counting_shard(64 * 8 + 1);  // 64 windows of 8 tokens: 16 batches of 4, none dropped
  auto loader = make_loader(shard, 4, 8, 7);
  ASSERT_EQ(loader->batches_per_epoch(), 16u);
  std::vector<std::vector<uint64_t>> orders;
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<uint64_t> order;
    for (uint64_t i = 0; i < 16; ++i) {
      EXPECT_EQ(loader->position(), (LoaderPosition{epoch, i}));
      const HostBatch& b = loader->next();
      EXPECT_EQ(b.pos, (LoaderPosition{epoch, i}));
      for (uint64_t w : windows_of(b)) order.push_back(w);
    }
    std::vector<uint64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<uint64_t> all(64);
    std::iota(all.begin(), all.end(), uint64_t{0});
    EXPECT_EQ(sorted, all) << "epoch " << epoch;
    orders.push_back(order);
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
}

TEST_F(LoaderTest, DroppedPartialBatchStillCoversDistinctWindows) {
  auto shard = counting_shard(10 * 5 + 3);  // 10 windows of 5 tokens, batches of 3: 3 batches, 1 dropped
  auto loader = make_loader(shard, 3, 5, 9);
  ASSERT_EQ(loader->batches_per_epoch(), 3u);
  std::vector<uint64_t> seen;
  for (int i = 0; i < 3; ++i)
    for (uint64_t w : windows_of(loader->next())) seen.push_back(w);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end());
  EXPECT_LT(seen.back(), 10u);
  EXPECT_EQ(loader->position(), (LoaderPosition{1, 0}));
}

TEST_F(LoaderTest, WithoutShuffleWindowsComeInOrder) {
  auto shard = counting_shard(12 * 4 + 1);
  auto loader = make_loader(shard, 3, 4, 5, /*shuffle=*/false);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (uint64_t i = 0; i < loader->batches_per_epoch(); ++i) {
      EXPECT_EQ(windows_of(loader->next()), (std::vector<uint64_t>{3 * i, 3 * i + 1, 3 * i + 2}));
    }
  }
}

TEST_F(LoaderTest, SeekReproducesTheBatchAFreshLoaderProduces) {
  auto shard = counting_shard(2000);
  auto reference = make_loader(shard, 5, 7, 11);
  const uint64_t per_epoch = reference->batches_per_epoch();  // 285 windows -> 57 batches
  const auto run = take(*reference, static_cast<int>(3 * per_epoch));

  // Seek a fresh loader to several positions, including across epochs and backwards.
  auto loader = make_loader(shard, 5, 7, 11);
  for (LoaderPosition p : {LoaderPosition{1, 3}, LoaderPosition{0, 0}, LoaderPosition{2, per_epoch - 1},
                           LoaderPosition{0, 20}, LoaderPosition{1, per_epoch - 1}}) {
    loader->seek(p);
    EXPECT_EQ(loader->position(), p);
    const size_t index = p.epoch * per_epoch + p.batch;
    for (size_t k = index; k < std::min(index + 3, run.size()); ++k) {
      EXPECT_EQ(copy_of(loader->next()), run[k])
          << "epoch " << p.epoch << " batch " << p.batch << " +" << k - index;
    }
  }
  // After consuming (so batches are prefetched), a seek discards them.
  auto resumed = make_loader(shard, 5, 7, 11);
  take(*resumed, 10);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  resumed->seek({0, 4});
  EXPECT_EQ(copy_of(resumed->next()), run[4]);
  EXPECT_EQ(resumed->position(), (LoaderPosition{0, 5}));
}

TEST_F(LoaderTest, ReturnedBuffersStayValidForTwoMoreCalls) {
  auto shard = counting_shard(3001);
  auto loader = make_loader(shard, 4, 6, 3, true, /*prefetch=*/1);  // the smallest ring: reuse is quick
  const HostBatch* older = &loader->next();
  BatchCopy older_copy = copy_of(*older);
  const HostBatch* newer = &loader->next();
  BatchCopy newer_copy = copy_of(*newer);
  for (int i = 0; i < 60; ++i) {
    // Give the prefetch thread time to overwrite anything it is allowed to.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(copy_of(*older), older_copy) << i;
    EXPECT_EQ(copy_of(*newer), newer_copy) << i;
    const HostBatch* next = &loader->next();  // now `older` may be reused, `newer` may not
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    EXPECT_EQ(copy_of(*newer), newer_copy) << i;
    older = newer, older_copy = newer_copy;
    newer = next, newer_copy = copy_of(*next);
  }
  // The same must hold across a seek: the two batches returned last are still the caller's.
  loader->seek({0, 0});
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(copy_of(*older), older_copy);
  EXPECT_EQ(copy_of(*newer), newer_copy);
  const BatchCopy first = copy_of(loader->next());
  EXPECT_EQ(first.pos, (LoaderPosition{0, 0}));
  EXPECT_EQ(copy_of(*newer), newer_copy);
}

TEST_F(LoaderTest, TooSmallShardAndBadConfigAreErrors) {
  auto shard = counting_shard(10);  // (10 - 1) / 4 = 2 windows
  const std::string& path = shard->path();
  auto expect_error = [&](LoaderConfig cfg, std::vector<std::string> needles) {
    try {
      DataLoader loader(shard, cfg, *dev_);
      ADD_FAILURE() << "expected anvil::Error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      needles.push_back(path);
      for (const std::string& needle : needles) EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  };
  expect_error({3, 4, 0}, {"10 tokens", "2 windows", "batch_size = 3"});
  expect_error({0, 4, 0}, {"batch_size 0"});
  expect_error({1, 0, 0}, {"seq_len 0"});
  expect_error({1, 4, 0, true, 0}, {"prefetch 0"});
  DataLoader ok(shard, {2, 4, 0}, *dev_);  // exactly one batch fits
  EXPECT_EQ(ok.batches_per_epoch(), 1u);
  EXPECT_EQ(ok.next().pos, (LoaderPosition{0, 0}));
  EXPECT_EQ(ok.next().pos, (LoaderPosition{1, 0}));

  auto tiny = counting_shard(1, "tiny.bin");
  EXPECT_THROW({ DataLoader loader(tiny, {1, 1, 0}, *dev_); }, Error);
}

TEST_F(LoaderTest, SeekRejectsABatchPastTheEpoch) {
  auto loader = make_loader(counting_shard(101), 2, 10, 0);  // 10 windows, 5 batches
  try {
    loader->seek({3, 5});
    ADD_FAILURE() << "expected anvil::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch 5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("5 batches"), std::string::npos) << e.what();
  }
  EXPECT_EQ(loader->position(), (LoaderPosition{0, 0}));  // unchanged
  loader->seek({1000, 4});
  EXPECT_EQ(loader->next().pos, (LoaderPosition{1000, 4}));
  EXPECT_EQ(loader->position(), (LoaderPosition{1001, 0}));
}

TEST_F(LoaderTest, ShutsDownCleanlyWithPrefetchedBatchesAndTracksWaiting) {
  auto shard = counting_shard(5001);
  for (int i = 0; i < 20; ++i) {
    auto loader = make_loader(shard, 4, 8, static_cast<uint64_t>(i), true, 1 + i % 5);
    if (i % 2) loader->next();
  }  // destructors stop and join while the thread is mid-batch or waiting for a free slot
  auto loader = make_loader(shard, 4, 8, 1);
  take(*loader, 5);
  EXPECT_GE(loader->wait_seconds(), 0.0);
  EXPECT_LT(loader->wait_seconds(), 10.0);
}

}  // namespace
}  // namespace anvil::data

namespace anvil::data {
namespace {

// Several assembling threads and pageable staging must not change a single token of any batch.
TEST_F(LoaderTest, WorkersAndPageableMemoryGiveTheSameBatches) {
  auto shard = counting_shard(9001);
  auto reference = make_loader(shard, 7, 16, 3);
  LoaderConfig cfg{7, 16, 3, true, 2};
  cfg.num_workers = 3;
  DataLoader workers(shard, cfg, *dev_);
  cfg.num_workers = 8;  // more threads than rows: some get none
  cfg.pin_memory = false;
  DataLoader pageable(shard, cfg, *dev_);
  const int n = 2 * static_cast<int>(reference->batches_per_epoch()) + 1;
  const auto want = take(*reference, n);
  EXPECT_EQ(take(workers, n), want);
  EXPECT_EQ(take(pageable, n), want);
  workers.seek({1, 2});
  reference->seek({1, 2});
  EXPECT_EQ(take(workers, 3), take(*reference, 3));
  cfg.num_workers = 0;
  EXPECT_THROW(DataLoader(shard, cfg, *dev_), Error);
}

}  // namespace
}  // namespace anvil::data
