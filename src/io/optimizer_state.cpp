#include "io/optimizer_state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "anvil/error.hpp"
#include "io/checkpoint.hpp"
#include "io/hf_weights.hpp"
#include "io/safetensors.hpp"

namespace anvil::io {
namespace fs = std::filesystem;

namespace {

StateSlice slice_of(const StateSlices& slices, const OptimizerStateTensor& t) {
  const auto it = slices.find(t.name);
  return it == slices.end() ? StateSlice{0, t.count} : it->second;
}

size_t meta_size(const SafeTensorsReader& r, const std::string& key) {
  const auto it = r.metadata().find(key);
  ANVIL_REQUIRE(it != r.metadata().end(), "{}: metadata '{}' is missing (not a rank file Anvil wrote?)",
                r.path(), key);
  try {
    return size_t(std::stoull(it->second));
  } catch (const std::exception&) {
    ANVIL_THROW("{}: metadata '{}' is '{}', not a count", r.path(), key, it->second);
  }
}

// Copies elements [from, from + n) of a file tensor that holds elements [at, at + its count) of the
// one-process tensor into the device tensor `t`, which holds [slice.offset, slice.offset + t.count).
void copy_piece(Device& dev, const OptimizerStateTensor& t, const StateSlice& slice,
                const SafeTensorsReader& r, const SafeTensorInfo& info, size_t at,
                std::vector<bool>& filled) {
  const size_t count = size_t(info.numel());
  const size_t lo = std::max(at, slice.offset), hi = std::min(at + count, slice.offset + t.count);
  if (lo >= hi) return;
  const char* src = static_cast<const char*>(r.data(info)) + dtype_bytes(t.dtype, lo - at);
  dev.copy_to_device(static_cast<char*>(t.data) + dtype_bytes(t.dtype, lo - slice.offset), src,
                     dtype_bytes(t.dtype, hi - lo));
  std::fill(filled.begin() + std::ptrdiff_t(lo - slice.offset),
            filled.begin() + std::ptrdiff_t(hi - slice.offset), true);
}

void require_tensor_type(const SafeTensorsReader& r, const SafeTensorInfo& info,
                         const OptimizerStateTensor& t) {
  ANVIL_REQUIRE(info.dtype == t.dtype && info.shape.size() == 1,
                "{}: tensor '{}' is {} {} but this run needs a 1-D {} tensor (a different model or optimizer "
                "setting)",
                r.path(), t.name, dtype_name(info.dtype), shape_string(info.shape), dtype_name(t.dtype));
}

}  // namespace

void require_optimizer(const SafeTensorsReader& r, const Optimizer& opt) {
  const auto it = r.metadata().find("optimizer");
  const std::string saved = it == r.metadata().end() ? "" : it->second;
  const std::string wanted = optimizer_name(opt.kind());
  ANVIL_REQUIRE(saved == wanted,
                "{}: the checkpoint's optimizer state is for '{}' but this run uses optim '{}'; resume with "
                "--optim {} (or start a new run from the weights with --init_from)",
                r.path(), saved.empty() ? "(unnamed)" : saved, wanted, saved.empty() ? wanted : saved);
}

std::string optimizer_shard_path(const std::string& checkpoint_dir, int rank, int world) {
  return (fs::path(checkpoint_dir) / "zero" /
          fmt::format("optimizer-rank-{:05d}-of-{:05d}.safetensors", rank, world))
      .string();
}

void add_state_tensors(SafeTensorsWriter& w, const OptimizerStateParts& state, Device& dev,
                       std::vector<std::vector<char>>& host) {
  const bool in_host_memory = dev.kind() == DeviceKind::CPU;
  for (const OptimizerStateTensor& whole : state.whole().state_tensors()) {
    std::vector<SafeTensorsWriter::Piece> pieces;
    size_t count = 0;
    for (const Optimizer* part : state.parts())
      for (const OptimizerStateTensor& t : part->state_tensors()) {
        if (t.name != whole.name || t.count == 0) continue;
        count += t.count;
        const size_t bytes = dtype_bytes(t.dtype, t.count);
        if (in_host_memory) {
          pieces.emplace_back(t.data, bytes);
        } else {
          host.emplace_back(bytes);
          dev.copy_to_host(host.back().data(), t.data, bytes);
          pieces.emplace_back(host.back().data(), bytes);
        }
      }
    ANVIL_ASSERT(count == whole.count, "optimizer state '{}': the parts hold {} elements of the shard's {}",
                 whole.name, count, whole.count);
    w.add_pieces(whole.name, whole.dtype, {int64_t(whole.count)}, std::move(pieces));
  }
}

void save_optimizer_shard(const std::string& path, const OptimizerStateParts& state, Device& dev,
                          const StateSlices& slices, int rank, int world) {
  SafeTensorsWriter w;
  w.set_metadata("optimizer", optimizer_name(state.whole().kind()));
  w.set_metadata("zero_rank", std::to_string(rank));
  w.set_metadata("zero_world", std::to_string(world));
  for (const OptimizerStateTensor& t : state.whole().state_tensors()) {
    const StateSlice s = slice_of(slices, t);
    w.set_metadata("offset." + t.name, std::to_string(s.offset));
    w.set_metadata("total." + t.name, std::to_string(s.total));
  }
  std::vector<std::vector<char>> host;  // kept alive until write()
  add_state_tensors(w, state, dev, host);
  w.write(path);
}

void load_optimizer_state(const std::string& checkpoint_dir, Optimizer& opt, Device& dev,
                          const StateSlices& slices) {
  const fs::path dir(checkpoint_dir);
  const std::string one_process = (dir / "optimizer.safetensors").string();
  bool whole = true;
  for (const OptimizerStateTensor& t : opt.state_tensors()) {
    const StateSlice s = slice_of(slices, t);
    whole = whole && s.offset == 0 && s.total == t.count;
  }
  if (fs::exists(one_process) && whole) {  // the format of one process, read as before
    load_optimizer(one_process, opt, dev);
    return;
  }

  // The files that hold the state: optimizer.safetensors (each tensor whole, at offset 0), or every rank
  // file.
  std::vector<std::unique_ptr<SafeTensorsReader>> files;
  if (fs::exists(one_process)) {
    files.push_back(std::make_unique<SafeTensorsReader>(one_process));
  } else {
    const fs::path zero = dir / "zero";
    ANVIL_REQUIRE(
        fs::is_directory(zero),
        "{}: the checkpoint has neither optimizer.safetensors nor zero/ (its optimizer state); resume "
        "from a complete checkpoint, or start from its weights with --init_from",
        checkpoint_dir);
    const std::string first = optimizer_shard_path(checkpoint_dir, 0, 1);
    int world = 0;
    for (const auto& entry : fs::directory_iterator(zero)) {
      int r = 0, w = 0;
      if (std::sscanf(entry.path().filename().c_str(), "optimizer-rank-%d-of-%d.safetensors", &r, &w) == 2)
        world = std::max(world, w);
    }
    ANVIL_REQUIRE(world > 0, "{}: no optimizer-rank-R-of-W.safetensors file in it (like {})", zero.string(),
                  first);
    for (int r = 0; r < world; ++r) {
      const std::string path = optimizer_shard_path(checkpoint_dir, r, world);
      ANVIL_REQUIRE(
          fs::exists(path),
          "{}: missing (the checkpoint was written by {} ranks and each wrote one file); resume from "
          "a complete checkpoint",
          path, world);
      files.push_back(std::make_unique<SafeTensorsReader>(path));
    }
  }
  for (const auto& f : files) require_optimizer(*f, opt);

  for (const OptimizerStateTensor& t : opt.state_tensors()) {
    const StateSlice s = slice_of(slices, t);
    std::vector<bool> filled(t.count, false);
    for (const auto& f : files) {
      const SafeTensorInfo* info = f->find(t.name);
      if (!info) continue;  // a rank whose shard holds none of this kind of state
      require_tensor_type(*f, *info, t);
      const bool rank_file = f->metadata().count("offset." + t.name) > 0;
      const size_t at = rank_file ? meta_size(*f, "offset." + t.name) : 0;
      const size_t total = rank_file ? meta_size(*f, "total." + t.name) : size_t(info->numel());
      ANVIL_REQUIRE(
          total == s.total,
          "{}: tensor '{}' belongs to a state of {} elements but this run's has {} (a different model "
          "or optimizer setting)",
          f->path(), t.name, total, s.total);
      copy_piece(dev, t, s, *f, *info, at, filled);
    }
    const auto hole = std::find(filled.begin(), filled.end(), false);
    ANVIL_REQUIRE(hole == filled.end(),
                  "{}: the optimizer state '{}' lacks elements from {} on (the files cover part of it only); "
                  "resume from a complete checkpoint",
                  checkpoint_dir, t.name, s.offset + size_t(hole - filled.begin()));
  }
}

void load_optimizer_state(const std::string& checkpoint_dir, const OptimizerStateParts& state, Device& dev,
                          const StateSlices& slices) {
  if (state.parts().size() == 1 && state.parts()[0] == &state.whole()) {
    load_optimizer_state(checkpoint_dir, *state.parts()[0], dev, slices);
    return;
  }
  // Each part's slices: the shard's, moved past the elements of the parts before it.
  StateSlices shard;
  for (const OptimizerStateTensor& t : state.whole().state_tensors()) shard[t.name] = slice_of(slices, t);
  std::map<std::string, size_t> before;
  for (Optimizer* part : state.parts()) {
    StateSlices mine;
    for (const OptimizerStateTensor& t : part->state_tensors()) {
      const auto it = shard.find(t.name);
      ANVIL_ASSERT(it != shard.end(), "optimizer state '{}' of a part is not one of the shard's", t.name);
      mine[t.name] = {it->second.offset + before[t.name], it->second.total};
      before[t.name] += t.count;
    }
    load_optimizer_state(checkpoint_dir, *part, dev, mine);
  }
  state.sync();
}

}  // namespace anvil::io
