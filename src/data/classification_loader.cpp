#include "data/classification_loader.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <utility>

#include "anvil/error.hpp"
#include "anvil/rng.hpp"

namespace anvil::data {
namespace {

// Checked before any member that depends on the config is built.
ClassificationLoaderConfig validated(const std::shared_ptr<const ClassificationShard>& shard,
                                     const ClassificationLoaderConfig& cfg) {
  ANVIL_REQUIRE(shard != nullptr, "classification loader: no shard given");
  const std::string& path = shard->path();
  ANVIL_REQUIRE(cfg.batch_size >= 1, "classification loader for '{}': batch_size {} must be >= 1", path,
                cfg.batch_size);
  ANVIL_REQUIRE(cfg.max_length >= 1, "classification loader for '{}': max_length {} must be >= 1", path,
                cfg.max_length);
  ANVIL_REQUIRE(cfg.pad_multiple >= 1, "classification loader for '{}': pad_multiple must be >= 1", path);
  ANVIL_REQUIRE(cfg.pad_id >= 0, "classification loader for '{}': pad id {} must be >= 0", path, cfg.pad_id);
  ANVIL_REQUIRE(cfg.prefetch >= 1, "classification loader for '{}': prefetch {} must be >= 1", path,
                cfg.prefetch);
  ANVIL_REQUIRE(cfg.num_workers >= 1 && cfg.num_workers <= 256,
                "classification loader for '{}': num_workers {} must be between 1 and 256", path,
                cfg.num_workers);
  ANVIL_REQUIRE(shard->size() > 0, "classification shard '{}' has no examples", path);
  ANVIL_REQUIRE(!cfg.drop_last || shard->size() >= uint64_t(cfg.batch_size),
                "classification shard '{}' has {} examples; one batch needs batch_size = {}", path,
                shard->size(), cfg.batch_size);
  // Cutting an example would silently change what the model is trained or evaluated on (and, for [CLS] text
  // [SEP] examples, drop the [SEP]); the data must be prepared for the length instead.
  for (uint64_t i = 0; i < shard->size(); ++i)
    ANVIL_REQUIRE(
        shard->length(i) <= uint32_t(cfg.max_length),
        "classification shard '{}': example {} has {} tokens, more than the sequence length {} (prepare "
        "the data with `anvil prepare-data --max_length {}`, or raise max_seq_length up to the model's "
        "block_size)",
        path, i, shard->length(i), cfg.max_length, cfg.max_length);
  return cfg;
}

size_t slot_ints(const ClassificationLoaderConfig& cfg) {
  return size_t(cfg.batch_size) * size_t(cfg.max_length) + 2 * size_t(cfg.batch_size);
}

// The caller may hold the two most recent batches (see next()), so the ring has two slots more than the
// number of batches prepared ahead.
size_t ring_slots(const ClassificationLoaderConfig& cfg) {
  return size_t(cfg.prefetch) + 2;
}

}  // namespace

uint32_t ClassificationLoader::longest_example(const ClassificationShard& shard) {
  uint32_t longest = 0;
  for (uint64_t i = 0; i < shard.size(); ++i) longest = std::max(longest, shard.length(i));
  return longest;
}

ClassificationLoader::ClassificationLoader(std::shared_ptr<const ClassificationShard> shard,
                                           ClassificationLoaderConfig cfg, Device& dev)
    : shard_(std::move(shard)),
      cfg_(validated(shard_, cfg)),
      batches_per_epoch_(cfg_.drop_last
                             ? shard_->size() / uint64_t(cfg_.batch_size)
                             : (shard_->size() + uint64_t(cfg_.batch_size) - 1) / uint64_t(cfg_.batch_size)),
      pinned_staging_(cfg_.pin_memory
                          ? PinnedBuffer(dev, ring_slots(cfg_) * slot_ints(cfg_) * sizeof(int32_t))
                          : PinnedBuffer()),
      pageable_staging_(cfg_.pin_memory ? 0 : ring_slots(cfg_) * slot_ints(cfg_)) {
  auto* base = cfg_.pin_memory ? static_cast<int32_t*>(pinned_staging_.get()) : pageable_staging_.data();
  const size_t B = size_t(cfg_.batch_size);
  slots_.resize(ring_slots(cfg_));
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    s.ids = base + i * slot_ints(cfg_);
    s.lengths = s.ids + B * size_t(cfg_.max_length);
    s.labels = s.lengths + B;
    s.batch = ClassificationHostBatch{s.ids, s.lengths, s.labels, 0, 0, LoaderPosition{}};
  }
  if (cfg_.shuffle) permutation_.resize(shard_->size());
  for (int k = 1; k < cfg_.num_workers; ++k)
    workers_.emplace_back(&ClassificationLoader::worker_loop, this, k);
  thread_ = std::thread(&ClassificationLoader::producer_loop, this);
}

ClassificationLoader::~ClassificationLoader() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  producer_cv_.notify_all();
  thread_.join();
  {
    std::lock_guard lock(work_mutex_);
    work_stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& w : workers_) w.join();
}

LoaderPosition ClassificationLoader::advance(LoaderPosition p) const {
  if (++p.batch == batches_per_epoch_) {
    ++p.epoch;
    p.batch = 0;
  }
  return p;
}

void ClassificationLoader::ensure_permutation(uint64_t epoch) {
  if (permutation_epoch_ == epoch) return;
  // From the identity each time, so the order depends on the epoch alone, not on history.
  std::iota(permutation_.begin(), permutation_.end(), uint64_t{0});
  Rng rng(shuffle_seed(cfg_.seed, epoch));
  for (uint64_t i = permutation_.size(); i > 1; --i)
    std::swap(permutation_[i - 1], permutation_[rng.below(i)]);
  permutation_epoch_ = epoch;
}

