#include "model/param_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "anvil/rng.hpp"
#include "core/half.hpp"

namespace anvil {

namespace {
// Elements converted on the host at a time when the compute-type weights are written or read (128 MB of
// 16-bit values).
constexpr size_t kHostChunk = size_t(64) << 20;
}  // namespace

ParamStore::ParamStore(ParamLayout layout, OpsPrecision precision, bool training)
    : layout_(std::move(layout)),
      frozen_(layout_.frozen_ranges()),  // a LoRA layout comes with its base frozen
      master_range_(layout_.all()),
      weight_range_(layout_.all()),
      precision_(precision),
      training_(training),
      weight_elem_(dtype_bits(precision.compute) / 8),
      grad_elem_(dtype_bits(precision.grad) / 8),
      grad_range_(layout_.all()) {
  validate_ops_precision(precision);
}

void ParamStore::set_master_range(ParamRange r) {
  const size_t n = optimizer_layout().total_numel();
  ANVIL_ASSERT(r.begin <= r.end && r.end <= n, "master range [{}, {}) outside the {} parameters", r.begin,
               r.end, n);
  master_range_ = r;
}

namespace {

// Unit slots (gradients under ZeRO-2, weights under ZeRO-3) for units of `unit_numel` elements: the first
// unit's, the last unit's, then two shared in turn by the units between. Fills each unit's slot; returns each
// slot's size in elements.
std::vector<size_t> plan_unit_slots(const std::vector<size_t>& unit_numel, std::vector<int>& slot_of_unit) {
  const size_t n = unit_numel.size();
  ANVIL_ASSERT(n > 0, "unit slots: the layout has no units");
  std::vector<size_t> slot_numel = {unit_numel[0]};
  slot_of_unit.assign(n, 0);
  if (n > 1) {
    slot_numel.push_back(unit_numel[n - 1]);
    slot_of_unit[n - 1] = 1;
  }
  for (size_t u = 1; u + 1 < n; ++u) {
    const size_t s = 2 + (u - 1) % 2;
    if (slot_numel.size() <= s) slot_numel.push_back(0);
    slot_numel[s] = std::max(slot_numel[s], unit_numel[u]);
    slot_of_unit[u] = int(s);
  }
  return slot_numel;
}

std::vector<size_t> unit_sizes(const std::vector<ParamUnit>& units) {
  std::vector<size_t> n;
  for (const ParamUnit& u : units) n.push_back(u.numel);
  return n;
}

// Byte offsets of slots of `slot_numel` elements of `elem` bytes, each aligned; returns the total.
size_t slot_offsets(const std::vector<size_t>& slot_numel, size_t elem, std::vector<size_t>& offsets) {
  offsets.clear();
  size_t total = 0;
  for (size_t e : slot_numel) {
    offsets.push_back(total);
    total += MemoryPlan::aligned(e * elem);
  }
  return total;
}

}  // namespace

void ParamStore::set_grad_shard(ParamRange r, std::optional<DType> slot_type) {
  const size_t n = optimizer_layout().total_numel();
  ANVIL_ASSERT(r.begin <= r.end && r.end <= n, "gradient shard [{}, {}) outside the {} parameters", r.begin,
               r.end, n);
  ANVIL_ASSERT(training_, "set_grad_shard: a store planned without training has no gradients");
  grads_sharded_ = true;
  grad_range_ = r;
  slot_type_ = slot_type.value_or(precision_.grad);
  ANVIL_ASSERT(slot_type_ == precision_.grad || slot_type_ == precision_.compute,
               "unit gradients in {}: the gradient type ({}) or the compute type ({})",
               dtype_name(slot_type_), dtype_name(precision_.grad), dtype_name(precision_.compute));
  slot_elem_ = dtype_bytes(slot_type_, 1);
  std::vector<size_t> unit_numel;  // what each unit's slot holds
  for (int u = 0; u < int(layout_.units().size()); ++u) unit_numel.push_back(unit_grad_range(u).numel());
  slot_numel_ = plan_unit_slots(unit_numel, slot_of_unit_);
  slot_bytes_ = slot_offsets(slot_numel_, slot_elem_, slot_offset_);
  slot_unit_.assign(slot_numel_.size(), -1);
  grad_state_.assign(layout_.units().size(), GradState::Idle);
}

void ParamStore::set_weight_shard(ParamRange r) {
  ANVIL_ASSERT(r.begin <= r.end && r.end <= numel(), "weight shard [{}, {}) outside the {} parameters",
               r.begin, r.end, numel());
  ANVIL_ASSERT(optimizer_range(r) == master_range_,
               "weight shard [{}, {}) does not hold the master range [{}, {}) (its part of the optimizer "
               "layout is [{}, {}))",
               r.begin, r.end, master_range_.begin, master_range_.end, optimizer_range(r).begin,
               optimizer_range(r).end);
  ANVIL_ASSERT(!quant_, "sharded weights with a quantized store");
  weights_sharded_ = true;
  weight_range_ = r;
  const std::vector<size_t> slot_numel = plan_unit_slots(unit_sizes(layout_.units()), slot_of_unit_);
  wslot_bytes_ = slot_offsets(slot_numel, weight_elem_, wslot_offset_);
  wslots_.assign(slot_numel.size(), WeightSlot{});
  in_use_.assign(layout_.units().size(), false);
}

void ParamStore::keep_trainable_only() {
  ANVIL_ASSERT(training_,
               "keep_trainable_only: a store planned without training has no master weights or "
               "gradients");
  ANVIL_ASSERT(!master_sharded() && !grads_sharded_ && !weights_sharded_ && !quant_,
               "keep_trainable_only: with ZeRO shards or quantized weights");
  ANVIL_ASSERT(i_weights_ == SIZE_MAX, "keep_trainable_only after plan_memory");
  ANVIL_ASSERT(!trainable_, "keep_trainable_only: called twice");
  trainable_.emplace(layout_.trainable_part());
  size_t packed = 0;
  for (const ParamUnit& u : layout_.units()) {
    size_t sink_at = 0;  // each unit's frozen 1-D tensors from the sink's start
    for (size_t i : u.tensors) {
      const ParamTensor& t = layout_.tensors()[i];
      const size_t n = t.numel();
      if (t.trainable) {
        if (!runs_.empty() && runs_.back().end == t.offset)
          runs_.back().end += n;
        else
          runs_.push_back({t.offset, t.offset + n, packed});
        tensor_grads_.push_back({t.offset, GradPlace::Packed, packed});
        packed += n;
      } else if (t.shape.ndim == 1) {
        tensor_grads_.push_back({t.offset, GradPlace::Sink, sink_at});
        sink_at += n;
      } else {
        tensor_grads_.push_back({t.offset, GradPlace::None, 0});
      }
    }
    sink_numel_ = std::max(sink_numel_, sink_at);
  }
  ANVIL_ASSERT(packed == trainable_->total_numel(), "keep_trainable_only: {} trainable elements, {} packed",
               trainable_->total_numel(), packed);
  master_range_ = grad_range_ = trainable_->all();
}

size_t ParamStore::optimizer_index(size_t offset) const {
  ANVIL_ASSERT(offset <= numel(), "element {} outside the {} parameters", offset, numel());
  if (!trainable_) return offset;
  // The last run beginning at or before `offset`: inside it, or the trainable elements up to its end.
  auto it = std::upper_bound(runs_.begin(), runs_.end(), offset,
                             [](size_t o, const TrainableRun& r) { return o < r.begin; });
  if (it == runs_.begin()) return 0;
  --it;
  return it->packed + (std::min(offset, it->end) - it->begin);
}

std::vector<ParamRange> ParamStore::trainable_runs() const {
  std::vector<ParamRange> out;
  if (trainable_) {
    for (const TrainableRun& r : runs_) out.push_back({r.begin, r.end});
    return out;
  }
  size_t at = 0;
  for (const ParamRange& f : layout_.frozen_ranges()) {
    if (f.begin > at) out.push_back({at, f.begin});
    at = f.end;
  }
  if (at < numel()) out.push_back({at, numel()});
  return out;
}

ParamRange ParamStore::unit_grad_range(int unit) const {
  const ParamUnit& u = layout_.units()[size_t(unit)];
  return optimizer_range({u.offset, u.offset + u.numel});
}

void ParamStore::set_master_on_host() {
  ANVIL_ASSERT(training_, "set_master_on_host: a store planned without training has no master weights");
  ANVIL_ASSERT(!trainable_ && !quant_,
               "set_master_on_host: with trainable tensors only or quantized weights");
  ANVIL_ASSERT(i_weights_ == SIZE_MAX, "set_master_on_host after plan_memory");
  master_on_host_ = true;
}

void ParamStore::set_weights_on_host() {
  ANVIL_ASSERT(
      weights_sharded_ && master_on_host_,
      "set_weights_on_host: a store with sharded weights (ZeRO-3) and its master weights on the host");
  ANVIL_ASSERT(i_weights_ == SIZE_MAX, "set_weights_on_host after plan_memory");
  weights_on_host_ = true;
}

void ParamStore::set_grads_on_host() {
  ANVIL_ASSERT(
      grads_sharded_ && master_on_host_,
      "set_grads_on_host: a store with sharded gradients (ZeRO-2) and its master weights on the host");
  ANVIL_ASSERT(i_slots_ == SIZE_MAX, "set_grads_on_host after plan_memory");
  grads_on_host_ = true;
}

void ParamStore::bind_host_grads(void* host) {
  ANVIL_ASSERT(grads_on_host_ && (host || grad_range_.numel() == 0),
               "bind_host_grads: after set_grads_on_host, with host memory");
  grads_ = host;  // (bind leaves it: no device buffer is planned for them)
}

void ParamStore::bind_host_weights(void* host) {
  ANVIL_ASSERT(weights_on_host_ && host, "bind_host_weights: after set_weights_on_host, with host memory");
  host_weights_ = weights_ = host;
}

void ParamStore::bind_weight_pages(WeightPages* pages) {
  ANVIL_ASSERT(weights_on_host_ && pages && pages->numel() == weight_range_.numel(),
               "bind_weight_pages: after set_weights_on_host, with pages of the shard's {} elements",
               weight_range_.numel());
  pages_ = pages;
  host_weights_ = weights_ = nullptr;
}

void ParamStore::bind_host_master(float* host) {
  ANVIL_ASSERT(master_on_host_ && host, "bind_host_master: after set_master_on_host, with host memory");
  host_master_ = master_ = host;
}

void ParamStore::clear_grad_sink(Device& dev) const {
  if (sink_) dev.fill_zero(sink_, sink_numel_ * sink_elem_);
}

void* ParamStore::packed_grad_at(size_t offset) const {
  ANVIL_ASSERT(offset < numel(), "gradient view of element {} outside the {} parameters", offset, numel());
  auto it = std::upper_bound(tensor_grads_.begin(), tensor_grads_.end(), offset,
                             [](size_t o, const TensorGrad& t) { return o < t.begin; });
  --it;  // tensor_grads_[0].begin is 0
  const size_t i = it->at + (offset - it->begin);
  switch (it->place) {
    case GradPlace::Packed:
      return grads_sharded_ ? slot_grad_at(offset) : static_cast<char*>(grads_) + i * grad_elem_;
    case GradPlace::Sink:
      return sink_ + i * sink_elem_;
    case GradPlace::None:
      break;
  }
  return nullptr;
}

size_t ParamStore::packed_index(size_t offset) const {
  auto it = std::upper_bound(runs_.begin(), runs_.end(), offset,
                             [](size_t o, const TrainableRun& r) { return o < r.begin; });
  ANVIL_ASSERT(it != runs_.begin() && offset < std::prev(it)->end,
               "element {} of the layout is frozen: the store keeps no gradient for it", offset);
  --it;
  return it->packed + (offset - it->begin);
}

void ParamStore::set_comm_type(DType t) {
  ANVIL_ASSERT(training_, "set_comm_type: a store planned without training has no gradients");
  ANVIL_ASSERT(t == DType::F32 || t == DType::BF16 || t == DType::F16,
               "communication type {}: gradients are reduced in fp32, bf16 or fp16", dtype_name(t));
  comm_type_ = t;
}

DType ParamStore::comm_type() const {
  return comm_type_.value_or(written_grad_type());
}

void* ParamStore::comm_grad_at(size_t offset) const {
  if (!comm_staged()) return grad_at(offset);
  const size_t elem = dtype_bytes(comm_type(), 1);
  if (!grads_sharded_) return comm_ + (trainable_ ? packed_index(offset) : offset) * elem;
  const auto [s, i] = slot_place(offset);
  return comm_ + comm_slot_offset_[s] + i * elem;
}

void ParamStore::forget_gathered() const {
  for (WeightSlot& s : wslots_) s.valid = s.waited = false;
  std::fill(in_use_.begin(), in_use_.end(), false);
}

void ParamStore::plan_memory(MemoryPlan& plan, bool grads_elsewhere) {
  using M = MemoryCategory;
  // The weights buffer holds every tensor but the quantized ones.
  const size_t P = quant_ ? quant_->dense_numel() : numel();
  // Trainable tensors only: fp32 master weights of those, beside the weights of any type.
  if (trainable_)
    i_master_ =
        plan.add(master_sharded() ? "master weights (fp32, this rank's shard of the trainable tensors)"
                                  : "master weights (fp32, the trainable tensors)",
                 M::MasterWeights, master_range_.numel() * sizeof(float));
  if (precision_.compute != DType::F32) {
    // Only an optimizer step needs fp32 weights beside the 16-bit ones (offload: in host memory).
    if (training_ && !trainable_ && !master_on_host_)
      i_master_ =
          plan.add(master_sharded() ? "master weights (fp32, this rank's shard)" : "master weights (fp32)",
                   M::MasterWeights, master_range_.numel() * sizeof(float));
    if (!weights_on_host_)
      i_weights_ = plan.add(std::string("weights (") + std::string(dtype_name(precision_.compute)) +
                                (weights_sharded_ ? ", this rank's shard)"
                                 : quant_         ? ", the tensors not quantized)"
                                                  : ")"),
                            M::Weights, (weights_sharded_ ? weight_range_.numel() : P) * weight_elem_);
  } else if (!weights_on_host_) {
    i_weights_ = plan.add(weights_sharded_ ? "parameters (this rank's shard)"
                          : quant_         ? "parameters (the tensors not quantized)"
                                           : "parameters",
                          M::Weights, (weights_sharded_ ? weight_range_.numel() : P) * sizeof(float));
  }
  if (quant_) quant_->plan_memory(plan);
  if (weights_sharded_)
    i_wslots_ =
        plan.add(fmt::format("weight slots ({} units gathered)", wslots_.size()), M::Weights, wslot_bytes_);
  if (grads_sharded_) {
    ANVIL_ASSERT(!grads_elsewhere, "sharded gradients cannot live in activation memory");
    if (!grads_on_host_)
      i_grads_ = plan.add("gradients (this rank's shard, reduced)", M::Gradients, grad_bytes());
    i_slots_ = plan.add(fmt::format("gradient slots ({} units in backward)", slot_offset_.size()),
                        M::Gradients, slot_bytes_);
  } else if (training_ && !grads_elsewhere) {
    i_grads_ =
        plan.add(trainable_ ? "gradients (the trainable tensors)" : "gradients", M::Gradients, grad_bytes());
  }
  sink_elem_ = dtype_bytes(written_grad_type(), 1);  // (what backward writes into it)
  if (training_ && sink_numel_ > 0)
    i_sink_ = plan.add("gradient sink (frozen norms' gradients, discarded)", M::Gradients,
                       sink_numel_ * sink_elem_);
  if (training_ && comm_staged()) {
    // As communication_data_type spells it.
    const DType t = comm_type();
    const char* type = t == DType::BF16 ? "bf16" : t == DType::F16 ? "fp16" : "fp32";
    if (grads_sharded_) {
      const size_t bytes = slot_offsets(slot_numel_, dtype_bytes(comm_type(), 1), comm_slot_offset_);
      i_comm_ = plan.add(fmt::format("gradient slots in the communication type ({})", type), M::Communication,
                         bytes);
    } else {
      i_comm_ = plan.add(fmt::format("gradients in the communication type ({})", type), M::Communication,
                         dtype_bytes(comm_type(), trainable_ ? grad_range_.numel() : P));
    }
  }
}

void ParamStore::bind(const Arena& arena) {
  weights_ = weights_on_host_ ? host_weights_ : arena.get<void>(i_weights_);
  if (quant_) quant_->bind(arena);
  if (i_wslots_ != SIZE_MAX) wslot_mem_ = arena.get<char>(i_wslots_);
  master_ = master_on_host_ ? host_master_
            : trainable_    ? arena.get<float>(i_master_)
            : precision_.compute == DType::F32
                ? static_cast<float*>(weights_) + (weights_sharded_ ? 0 : master_range_.begin)
            : i_master_ != SIZE_MAX ? arena.get<float>(i_master_)
                                    : nullptr;
  if (i_grads_ != SIZE_MAX) grads_ = arena.get<void>(i_grads_);
  if (i_slots_ != SIZE_MAX) slots_ = arena.get<char>(i_slots_);
  if (i_comm_ != SIZE_MAX) comm_ = arena.get<char>(i_comm_);
  if (i_sink_ != SIZE_MAX) sink_ = arena.get<char>(i_sink_);
}

size_t ParamStore::held_slot(int unit) const {
  const size_t s = size_t(slot_of_unit_[size_t(unit)]);
  ANVIL_ASSERT(
      slot_unit_[s] == unit,
      "gradient view of unit '{}', whose slot it does not hold (begin_grads comes first; a slot holds "
      "one unit at a time)",
      layout_.units()[size_t(unit)].name);
  return s;
}

std::pair<size_t, size_t> ParamStore::slot_place(size_t offset) const {
  const int u = layout_.unit_of(offset);
  const size_t s = held_slot(u);
  // (A store of the trainable tensors only packs them in the slot.)
  if (trainable_) return {s, packed_index(offset) - unit_grad_range(u).begin};
  return {s, offset - layout_.units()[size_t(u)].offset};
}

void* ParamStore::unit_grads(int unit) const {
  ANVIL_ASSERT(grads_sharded_, "unit_grads: the gradients are not kept by unit");
  return slots_ + slot_offset_[held_slot(unit)];
}

void* ParamStore::comm_unit_grads(int unit) const {
  if (!comm_staged()) return unit_grads(unit);
  return comm_ + comm_slot_offset_[held_slot(unit)];
}

void* ParamStore::slot_grad_at(size_t offset) const {
  const auto [s, i] = slot_place(offset);
  return slots_ + slot_offset_[s] + i * slot_elem_;
}

void* ParamStore::reduced_grad_at(size_t offset) const {
  // (Whole gradients: the buffer backward writes, in the optimizer layout's numbering.)
  if (!grads_sharded_) return static_cast<char*>(grads_) + offset * grad_elem_;
  ANVIL_ASSERT(offset >= grad_range_.begin && offset <= grad_range_.end,
               "reduced gradient {} outside this rank's shard [{}, {})", offset, grad_range_.begin,
               grad_range_.end);
  return static_cast<char*>(grads_) + (offset - grad_range_.begin) * grad_elem_;
}

FrozenCount ParamStore::freeze(const std::vector<std::string>& patterns) {
  const FrozenCount n = freeze_parameters(layout_, patterns);
  frozen_ = layout_.frozen_ranges();
  return n;
}

void ParamStore::zero_frozen_grads(Device& dev) const {
  if (trainable_) return;  // no gradient is kept for a frozen tensor
  for (const ParamRange& f : frozen_) {
    const size_t b = std::max(f.begin, grad_range_.begin), e = std::min(f.end, grad_range_.end);
    if (b < e) dev.fill_zero(reduced_grad_at(b), (e - b) * grad_elem_);
  }
}

std::pair<void*, size_t> ParamStore::gradient_scratch() const {
  if (grads_sharded_) return {slots_, slot_bytes_};
  return {grads_, grad_bytes()};
}

void ParamStore::begin_grads(Device& dev, int unit) {
  if (!grads_sharded_) return;
  GradState& state = grad_state_[size_t(unit)];
  if (state == GradState::Writing) return;
  const size_t s = size_t(slot_of_unit_[size_t(unit)]);
  const int prev = slot_unit_[s];
  if (prev >= 0 && prev != unit) {
    ANVIL_ASSERT(grad_state_[size_t(prev)] != GradState::Writing,
                 "unit '{}' begins its gradients in the slot of unit '{}', whose gradients are not ready yet",
                 layout_.units()[size_t(unit)].name, layout_.units()[size_t(prev)].name);
    grad_state_[size_t(prev)] = GradState::Idle;
  }
  // Whatever the slot held (this unit's previous micro-batch included) goes out first.
  if (prev >= 0 && on_slot_reuse_) on_slot_reuse_(prev);
  slot_unit_[s] = unit;
  state = GradState::Writing;
  dev.fill_zero(slots_ + slot_offset_[s], unit_grad_range(unit).numel() * slot_elem_);
}

void* ParamStore::slot_weight_at(size_t offset) const {
  const int u = layout_.unit_of(offset);
  const ParamUnit& unit = layout_.units()[size_t(u)];
  const WeightSlot& slot = wslots_[size_t(slot_of_unit_[size_t(u)])];
  ANVIL_ASSERT(slot.unit == u && slot.valid && in_use_[size_t(u)],
               "weight view of unit '{}' outside its acquire / release (its weights are gathered by acquire)",
               unit.name);
  return wslot_mem_ + wslot_offset_[size_t(slot_of_unit_[size_t(u)])] + (offset - unit.offset) * weight_elem_;
}

void* ParamStore::own_weight_at(size_t offset) const {
  if (!weights_sharded_) return weight_at(offset);
  ANVIL_ASSERT(offset >= weight_range_.begin && offset < weight_range_.end,
               "element {} outside this rank's weight shard [{}, {})", offset, weight_range_.begin,
               weight_range_.end);
  return static_cast<char*>(weights_) + (offset - weight_range_.begin) * weight_elem_;
}

std::pair<void*, size_t> ParamStore::weight_scratch() const {
  ANVIL_ASSERT(weights_sharded_, "weight_scratch: the weights are not sharded (no slots)");
  forget_gathered();
  return {wslot_mem_, wslot_bytes_};
}

void ParamStore::gather_into(size_t s, int unit) const {
  WeightSlot& slot = wslots_[s];
  ANVIL_ASSERT(gatherer_, "unit '{}': sharded weights and no gatherer", layout_.units()[size_t(unit)].name);
  ANVIL_ASSERT(slot.unit < 0 || slot.unit == unit || !in_use_[size_t(slot.unit)],
               "unit '{}' needs the weight slot of unit '{}', which is still acquired (not released)",
               layout_.units()[size_t(unit)].name, layout_.units()[size_t(slot.unit)].name);
  slot.unit = unit;
  slot.valid = true;
  slot.waited = false;
  slot.ticket = gatherer_->gather(unit, wslot_mem_ + wslot_offset_[s]);
}

void ParamStore::acquire(int unit) const {
  if (!weights_sharded_) return;
  const size_t s = size_t(slot_of_unit_[size_t(unit)]);
  WeightSlot& slot = wslots_[s];
  if (slot.unit != unit || !slot.valid) gather_into(s, unit);
  if (!slot.waited) {
    gatherer_->wait(slot.ticket);
    slot.waited = true;
  }
  in_use_[size_t(unit)] = true;
}

void ParamStore::release(int unit) const {
  if (weights_sharded_) in_use_[size_t(unit)] = false;
}

void ParamStore::prefetch(int unit) const {
  if (!weights_sharded_) return;
  const size_t s = size_t(slot_of_unit_[size_t(unit)]);
  const WeightSlot& slot = wslots_[s];
  if (slot.unit == unit && slot.valid) return;
  if (slot.unit >= 0 && in_use_[size_t(slot.unit)]) return;  // busy: the unit's acquire gathers it
  gather_into(s, unit);
}

void ParamStore::grads_ready(int unit) {
  if (grads_sharded_) {
    GradState& state = grad_state_[size_t(unit)];
    ANVIL_ASSERT(state == GradState::Writing, "unit '{}': gradients ready without begin_grads",
                 layout_.units()[size_t(unit)].name);
    state = GradState::Ready;
  }
  if (on_grads_ready_) on_grads_ready_(unit);
}

float* ParamStore::grads_f32() const {
  ANVIL_ASSERT(precision_.grad == DType::F32, "grads(): the gradients are {}, not F32",
               dtype_name(precision_.grad));
  return static_cast<float*>(grads_);
}

void ParamStore::quantize(WeightStorage s) {
  ANVIL_ASSERT(!training_ || trainable_,
               "quantized weights train only as a frozen base beside a store of the trainable tensors only");
  ANVIL_ASSERT(!weights_sharded_ && !grads_sharded_ && !master_sharded(),
               "quantized weights with a sharded store");
  ANVIL_ASSERT(i_weights_ == SIZE_MAX, "quantize after plan_memory");
  ANVIL_ASSERT(!quant_, "the store is quantized already");
  quant_.emplace(layout_, s, precision_.compute);
  for (const ParamTensor& t : layout_.tensors())
    ANVIL_ASSERT(t.storage == WeightStorage::Compute || !t.trainable, "quantized tensor {} is trainable",
                 t.name);
}

WeightView ParamStore::linear_weight(size_t offset) const {
  if (quant_)
    if (const QuantizedMatrix* m = quant_->matrix_at(offset)) return {nullptr, m, quant_->workspace()};
  return {weight_at(offset)};
}

void ParamStore::upload(Device& dev, const float* host) const {
  if (quant_) {
    std::vector<float> dense(quant_->dense_numel());
    size_t at = 0;
    for (const ParamRange& r : quant_->dense_ranges()) {
      std::copy_n(host + r.begin, r.numel(), dense.data() + at);
      at += r.numel();
    }
    forget_gathered();
    write_weights(dev, dense.data(), dense.size());
    quant_->upload(dev, host);
    if (trainable_) upload_master(dev, host);
    return;
  }
  // Sharded weights: the shard's only.
  upload_values(dev, host + weight_range_.begin, weight_range_);
}

void ParamStore::upload_own(Device& dev, const float* values) const {
  ANVIL_ASSERT(!quant_, "upload_own: a quantized store uploads the whole model");
  upload_values(dev, values, weight_range_);
}

void ParamStore::upload_values(Device& dev, const float* values, ParamRange w) const {
  ANVIL_ASSERT(w == weight_range_, "upload of [{}, {}): the store keeps weights [{}, {})", w.begin, w.end,
               weight_range_.begin, weight_range_.end);
  forget_gathered();
  if (master_on_host_) {
    ANVIL_ASSERT(host_master_, "upload: the master weights' host memory is not bound (bind_host_master)");
    // (ZeRO: the rank's shard of the master weights; values covers w.)
    if (values != host_master_)
      std::copy_n(values + (master_range_.begin - w.begin), master_range_.numel(), host_master_);
  } else if (trainable_) {
    upload_master(dev, values, w.begin);
  } else if (master_ && precision_.compute != DType::F32) {
    dev.copy_to_device(master_, values + (master_range_.begin - w.begin),
                       master_range_.numel() * sizeof(float));
  }
  write_weights(dev, values, w.numel());
}

void ParamStore::upload_master(Device& dev, const float* host, size_t first) const {
  std::vector<float> packed(master_range_.numel());
  for (const TrainableRun& run : runs_) {
    // The run's part in the master range (a ZeRO shard: inside the weights uploaded, from `first` on).
    const size_t lo = std::max(run.packed, master_range_.begin);
    const size_t hi = std::min(run.packed + (run.end - run.begin), master_range_.end);
    if (lo >= hi) continue;
    const size_t at = run.begin + (lo - run.packed);
    ANVIL_ASSERT(at >= first, "upload: master element {} lies before the values given (from {})", at, first);
    std::copy_n(host + (at - first), hi - lo, packed.data() + (lo - master_range_.begin));
  }
  if (!packed.empty()) dev.copy_to_device(master_, packed.data(), packed.size() * sizeof(float));
}

void ParamStore::download_master(Device& dev, float* host) const {
  ANVIL_ASSERT(!master_sharded(), "download: sharded master weights are gathered (set_master_gather)");
  std::vector<float> packed(master_range_.numel());
  dev.copy_to_host(packed.data(), master_, packed.size() * sizeof(float));
  for (const TrainableRun& run : runs_)
    std::copy_n(packed.data() + run.packed, run.end - run.begin, host + run.begin);
}

void ParamStore::write_weights(Device& dev, const float* values, size_t n) const {
  if (pages_) {  // parameter offload to NVMe: the swap file holds them
    ANVIL_ASSERT(n == pages_->numel(), "upload: {} weights for pages of {}", n, pages_->numel());
    pages_->write(values);
    return;
  }
  if (weights_on_host_) {  // parameter offload: the host holds them
    ANVIL_ASSERT(host_weights_, "upload: the weights' host memory is not bound (bind_host_weights)");
    if (precision_.compute == DType::F32) {
      std::copy_n(values, n, static_cast<float*>(weights_));
      return;
    }
    const bool bf16 = precision_.compute == DType::BF16;
    auto* out = static_cast<uint16_t*>(weights_);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i)
      out[i] = bf16 ? float_to_bf16(values[i]) : float_to_fp16(values[i]);
    return;
  }
  if (precision_.compute == DType::F32) {
    dev.copy_to_device(weights_, values, n * sizeof(float));
    return;
  }
  // In chunks, so that the host holds one chunk of 16-bit values at a time, not the model's.
  const bool bf16 = precision_.compute == DType::BF16;
  std::vector<uint16_t> half(std::min(n, kHostChunk));
  for (size_t at = 0; at < n; at += kHostChunk) {
    const size_t m = std::min(kHostChunk, n - at);
    const float* v = values + at;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(m); ++i)
      half[size_t(i)] = bf16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
    dev.copy_to_device(static_cast<uint16_t*>(weights_) + at, half.data(), m * sizeof(uint16_t));
  }
}

