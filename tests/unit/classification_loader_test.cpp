// The classification loader: every example once per epoch in a seeded, per-epoch shuffle; padded batches
// (ids then pad id, real lengths, labels; the length a multiple of 8 capped at max_length); the same batches
// for any worker count and pinned or pageable staging; seek / position for resume; the final partial batch
// kept or dropped; errors for data that cannot be batched.
#include "data/classification_loader.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "test_util.hpp"

namespace anvil::data {
namespace {

using test::expect_error;

// A batch copied out of the loader's staging buffers.
struct Batch {
  std::vector<int32_t> ids, lengths, labels;
  int rows = 0, length = 0;
  LoaderPosition pos;
  bool operator==(const Batch& o) const {
    return ids == o.ids && lengths == o.lengths && labels == o.labels && rows == o.rows &&
           length == o.length && pos == o.pos;
  }
};

Batch copy(const ClassificationHostBatch& b) {
  Batch out;
  out.rows = b.batch_size, out.length = b.length, out.pos = b.pos;
  out.ids.assign(b.ids, b.ids + size_t(b.batch_size) * size_t(b.length));
  out.lengths.assign(b.lengths, b.lengths + b.batch_size);
  out.labels.assign(b.labels, b.labels + b.batch_size);
  return out;
}

class ClassificationLoaderTest : public ::testing::Test {
 protected:
  // 37 examples; example i has 1 + (i * 7) % 19 tokens, ids 10 * i + k (identifies the example and the
  // position), label i % 3.
  void SetUp() override {
    std::vector<std::vector<uint32_t>> examples;
    std::vector<int32_t> labels;
    for (uint32_t i = 0; i < kExamples; ++i) {
      std::vector<uint32_t> ids;
      for (uint32_t k = 0; k < 1 + (i * 7) % 19; ++k) ids.push_back(10 * i + k);
      examples.push_back(ids);
      labels.push_back(int32_t(i % 3));
    }
    write_classification_shard(dir_ / "s.cls", 1000, 24, {"a", "b", "c"}, examples, labels);
    shard_ = std::make_shared<ClassificationShard>(dir_ / "s.cls");
  }
  ClassificationLoaderConfig config(int batch, bool shuffle = true, bool drop_last = true) const {
    ClassificationLoaderConfig c;
    c.batch_size = batch, c.max_length = 24, c.seed = 11, c.shuffle = shuffle, c.drop_last = drop_last;
    c.pad_id = 999;
    return c;
  }
  std::vector<Batch> take(ClassificationLoader& l, int n) const {
    std::vector<Batch> out;
    for (int i = 0; i < n; ++i) out.push_back(copy(l.next()));
    return out;
  }
  // The example a row holds, from its first id.
  static int example_of(const Batch& b, int row) { return b.ids[size_t(row) * size_t(b.length)] / 10; }

