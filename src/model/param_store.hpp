// The parameters of a model in one place (DESIGN: "ParamStore"): the compute-type weights, the fp32 master
// weights (16-bit compute, training only: inference keeps the compute-type weights alone) and the gradients
// of every unit of a ParamLayout, planned once from the layout table. Models read views of it and never plan
// or own parameter memory; the optimizer's state mirrors the same flat layout (Optimizer::state_buffers).
//
// Per-unit hooks (DESIGN: "How the pieces meet"): a model calls acquire(unit) before a unit's forward or
// backward reads its weights, and grads_ready(unit) once the unit's gradients of a micro-batch are complete.
// With one process and everything on the device both are no-ops; partitioned parameters (ZeRO-3) gather
// in acquire, data parallelism reduces in the grads_ready hook, offload streams there. A model that takes
// every gradient view after begin_grads(unit) (Model::grads_by_unit) lets the store keep gradients by unit
// (ZeRO stage 2, set_grad_shard): then begin_grads hands the unit a zeroed slot, and grad_at views point
// into it until the slot goes to another unit.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "anvil/memory_plan.hpp"
#include "kernels/ops.hpp"
#include "model/freeze.hpp"
#include "model/linear.hpp"
#include "model/param_layout.hpp"
#include "model/quantized_weights.hpp"
#include "model/weight_pages.hpp"
#include "runtime/arena.hpp"

namespace anvil {

// How a store with sharded weights (ZeRO stage 3) fills a unit's slot: dist::ZeroSync, over the ranks.
class WeightGatherer {
 public:
  virtual ~WeightGatherer() = default;
  // Queues the gather of `unit`'s compute-type weights into `slot` (the unit's size), after the compute
  // queued so far (the slot's previous reader); returns a ticket for wait().
  virtual uint64_t gather(int unit, void* slot) = 0;
  // Compute queued after this call waits for the gather of `ticket`.
  virtual void wait(uint64_t ticket) = 0;
};

// How a layout's tensors start: Normal ~ N(0, std), NormalResidual ~ N(0, residual_std), Ones, Zeros; rows
// past a tensor's hf_rows stay 0; `zero_row` (>= 0) of the TokenEmbedding stays 0 too (HF's padding_idx).
struct ParamInit {
  float std = 0.02f;
  float residual_std = 0.02f;
  int64_t zero_row = -1;
};

class ParamStore {
 public:
  // Gradients are planned with `training` (in precision.grad). Each tensor is stored in the compute type,
  // unless quantize() keeps the block Linear weights quantized (inference).
  ParamStore(ParamLayout layout, OpsPrecision precision, bool training);

  // ZeRO stages 1-2 (before plan_memory): this rank keeps the fp32 master weights of `r` only (in
  // optimizer_layout()'s numbering: a store of the trainable tensors only shards those); the compute-type
  // weights stay whole. For an fp32 compute type the weights are the master weights, so nothing changes in
  // memory: master() points at `r`'s first element of them.
  void set_master_range(ParamRange r);
  // The range the master weights cover (the whole buffer unless set_master_range was called), in
  // optimizer_layout()'s numbering.
  ParamRange master_range() const { return master_range_; }
  bool master_sharded() const { return master_range_ != optimizer_layout().all(); }
  // Sharded 16-bit master weights: how download() obtains the other ranks' master weights (a collective:
  // every rank must download at the same time). Without it, download() of a sharded store throws.
  void set_master_gather(std::function<void(Device&, float* host)> gather) { gather_ = std::move(gather); }
  // The same for download_trainable of a sharded store of the trainable tensors only.
  void set_trainable_gather(std::function<void(Device&, float* packed)> gather) {
    trainable_gather_ = std::move(gather);
  }

