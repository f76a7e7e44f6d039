// The optimizer state of a shard kept on NVMe (DeepSpeed's `offload_optimizer.device nvme`, ZeRO-Infinity;
// docs/memory.md): the shard is cut into sub-groups of at most `sub_group_size` elements (DeepSpeed's key)
// by the ZeRO partition's rules, so that each sub-group's state is a slice of the shard's, and each
// sub-group's optimizer keeps its state (moments, factored statistics, 8-bit codes and their tables) in a
// region of one swap file. An update reads each sub-group's state into one of two host buffers, the next
// sub-group's read and the previous one's write running while it is updated, and writes it back. Host
// memory holds the two buffers (a sub-group each) instead of the whole state.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "anvil/memory_plan.hpp"
#include "offload/swap_file.hpp"
#include "optim/optimizer.hpp"

namespace anvil::offload {

// Where and how the state is swapped (Anvil's offload_nvme_* keys; DeepSpeed's nvme_path, sub_group_size and
// aio block_size, thread_count x queue_depth).
struct NvmeOptions {
  std::string path;
  size_t sub_group_size = 1000000000;
  size_t block_bytes = size_t(1) << 20;
  int io_threads = 8;
};

class PagedOptimizerState {
 public:
  // Host buffers: one sub-group updated while the next is read (after the previous one's write: the
  // drives measured share their bandwidth between reads and writes, docs/memory.md).
  static constexpr size_t kBuffers = 2;

  // The sub-groups of `shard` and their regions; creates the swap file in opts.path.
  PagedOptimizerState(OptimizerKind kind, const ParamLayout& layout, const OptimizerHyper& h,
                      ParamRange shard, const NvmeOptions& opts);

  // The sizes a run with these settings takes, without creating anything (`anvil estimate`).
  struct Sizes {
    size_t groups = 0;
    size_t buffer_bytes = 0;  // one swap buffer: the largest sub-group's state
    size_t buffers = 0;       // kBuffers, or one with one sub-group
    size_t file_bytes = 0;    // the swap file: every sub-group's state
  };
  static Sizes sizes(OptimizerKind kind, const ParamLayout& layout, const OptimizerHyper& h, ParamRange shard,
                     size_t sub_group_size);
  const Sizes& size() const { return sizes_; }
  const SwapFile& file() const { return *file_; }

  // Zeroes every sub-group's state and writes its constant tables (before the first step; on the new file,
  // which reads as zeros, only the pages that are not zero).
  void reset(Device& host);
  // One pass over the sub-groups in order: `update(optimizer, range)` with the sub-group's optimizer bound
  // to its state, read in before and written back after. Returns when every write is done.
  void for_each_group(const std::function<void(Optimizer&, ParamRange)>& update);
  // Every sub-group's optimizer bound to its region of a mapping of the file, for checkpoints; `whole` is
  // the shard's optimizer (`writable`: a resume writes the state through it; synced when the last copy of
  // the result goes).
  OptimizerStateParts map(const Optimizer& whole, bool writable);

 private:
  struct Group {
    ParamRange range;
    std::unique_ptr<Optimizer> opt;
    MemoryPlan plan;
    size_t offset = 0, bytes = 0;  // the region in the file (bytes: the plan's, rounded up to kSwapAlign)
  };
  static std::vector<Group> make_groups(OptimizerKind kind, const ParamLayout& layout,
                                        const OptimizerHyper& h, ParamRange shard, size_t sub_group_size,
                                        Sizes& sizes);

  Sizes sizes_;
  std::vector<Group> groups_;
  std::vector<std::unique_ptr<AlignedBuffer>> buffers_;
  std::unique_ptr<SwapFile> file_;  // after the buffers: its threads stop before they are freed
  bool written_once_ = false;       // reset() has run (the file no longer reads as zeros)
};

}  // namespace anvil::offload