bool ParamStore::download_gathers() const {
  // (download's branches, in its order)
  if (trainable_) return master_sharded() || weights_sharded_;
  if (quant_ || (master_on_host_ && !master_sharded())) return false;
  if (precision_.compute == DType::F32 && !weights_sharded_) return false;
  return master_ && master_sharded();
}

void ParamStore::join_download(Device& dev) const {
  if (!download_gathers()) return;
  ANVIL_ASSERT(gather_, "download: the store is sharded and no gather is set");
  gather_(dev, nullptr);
}

void ParamStore::download_trainable(Device& dev, float* packed) const {
  ANVIL_ASSERT(trainable_, "download_trainable: a store of the trainable tensors only");
  if (master_sharded()) {
    ANVIL_ASSERT(trainable_gather_, "download_trainable: the store is sharded and no gather is set");
    trainable_gather_(dev, packed);
    return;
  }
  if (packed) dev.copy_to_host(packed, master_, master_range_.numel() * sizeof(float));
}

void ParamStore::download(Device& dev, float* host) const {
  if (download_gathers()) {  // ZeRO: a collective
    ANVIL_ASSERT(gather_, "download: the store is sharded and no gather is set");
    gather_(dev, host);
    return;
  }
  if (quant_) {
    read_own_weights(dev, host);
    if (trainable_) download_master(dev, host);
    return;
  }
  const size_t n = numel();
  if (master_on_host_) {
    ANVIL_ASSERT(host_master_, "download: the master weights' host memory is not bound (bind_host_master)");
    std::copy_n(host_master_, n, host);
    return;
  }
  if (trainable_) {  // the frozen tensors as the weights hold them, the trainable ones from the master
                     // weights
    read_weights(dev, host, n);
    download_master(dev, host);
    return;
  }
  if (precision_.compute == DType::F32 && !weights_sharded_) {
    read_weights(dev, host, n);
    return;
  }
  ANVIL_ASSERT(master_ || !weights_sharded_, "download: sharded weights without master weights");
  if (master_) {
    dev.copy_to_host(host, master_, n * sizeof(float));
    return;
  }
  read_weights(dev, host, n);
}