void ClassificationLoader::fill_rows(Slot& slot, uint64_t first, uint64_t row_begin, uint64_t row_end) const {
  const uint64_t L = uint64_t(slot.batch.length);
  for (uint64_t row = row_begin; row < row_end; ++row) {
    const uint64_t example = example_at(first + row);
    const uint32_t n = shard_->length(example);
    int32_t* ids = slot.ids + row * L;
    shard_->read(example, ids);
    std::fill(ids + n, ids + L, cfg_.pad_id);
    slot.lengths[row] = int32_t(n);
    slot.labels[row] = shard_->label(example);
  }
}

void ClassificationLoader::fill(Slot& slot, LoaderPosition pos) {
  if (cfg_.shuffle) ensure_permutation(pos.epoch);
  const uint64_t B = uint64_t(cfg_.batch_size);
  const uint64_t first = pos.batch * B;
  const uint64_t rows = std::min(B, shard_->size() - first);
  // The batch's length: its longest example (at least 1 token), rounded up to the pad multiple, capped at
  // max_length (which no example exceeds). Decided before the rows are split among the workers.
  uint64_t longest = 1;
  for (uint64_t r = 0; r < rows; ++r)
    longest = std::max<uint64_t>(longest, shard_->length(example_at(first + r)));
  const uint64_t m = cfg_.pad_multiple;
  slot.batch.length = int(std::min<uint64_t>((longest + m - 1) / m * m, uint64_t(cfg_.max_length)));
  slot.batch.batch_size = int(rows);

  const uint64_t W = std::min<uint64_t>(uint64_t(cfg_.num_workers), rows);
  if (W > 1) {  // helpers take rows [rows*k/W, rows*(k+1)/W) for k >= 1; the first share is assembled here
    {
      std::lock_guard lock(work_mutex_);
      work_slot_ = &slot, work_first_ = first, work_rows_ = rows;
      work_pending_ = cfg_.num_workers - 1, work_error_ = nullptr;
      ++work_round_;
    }
    work_cv_.notify_all();
  }
  std::exception_ptr error;
  try {
    fill_rows(slot, first, 0, W > 1 ? rows / uint64_t(cfg_.num_workers) : rows);
  } catch (...) {
    error = std::current_exception();
  }
  if (W > 1) {
    std::unique_lock lock(work_mutex_);
    done_cv_.wait(lock, [&] { return work_pending_ == 0; });
    if (!error) error = work_error_;
  }
  if (error) std::rethrow_exception(error);
  slot.batch.pos = pos;
}

void ClassificationLoader::worker_loop(int k) {
  const uint64_t W = uint64_t(cfg_.num_workers);
  uint64_t seen = 0;
  std::unique_lock lock(work_mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return work_stop_ || work_round_ != seen; });
    if (work_stop_) return;
    seen = work_round_;
    Slot* slot = work_slot_;
    const uint64_t first = work_first_, rows = work_rows_;
    lock.unlock();
    std::exception_ptr error;
    try {
      fill_rows(*slot, first, rows * uint64_t(k) / W, rows * uint64_t(k + 1) / W);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !work_error_) work_error_ = error;
    if (--work_pending_ == 0) done_cv_.notify_one();
  }
}

void ClassificationLoader::producer_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    producer_cv_.wait(lock, [&] { return stop_ || (!error_ && produced_ < released_ + slots_.size()); });
    if (stop_) return;
    const uint64_t generation = generation_, sequence = produced_;
    const LoaderPosition pos = produce_pos_;
    lock.unlock();
    // The slot for `sequence` is neither held by the caller nor published, so it is written unlocked.
    std::exception_ptr error;
    try {
      fill(slot_for(sequence), pos);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (generation != generation_) continue;  // a seek() happened meanwhile: drop this batch
    if (error) {
      error_ = error;  // production stops until a seek() clears it
    } else {
      ++produced_;
      produce_pos_ = advance(pos);
    }
    consumer_cv_.notify_one();
  }
}

const ClassificationHostBatch& ClassificationLoader::next() {
  std::unique_lock lock(mutex_);
  // The batch returned two calls ago is now free for reuse (see the contract in the header).
  if (consumed_ >= 1) {
    released_ = consumed_ - 1;
    producer_cv_.notify_one();
  }
  if (produced_ == consumed_ && !error_) {
    const auto start = std::chrono::steady_clock::now();
    consumer_cv_.wait(lock, [&] { return produced_ > consumed_ || error_; });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  if (produced_ == consumed_) std::rethrow_exception(error_);
  const Slot& slot = slot_for(consumed_++);
  consumer_pos_ = advance(slot.batch.pos);
  return slot.batch;
}

LoaderPosition ClassificationLoader::position() const {
  std::lock_guard lock(mutex_);
  return consumer_pos_;
}

void ClassificationLoader::seek(LoaderPosition p) {
  ANVIL_REQUIRE(p.batch < batches_per_epoch_,
                "classification loader for '{}': cannot seek to epoch {} batch {}: an epoch has {} batches",
                shard_->path(), p.epoch, p.batch, batches_per_epoch_);
  {
    std::lock_guard lock(mutex_);
    ++generation_;
    produced_ = consumed_;  // drop prefetched batches; slots the caller holds stay untouched
    produce_pos_ = p;
    consumer_pos_ = p;
    error_ = nullptr;
  }
  producer_cv_.notify_one();
}

double ClassificationLoader::wait_seconds() const {
  std::lock_guard lock(mutex_);
  return wait_seconds_;
}

}  // namespace anvil::data
