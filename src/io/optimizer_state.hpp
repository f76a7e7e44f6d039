// The optimizer state of a checkpoint under ZeRO (docs/formats.md, "Sharded optimizer state"). Each rank
// writes the state of its shard to zero/optimizer-rank-R-of-W.safetensors; each tensor's metadata says
// where its slice sits in the one-process tensor ("offset.<name>") and how long that tensor is
// ("total.<name>"). Because every state tensor of a shard is such a slice (optim/optimizer.hpp), a run
// with any partition (another world size, another stage, one process) reads its own slices back from the
// rank files, or from a one-process checkpoint's optimizer.safetensors.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "io/safetensors.hpp"
#include "optim/optimizer.hpp"
#include "runtime/device.hpp"

namespace anvil::io {

// Where an optimizer's state tensor sits in the one-process tensor of that name.
struct StateSlice {
  size_t offset = 0;
  size_t total = 0;
};
// By state tensor name; a name missing here means the whole tensor (offset 0, total = its count).
using StateSlices = std::map<std::string, StateSlice>;

// Throws, naming the file and what to pass, unless `r` holds the state of `opt`'s optimizer.
void require_optimizer(const SafeTensorsReader& r, const Optimizer& opt);

// The file of rank `rank` of `world` inside a checkpoint directory.
std::string optimizer_shard_path(const std::string& checkpoint_dir, int rank, int world);

// Adds the shard's state tensors to `w`, in the order of the whole optimizer's, each the concatenation of
// the parts' tensors of that name. State on the CPU device (`dev`) is written from where it lies (no copy:
// the NVMe-offloaded state stays in its mapped file); device state through host copies that `host` keeps
// until write().
void add_state_tensors(SafeTensorsWriter& w, const OptimizerStateParts& state, Device& dev,
                       std::vector<std::vector<char>>& host);

// Writes the state of `state`'s shard with the slices' metadata to `path`.
void save_optimizer_shard(const std::string& path, const OptimizerStateParts& state, Device& dev,
                          const StateSlices& slices, int rank, int world);

// Restores `opt`'s state from a checkpoint directory: from optimizer.safetensors (one process) or from the
// rank files of zero/ (any world size), taking for each state tensor the slice `slices` names. Another
// optimizer, a missing rank file, a tensor of another type or total length, or a slice the files do not
// cover is an error naming the file and what to do.
void load_optimizer_state(const std::string& checkpoint_dir, Optimizer& opt, Device& dev,
                          const StateSlices& slices);
// The same into each part of `state` (the slices are the shard's; each part reads its own piece of them).
void load_optimizer_state(const std::string& checkpoint_dir, const OptimizerStateParts& state, Device& dev,
                          const StateSlices& slices);

}  // namespace anvil::io
