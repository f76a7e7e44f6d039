#include "data/loader.hpp"

#include <chrono>
#include <numeric>
#include <utility>

#include "anvil/error.hpp"
#include "anvil/rng.hpp"

namespace anvil::data {
namespace {

// splitmix64's finaliser: a bijection that spreads every input bit over the output.
uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Each epoch's shuffle gets its own stream. Mixing the epoch before adding keeps the streams of
// (seed, e) and (seed + 1, e - 1) or similar neighbours unrelated.
uint64_t epoch_seed(uint64_t seed, uint64_t epoch) {
  return mix64(seed + mix64(epoch + 0x5DA7A10ADE5ull));
}

}  // namespace

uint64_t shuffle_seed(uint64_t seed, uint64_t epoch) {
  return epoch_seed(seed, epoch);
}

namespace {

uint64_t count_windows(const TokenShard& shard, int seq_len) {
  return shard.size() < 2 ? 0 : (shard.size() - 1) / static_cast<uint64_t>(seq_len);
}

// Checked before any member that depends on the config is built.
LoaderConfig validated(const std::shared_ptr<const TokenShard>& shard, const LoaderConfig& cfg) {
  ANVIL_REQUIRE(shard != nullptr, "data loader: no token shard given");
  ANVIL_REQUIRE(cfg.batch_size >= 1, "data loader for '{}': batch_size {} must be >= 1", shard->path(),
                cfg.batch_size);
  ANVIL_REQUIRE(cfg.seq_len >= 1, "data loader for '{}': seq_len {} must be >= 1", shard->path(),
                cfg.seq_len);
  ANVIL_REQUIRE(cfg.prefetch >= 1, "data loader for '{}': prefetch {} must be >= 1", shard->path(),
                cfg.prefetch);
  ANVIL_REQUIRE(cfg.num_workers >= 1 && cfg.num_workers <= 256,
                "data loader for '{}': num_workers {} must be between 1 and 256", shard->path(),
                cfg.num_workers);
  const uint64_t windows = count_windows(*shard, cfg.seq_len);
  ANVIL_REQUIRE(
      windows >= static_cast<uint64_t>(cfg.batch_size),
      "data loader: token shard '{}' has {} tokens, which make {} windows of seq_len + 1 = {} tokens; "
      "one batch needs batch_size = {} windows ({} tokens at least)",
      shard->path(), shard->size(), windows, cfg.seq_len + 1, cfg.batch_size,
      static_cast<uint64_t>(cfg.batch_size) * static_cast<uint64_t>(cfg.seq_len) + 1);
  return cfg;
}

size_t tokens_per_batch(const LoaderConfig& cfg) {
  return static_cast<size_t>(cfg.batch_size) * static_cast<size_t>(cfg.seq_len);
}

// The caller may hold the two most recent batches (see next()), so the ring has two slots more than
// the number of batches prepared ahead.
size_t ring_slots(const LoaderConfig& cfg) {
  return static_cast<size_t>(cfg.prefetch) + 2;
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const TokenShard> shard, LoaderConfig cfg, Device& dev)
    : shard_(std::move(shard)),
      cfg_(validated(shard_, cfg)),
      num_windows_(count_windows(*shard_, cfg_.seq_len)),
      batches_per_epoch_(num_windows_ / static_cast<uint64_t>(cfg_.batch_size)),
      pinned_staging_(cfg_.pin_memory
                          ? PinnedBuffer(dev, ring_slots(cfg_) * 2 * tokens_per_batch(cfg_) * sizeof(int32_t))
                          : PinnedBuffer()),
      pageable_staging_(cfg_.pin_memory ? 0 : ring_slots(cfg_) * 2 * tokens_per_batch(cfg_)) {
  const size_t batch_tokens = tokens_per_batch(cfg_);
  auto* base = cfg_.pin_memory ? static_cast<int32_t*>(pinned_staging_.get()) : pageable_staging_.data();
  slots_.resize(ring_slots(cfg_));
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = slots_[i];
    slot.inputs = base + (2 * i) * batch_tokens;
    slot.targets = base + (2 * i + 1) * batch_tokens;
    slot.batch = HostBatch{slot.inputs, slot.targets, cfg_.batch_size, cfg_.seq_len, LoaderPosition{}};
  }
  if (cfg_.shuffle) permutation_.resize(num_windows_);
  for (int k = 1; k < cfg_.num_workers; ++k) workers_.emplace_back(&DataLoader::worker_loop, this, k);
  thread_ = std::thread(&DataLoader::producer_loop, this);
}

DataLoader::~DataLoader() {
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

LoaderPosition DataLoader::advance(LoaderPosition p) const {
  if (++p.batch == batches_per_epoch_) {
    ++p.epoch;
    p.batch = 0;
  }
  return p;
}

void DataLoader::ensure_permutation(uint64_t epoch) {
  if (permutation_epoch_ == epoch) return;
  // Always start from the identity so the order depends on the epoch alone, not on history.
  std::iota(permutation_.begin(), permutation_.end(), uint64_t{0});
  Rng rng(epoch_seed(cfg_.seed, epoch));
  for (uint64_t i = num_windows_; i > 1; --i) std::swap(permutation_[i - 1], permutation_[rng.below(i)]);
  permutation_epoch_ = epoch;
}

void DataLoader::fill_rows(Slot& slot, LoaderPosition pos, uint64_t row_begin, uint64_t row_end) const {
  const auto seq_len = static_cast<uint64_t>(cfg_.seq_len);
  const auto batch_size = static_cast<uint64_t>(cfg_.batch_size);
  for (uint64_t row = row_begin; row < row_end; ++row) {
    const uint64_t index = pos.batch * batch_size + row;
    const uint64_t window = cfg_.shuffle ? permutation_[index] : index;
    shard_->read(window * seq_len, seq_len, slot.inputs + row * seq_len);
    shard_->read(window * seq_len + 1, seq_len, slot.targets + row * seq_len);
  }
}

void DataLoader::fill(Slot& slot, LoaderPosition pos) {
  if (cfg_.shuffle) ensure_permutation(pos.epoch);
  const auto B = static_cast<uint64_t>(cfg_.batch_size);
  const auto W = static_cast<uint64_t>(cfg_.num_workers);
  if (W > 1) {  // hand rows [B/W, B) to the helpers, assemble the first share here, then wait for them
    {
      std::lock_guard lock(work_mutex_);
      work_slot_ = &slot, work_pos_ = pos, work_pending_ = int(W) - 1, work_error_ = nullptr;
      ++work_round_;
    }
    work_cv_.notify_all();
  }
  std::exception_ptr error;
  try {
    fill_rows(slot, pos, 0, B / W);
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

void DataLoader::worker_loop(int k) {
  const auto B = static_cast<uint64_t>(cfg_.batch_size);
  const auto W = static_cast<uint64_t>(cfg_.num_workers);
  uint64_t seen = 0;
  std::unique_lock lock(work_mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return work_stop_ || work_round_ != seen; });
    if (work_stop_) return;
    seen = work_round_;
    Slot* slot = work_slot_;
    const LoaderPosition pos = work_pos_;
    lock.unlock();
    std::exception_ptr error;
    try {
      fill_rows(*slot, pos, B * k / W, B * (k + 1) / W);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !work_error_) work_error_ = error;
    if (--work_pending_ == 0) done_cv_.notify_one();
  }
}

void DataLoader::producer_loop() {
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

const HostBatch& DataLoader::next() {
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

LoaderPosition DataLoader::position() const {
  std::lock_guard lock(mutex_);
  return consumer_pos_;
}

void DataLoader::seek(LoaderPosition p) {
  ANVIL_REQUIRE(p.batch < batches_per_epoch_,
                "data loader for '{}': cannot seek to epoch {} batch {}: an epoch has {} batches",
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

double DataLoader::wait_seconds() const {
  std::lock_guard lock(mutex_);
  return wait_seconds_;
}

}  // namespace anvil::data
