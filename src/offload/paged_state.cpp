#include "offload/paged_state.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "anvil/error.hpp"
#include "dist/zero_partition.hpp"

namespace anvil::offload {

std::vector<PagedOptimizerState::Group> PagedOptimizerState::make_groups(
    OptimizerKind kind, const ParamLayout& layout, const OptimizerHyper& h, ParamRange shard,
    size_t sub_group_size, Sizes& sizes) {
  std::vector<Group> groups;
  sizes = {};
  if (shard.numel() == 0) return groups;  // an empty ZeRO shard
  const std::vector<size_t> cuts =
      dist::sub_group_cuts(layout, shard, sub_group_size, dist::shard_cuts(kind));
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    Group g;
    g.range = {cuts[i], cuts[i + 1]};
    g.opt = make_optimizer(kind, layout, h, g.range);
    g.opt->plan_memory(g.plan);
    g.offset = sizes.file_bytes;
    g.bytes = swap_aligned(g.plan.total_bytes());
    sizes.file_bytes += g.bytes;
    sizes.buffer_bytes = std::max(sizes.buffer_bytes, g.bytes);
    groups.push_back(std::move(g));
  }
  sizes.groups = groups.size();
  sizes.buffers = std::min(kBuffers, groups.size());
  return groups;
}

PagedOptimizerState::Sizes PagedOptimizerState::sizes(OptimizerKind kind, const ParamLayout& layout,
                                                      const OptimizerHyper& h, ParamRange shard,
                                                      size_t sub_group_size) {
  Sizes s;
  make_groups(kind, layout, h, shard, sub_group_size, s);
  return s;
}

PagedOptimizerState::PagedOptimizerState(OptimizerKind kind, const ParamLayout& layout,
                                         const OptimizerHyper& h, ParamRange shard, const NvmeOptions& opts)
    : groups_(make_groups(kind, layout, h, shard, opts.sub_group_size, sizes_)) {
  buffers_.resize(sizes_.buffers);
  for (auto& b : buffers_) b = std::make_unique<AlignedBuffer>(sizes_.buffer_bytes);
  file_ = std::make_unique<SwapFile>(opts.path, fmt::format("anvil-optimizer-{}.swap", ::getpid()),
                                     sizes_.file_bytes, opts.block_bytes, opts.io_threads);
}

namespace {

bool page_is_zero(const char* p) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  return std::all_of(w, w + kSwapAlign / sizeof(uint64_t), [](uint64_t x) { return x == 0; });
}

}  // namespace

void PagedOptimizerState::reset(Device& host) {
  std::vector<uint64_t> written(buffers_.size(), 0);
  for (size_t i = 0; i < groups_.size(); ++i) {
    Group& g = groups_[i];
    AlignedBuffer& buf = *buffers_[i % buffers_.size()];
    file_->wait(written[i % buffers_.size()]);  // the buffer's previous writes are done
    std::memset(buf.get(), 0, g.bytes);
    g.opt->bind(buf.get(), g.plan);
    g.opt->reset(host);
    // A new file reads as zeros: only the pages the reset made nonzero (tables, constants) are written,
    // so that start-up does not write the whole state (DeepSpeed's fast_init). Later resets write all.
    const char* p = static_cast<const char*>(buf.get());
    const auto needed = [&](size_t at) { return written_once_ || !page_is_zero(p + at); };
    for (size_t at = 0; at < g.bytes; at += kSwapAlign) {
      if (!needed(at)) continue;
      size_t end = at + kSwapAlign;  // the run of pages to write
      while (end < g.bytes && needed(end)) end += kSwapAlign;
      written[i % buffers_.size()] = file_->write_async(p + at, end - at, g.offset + at);
      at = end;  // (the page at `end` is not needed: the loop steps past it)
    }
  }
  file_->wait_all();
  written_once_ = true;
}

void PagedOptimizerState::for_each_group(const std::function<void(Optimizer&, ParamRange)>& update) {
  if (groups_.empty()) return;
  const auto read = [&](size_t i) {
    return file_->read_async(buffers_[i % buffers_.size()]->get(), groups_[i].bytes, groups_[i].offset);
  };
  uint64_t next = read(0);
  for (size_t i = 0; i < groups_.size(); ++i) {
    const uint64_t current = next;
    // Queued behind the previous sub-group's write, which used the same buffer.
    if (i + 1 < groups_.size()) next = read(i + 1);
    file_->wait(current);
    Group& g = groups_[i];
    void* buf = buffers_[i % buffers_.size()]->get();
    g.opt->bind(buf, g.plan);
    update(*g.opt, g.range);
    file_->write_async(buf, g.bytes, g.offset);
  }
  file_->wait_all();
}

OptimizerStateParts PagedOptimizerState::map(const Optimizer& whole, bool writable) {
  std::shared_ptr<SwapFile::Mapping> mapping = file_->map(writable);
  std::vector<Optimizer*> parts;
  for (Group& g : groups_) {
    g.opt->bind(mapping->data() + g.offset, g.plan);
    parts.push_back(g.opt.get());
  }
  std::function<void()> sync;
  if (writable) sync = [m = mapping.get()] { m->sync(); };
  return OptimizerStateParts(whole, std::move(parts), std::move(mapping), std::move(sync));
}

}  // namespace anvil::offload