  // ZeRO stage 2 (before plan_memory; only for a model whose gradient writes all follow begin_grads): the
  // gradients kept from backward to the optimizer cover `r` only (this rank's reduced shard: grads(),
  // reduced_grad_at; in optimizer_layout()'s numbering, as master_range()). Backward writes each unit's
  // gradients into a unit-sized slot instead of the whole buffer: the layout's first and last units have a
  // slot each (a tied head's gradient and the loss's head gradient are written in forward and live through
  // backward), the units between them share two slots in turn (one written while the other's reduction runs).
  // Before a slot goes to another unit, the slot-reuse hook moves the previous unit's reduced piece out
  // (dist::GradSync); at each micro-batch's end every slot must have been emptied so (the hook is then a
  // no-op for it). The slots hold `slot_type`: the gradient type (default), or the 16-bit compute type
  // (backward_grad_dtype: half the slots' memory; the shard keeps the gradient type, so accumulation over
  // micro-batches stays in it). A store of the trainable tensors only keeps the unit's trainable gradients in
  // its slot, packed as in the optimizer layout (unit_grad_range), and its frozen 1-D tensors' in the sink.
  void set_grad_shard(ParamRange r, std::optional<DType> slot_type = std::nullopt);
  bool grads_sharded() const { return grads_sharded_; }
  // The range grads() covers: set_grad_shard's, else the whole buffer.
  ParamRange grad_range() const { return grad_range_; }

  // ZeRO stage 3 (before plan_memory; after set_master_range and set_grad_shard; a model that acquires every
  // unit before it reads the unit's weights and releases it after): the compute-type weights of `r` (in the
  // layout's numbering) only are kept (weights(); for fp32 compute they are the master weights). The master
  // range must be `r`'s part of the optimizer layout (optimizer_range(r)): each rank casts its master
  // weights into its own weight shard. acquire(unit) gathers the unit into a slot laid out as the gradient
  // slots (first and last units their own, the units between two in turn) through the gatherer, unless the
  // slot holds it from earlier in the pass; prefetch(unit) queues that gather early, so that it overlaps the
  // compute before the unit's acquire.
  void set_weight_shard(ParamRange r);
  bool weights_sharded() const { return weights_sharded_; }
  // The compute-type weights this store keeps, in the layout's numbering: set_weight_shard's, else all.
  ParamRange weight_range() const { return weight_range_; }
  // Sharded weights: the weight slots' memory, free between steps (a collective gathering the whole model
  // stages through it); forgets the gathered units.
  std::pair<void*, size_t> weight_scratch() const;
  void set_weight_gatherer(WeightGatherer* g) { gatherer_ = g; }
  // The type backward writes gradients in: the slots' under sharded gradients, else the gradient type.
  DType written_grad_type() const { return grads_sharded_ ? slot_type_ : precision_.grad; }
  // Data parallelism reduces the gradients in `t` (communication_data_type; before plan_memory, after
  // set_grad_shard; default: written_grad_type()). For another type the store plans a staging buffer of `t`
  // beside what backward writes: the whole buffer's size, or the gradient slots' (sharded gradients); the
  // reduction converts into it, reduces there and converts back (dist::GradSync).
  void set_comm_type(DType t);
  DType comm_type() const;
  bool comm_staged() const { return comm_type() != written_grad_type(); }
  // Element `offset` of the buffer the reduction runs in: the staging buffer (in comm_type(); sharded
  // gradients: in the slot of offset's unit, which must hold that unit), else grad_at(offset) itself.
  void* comm_grad_at(size_t offset) const;

  // Freezing (before plan_memory, and before an optimizer is made from layout()): marks the tensors that
  // match `patterns` frozen (model/freeze.hpp, which names the errors); returns what is frozen.
  FrozenCount freeze(const std::vector<std::string>& patterns);
  bool has_frozen() const { return !frozen_.empty(); }
  // Zeroes the frozen tensors' part of the gradients kept for the optimizer (grad_range()), queued on `dev`.
  // The step calls it before the norm, so that gradients a model computes anyway (a norm weight's; a fused
  // matrix frozen in part) count in neither the norm nor the update. No-op without frozen tensors.
  void zero_frozen_grads(Device& dev) const;

