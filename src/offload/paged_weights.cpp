#include "offload/paged_weights.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "anvil/error.hpp"
#include "core/half.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::offload {

std::vector<PagedWeights::Piece> PagedWeights::make_pieces(const ParamLayout& layout, ParamRange shard,
                                                           DType type, Sizes& sizes) {
  std::vector<Piece> pieces;
  sizes.file_bytes = sizes.buffer_bytes = 0;
  for (const ParamUnit& u : layout.units()) {
    Piece p;
    const size_t lo = std::max(u.offset, shard.begin), hi = std::min(u.offset + u.numel, shard.end);
    if (lo < hi) {
      p.first = lo - shard.begin, p.numel = hi - lo;
      p.offset = sizes.file_bytes;
      p.bytes = swap_aligned(dtype_bytes(type, p.numel));
      sizes.file_bytes += p.bytes;
      sizes.buffer_bytes = std::max(sizes.buffer_bytes, p.bytes);
    }
    pieces.push_back(p);
  }
  return pieces;
}

PagedWeights::Sizes PagedWeights::sizes(const ParamLayout& layout, ParamRange shard, DType type,
                                        int buffers) {
  Sizes s;
  const std::vector<Piece> pieces = make_pieces(layout, shard, type, s);
  const auto touched =
      size_t(std::count_if(pieces.begin(), pieces.end(), [](const Piece& p) { return p.numel; }));
  s.buffers = std::min(size_t(std::max(buffers, 0)), touched);
  return s;
}

PagedWeights::PagedWeights(Device& dev, const ParamLayout& layout, ParamRange shard, DType type,
                           const NvmeOptions& opts, int buffers)
    : shard_(shard), type_(type) {
  ANVIL_REQUIRE(buffers >= 2,
                "offload_param_buffer_count must be at least 2 (one piece copied while the next is read), "
                "got {}",
                buffers);
  sizes_ = sizes(layout, shard, type, buffers);
  pieces_ = make_pieces(layout, shard, type, sizes_);
  buffers_.resize(sizes_.buffers);
  for (Buffer& b : buffers_) {
    // Pinned for the device's copies, page-aligned inside for direct I/O.
    b.memory.emplace(dev, sizes_.buffer_bytes + kSwapAlign);
    const auto at = reinterpret_cast<uintptr_t>(b.memory->get());
    b.data = static_cast<char*>(b.memory->get()) + (swap_aligned(at) - at);
    b.fence = dev.make_fence();
  }
  file_ =
      std::make_unique<SwapFile>(opts.path, fmt::format("anvil-weights-{}.swap", ::getpid()),
                                 sizes_.file_bytes, opts.block_bytes, opts.io_threads, true, "the weights");
}

PagedWeights::~PagedWeights() {
  // The device may still copy from the buffers: let it finish before they go (a device already failed has
  // reported that elsewhere; a destructor must not throw).
  for (Buffer& b : buffers_) {
    if (!b.fenced) continue;
    try {
      b.fence->wait();
    } catch (const std::exception& e) {
      fmt::print(stderr, "paged weights: waiting for the device's last copy failed: {}\n", e.what());
    }
  }
}

PagedWeights::Buffer* PagedWeights::holding(int unit) {
  for (Buffer& b : buffers_)
    if (b.unit == unit) return &b;
  return nullptr;
}

PagedWeights::Buffer* PagedWeights::victim(const std::vector<int>& keep) {
  Buffer* best = nullptr;
  for (Buffer& b : buffers_) {
    if (b.unit >= 0 && std::find(keep.begin(), keep.end(), b.unit) != keep.end()) continue;
    if (!best || b.used < best->used) best = &b;
  }
  return best;
}

void PagedWeights::fill(Buffer& b, int unit) {
  if (b.fenced) {  // the device's copy of its previous piece must have run
    b.fence->wait();
    b.fenced = false;
  }
  const Piece& p = pieces_[size_t(unit)];
  b.unit = unit;
  b.ticket = file_->read_async(b.data, p.bytes, p.offset);
}

namespace {
uint64_t pair_key(int a, int b) {
  return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
}
}  // namespace

