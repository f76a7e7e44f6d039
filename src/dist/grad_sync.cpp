#include "dist/grad_sync.hpp"

#include <algorithm>

#include "anvil/error.hpp"

namespace anvil::dist {

GradSync::GradSync(Communicator& comm, ParamStore& store, size_t bucket_bytes, const ZeroPartition* scatter)
    : comm_(comm),
      store_(store),
      bucket_elems_(bucket_bytes == 0
                        ? SIZE_MAX
                        : std::max<size_t>(1, bucket_bytes / dtype_bytes(store.precision().grad, 1))),
      scatter_(scatter),
      pending_begin_(store.numel()),
      pending_end_(store.numel()) {
  store_.set_grads_ready_hook([this](int unit) { unit_ready(unit); });
}

GradSync::~GradSync() {
  store_.set_grads_ready_hook(nullptr);
}

void GradSync::unit_ready(int unit) {
  if (!armed_) return;
  const ParamUnit& u = store_.layout().units()[size_t(unit)];
  // Backward completes the units from the buffer's end towards its start, so each one ends where the
  // pending range begins.
  ANVIL_REQUIRE(
      u.offset + u.numel == pending_begin_,
      "gradient sync: unit '{}' completed out of order (its range ends at {}, the next expected end is "
      "{})",
      u.name, u.offset + u.numel, pending_begin_);
  pending_begin_ = u.offset;
  if (pending_end_ - pending_begin_ >= bucket_elems_ || pending_begin_ == 0) {
    queue(pending_begin_, pending_end_);
    pending_end_ = pending_begin_;
  }
}

void GradSync::finish() {
  ANVIL_REQUIRE(
      pending_begin_ == 0 && pending_end_ == 0,
      "gradient sync: the step ended with gradients [{}, {}) not reduced (a unit's grads_ready never "
      "came)",
      pending_begin_, pending_end_);
  comm_.join();
  pending_begin_ = pending_end_ = store_.numel();
  armed_ = false;
}

void GradSync::queue(size_t begin, size_t end) {
  if (scatter_)
    comm_.reduce_scatter_v(store_.grad_at(begin), scatter_->counts_in(begin, end), store_.precision().grad);
  else
    comm_.all_reduce(store_.grad_at(begin), end - begin, store_.precision().grad);
  ++buckets_;
}

}  // namespace anvil::dist