  // Trainable tensors only (before plan_memory and the ZeRO shards; training): the fp32 master weights, the
  // gradients and so the optimizer cover the trainable tensors alone, packed in layout order
  // (optimizer_layout(): master_range(), grad_range(), grads(), reduced_grad_at() and the optimizer index
  // that space); the frozen tensors live in the compute-type weights only. A LoRA base then costs its weights
  // and nothing else (under ZeRO stage 3 its shard of them). The gradient views (grad_at) of trainable
  // tensors point into the packed gradients; those of frozen 1-D tensors (norm weights and biases, whose
  // gradients the norm kernels compute anyway) into a sink whose values are discarded (laid out per unit, so
  // a unit's views do not overlap); other frozen tensors have none (null). For a model that asks for no other
  // frozen gradient and writes no gradient across a trainable tensor's end: the decoders under LoRA (Linear
  // weight gradients skipped, blocks below the first adapter not differentiated, every adapter trainable).
  void keep_trainable_only();
  bool trainable_only() const { return trainable_.has_value(); }
  // The layout the optimizer updates: layout(), or its trainable part (keep_trainable_only).
  const ParamLayout& optimizer_layout() const { return trainable_ ? *trainable_ : layout_; }
  // The optimizer layout's index of the first of its elements at or after element `offset` of the layout
  // (`offset` itself without keep_trainable_only; its end allowed), and a layout range's part of it.
  size_t optimizer_index(size_t offset) const;
  ParamRange optimizer_range(ParamRange r) const {
    return {optimizer_index(r.begin), optimizer_index(r.end)};
  }
  // The layout's runs of trainable elements (keep_trainable_only: consecutive in the optimizer layout too).
  std::vector<ParamRange> trainable_runs() const;
  // A unit's gradients in the optimizer layout's numbering: what its slot holds under sharded gradients.
  ParamRange unit_grad_range(int unit) const;
  // Sharded gradients: the start of `unit`'s slot (which must hold it), as backward writes it and in the
  // communication type (comm_grad_at's staging slot, or the slot itself).
  void* unit_grads(int unit) const;
  void* comm_unit_grads(int unit) const;
  // Optimizer offload (before plan_memory; training; not with keep_trainable_only or quantize): the fp32
  // master weights of master_range() (the whole layout, or this rank's ZeRO shard) live in host memory,
  // outside the device plan; bind_host_master gives it (master_range().numel() floats,
  // offload::HostOptimizer's; before upload). upload and download read and write them there (a sharded
  // store's download gathers through set_master_gather); the cast into the compute-type weights after an
  // update is the host optimizer's (sync refuses).
  void set_master_on_host();
  void bind_host_master(float* host);
  bool master_on_host() const { return master_on_host_; }
  // Parameter offload (before plan_memory; after set_weight_shard and set_master_on_host): the shard of the
  // compute-type weights lives in pinned host memory, outside the device plan; bind_host_weights gives it
  // (master_range().numel() elements of the compute type; before upload). Gathers copy from there
  // (dist::ZeroSync), upload and download write and read it directly, the host optimizer writes the update
  // there.
  void set_weights_on_host();
  void bind_host_weights(void* host);
  bool weights_on_host() const { return weights_on_host_; }
  // Parameter offload to NVMe: instead of bind_host_weights, the shard lives in `pages` (not owned; its
  // numel() is the shard's), reached unit by unit: weights() is null, the gathers read pages->piece(unit),
  // upload and download go through pages->write / read.
  void bind_weight_pages(WeightPages* pages);
  WeightPages* weight_pages() const { return pages_; }
  // Gradient offload (before plan_memory; after set_grad_shard and set_master_on_host): the reduced
  // gradients of the shard (grads(), reduced_grad_at) live in pinned host memory, outside the device plan,
  // as DeepSpeed's ZeRO-Offload keeps its gradient partition; bind_host_grads gives it (grad_range().numel()
  // elements of the gradient type, offload::HostOptimizer's). The device reaches it through unified
  // addressing: dist::GradSync writes each unit's reduced piece there (the step's first micro-batch
  // overwrites, the others add; a CUDA step sums the norm's squares as the last one writes them) and the
  // host optimizer reads it in place. It is never zeroed on the device (a device memset of host memory is not
  // portable): the first micro-batch overwrites every trainable element of the shard; frozen tensors'
  // gradients are zeroed by zero_frozen_grads on the CPU backend only (a CUDA step leaves them out of the
  // norm as it sums it, and the optimizer never reads them).
  void set_grads_on_host();
  void bind_host_grads(void* host);
  bool grads_on_host() const { return grads_on_host_; }