void ParamStore::read_own_weights(Device& dev, float* values) const {
  if (!quant_) {
    read_weights(dev, values, weight_range_.numel());
    return;
  }
  // The dense tensors into their places, the quantized matrices dequantized.
  std::vector<float> dense(quant_->dense_numel());
  read_weights(dev, dense.data(), dense.size());
  size_t at = 0;
  for (const ParamRange& r : quant_->dense_ranges()) {
    std::copy_n(dense.data() + at, r.numel(), values + r.begin);
    at += r.numel();
  }
  quant_->download(dev, values);
}

void ParamStore::read_weights(Device& dev, float* values, size_t n) const {
  if (pages_) {  // parameter offload to NVMe: the swap file holds them
    ANVIL_ASSERT(n == pages_->numel(), "download: {} weights from pages of {}", n, pages_->numel());
    pages_->read(values);
    return;
  }
  if (weights_on_host_) {  // parameter offload: the host holds them
    const bool bf16 = precision_.compute == DType::BF16, f32 = precision_.compute == DType::F32;
    const auto* in = static_cast<const uint16_t*>(weights_);
    if (f32) {
      std::copy_n(static_cast<const float*>(weights_), n, values);
      return;
    }
    for (size_t i = 0; i < n; ++i) values[i] = bf16 ? bf16_to_float(in[i]) : fp16_to_float(in[i]);
    return;
  }
  if (precision_.compute == DType::F32) {
    dev.copy_to_host(values, weights_, n * sizeof(float));
    return;
  }
  const bool bf16 = precision_.compute == DType::BF16;
  std::vector<uint16_t> half(std::min(n, kHostChunk));
  for (size_t at = 0; at < n; at += kHostChunk) {
    const size_t m = std::min(kHostChunk, n - at);
    dev.copy_to_host(half.data(), static_cast<const uint16_t*>(weights_) + at, m * sizeof(uint16_t));
    for (size_t i = 0; i < m; ++i) values[at + i] = bf16 ? bf16_to_float(half[i]) : fp16_to_float(half[i]);
  }
}

