// How ZeRO splits the flat parameter buffer among the ranks (DESIGN: "ZeRO"): rank r owns the range
// [cuts[r], cuts[r + 1]) of the fp32 master weights, the optimizer state and (stage 2) the reduced
// gradients. The shards are as equal as the optimizer's state allows:
//  - every cut is a multiple of kShardAlign elements (16-byte vector accesses on fp32 and 16-bit buffers);
//  - elementwise optimizers (AdamW, SGD) cut anywhere else;
//  - 8-bit AdamW cuts a tensor only on a multiple of its quantisation block (256) from the tensor's start,
//    so the blocks, and so the states, are those of one process;
//  - Adafactor cuts between tensors only (its factored second moment and RMS are per tensor).
// Each optimizer's state over a shard is then the slice of its one-process state: concatenated in rank
// order, the shards' state tensors are the unsharded ones (what lets a checkpoint resume on any world size).
#pragma once
#include <cstddef>
#include <vector>

#include "model/param_layout.hpp"
#include "optim/optimizer_kind.hpp"

namespace anvil::dist {

constexpr size_t kShardAlign = 16;

enum class ShardCuts { Anywhere, Blocks8bit, WholeTensors };
ShardCuts shard_cuts(OptimizerKind kind);

class ZeroPartition {
 public:
  // One shard per rank; `world` >= 1. A rank's shard may be empty (a tiny model on many ranks).
  ZeroPartition(const ParamLayout& layout, int world, ShardCuts cuts);
  // The partition whose cuts are `f` of these (f non-decreasing, f(0) = 0): the same shards in another
  // numbering (a store of the trainable tensors only: ParamStore::optimizer_index).
  template <class F>
  ZeroPartition mapped(F f) const {
    ZeroPartition p = *this;
    for (size_t& c : p.cuts_) c = f(c);
    return p;
  }

  int world() const { return int(cuts_.size()) - 1; }
  ParamRange shard(int rank) const { return {cuts_[size_t(rank)], cuts_[size_t(rank) + 1]}; }
  // Every shard's element count, in rank order (the counts of the v-collectives).
  std::vector<size_t> counts() const;
  // The counts of the pieces of [begin, end) that each rank owns (zero where it owns none).
  std::vector<size_t> counts_in(size_t begin, size_t end) const;
  size_t max_shard() const;
  const std::vector<size_t>& cuts() const { return cuts_; }

 private:
  std::vector<size_t> cuts_;  // world + 1 entries, cuts_[0] = 0, cuts_[world] = numel
};

// Cuts `range` (itself cut by these rules, e.g. a shard) into consecutive pieces of at most `max_numel`
// elements where the rules allow (a piece grows past it only where no cut is allowed, e.g. a tensor longer
// than `max_numel` under WholeTensors): the sub-groups of an optimizer step (DeepSpeed's sub_group_size).
// Returns the cuts, from range.begin to range.end (one piece: those two).
std::vector<size_t> sub_group_cuts(const ParamLayout& layout, ParamRange range, size_t max_numel,
                                   ShardCuts cuts);

}  // namespace anvil::dist