  // Zeroes the gradient sink (keep_trainable_only; else nothing), queued on `dev`: once, before the first
  // step, so that what the kernels add into it stays finite.
  void clear_grad_sink(Device& dev) const;

  // Quantized storage (before plan_memory and the ZeRO shards, whose weights stay whole: stages 1-2; a store
  // without training, or one that keeps its trainable tensors only and whose block Linear weights are frozen:
  // QLoRA): keeps the Linear weights of
  // the blocks as `s` (Int8 or NF4; model/quantized_weights.hpp) and the rest in the compute type. Views of
  // the quantized tensors are taken with linear_weight only.
  void quantize(WeightStorage s);
  // The quantized part, or null (everything in the compute type).
  const QuantizedWeights* quantized() const { return quant_ ? &*quant_ : nullptr; }
  // The weight of the Linear whose weight starts at `offset`, as stored: quantized, or dense (weight_at).
  WeightView linear_weight(size_t offset) const;

  // The weights changed (an optimizer step) or a new micro-batch begins: every slot must gather again (a
  // CUDA graph of a micro-batch replays its gathers, so each one starts from none). Releases every unit.
  void forget_gathered() const;

  // Adds the weights, master weights (16-bit compute, training) and, unless `grads_elsewhere`, the gradients.
  // A model that places the gradients itself (BERT's gradients in dead activation memory) says so and
  // hands their memory over with bind_grads.
  void plan_memory(MemoryPlan& plan, bool grads_elsewhere = false);
  void bind(const Arena& arena);
  void bind_grads(void* grads) { grads_ = grads; }

  const ParamLayout& layout() const { return layout_; }
  OpsPrecision precision() const { return precision_; }
  size_t numel() const { return layout_.total_numel(); }
  bool training() const { return training_; }

  // The flat buffers: fp32 master weights (the weights themselves for fp32 compute; null for a 16-bit store
  // without training; element 0 is master_range().begin), the compute-type weights, and the gradients kept
  // for the optimizer in the gradient type (element 0 is grad_range().begin; grads_f32 for fp32 gradients
  // only).
  float* master() const { return master_; }
  // The compute-type weights: the whole buffer, or this rank's shard (stage 3; element 0 is
  // master_range().begin).
  void* weights() const { return weights_; }
  void* grads() const { return grads_; }
  float* grads_f32() const;
  size_t grad_bytes() const { return dtype_bytes(precision_.grad, grad_range_.numel()); }
  // Views: element `offset` (in floats of the layout) of the weights / the gradients backward writes
  // (sharded gradients: in the slot of offset's unit, which must hold that unit).
  void* weight_at(size_t offset) const {
    return weights_sharded_ ? slot_weight_at(offset)
                            : static_cast<char*>(weights_) +
                                  (quant_ ? quant_->dense_index(offset) : offset) * weight_elem_;
  }
  void* grad_at(size_t offset) const {
    return trainable_       ? packed_grad_at(offset)
           : grads_sharded_ ? slot_grad_at(offset)
                            : static_cast<char*>(grads_) + offset * grad_elem_;
  }
  void* weight(const ParamTensor& t) const { return weight_at(t.offset); }
  void* grad(const ParamTensor& t) const { return grad_at(t.offset); }
  // The gradients the optimizer reads (after the reduction): element `offset` of grads() (inside
  // grad_range(), in optimizer_layout()'s numbering; its end allowed).
  void* reduced_grad_at(size_t offset) const;
  // Gradient memory free between steps, for staging (the whole buffer, or the slots when sharded).
  std::pair<void*, size_t> gradient_scratch() const;

