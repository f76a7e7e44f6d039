// The classification data loader: batches of (token ids, length, label) examples from a classification
// shard, padded per batch, assembled ahead of time on a background thread (and helper threads) into pinned
// host buffers ready for an asynchronous copy to the device. The design is the LM DataLoader's (loader.hpp),
// through the same PrefetchRing (prefetch_ring.hpp): a ring of prefetched batches indexed by a sequence
// number, a generation counter that seek() bumps, and the same contract for how long a returned batch stays
// valid.
//
// Batches: an epoch visits every example once, in a Fisher-Yates permutation drawn from the same per-epoch
// seed as the LM loader (shuffle_seed(seed, epoch)), or in order without shuffling. Batch b of an epoch is
// the examples at permutation positions [b*B, (b+1)*B). With drop_last the final partial batch is dropped
// (training: every micro-batch has B sequences); without it the last batch has the remaining examples
// (evaluation: every example counts once). A batch's length L is its longest example rounded up to a
// multiple of pad_multiple, capped at max_length; each row holds the example's ids then pad_id, and its
// real length (the attention mask is that prefix). What a batch contains is a pure function of (shard,
// batch_size, max_length, pad settings, seed, shuffle, drop_last, position), so seeking to a saved position
// reproduces a run exactly.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "data/classification_shard.hpp"
#include "data/loader.hpp"
#include "data/prefetch_ring.hpp"
#include "runtime/device.hpp"

namespace anvil::data {

struct ClassificationLoaderConfig {
  int batch_size = 0;
  // The longest batch the consumer can take (the engine's planned sequence length). An example longer than
  // this is an error at construction, naming the shard and the example (nothing is cut silently).
  int max_length = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  bool drop_last = true;      // drop the final partial batch of an epoch
  int32_t pad_id = 0;         // the id padding positions hold (what it is changes nothing in BERT's outputs)
  uint32_t pad_multiple = 8;  // batch lengths are multiples of this (Tensor Core friendly GEMM shapes)
  int prefetch = 4;           // batches assembled ahead of the consumer
  int num_workers = 1;        // threads assembling a batch (its rows are split among them)
  bool pin_memory = true;     // stage batches in page-locked memory (fast, truly async device copies)
  // Data parallelism (as LoaderConfig::ranks): the global batch is `ranks` x batch_size examples, this
  // loader's batches are rank `rank`'s rows of it, positions count global batches. Needs drop_last (every
  // rank's batch is then full).
  int ranks = 1;
  int rank = 0;
};

struct ClassificationHostBatch {
  const int32_t* ids;      // [batch_size, length], row-major (pinned host memory)
  const int32_t* lengths;  // [batch_size] real tokens of each row
  const int32_t* labels;   // [batch_size] class ids in [0, num_labels)
  int batch_size;          // rows (smaller than the configured batch only for a final partial batch)
  int length;              // padded length of every row
  LoaderPosition pos;      // the position this batch was produced for
};

class ClassificationLoader {
 public:
  ClassificationLoader(std::shared_ptr<const ClassificationShard> shard, ClassificationLoaderConfig cfg,
                       Device& dev);
  ~ClassificationLoader() = default;  // stops and joins the threads (ring_)
  ClassificationLoader(const ClassificationLoader&) = delete;
  ClassificationLoader& operator=(const ClassificationLoader&) = delete;

  // Blocks until the batch at position() is ready and returns it. The returned batch stays valid and
  // unchanged until next() has been called twice more (so batch k may be copied asynchronously while
  // batch k+1 is asked for). Rethrows an exception raised while the batch was being assembled.
  const ClassificationHostBatch& next() { return slots_[ring_.next()].batch; }
  // The position of the batch the next call of next() returns.
  LoaderPosition position() const { return ring_.position(); }
  // Discards prefetched batches and restarts production at p (resume, or evaluation from the start).
  // Throws anvil::Error if p.batch >= batches_per_epoch().
  void seek(LoaderPosition p);

  uint64_t batches_per_epoch() const { return batches_per_epoch_; }
  uint64_t num_examples() const { return shard_->size(); }
  // Total time next() spent blocked waiting for the producer.
  double wait_seconds() const { return ring_.wait_seconds(); }

  // The longest example of a shard (a scan of its offsets).
  static uint32_t longest_example(const ClassificationShard& shard);

 private:
  struct Slot {
    ClassificationHostBatch batch;
    int32_t *ids, *lengths, *labels;
  };

  std::vector<Slot> make_slots();
  // Producer thread, before the rows are split among the workers: decides the batch's rows and length.
  uint64_t prepare(Slot& slot, LoaderPosition pos);
  void fill_rows(Slot& slot, LoaderPosition pos, uint64_t row_begin, uint64_t row_end) const;
  void ensure_permutation(uint64_t epoch);  // producer thread only
  uint64_t example_at(uint64_t index) const { return cfg_.shuffle ? permutation_[index] : index; }
  // The permutation index of the first row of this rank's batch at `pos`.
  uint64_t first_row(LoaderPosition pos) const {
    return (pos.batch * uint64_t(cfg_.ranks) + uint64_t(cfg_.rank)) * uint64_t(cfg_.batch_size);
  }

  std::shared_ptr<const ClassificationShard> shard_;
  ClassificationLoaderConfig cfg_;
  uint64_t batches_per_epoch_ = 0;

  PinnedBuffer pinned_staging_;            // every slot's ids, lengths and labels (pin_memory)
  std::vector<int32_t> pageable_staging_;  // the same without pin_memory
  std::vector<Slot> slots_;                // the ring's slots, indexed by batch sequence number
  std::vector<uint64_t> permutation_;      // producer thread only: example order of permutation_epoch_
  uint64_t permutation_epoch_ = UINT64_MAX;

  // The producer and helper threads (num_workers - 1 of them: helper k fills rows [k*n/W, (k+1)*n/W) of a
  // batch of n rows, its length already decided), and the protocol of next() and seek().
  PrefetchRing ring_;  // last member: its threads start once everything above is initialised
};

}  // namespace anvil::data