  static constexpr uint32_t kExamples = 37;
  test::TempDir dir_;
  std::shared_ptr<ClassificationShard> shard_;
  std::unique_ptr<Device> dev_ = make_cpu_device();
};

TEST_F(ClassificationLoaderTest, RowsArePaddedExamplesWithLengthsAndLabels) {
  ClassificationLoader l(shard_, config(5), *dev_);
  EXPECT_EQ(l.batches_per_epoch(), kExamples / 5);
  for (const Batch& b : take(l, 10)) {
    ASSERT_EQ(b.rows, 5);
    int longest = 0;
    for (int r = 0; r < b.rows; ++r) {
      const int e = example_of(b, r);
      const int n = 1 + (e * 7) % 19;
      longest = std::max(longest, n);
      EXPECT_EQ(b.lengths[size_t(r)], n);
      EXPECT_EQ(b.labels[size_t(r)], e % 3);
      for (int k = 0; k < b.length; ++k)
        EXPECT_EQ(b.ids[size_t(r) * size_t(b.length) + size_t(k)], k < n ? 10 * e + k : 999) << r << " " << k;
    }
    // The longest row rounded up to a multiple of 8, at most max_length (24).
    EXPECT_EQ(b.length, std::min(24, (longest + 7) / 8 * 8));
  }
}

TEST_F(ClassificationLoaderTest, EachEpochVisitsEveryExampleOnceInItsOwnOrder) {
  ClassificationLoader l(shard_, config(4, true, false), *dev_);
  const uint64_t per_epoch = (kExamples + 3) / 4;
  ASSERT_EQ(l.batches_per_epoch(), per_epoch);
  std::vector<std::vector<int>> orders(3);
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (uint64_t i = 0; i < per_epoch; ++i) {
      const Batch b = copy(l.next());
      EXPECT_EQ(b.pos, (LoaderPosition{uint64_t(epoch), i}));
      EXPECT_EQ(b.rows, i + 1 < per_epoch ? 4 : int(kExamples % 4));  // the partial last batch is kept
      for (int r = 0; r < b.rows; ++r) orders[size_t(epoch)].push_back(example_of(b, r));
    }
    std::vector<int> sorted = orders[size_t(epoch)];
    std::sort(sorted.begin(), sorted.end());
    for (int i = 0; i < int(kExamples); ++i) ASSERT_EQ(sorted[size_t(i)], i) << "epoch " << epoch;
  }
  EXPECT_NE(orders[0], orders[1]);
  EXPECT_NE(orders[1], orders[2]);
  // The same seed gives the same order.
  ClassificationLoader again(shard_, config(4, true, false), *dev_);
  std::vector<int> first;
  for (uint64_t i = 0; i < per_epoch; ++i) {
    const Batch b = copy(again.next());
    for (int r = 0; r < b.rows; ++r) first.push_back(example_of(b, r));
  }
  EXPECT_EQ(first, orders[0]);
}

TEST_F(ClassificationLoaderTest, WithoutShuffleExamplesComeInOrder) {
  ClassificationLoader l(shard_, config(8, false, false), *dev_);
  int next = 0;
  for (uint64_t i = 0; i < l.batches_per_epoch(); ++i) {
    const Batch b = copy(l.next());
    for (int r = 0; r < b.rows; ++r) EXPECT_EQ(example_of(b, r), next++);
  }
  EXPECT_EQ(next, int(kExamples));
}

TEST_F(ClassificationLoaderTest, WorkersAndStagingDoNotChangeBatches) {
  ClassificationLoader one(shard_, config(6), *dev_);
  const std::vector<Batch> want = take(one, 14);  // more than two epochs
  for (int workers : {2, 3, 7}) {
    for (bool pin : {true, false}) {
      ClassificationLoaderConfig c = config(6);
      c.num_workers = workers, c.pin_memory = pin, c.prefetch = 2;
      ClassificationLoader l(shard_, c, *dev_);
      EXPECT_EQ(take(l, 14), want) << workers << " workers, pin " << pin;
    }
  }
}

TEST_F(ClassificationLoaderTest, SeekReproducesTheRunFromAPosition) {
  ClassificationLoader l(shard_, config(5), *dev_);
  const std::vector<Batch> run = take(l, 12);
  EXPECT_EQ(l.position(), (LoaderPosition{1, 5}));  // 7 batches per epoch
  ClassificationLoader resumed(shard_, config(5), *dev_);
  resumed.seek({1, 2});
  EXPECT_EQ(resumed.position(), (LoaderPosition{1, 2}));
  const std::vector<Batch> rest = take(resumed, 3);
  EXPECT_EQ(rest, std::vector<Batch>(run.begin() + 9, run.end()));
  // Seeking back to the start (what evaluation does) restarts the epoch.
  resumed.seek({});
  EXPECT_EQ(copy(resumed.next()), run[0]);
  expect_error([&] { resumed.seek({0, 7}); }, {"cannot seek", "7 batches"});
}

TEST_F(ClassificationLoaderTest, ErrorsNameTheShard) {
  ClassificationLoaderConfig c = config(4);
  c.max_length = 16;  // example 2 has 15 tokens, example 5 has 17
  expect_error([&] { ClassificationLoader l(shard_, c, *dev_); },
               {"s.cls", "example 5 has 17 tokens", "sequence length 16", "--max_length 16"});
  expect_error([&] { ClassificationLoader l(shard_, config(38), *dev_); },
               {"s.cls", "37 examples", "batch_size = 38"});
  // Without drop_last one partial batch holds them all.
  ClassificationLoader all(shard_, config(38, true, false), *dev_);
  EXPECT_EQ(all.batches_per_epoch(), 1u);
  EXPECT_EQ(copy(all.next()).rows, int(kExamples));
  EXPECT_EQ(ClassificationLoader::longest_example(*shard_), 19u);
}

}  // namespace
}  // namespace anvil::data
