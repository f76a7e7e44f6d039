#include "dist/grad_sync.hpp"

#include <algorithm>

#include "anvil/error.hpp"

namespace anvil::dist {

GradSync::GradSync(Communicator& comm, ParamStore& store, size_t bucket_bytes, const ZeroPartition* scatter,
                   Ops* ops)
    : comm_(comm),
      store_(store),
      bucket_elems_(bucket_bytes == 0
                        ? SIZE_MAX
                        : std::max<size_t>(1, bucket_bytes / dtype_bytes(store.precision().grad, 1))),
      scatter_(scatter),
      ops_(ops),
      by_unit_(store.grads_sharded()),
      written_type_(store.written_grad_type()),
      kept_type_(store.precision().grad),
      comm_type_(store.comm_type()),
      staged_(store.comm_staged()),
      overwrite_first_(store.grads_on_host()),
      pending_begin_(store.numel()),
      pending_end_(store.numel()) {
  if (by_unit_) {
    ANVIL_ASSERT(scatter_ && ops_, "gradient sync: gradients by unit need the ZeRO partition and the ops");
    ANVIL_ASSERT(store.grad_range() == scatter_->shard(comm.rank()),
                 "gradient sync: the store keeps gradients [{}, {}), rank {}'s shard is [{}, {})",
                 store.grad_range().begin, store.grad_range().end, comm.rank(),
                 scatter_->shard(comm.rank()).begin, scatter_->shard(comm.rank()).end);
    marks_.assign(store.layout().units().size(), 0);
    to_add_.assign(store.layout().units().size(), false);
    store_.set_slot_reuse_hook([this](int unit) { drain(unit); });
    armed_ = true;  // every micro-batch reduces
  }
  ANVIL_ASSERT(!staged_ || ops_,
               "gradient sync: a communication type other than the gradients' needs the ops");
  // A store of the trainable tensors only keeps no gradient for the frozen ones; its reduce-scatter goes by
  // unit slots (whole gradients are all-reduced).
  ANVIL_ASSERT(!store.trainable_only() || by_unit_ || !scatter_,
               "gradient sync: a store of the trainable tensors only reduce-scatters by unit");
  // The runs of trainable tensors (the gaps between the frozen ones), which the buckets reduce, and the same
  // in the optimizer layout (the gradients kept for the optimizer).
  trainable_ = store.trainable_runs();
  if (store.trainable_only())
    trainable_kept_ = {store.optimizer_layout().all()};
  else
    trainable_kept_ = trainable_;
  store_.set_grads_ready_hook([this](int unit) { unit_ready(unit); });
}

GradSync::~GradSync() {
  store_.set_grads_ready_hook(nullptr);
  if (by_unit_) store_.set_slot_reuse_hook(nullptr);
}

void GradSync::unit_ready(int unit) {
  if (!armed_) return;
  const ParamUnit& u = store_.layout().units()[size_t(unit)];
  // A unit whose tensors are all frozen (freeze_parameters; the same on every rank) has no gradient to
  // reduce: it is passed over (the step zeroes frozen gradients before the norm, whatever they hold).
  const bool frozen = !store_.layout().any_trainable({u.offset, u.offset + u.numel});
  if (by_unit_ && frozen) {
    ++reduced_in_micro_batch_;
    return;
  }
  if (by_unit_) {
    // The unit's slot: its gradients in the optimizer layout's numbering.
    const ParamRange g = store_.unit_grad_range(unit);
    void* data = store_.comm_unit_grads(unit);
    if (staged_)
      ops_->convert_grads(data, comm_type_, store_.unit_grads(unit), written_type_, g.numel(), false);
    comm_.reduce_scatter_v(data, scatter_->counts_in(g.begin, g.end), comm_type_);
    marks_[size_t(unit)] = comm_.mark();
    to_add_[size_t(unit)] = true;
    ++reduced_in_micro_batch_;
    ++buckets_;
    return;
  }
  // Backward completes the units from the buffer's end towards its start, so each one ends where the
  // pending range begins.
  ANVIL_REQUIRE(
      u.offset + u.numel == pending_begin_,
      "gradient sync: unit '{}' completed out of order (its range ends at {}, the next expected end is "
      "{})",
      u.name, u.offset + u.numel, pending_begin_);
  if (frozen) {  // flush the bucket above it, then start the next one below it
    if (pending_end_ > pending_begin_) queue(pending_begin_, pending_end_);
    pending_begin_ = pending_end_ = u.offset;
    return;
  }
  pending_begin_ = u.offset;
  if (pending_end_ - pending_begin_ >= bucket_elems_ || pending_begin_ == 0) {
    queue(pending_begin_, pending_end_);
    pending_end_ = pending_begin_;
  }
}

void GradSync::set_norm_sink(double* sum_squares) {
  ANVIL_ASSERT(by_unit_ && overwrite_first_,
               "gradient sync: the norm's squares are summed for offloaded gradients");
  norm_sink_ = sum_squares;
}

void GradSync::drain(int unit) {
  if (!to_add_[size_t(unit)]) return;
  comm_.join_until(marks_[size_t(unit)]);
  add_piece(unit);
}

void GradSync::add_piece(int unit) {
  const ParamRange g = store_.unit_grad_range(unit);  // (optimizer layout)
  const ParamRange mine = store_.grad_range();
  const size_t lo = std::max(g.begin, mine.begin), hi = std::min(g.end, mine.end);
  if (lo < hi) {
    const char* slot = static_cast<const char*>(store_.comm_unit_grads(unit));
    const auto piece = [&](size_t i) { return slot + dtype_bytes(comm_type_, i - g.begin); };
    const bool accumulate = !(first_ && overwrite_first_);
    if (norm_sink_ && last_) {
      // Only the trainable tensors' gradients count in the norm (frozen ones are neither summed nor written:
      // the optimizer never reads them, and the step does not zero offloaded gradients).
      for (const ParamRange& r : trainable_kept_) {
        const size_t b = std::max(lo, r.begin), e = std::min(hi, r.end);
        if (b < e)
          ops_->convert_grads_sum_squares(store_.reduced_grad_at(b), kept_type_, piece(b), comm_type_, e - b,
                                          accumulate, norm_sink_);
      }
    } else {
      ops_->convert_grads(store_.reduced_grad_at(lo), kept_type_, piece(lo), comm_type_, hi - lo, accumulate);
    }
  }
  to_add_[size_t(unit)] = false;
}

void GradSync::finish() {
  if (by_unit_) {
    const size_t units = store_.layout().units().size();
    ANVIL_REQUIRE(size_t(reduced_in_micro_batch_) == units,
                  "gradient sync: the micro-batch ended with {} of {} units reduced (a unit's grads_ready "
                  "never came)",
                  reduced_in_micro_batch_, units);
    comm_.join();
    for (size_t u = 0; u < units; ++u)
      if (to_add_[u]) add_piece(int(u));
    reduced_in_micro_batch_ = 0;
    armed_ = false;
    return;
  }
  ANVIL_REQUIRE(
      pending_begin_ == 0 && pending_end_ == 0,
      "gradient sync: the step ended with gradients [{}, {}) not reduced (a unit's grads_ready never "
      "came)",
      pending_begin_, pending_end_);
  comm_.join();
  if (staged_) convert_back();
  pending_begin_ = pending_end_ = store_.numel();
  armed_ = false;
}

void GradSync::queue(size_t begin, size_t end) {
  // The trainable tensors' gradients in [begin, end) only: a frozen tensor's gradient is zeroed before the
  // norm whatever it holds (LoRA: a block's factors are reduced, not its base matrices). One collective per
  // run of trainable tensors: without frozen tensors, one per bucket.
  for (const ParamRange& r : trainable_) {
    const size_t lo = std::max(begin, r.begin), hi = std::min(end, r.end);
    if (lo >= hi) continue;
    void* data = store_.comm_grad_at(lo);
    if (staged_) ops_->convert_grads(data, comm_type_, store_.grad_at(lo), written_type_, hi - lo, false);
    if (scatter_)
      comm_.reduce_scatter_v(data, scatter_->counts_in(lo, hi), comm_type_);
    else
      comm_.all_reduce(data, hi - lo, comm_type_);
    ++buckets_;
  }
}

// After the step's last collective. Reduce-scattered buckets (stage 2 of a model with whole gradients) hold
// sums in this rank's shard only (the rest of the staging buffer is undefined), the part the optimizer reads.
void GradSync::convert_back() {
  size_t begin = 0, end = store_.numel();
  if (scatter_) {
    const ParamRange mine = scatter_->shard(comm_.rank());
    begin = std::max(begin, mine.begin), end = std::min(end, mine.end);
  }
  for (const ParamRange& r : trainable_) {  // what queue() reduced
    const size_t lo = std::max(begin, r.begin), hi = std::min(end, r.end);
    if (lo < hi)
      ops_->convert_grads(store_.grad_at(lo), kept_type_, store_.comm_grad_at(lo), comm_type_, hi - lo,
                          false);
  }
}

}  // namespace anvil::dist
