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
// Units whose tensors are all frozen (freeze_parameters) are not reduced: a bucket ends above such a unit
// and the next starts below it (by unit: the unit is passed over). Inside a bucket only the runs of trainable
// tensors are reduced, one collective each (LoRA: each block's factors, not its frozen matrices).
// Gradient accumulation: only the step's last micro-batch reduces (the sums of the earlier ones are in the
// buffer by then), so a step makes one reduction whatever its accumulation.
//
// ZeRO stage 2: each bucket is reduce-scattered instead (Communicator::reduce_scatter_v), each rank
// receiving the sum of the bucket's piece inside its shard only. When the store keeps gradients by unit
// (ParamStore::set_grad_shard: a unit slot in backward, the reduced shard for the optimizer) a bucket is
// one unit, reduce-scattered inside its slot as soon as it is ready, in every micro-batch; this rank's
// piece is added into the shard's gradients once the collective is done, at the latest when the slot goes
// to another unit (the store's slot-reuse hook; compute waits for that unit's collective only) and at the
// end of each micro-batch (finish). The step's first micro-batch adds into zeros (the step zeroes grads()),
// except where the shard's gradients are in host memory (ParamStore::grads_on_host, gradient offload): there
// the first micro-batch's pieces overwrite it, written by the device over the bus (no memset of host memory
// on the device), and the later ones add.
//
// The communication type (communication_data_type, ParamStore::set_comm_type). When it differs from the
// gradient type (fp32 gradients reduced in bf16 or fp16: half the bytes on the wire), each bucket or unit is
// converted into the store's staging buffer on the compute stream before its collective and the reduction
// runs there; the result is converted back into the gradients after the step's last collective (whole
// gradients: the shard's range only under stage 1), or added into the shard's gradients from the staging
// slot (gradients by unit). Accumulation over micro-batches stays in the gradient type. Unit slots in the
// 16-bit compute type (backward_grad_dtype) reduce in it unless communication_data_type says otherwise, and
// are added into the shard's gradient type the same way.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "dist/communicator.hpp"
#include "dist/zero_partition.hpp"
#include "kernels/ops.hpp"
#include "model/param_store.hpp"

namespace anvil::dist {

class GradSync {
 public:
  // Installs itself as `store`'s grads_ready (and slot-reuse) hook, removed by the destructor. With
  // `scatter` (ZeRO stage 2, kept by reference) the buckets are reduce-scattered over its shards; a store
  // with sharded gradients or a staged communication type also needs `ops` (kept by reference: the pieces
  // are added and converted with it).
  GradSync(Communicator& comm, ParamStore& store, size_t bucket_bytes, const ZeroPartition* scatter = nullptr,
           Ops* ops = nullptr);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Before each micro-batch's backward: whether it is the step's first and last (the last one reduces;
  // gradients by unit reduce in every micro-batch, and the first one's overwrite offloaded gradients).
  void begin_micro_batch(bool first, bool last) {
    armed_ = last || by_unit_;
    first_ = first, last_ = last;
  }
  // Offloaded gradients (ParamStore::grads_on_host): the step's last micro-batch adds the squares of the
  // shard's gradients, as it writes their final values, into `sum_squares` (one fp64 value in the device's
  // memory, which the caller zeroes before each step; Ops::convert_grads_sum_squares), so the norm need not
  // read them back from host memory. The sum runs piece by piece, in another order than one pass over the
  // shard (the norm differs from it in its last bits).
  void set_norm_sink(double* sum_squares);
  bool sums_norm() const { return norm_sink_ != nullptr; }
  // Whether the step's first micro-batch runs other work than the later ones (its graph is another).
  bool first_micro_batch_differs() const { return overwrite_first_; }
  bool armed() const { return armed_; }
  // Whether every micro-batch reduces (gradients by unit), not only the step's last.
  bool reduces_every_micro_batch() const { return by_unit_; }
  // After an armed micro-batch's backward: queues what is left and makes compute wait for every bucket
  // (gradients by unit: and adds the pieces not yet added).
  void finish();

  int64_t buckets_queued() const { return buckets_; }  // since construction (tests, logs)

 private:
  void unit_ready(int unit);
  void queue(size_t begin, size_t end);  // floats [begin, end) of the flat buffer
  void drain(int unit);                  // gradients by unit: adds its reduced piece (once)
  void add_piece(int unit);
  void convert_back();  // staged whole gradients: the reduced sums into the gradients

  Communicator& comm_;
  ParamStore& store_;
  const size_t bucket_elems_;
  const ZeroPartition* const scatter_;
  Ops* const ops_;
  const bool by_unit_;
  // What backward writes (the unit slots' type under ZeRO-2/3), what the optimizer's gradients are kept in,
  // and what the collectives run in.
  const DType written_type_, kept_type_, comm_type_;
  const bool staged_;                       // the reduction runs in the store's staging buffer of comm_type_
  const bool overwrite_first_;              // the first micro-batch's pieces overwrite (offloaded gradients)
  std::vector<ParamRange> trainable_;       // the trainable runs of the layout (one without frozen tensors)
  std::vector<ParamRange> trainable_kept_;  // the same in the optimizer layout's numbering
  bool armed_ = false;
  bool first_ = true, last_ = true;
  double* norm_sink_ = nullptr;
  size_t pending_begin_, pending_end_;  // completed, not yet queued: [begin, end) in floats of the layout
  int64_t buckets_ = 0;
  // Gradients by unit: each unit's collective (Communicator::mark) and whether its piece is still to add.
  std::vector<uint64_t> marks_;
  std::vector<bool> to_add_;
  int reduced_in_micro_batch_ = 0;
};

}  // namespace anvil::dist
