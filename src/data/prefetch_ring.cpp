#include "data/prefetch_ring.hpp"

#include <chrono>
#include <utility>

namespace anvil::data {

PrefetchRing::PrefetchRing(int prefetch, int num_workers, uint64_t batches_per_epoch, Prepare prepare,
                           FillRows fill_rows)
    : batches_per_epoch_(batches_per_epoch),
      num_workers_(num_workers),
      prepare_(std::move(prepare)),
      fill_rows_(std::move(fill_rows)),
      positions_(slots(prefetch)) {
  for (int k = 1; k < num_workers_; ++k) workers_.emplace_back(&PrefetchRing::worker_loop, this, k);
  thread_ = std::thread(&PrefetchRing::producer_loop, this);
}

PrefetchRing::~PrefetchRing() {
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

LoaderPosition PrefetchRing::advance(LoaderPosition p) const {
  if (++p.batch == batches_per_epoch_) {
    ++p.epoch;
    p.batch = 0;
  }
  return p;
}

void PrefetchRing::fill(size_t slot, LoaderPosition pos) {
  const uint64_t rows = prepare_(slot, pos);
  const auto W = static_cast<uint64_t>(num_workers_);
  const bool helpers = W > 1 && rows > 1;
  if (helpers) {  // hand rows [rows/W, rows) to the helpers, fill the first share here, then wait for them
    {
      std::lock_guard lock(work_mutex_);
      work_slot_ = slot, work_pos_ = pos, work_rows_ = rows;
      work_pending_ = num_workers_ - 1, work_error_ = nullptr;
      ++work_round_;
    }
    work_cv_.notify_all();
  }
  std::exception_ptr error;
  try {
    fill_rows_(slot, pos, 0, helpers ? rows / W : rows);
  } catch (...) {
    error = std::current_exception();
  }
  if (helpers) {
    std::unique_lock lock(work_mutex_);
    done_cv_.wait(lock, [&] { return work_pending_ == 0; });
    if (!error) error = work_error_;
  }
  if (error) std::rethrow_exception(error);
}

void PrefetchRing::worker_loop(int k) {
  const auto W = static_cast<uint64_t>(num_workers_);
  uint64_t seen = 0;
  std::unique_lock lock(work_mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return work_stop_ || work_round_ != seen; });
    if (work_stop_) return;
    seen = work_round_;
    const size_t slot = work_slot_;
    const LoaderPosition pos = work_pos_;
    const uint64_t rows = work_rows_;
    lock.unlock();
    std::exception_ptr error;
    try {
      fill_rows_(slot, pos, rows * uint64_t(k) / W, rows * uint64_t(k + 1) / W);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !work_error_) work_error_ = error;
    if (--work_pending_ == 0) done_cv_.notify_one();
  }
}

void PrefetchRing::producer_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    producer_cv_.wait(lock, [&] { return stop_ || (!error_ && produced_ < released_ + positions_.size()); });
    if (stop_) return;
    const uint64_t generation = generation_, sequence = produced_;
    const LoaderPosition pos = produce_pos_;
    const size_t slot = sequence % positions_.size();
    lock.unlock();
    // The slot for `sequence` is neither held by the caller nor published, so it is written unlocked.
    std::exception_ptr error;
    try {
      fill(slot, pos);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (generation != generation_) continue;  // a seek() happened meanwhile: drop this batch
    if (error) {
      error_ = error;  // production stops until a seek() clears it
    } else {
      positions_[slot] = pos;
      ++produced_;
      produce_pos_ = advance(pos);
    }
    consumer_cv_.notify_one();
  }
}

size_t PrefetchRing::next() {
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
  const size_t slot = consumed_++ % positions_.size();
  consumer_pos_ = advance(positions_[slot]);
  return slot;
}

LoaderPosition PrefetchRing::position() const {
  std::lock_guard lock(mutex_);
  return consumer_pos_;
}

void PrefetchRing::seek(LoaderPosition p) {
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

double PrefetchRing::wait_seconds() const {
  std::lock_guard lock(mutex_);
  return wait_seconds_;
}

}  // namespace anvil::data