// The tensors draw normals from one splitmix64 stream in layout order, one per element of their first
// hf_rows rows (Rng::normal: two words each). Draw k of that stream is Rng(seed + 2k * golden).normal(), so
// every element's value is known without drawing the ones before it: the elements are filled in parallel,
// and a store with sharded weights (ZeRO-3) draws its shard only. The values are those of drawing the whole
// stream in order.
void ParamStore::init(uint64_t seed, const ParamInit& how, Device& dev) const {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // splitmix64's increment (anvil/rng.hpp)
  constexpr uint64_t kLoraStream = 0x4C6F52414C6F5241ull;
  const ParamRange r = weight_range_;
  // Offloaded master weights: drawn where they stay (no second copy of the model on the host).
  std::vector<float> own;
  float* values = master_on_host_ && host_master_ && master_range_ == r ? host_master_
                                                                        : (own.resize(r.numel()), own.data());
  std::fill_n(values, r.numel(), 0.0f);
  uint64_t drawn = 0;  // normals drawn before the tensor
  for (const ParamTensor& t : layout_.tensors()) {
    const size_t row = t.shape.ndim > 1 ? size_t(t.shape[1]) : 1;
    const size_t n = t.hf_rows >= 0 ? size_t(t.hf_rows) * row : t.numel();  // padded rows stay 0
    const bool normal = t.init == ParamTensor::Init::Normal || t.init == ParamTensor::Init::NormalResidual;
    const float scale = t.init == ParamTensor::Init::Normal ? how.std : how.residual_std;
    const size_t lo = std::max(t.offset, r.begin), hi = std::min(t.offset + n, r.end);
    if (lo < hi) {
      float* p = values + (lo - r.begin);
      if (normal) {
        const uint64_t first = drawn + (lo - t.offset);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < int64_t(hi - lo); ++i) {
          Rng g(seed + 2 * (first + uint64_t(i)) * kGolden);
          p[i] = scale * g.normal();
        }
      } else if (t.init == ParamTensor::Init::Ones) {
        std::fill_n(p, hi - lo, 1.0f);
      } else if (t.init == ParamTensor::Init::LoraA) {
        // Uniform in +-1/sqrt(in), element k of the tensor from its own stream (seed, tensor offset): the
        // base tensors' normals do not depend on whether adapters are there.
        const float bound = 1.0f / std::sqrt(float(row));
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < int64_t(hi - lo); ++i) {
          Rng g((seed ^ kLoraStream) + 2 * (lo + uint64_t(i)) * kGolden);
          p[i] = bound * (2.0f * g.uniform() - 1.0f);
        }
      }
    }
    if (normal) drawn += n;
    if (t.role == TensorRole::TokenEmbedding && how.zero_row >= 0) {
      const size_t z0 = std::max(t.offset + size_t(how.zero_row) * row, r.begin);
      const size_t z1 = std::min(t.offset + size_t(how.zero_row + 1) * row, r.end);
      if (z0 < z1) std::fill_n(values + (z0 - r.begin), z1 - z0, 0.0f);
    }
  }
  if (quant_)
    upload(dev, values);
  else
    upload_values(dev, values, r);
}

