#include "dist/zero_partition.hpp"

#include <algorithm>
#include <optional>

#include "anvil/error.hpp"
#include "optim/adamw_8bit.hpp"

namespace anvil::dist {
namespace {

// The allowed cuts inside one tensor [start, end): start + k * step for k >= 0 (none when `step` is 0).
struct Progression {
  size_t start = 0, step = 0, end = 0;
  std::optional<size_t> at_most(size_t x) const {
    if (step == 0 || start > x || start >= end) return std::nullopt;
    const size_t last = std::min(x, end - 1);
    return start + (last - start) / step * step;
  }
  std::optional<size_t> at_least(size_t x) const {
    if (step == 0 || start >= end) return std::nullopt;
    if (x <= start) return start;
    const size_t c = start + (x - start + step - 1) / step * step;
    return c < end ? std::optional<size_t>(c) : std::nullopt;
  }
};

size_t align_up(size_t x) {
  return (x + kShardAlign - 1) / kShardAlign * kShardAlign;
}

std::vector<Progression> progressions(const ParamLayout& layout, ShardCuts cuts) {
  std::vector<Progression> out;
  for (const ParamTensor& t : layout.tensors()) {
    const size_t s = t.offset, e = t.offset + t.numel();
    if (s == e) continue;
    switch (cuts) {
      case ShardCuts::Anywhere:
        out.push_back({align_up(s), kShardAlign, e});
        break;
      case ShardCuts::Blocks8bit:
        if (s % kShardAlign == 0) out.push_back({s, kAdamW8bitBlockSize, e});
        break;
      case ShardCuts::WholeTensors:
        if (s % kShardAlign == 0) out.push_back({s, e - s, e});
        break;
    }
  }
  return out;
}

}  // namespace

ShardCuts shard_cuts(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::AdamW:
    case OptimizerKind::SGD:
      return ShardCuts::Anywhere;
    case OptimizerKind::AdamW8bit:
      return ShardCuts::Blocks8bit;
    case OptimizerKind::Adafactor:
      return ShardCuts::WholeTensors;
  }
  return ShardCuts::WholeTensors;
}

ZeroPartition::ZeroPartition(const ParamLayout& layout, int world, ShardCuts cuts) {
  ANVIL_REQUIRE(world >= 1, "ZeRO partition over {} ranks", world);
  const size_t n = layout.total_numel();
  const std::vector<Progression> allowed = progressions(layout, cuts);
  cuts_.push_back(0);
  for (int r = 1; r < world; ++r) {
    const size_t prev = cuts_.back();
    const size_t target = std::max(prev, size_t((long double)(n)*r / world));
    // The allowed cut nearest the ideal one, not before the previous cut (the end always qualifies).
    size_t below = prev, above = n;
    for (const Progression& p : allowed) {
      if (auto c = p.at_most(target); c && *c >= prev) below = std::max(below, *c);
      if (auto c = p.at_least(target); c) above = std::min(above, *c);
    }
    cuts_.push_back(target - below <= above - target ? below : above);
  }
  cuts_.push_back(n);
}

std::vector<size_t> sub_group_cuts(const ParamLayout& layout, ParamRange range, size_t max_numel,
                                   ShardCuts cuts) {
  ANVIL_REQUIRE(max_numel >= 1, "sub-group size {} (elements)", max_numel);
  const std::vector<Progression> allowed = progressions(layout, cuts);
  std::vector<size_t> out{range.begin};
  while (range.end - out.back() > max_numel) {
    const size_t prev = out.back(), target = prev + max_numel;
    // The last allowed cut after `prev` and not past the target; else the first one past it.
    size_t below = prev, above = range.end;
    for (const Progression& p : allowed) {
      if (auto c = p.at_most(target); c && *c > prev) below = std::max(below, *c);
      if (auto c = p.at_least(target); c && *c > prev) above = std::min(above, *c);
    }
    const size_t cut = below > prev ? below : above;
    if (cut >= range.end) break;
    out.push_back(cut);
  }
  out.push_back(range.end);
  return out;
}

std::vector<size_t> ZeroPartition::counts() const {
  std::vector<size_t> c;
  for (int r = 0; r < world(); ++r) c.push_back(shard(r).numel());
  return c;
}

std::vector<size_t> ZeroPartition::counts_in(size_t begin, size_t end) const {
  std::vector<size_t> c;
  for (int r = 0; r < world(); ++r) {
    const ParamRange s = shard(r);
    const size_t b = std::max(begin, s.begin), e = std::min(end, s.end);
    c.push_back(b < e ? e - b : 0);
  }
  return c;
}

size_t ZeroPartition::max_shard() const {
  const std::vector<size_t> c = counts();
  return *std::max_element(c.begin(), c.end());
}

}  // namespace anvil::dist