  // Sets the weights from fp32 host values in the flat layout: the master weights (where kept: master_range)
  // and their round-to-nearest compute-type copy.
  void upload(Device& dev, const float* host) const;
  // The same from the values of weight_range() alone (`values[i]` is element weight_range().begin + i): what
  // a rank of a sharded store reads of a model, without the rest (not for quantized stores).
  void upload_own(Device& dev, const float* values) const;
  // The compute-type weights this store keeps (weight_range()), widened into `values` (quantized matrices:
  // their dequantized values).
  void read_own_weights(Device& dev, float* values) const;
  // The weights as fp32 host values in the flat layout: the master weights, or the compute-type weights
  // widened when there are none; sharded master weights through the gather (see set_master_gather).
  void download(Device& dev, float* host) const;
  // On a rank that does not need the values (a ZeRO checkpoint's other ranks): takes part in what download()
  // does collectively, without host memory for the model; nothing where download() is local.
  void join_download(Device& dev) const;
  // A store of the trainable tensors only (keep_trainable_only): their fp32 values (the master weights),
  // packed in optimizer_layout()'s numbering (its total_numel() floats), without the frozen tensors. Sharded:
  // a collective through set_trainable_gather; `packed` null on a rank that takes part only.
  void download_trainable(Device& dev, float* packed) const;
  // The layout's initialisation for a seed (deterministic; tensors in layout order; computed in parallel,
  // only the shard with sharded weights), uploaded.
  void init(uint64_t seed, const ParamInit& how, Device& dev) const;
  // Rounds the master weights into the compute-type copy after an optimizer step (stochastically with a
  // nonzero seed, bf16; with `step_values`, the seed is read there when the cast runs); no-op for fp32.
  // Sharded: the master range only (the seed then offset so that each element draws what one process
  // draws for it: shard_rounding_seed in core/half.hpp).
  // Sharded weights: also forgets the gathered slots (forget_gathered).
  void sync(Ops& ops, uint64_t rounding_seed = 0, const StepValues* step_values = nullptr) const;

  // Per-unit hooks (see the top of this file). acquire/release nest per unit: several acquires, one release.
  void acquire(int unit) const;
  void release(int unit) const;
  // Sharded weights: queue `unit`'s gather now, when its slot is free (else nothing: acquire gathers).
  void prefetch(int unit) const;
  // Before the first gradient write of `unit` in a micro-batch (again later in the same micro-batch: no-op).
  // Whole gradients: nothing (the step zeroes them once). Sharded: gives the unit its slot, zeroed on `dev`
  // after the slot-reuse hook emptied it of its previous unit.
  void begin_grads(Device& dev, int unit);
  void grads_ready(int unit);
  // Called with a unit's index when its gradients of a micro-batch are complete (null: none).
  void set_grads_ready_hook(std::function<void(int unit)> hook) { on_grads_ready_ = std::move(hook); }
  // Sharded gradients: called with a unit whose gradients were ready before its slot goes to another unit.
  void set_slot_reuse_hook(std::function<void(int unit)> hook) { on_slot_reuse_ = std::move(hook); }

 private:
  ParamLayout layout_;
  std::vector<ParamRange> frozen_;  // layout_.frozen_ranges(), kept by freeze()
  ParamRange master_range_;
  ParamRange weight_range_;
  std::function<void(Device&, float*)> gather_, trainable_gather_;
  OpsPrecision precision_;
  bool training_;
  size_t weight_elem_, grad_elem_;
  size_t i_master_ = SIZE_MAX, i_weights_ = SIZE_MAX, i_grads_ = SIZE_MAX;
  float* master_ = nullptr;
  void *weights_ = nullptr, *grads_ = nullptr;
  std::function<void(int)> on_grads_ready_;

  // Sharded gradients (set_grad_shard).
  enum class GradState : uint8_t { Idle, Writing, Ready };
  void* slot_grad_at(size_t offset) const;
  // The gradient slot holding offset's unit (asserting that it does) and offset's element in the slot.
  std::pair<size_t, size_t> slot_place(size_t offset) const;
  size_t held_slot(int unit) const;  // the gradient slot of `unit`, asserting that it holds it
  bool grads_sharded_ = false;
  ParamRange grad_range_;
  std::vector<int> slot_of_unit_;  // per unit
  DType slot_type_ = DType::F32;   // what the slots hold
  size_t slot_elem_ = 4;
  std::vector<size_t> slot_numel_;     // elements, per slot
  std::vector<size_t> slot_offset_;    // bytes into the slot memory, per slot
  size_t slot_bytes_ = 0;              // all slots
  std::vector<int> slot_unit_;         // the unit a slot holds (-1: none yet)
  std::vector<GradState> grad_state_;  // per unit
  size_t i_slots_ = SIZE_MAX;
  char* slots_ = nullptr;
  std::function<void(int)> on_slot_reuse_;