void ParamStore::sync(Ops& ops, uint64_t rounding_seed, const StepValues* step_values) const {
  forget_gathered();  // the slots hold the weights before this update
  ANVIL_ASSERT(!master_on_host_,
               "sync: the master weights are in host memory; the host optimizer casts them");
  if (trainable_) {  // each run of trainable elements into its place in the weights
    ANVIL_ASSERT(
        rounding_seed == 0,
        "sync: stochastic rounding draws by layout position; the store keeps its trainable tensors only");
    // (ZeRO: the runs' part in the master range, which lies in this rank's weight shard.)
    for (const TrainableRun& run : runs_) {
      const size_t lo = std::max(run.packed, master_range_.begin);
      const size_t hi = std::min(run.packed + (run.end - run.begin), master_range_.end);
      if (lo >= hi) continue;
      void* out = own_weight_at(run.begin + (lo - run.packed));
      const float* in = master_ + (lo - master_range_.begin);
      if (precision_.compute == DType::F32)
        ops.device().copy_on_device(out, in, (hi - lo) * sizeof(float));
      else
        ops.cast_weights(out, in, hi - lo, 0, step_values);
    }
    return;
  }
  if (precision_.compute == DType::F32) return;
  ANVIL_ASSERT(master_, "sync: a store planned without training has no master weights to cast");
  if (master_range_.numel() == 0) return;  // an empty ZeRO shard
  // With step values the kernel reads the seed there (the trainer writes the shard's seed into them).
  void* out = weights_sharded_ ? weights_ : weight_at(master_range_.begin);
  ops.cast_weights(out, master_, master_range_.numel(),
                   step_values ? rounding_seed : shard_rounding_seed(rounding_seed, master_range_.begin),
                   step_values);
}

}  // namespace anvil
