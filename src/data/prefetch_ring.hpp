// The prefetch machinery shared by the data loaders (DataLoader in loader.hpp, ClassificationLoader in
// classification_loader.hpp), so the threading protocol lives in one place: a producer thread assembles
// batches ahead of the consumer into a ring of slots, helper threads fill a batch's rows in parallel, and
// the consumer takes them in order. The owner keeps the slots' buffers and says how to fill a slot (two
// callbacks); the ring only hands out slot indices.
//
// Contract. next() blocks until the batch at position() is ready and returns its slot; that slot stays
// valid and unchanged until next() has been called twice more (the ring has prefetch + 2 slots), so the
// caller may copy batch k to the device asynchronously while it asks for batch k+1. An exception raised
// while a batch was being assembled is rethrown by the next() that would have returned it, and production
// stops until a seek(). seek(p) drops every prefetched batch (a generation counter discards one being
// assembled meanwhile) and restarts production at p; slots already returned stay valid as for next().
// Sequence numbers count batches handed out since construction and keep counting across seeks, so a slot
// the caller still holds is never reused. Which rows a thread fills never changes what a batch holds: that
// is up to the callbacks, a function of the position alone (so seeking to a saved position reproduces a
// run exactly).
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace anvil::data {

// Identifies a batch: the batch index within an epoch. Saved in checkpoints for resume.
struct LoaderPosition {
  uint64_t epoch = 0;
  uint64_t batch = 0;
  bool operator==(const LoaderPosition&) const = default;
};

class PrefetchRing {
 public:
  // Producer thread, before the batch's rows are split among threads: readies slot `slot` for the batch at
  // `pos` (the epoch's order, the batch's shape and position) and returns how many rows the batch has.
  using Prepare = std::function<uint64_t(size_t slot, LoaderPosition pos)>;
  // Producer and helper threads concurrently, on disjoint rows: fills rows [row_begin, row_end) of the
  // batch at `pos` in slot `slot`.
  using FillRows = std::function<void(size_t slot, LoaderPosition pos, uint64_t row_begin, uint64_t row_end)>;

  // The number of slots for `prefetch` batches assembled ahead: the caller may hold the two most recent
  // batches (see next()), so two more.
  static size_t slots(int prefetch) { return static_cast<size_t>(prefetch) + 2; }

  // Starts the producer and num_workers - 1 helper threads at once, so everything the callbacks use must be
  // ready: an owner declares its ring as its last member. Production starts at {0, 0}.
  PrefetchRing(int prefetch, int num_workers, uint64_t batches_per_epoch, Prepare prepare,
               FillRows fill_rows);
  ~PrefetchRing();  // stops and joins the threads
  PrefetchRing(const PrefetchRing&) = delete;
  PrefetchRing& operator=(const PrefetchRing&) = delete;

  size_t next();                    // the slot of the batch at position() (see the contract above)
  LoaderPosition position() const;  // the position of the batch the next call of next() returns
  void seek(LoaderPosition p);      // p.batch must be < batches_per_epoch (the owner checks it)
  double wait_seconds() const;      // total time next() spent blocked waiting for the producer

 private:
  void producer_loop();
  void fill(size_t slot, LoaderPosition pos);  // producer thread: prepare, then rows split among helpers
  void worker_loop(int k);
  LoaderPosition advance(LoaderPosition p) const;

  const uint64_t batches_per_epoch_;
  const int num_workers_;
  const Prepare prepare_;
  const FillRows fill_rows_;

  // Everything below is guarded by mutex_.
  mutable std::mutex mutex_;
  std::condition_variable producer_cv_, consumer_cv_;
  std::vector<LoaderPosition> positions_;  // the position of the batch last published in each slot
  uint64_t produced_ = 0;                  // batches [consumed_, produced_) are ready
  uint64_t consumed_ = 0;                  // batches returned by next()
  uint64_t released_ = 0;                  // batches whose slots the caller has given up (may be overwritten)
  uint64_t generation_ = 0;      // bumped by seek(): a batch assembled for an older generation is dropped
  LoaderPosition produce_pos_;   // position of batch sequence produced_
  LoaderPosition consumer_pos_;  // position of batch sequence consumed_
  std::exception_ptr error_;     // raised while assembling batch sequence produced_
  bool stop_ = false;
  double wait_seconds_ = 0.0;

  // Helpers of the producer for num_workers > 1: for a batch of n > 1 rows, helper k fills rows
  // [k*n/W, (k+1)*n/W) (the producer fills the first share), then the producer joins them at a barrier.
  std::mutex work_mutex_;
  std::condition_variable work_cv_, done_cv_;
  size_t work_slot_ = 0;
  LoaderPosition work_pos_;
  uint64_t work_rows_ = 0;
  uint64_t work_round_ = 0;
  int work_pending_ = 0;
  bool work_stop_ = false;
  std::exception_ptr work_error_;
  std::vector<std::thread> workers_;

  std::thread thread_;  // last member: started once everything above is initialised
};

}  // namespace anvil::data
