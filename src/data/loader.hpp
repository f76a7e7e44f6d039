// The training data loader: cuts a token shard into fixed-length windows, groups them into
// (optionally shuffled) batches, and assembles batches ahead of time on a background thread into
// pinned host buffers ready for an asynchronous copy to the device.
//
// Windows: window w covers tokens [w*T, w*T + T + 1); its inputs are the first T of them and its
// targets the last T (next-token prediction). num_windows = (size - 1) / T; an epoch has
// num_windows / (B x ranks) batches (the last partial batch is dropped; see LoaderConfig::ranks). Epoch e
// takes windows in a Fisher-Yates permutation drawn from an Rng seeded by (seed, e), or in order without
// shuffling. What a batch contains is a pure function of (shard, batch_size, seq_len, seed, shuffle,
// position), so seeking to a saved position reproduces a run exactly.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "data/prefetch_ring.hpp"
#include "data/token_shard.hpp"
#include "runtime/device.hpp"

namespace anvil::data {

struct LoaderConfig {
  int batch_size = 0;
  int seq_len = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  int prefetch = 4;        // batches assembled ahead of the consumer
  int num_workers = 1;     // threads assembling a batch (its rows are split among them)
  bool pin_memory = true;  // stage batches in page-locked memory (fast, truly async device copies)
  // Data parallelism: the global batch is `ranks` x batch_size windows and this loader's batches are rank
  // `rank`'s rows of it, [rank x batch_size, (rank + 1) x batch_size). Positions and batches_per_epoch()
  // count global batches, so every rank is at the same position and a checkpoint's position means the
  // same windows to every world size with the same global batch.
  int ranks = 1;
  int rank = 0;
};

// The seed of epoch `epoch`'s shuffle for a run seeded with `seed` (shared by the classification loader, so
// both kinds of data are shuffled the same way).
uint64_t shuffle_seed(uint64_t seed, uint64_t epoch);

struct HostBatch {
  const int32_t* inputs;   // [batch_size, seq_len], row-major, pinned host memory
  const int32_t* targets;  // [batch_size, seq_len]: inputs shifted by one token
  int batch_size;
  int seq_len;
  LoaderPosition pos;  // the position this batch was produced for
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const TokenShard> shard, LoaderConfig cfg, Device& dev);
  ~DataLoader() = default;  // stops and joins the prefetch thread (ring_)
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Blocks until the batch at position() is ready and returns it. The returned batch (struct and
  // buffers) stays valid and unchanged until next() has been called twice more, so the caller may
  // copy batch k to the device asynchronously while it asks for batch k+1. Rethrows an exception
  // raised while the batch was being assembled.
  const HostBatch& next() { return slots_[ring_.next()].batch; }
  // The position of the batch the next call of next() returns.
  LoaderPosition position() const { return ring_.position(); }
  // Discards prefetched batches and restarts production at p (for resume). Batches already returned
  // stay valid as documented for next(). Throws anvil::Error if p.batch >= batches_per_epoch().
  void seek(LoaderPosition p);

  uint64_t batches_per_epoch() const { return batches_per_epoch_; }
  uint64_t num_windows() const { return num_windows_; }
  // Total time next() spent blocked waiting for the prefetch thread.
  double wait_seconds() const { return ring_.wait_seconds(); }

 private:
  struct Slot {
    HostBatch batch;
    int32_t* inputs;
    int32_t* targets;
  };

  std::vector<Slot> make_slots();
  uint64_t prepare(Slot& slot, LoaderPosition pos);  // producer thread: readies the batch, returns its rows
  void ensure_permutation(uint64_t epoch);           // producer thread only
  void fill_rows(Slot& slot, LoaderPosition pos, uint64_t row_begin, uint64_t row_end) const;

  std::shared_ptr<const TokenShard> shard_;
  LoaderConfig cfg_;
  uint64_t num_windows_ = 0;
  uint64_t batches_per_epoch_ = 0;

  PinnedBuffer pinned_staging_;            // every slot's inputs and targets (pin_memory), allocated once
  std::vector<int32_t> pageable_staging_;  // the same without pin_memory
  std::vector<Slot> slots_;  // the ring's slots, indexed by batch sequence number (count of batches produced)
  std::vector<uint64_t> permutation_;  // producer thread only: window order of permutation_epoch_
  uint64_t permutation_epoch_ = UINT64_MAX;

  // The producer and helper threads (num_workers - 1 of them, each assembling a share of a batch's rows),
  // and the protocol of next() and seek().
  PrefetchRing ring_;  // last member: its threads start once everything above is initialised
};

}  // namespace anvil::data