void PagedWeights::learn(int unit) {
  if (prev1_ >= 0) next_[pair_key(prev2_, prev1_)] = unit;
  prev2_ = prev1_, prev1_ = unit;
}

std::vector<int> PagedWeights::expected_after(int unit) const {
  std::vector<int> out;
  const int units = int(pieces_.size());
  int a = prev2_, b = unit;
  while (out.size() + 1 < buffers_.size()) {
    int c = -1;
    if (auto it = next_.find(pair_key(a, b)); it != next_.end()) {
      c = it->second;
    } else {  // never seen: continue in the direction of the last two, over units this shard lacks
      const int step = a >= 0 && a == b + 1 ? -1 : 1;
      for (c = b + step; c >= 0 && c < units && pieces_[size_t(c)].numel == 0; c += step) {
      }
      if (c < 0 || c >= units) break;
    }
    if (c == unit || std::find(out.begin(), out.end(), c) != out.end()) break;  // a cycle: enough
    out.push_back(c);
    a = b, b = c;
  }
  return out;
}

const void* PagedWeights::piece(int unit) {
  ANVIL_ASSERT(unit >= 0 && size_t(unit) < pieces_.size() && pieces_[size_t(unit)].numel > 0,
               "paged weights: unit {} has no piece in this shard", unit);
  learn(unit);
  ++counts_.served;
  std::vector<int> keep{unit};
  Buffer* b = holding(unit);
  if (!b) {
    b = victim(keep);
    fill(*b, unit);
    ++counts_.read_on_demand;
  }
  b->used = ++clock_;
  // Queue the reads of the units expected next behind this one, into the buffers used longest ago.
  const std::vector<int> ahead = expected_after(unit);
  keep.insert(keep.end(), ahead.begin(), ahead.end());
  for (int next : ahead) {
    if (holding(next)) continue;
    Buffer* v = victim(keep);
    if (!v) break;
    fill(*v, next);
    v->used = clock_;  // (older than the piece served now, newer than the rest)
  }
  file_->wait(b->ticket);
  return b->data;
}

void PagedWeights::queued(int unit) {
  Buffer* b = holding(unit);
  ANVIL_ASSERT(b, "paged weights: a copy of unit {} queued, but no buffer holds it", unit);
  b->fence->record();
  b->fenced = true;
}

void PagedWeights::drain() {
  file_->wait_all();
  for (Buffer& b : buffers_) {
    if (b.fenced) b.fence->wait();
    b.fenced = false;
    b.unit = -1;
  }
}

void PagedWeights::write(const float* values) {
  drain();
  // The last unit first: the buffers keep the first units, which the next forward gathers first.
  size_t k = 0;
  for (size_t u = pieces_.size(); u-- > 0;) {
    const Piece& p = pieces_[u];
    if (p.numel == 0) continue;
    Buffer& b = buffers_[k++ % buffers_.size()];
    file_->wait(b.ticket);                                           // its previous write is out
    cpu::cast_weights(type_, b.data, values + p.first, p.numel, 0);  // to nearest, as the optimizer casts
    const size_t bytes = dtype_bytes(type_, p.numel);
    std::memset(b.data + bytes, 0, p.bytes - bytes);
    b.ticket = file_->write_async(b.data, p.bytes, p.offset);
    b.unit = int(u);
    b.used = ++clock_;
  }
  file_->wait_all();
}

void PagedWeights::read(float* values) {
  drain();
  for (size_t u = 0; u < pieces_.size(); ++u) {
    const Piece& p = pieces_[u];
    if (p.numel == 0) continue;
    Buffer& b = *victim({});
    fill(b, int(u));
    b.used = ++clock_;
    file_->wait(b.ticket);
    float* out = values + p.first;
    if (type_ == DType::F32) {
      std::memcpy(out, b.data, p.numel * sizeof(float));
      continue;
    }
    const auto* in = reinterpret_cast<const uint16_t*>(b.data);
    const bool bf16 = type_ == DType::BF16;
    for (size_t i = 0; i < p.numel; ++i) out[i] = bf16 ? bf16_to_float(in[i]) : fp16_to_float(in[i]);
  }
}

}  // namespace anvil::offload
