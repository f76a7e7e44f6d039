#include "optim/optimizer.hpp"

#include <algorithm>
#include <cstring>

#include "optim/adafactor.hpp"
#include "optim/adamw.hpp"
#include "optim/adamw_8bit.hpp"
#include "optim/sgd.hpp"

namespace anvil {

const char* param_group_name(ParamGroup g) {
  switch (g) {
    case ParamGroup::Decay:
      return "decay";
    case ParamGroup::NoDecay:
      return "no_decay";
    case ParamGroup::Embedding:
      return "embedding";
  }
  return "?";
}

ParamRangeTable ParamRangeTable::from_layout(const ParamLayout& layout) {
  ParamRangeTable t;
  auto add = [&](size_t begin, uint8_t g) {
    if (!t.groups.empty() && t.groups.back() == g) return;  // merge with the previous range
    t.begins.push_back(begin);
    t.groups.push_back(g);
  };
  for (const ParamUnit& u : layout.units())
    for (size_t i : u.tensors) {
      const ParamTensor& p = layout.tensors()[i];
      if (!p.trainable)
        add(p.offset, kSkipGroup);
      else if (!p.decay)
        add(p.offset, uint8_t(ParamGroup::NoDecay));
      else
        add(p.offset, uint8_t(u.name == "embedding" ? ParamGroup::Embedding : ParamGroup::Decay));
    }
  return t;
}

ParamRangeTable ParamRangeTable::from_layout(const ParamLayout& layout, ParamRange shard) {
  const ParamRangeTable whole = from_layout(layout);
  ParamRangeTable t;
  bool frozen = false;
  for (size_t i = 0; i < whole.begins.size(); ++i) {
    const size_t range_end = i + 1 < whole.begins.size() ? whole.begins[i + 1] : layout.total_numel();
    const size_t b = std::max<size_t>(whole.begins[i], shard.begin),
                 e = std::min<size_t>(range_end, shard.end);
    const bool skip = whole.groups[i] == kSkipGroup;
    frozen = frozen || skip;
    // Trainable elements of the whole buffer before the shard.
    if (!skip)
      t.compact_base +=
          std::min<size_t>(range_end, shard.begin) - std::min<size_t>(whole.begins[i], shard.begin);
    if (b >= e) continue;
    t.begins.push_back(b - shard.begin);
    t.groups.push_back(whole.groups[i]);
    t.state_begins.push_back(t.state_numel);
    if (!skip) t.state_numel += e - b;
  }
  if (!frozen) {  // states mirror the buffer
    t.state_begins.clear();
    t.compact_base = shard.begin;
  }
  return t;
}

size_t ParamRangeTable::device_bytes() const {
  const size_t n = begins.size();
  return (n + state_begins.size()) * sizeof(uint64_t) + (n + 7) / 8 * 8;
}

Optimizer::Optimizer(const ParamLayout& layout, const OptimizerHyper& h, ParamRange shard)
    : layout_(layout), h_(h), shard_(shard), ranges_(ParamRangeTable::from_layout(layout, shard)) {
  ANVIL_ASSERT(shard.begin <= shard.end && shard.end <= layout.total_numel(),
               "optimizer shard [{}, {}) outside the {} parameters", shard.begin, shard.end,
               layout.total_numel());
}

void Optimizer::plan_memory(MemoryPlan& plan) {
  i_state_.clear();
  state_sizes_.clear();
  for (const auto& [name, bytes] : state_buffers()) {
    i_state_.push_back(plan.add(name, MemoryCategory::OptimizerState, bytes));
    state_sizes_.push_back(bytes);
  }
  i_ranges_ = plan.add("optimizer parameter groups", MemoryCategory::OptimizerState, ranges_.device_bytes());
}

void Optimizer::bind(const Arena& arena) {
  bind_pointers([&](size_t i) { return arena.get<void>(i); });
}

void Optimizer::bind(void* base, const MemoryPlan& plan) {
  bind_pointers(
      [&](size_t i) { return static_cast<void*>(static_cast<char*>(base) + plan.buffers()[i].offset); });
}

template <class Pointer>
void Optimizer::bind_pointers(Pointer&& pointer) {
  state_ptrs_.clear();
  for (size_t i : i_state_) state_ptrs_.push_back(pointer(i));
  range_table_ = pointer(i_ranges_);
  const auto* words = static_cast<const uint64_t*>(range_table_);
  const size_t n = ranges_.begins.size();
  range_begins_ = words;
  range_states_ = ranges_.state_begins.empty() ? nullptr : words + n;
  range_groups_ = reinterpret_cast<const uint8_t*>(words + n + ranges_.state_begins.size());
  bind_state(state_ptrs_);
}

void Optimizer::reset(Device& dev) {
  for (size_t i = 0; i < state_ptrs_.size(); ++i)
    if (state_sizes_[i]) dev.fill_zero(state_ptrs_[i], state_sizes_[i]);
  std::vector<char> host(ranges_.device_bytes(), 0);
  const size_t n = ranges_.begins.size(), ns = ranges_.state_begins.size();
  std::memcpy(host.data(), ranges_.begins.data(), n * sizeof(uint64_t));
  if (ns) std::memcpy(host.data() + n * sizeof(uint64_t), ranges_.state_begins.data(), ns * sizeof(uint64_t));
  std::memcpy(host.data() + (n + ns) * sizeof(uint64_t), ranges_.groups.data(), ranges_.groups.size());
  dev.copy_to_device(range_table_, host.data(), host.size());
  after_reset(dev);
}

size_t Optimizer::state_bytes() const {
  size_t total = MemoryPlan::aligned(ranges_.device_bytes());
  for (const auto& [name, bytes] : state_buffers()) total += MemoryPlan::aligned(bytes);
  return total;
}

void Optimizer::group_args(float lr, float out_lr[kNumParamGroups], float out_wd[kNumParamGroups]) const {
  for (int g = 0; g < kNumParamGroups; ++g) {
    out_lr[g] = lr * h_.lr_multiplier[g];
    out_wd[g] = ParamGroup(g) == ParamGroup::NoDecay ? 0.0f : h_.weight_decay;
  }
}

std::unique_ptr<Optimizer> make_optimizer(OptimizerKind kind, const ParamLayout& layout,
                                          const OptimizerHyper& h, std::optional<ParamRange> shard) {
  const ParamRange s = shard.value_or(layout.all());
  switch (kind) {
    case OptimizerKind::AdamW:
      return std::make_unique<AdamW>(layout, h, s);
    case OptimizerKind::Adafactor:
      return std::make_unique<Adafactor>(layout, h, h.vocab_size, s);
    case OptimizerKind::AdamW8bit:
      return std::make_unique<AdamW8bit>(layout, h, s);
    case OptimizerKind::SGD:
      return std::make_unique<Sgd>(layout, h, s);
  }
  ANVIL_THROW("unknown optimizer kind");
}

}  // namespace anvil