  // The communication type's staging buffer (set_comm_type): whole, or one slot per gradient slot.
  std::optional<DType> comm_type_;
  size_t i_comm_ = SIZE_MAX;
  char* comm_ = nullptr;
  std::vector<size_t> comm_slot_offset_;  // bytes into comm_, per gradient slot (sharded gradients)

  // Sharded weights (set_weight_shard).
  struct WeightSlot {
    int unit = -1;        // the unit it holds or is gathering
    bool valid = false;   // gathered (or queued) in this pass
    bool waited = false;  // compute waits for the gather already
    uint64_t ticket = 0;
  };
  void* slot_weight_at(size_t offset) const;
  // Element `offset` (in weight_range()) of the weights this store keeps: its shard under sharded weights.
  void* own_weight_at(size_t offset) const;
  // upload() of the values of range `w` (values[0] is element w.begin): the weights this store keeps.
  void upload_values(Device& dev, const float* values, ParamRange w) const;
  // Trainable tensors only: the master weights (master_range()) from fp32 host values of the layout from
  // element `first` on, or into those of the whole layout (master weights not sharded).
  void upload_master(Device& dev, const float* host, size_t first = 0) const;
  void download_master(Device& dev, float* host) const;
  // The compute-type weights from n fp32 values (rounded to nearest), and back (widened).
  // Whether download() gathers through set_master_gather (a collective) rather than reading locally.
  bool download_gathers() const;
  void write_weights(Device& dev, const float* values, size_t n) const;
  void read_weights(Device& dev, float* values, size_t n) const;
  // Trainable tensors only (keep_trainable_only): the trainable part's layout; the runs of trainable
  // elements (layout range -> packed index of its begin); per tensor, where its gradient view points.
  struct TrainableRun {
    size_t begin, end, packed;
  };
  enum class GradPlace : uint8_t { Packed, Sink, None };
  struct TensorGrad {
    size_t begin;  // the tensor's offset
    GradPlace place;
    size_t at;  // Packed: packed index of begin; Sink: element of the sink
  };
  void* packed_grad_at(size_t offset) const;
  // The packed index of trainable element `offset`.
  size_t packed_index(size_t offset) const;
  std::optional<ParamLayout> trainable_;
  bool master_on_host_ = false;   // set_master_on_host
  float* host_master_ = nullptr;  // bind_host_master
  bool weights_on_host_ = false;  // set_weights_on_host
  void* host_weights_ = nullptr;  // bind_host_weights
  WeightPages* pages_ = nullptr;  // bind_weight_pages
  bool grads_on_host_ = false;    // set_grads_on_host
  std::vector<TrainableRun> runs_;
  std::vector<TensorGrad> tensor_grads_;
  size_t sink_numel_ = 0, i_sink_ = SIZE_MAX, sink_elem_ = 4;
  char* sink_ = nullptr;

  // Quantized storage: the tensors kept in the compute type (dense_ranges), then the quantized matrices.
  std::optional<QuantizedWeights> quant_;
  void gather_into(size_t slot, int unit) const;
  bool weights_sharded_ = false;
  // The gathered copies are a cache of the shards (acquire fills it, sync empties it): mutable.
  mutable std::vector<WeightSlot> wslots_;
  std::vector<size_t> wslot_offset_;  // bytes into the weight slot memory, per slot
  size_t wslot_bytes_ = 0;
  mutable std::vector<bool> in_use_;  // per unit: acquired, not released
  size_t i_wslots_ = SIZE_MAX;
  char* wslot_mem_ = nullptr;
  WeightGatherer* gatherer_ = nullptr;
};

}  // namespace anvil
