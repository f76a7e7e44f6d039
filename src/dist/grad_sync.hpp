// Data parallelism's gradient reduction (ZeRO stage 0; DESIGN: "gradient sync (buckets)"): every rank sums
// its gradients with every other's, in buckets, each queued as soon as the units it holds have their
// gradients of the step (ParamStore's grads_ready hook), so the reduction of late units overlaps the
// backward of earlier ones.
//
// Buckets. The flat gradient buffer holds the units in layout order (embedding, blocks, final) and backward
// completes them in reverse, so the completed units always form one contiguous range at the buffer's end: a
// bucket is the range of the units completed since the last one was queued, queued once it holds at least
// `bucket_bytes` (DeepSpeed's reduce_bucket_size, in bytes of the gradient type) and at the step's last
// unit. One collective per bucket. `bucket_bytes` 0: one bucket after the whole backward (no overlap).
//
// ZeRO stage 2: each bucket is reduce-scattered instead (Communicator::reduce_scatter_v), each rank
// receiving the sum of the bucket's piece inside its shard only.
//
// Gradient accumulation: only the step's last micro-batch reduces (the sums of the earlier ones are in the
// buffer by then), so a step makes one reduction whatever its accumulation.
#pragma once
#include <cstddef>
#include <cstdint>

#include "dist/communicator.hpp"
#include "dist/zero_partition.hpp"
#include "model/param_store.hpp"

namespace anvil::dist {

class GradSync {
 public:
  // Installs itself as `store`'s grads_ready hook (removed by the destructor). With `scatter` (ZeRO stage 2,
  // kept by reference) the buckets are reduce-scattered over its shards.
  GradSync(Communicator& comm, ParamStore& store, size_t bucket_bytes,
           const ZeroPartition* scatter = nullptr);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Before each micro-batch's backward: whether it is the step's last (the one that reduces).
  void set_last_micro_batch(bool last) { armed_ = last; }
  bool armed() const { return armed_; }
  // After the step's last backward: queues what is left and makes compute wait for every bucket.
  void finish();

  int64_t buckets_queued() const { return buckets_; }  // since construction (tests, logs)

 private:
  void unit_ready(int unit);
  void queue(size_t begin, size_t end);  // floats [begin, end) of the flat buffer

  Communicator& comm_;
  ParamStore& store_;
  const size_t bucket_elems_;
  const ZeroPartition* const scatter_;
  bool armed_ = false;
  size_t pending_begin_, pending_end_;  // completed, not yet queued: [begin, end) in floats of the layout
  int64_t buckets_ = 0;
};

}  // namespace anvil::dist
