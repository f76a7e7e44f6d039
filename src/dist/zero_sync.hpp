// ZeRO stages 1-3 around an optimizer step (DESIGN: "ZeRO"; docs/distributed.md). Each rank owns one
// shard of the flat parameter buffer (ZeroPartition): its fp32 master weights and optimizer state cover
// that shard only (ParamStore::set_master_range, make_optimizer's shard), the compute-type weights stay
// whole on every rank.
//
// A step: backward's gradients are all-reduced (stage 1) or reduce-scattered so that each rank receives its
// shard's sum only (stage 2; GradSync with the partition); the global gradient norm is the shard's sum of
// squares summed over the ranks (stage 2; stage 1 has the whole reduced gradient); the optimizer updates the
// shard; the shard's master weights are cast into the compute-type weights and every rank's updated piece is
// all-gathered into everyone's weights, in buckets of `gather_bucket_elems` (DeepSpeed's
// allgather_bucket_size). All of it is queued on the device (no host wait), so a step stays one CUDA graph.
//
// Stage 3 keeps the compute-type weights of the shard only (ParamStore::set_weight_shard): there is no
// all-gather after the step; instead each unit is all-gathered into a slot when the model acquires it
// (this class is the store's WeightGatherer), the next one prefetched, in forward and again in backward.
//
// A store of the trainable tensors only (LoRA: ParamStore::keep_trainable_only) keeps master weights,
// gradients and optimizer state for the trainable part of each shard of the layout: the optimizer's
// partition is the layout's in the optimizer layout's numbering (ZeroPartition::mapped), so each rank's
// update lands in its own shard of the weights. The frozen base has no master weights or gradients at all;
// under stage 3 each rank keeps its shard of the base's weights. After a step of stage 1 or 2 only the runs
// of trainable tensors are all-gathered.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "dist/communicator.hpp"
#include "dist/zero_partition.hpp"
#include "model/param_store.hpp"

namespace anvil::dist {

class ZeroSync final : public WeightGatherer {
 public:
  // Sets `store`'s master range to this rank's shard is the engine's job (it plans memory); this binds the
  // store's download to gather_master (removed by the destructor). `partition` cuts the store's layout.
  // `dev` is the communicator's device (stage 3 copies this rank's piece of a unit there).
  ZeroSync(Communicator& comm, Device& dev, ParamStore& store, const ZeroPartition& partition, int stage,
           size_t gather_bucket_elems);
  ~ZeroSync() override;
  ZeroSync(const ZeroSync&) = delete;
  ZeroSync& operator=(const ZeroSync&) = delete;

  int stage() const { return stage_; }
  // The optimizer's partition (of the store's optimizer layout) and this rank's shard of it.
  const ZeroPartition& partition() const { return partition_; }
  ParamRange shard() const { return partition_.shard(comm_.rank()); }
  // The layout's partition: the weights' (stage 3 shards, the gathers).
  const ZeroPartition& weight_partition() const { return weight_partition_; }
  // The gradients this rank holds reduced after backward (optimizer layout): its shard (stage 2) or all of
  // them (stage 1).
  ParamRange reduced_grads() const { return stage_ >= 2 ? shard() : store_.optimizer_layout().all(); }

  // After the norm's sum of squares over reduced_grads() (device memory, fp64): every rank's total. Queued.
  void reduce_norm(double* sum_squares);
  // After the optimizer updated the shard and the shard was cast (ParamStore::sync): every rank's updated
  // piece into every rank's compute-type weights. Queued; compute waits for it. (Stage 3: nothing; the
  // units gather when acquired.)
  void gather_weights();
  // WeightGatherer (stage 3): this rank's piece of `unit` into its place in `slot`, then every rank's.
  uint64_t gather(int unit, void* slot) override;
  void wait(uint64_t ticket) override { comm_.join_until(ticket); }
  // The whole fp32 master weights on the host, on every rank (a collective; between steps). Moves them
  // through the gradient memory (unused between steps: ParamStore::gradient_scratch) in chunks. A store of
  // the trainable tensors only: the frozen tensors as the weights hold them (stage 3: gathered through the
  // weight slots), the trainable ones from the master weights. `host` null: this rank takes part only
  // (ParamStore::join_download).
  void gather_master(Device& dev, float* host);
  // The trainable tensors' master weights of a store of the trainable tensors only, packed in its optimizer
  // layout (ParamStore::download_trainable; `packed` null: this rank takes part only).
  void gather_trainable(Device& dev, float* packed);

 private:
  // All-gathers `n` elements of `type`, of which this rank holds [mine.begin, mine.end) at `own` (device
  // memory, or host memory where `own_on_host`), cut as `p`, through the device memory `scratch`;
  // `take(begin, end, staging)` receives each chunk of whole values.
  template <class Take>
  void gather_through(Device& dev, const ZeroPartition& p, DType type, const void* own, bool own_on_host,
                      std::pair<void*, size_t> scratch, Take take);
  void gather_trainable_only(Device& dev, float* host);

  Communicator& comm_;
  Device& dev_;
  ParamStore& store_;
  const ZeroPartition weight_partition_;
  const ZeroPartition partition_;
  // What gather_weights all-gathers after a step of stage 1-2: the runs of trainable elements (a store of the
  // trainable tensors only), else the whole layout.
  const std::vector<ParamRange> gather_runs_;
  const int stage_;
  const size_t gather_bucket_elems_;
};

}  // namespace anvil::dist
