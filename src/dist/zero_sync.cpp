#include "dist/zero_sync.hpp"

#include <algorithm>

#include "anvil/error.hpp"
#include "core/half.hpp"
#include "runtime/device.hpp"

namespace anvil::dist {

ZeroSync::ZeroSync(Communicator& comm, Device& dev, ParamStore& store, const ZeroPartition& partition,
                   int stage, size_t gather_bucket_elems)
    : comm_(comm),
      dev_(dev),
      store_(store),
      weight_partition_(partition),
      partition_(partition.mapped([&store](size_t c) { return store.optimizer_index(c); })),
      // Each rank casts its shard's trainable elements into its part of the weights.
      gather_runs_(store.trainable_only() ? store.trainable_runs()
                                          : std::vector<ParamRange>{store.layout().all()}),
      stage_(stage),
      gather_bucket_elems_(std::max<size_t>(1, gather_bucket_elems)) {
  ANVIL_REQUIRE(stage >= 1 && stage <= 3, "ZeRO stage {}: this synchroniser runs stages 1 to 3", stage);
  ANVIL_REQUIRE(stage < 3 || store.weights_sharded(),
                "ZeRO stage 3: the parameter store keeps whole weights (set_weight_shard first)");
  ANVIL_REQUIRE(partition.world() == comm.world_size(), "ZeRO partition of {} ranks in a world of {}",
                partition.world(), comm.world_size());
  ANVIL_REQUIRE(partition.cuts().back() == store.numel(), "ZeRO partition of {} parameters for a store of {}",
                partition.cuts().back(), store.numel());
  ANVIL_REQUIRE(store.master_range() == shard(),
                "ZeRO: the parameter store keeps master weights [{}, {}) but rank {}'s shard is [{}, {})",
                store.master_range().begin, store.master_range().end, comm.rank(), shard().begin,
                shard().end);
  ANVIL_REQUIRE(stage < 3 || store.weight_range() == weight_partition_.shard(comm.rank()),
                "ZeRO stage 3: the parameter store keeps weights [{}, {}) but rank {}'s shard is [{}, {})",
                store.weight_range().begin, store.weight_range().end, comm.rank(),
                weight_partition_.shard(comm.rank()).begin, weight_partition_.shard(comm.rank()).end);
  store_.set_master_gather([this](Device& dev, float* host) { gather_master(dev, host); });
  if (store_.trainable_only())
    store_.set_trainable_gather([this](Device& dev, float* packed) { gather_trainable(dev, packed); });
  if (stage_ >= 3) store_.set_weight_gatherer(this);
}

ZeroSync::~ZeroSync() {
  store_.set_master_gather(nullptr);
  store_.set_trainable_gather(nullptr);
  if (stage_ >= 3) store_.set_weight_gatherer(nullptr);
}

uint64_t ZeroSync::gather(int unit, void* slot) {
  const ParamUnit& u = store_.layout().units()[size_t(unit)];
  const ParamRange mine = store_.weight_range();
  const DType t = store_.precision().compute;
  const size_t lo = std::max(u.offset, mine.begin), hi = std::min(u.offset + u.numel, mine.end);
  // The copy is queued on compute, so the collective (queued after it) sends it. Parameter offload: from
  // pinned host memory (a graph replaying the gather copies what the host holds then); to NVMe: from the
  // piece paged in (no graphs: the host reads the file as the step is queued).
  if (lo < hi) {
    void* dst = static_cast<char*>(slot) + dtype_bytes(t, lo - u.offset);
    if (WeightPages* pages = store_.weight_pages()) {  // parameter offload to NVMe: paged in
      dev_.upload_on_compute(dst, pages->piece(unit), dtype_bytes(t, hi - lo));
      pages->queued(unit);
    } else {
      const void* src = static_cast<const char*>(store_.weights()) + dtype_bytes(t, lo - mine.begin);
      if (store_.weights_on_host())
        dev_.upload_on_compute(dst, src, dtype_bytes(t, hi - lo));
      else
        dev_.copy_on_device(dst, src, dtype_bytes(t, hi - lo));
    }
  }
  comm_.all_gather_v(slot, weight_partition_.counts_in(u.offset, u.offset + u.numel), t);
  return comm_.mark();
}

void ZeroSync::reduce_norm(double* sum_squares) {
  if (stage_ < 2) return;
  comm_.all_reduce(sum_squares, 1, DType::F64);
  comm_.join();
}

void ZeroSync::gather_weights() {
  if (stage_ >= 3) return;
  const DType t = store_.precision().compute;
  for (const ParamRange& run : gather_runs_)
    for (size_t b = run.begin; b < run.end; b += gather_bucket_elems_) {
      const size_t e = std::min(run.end, b + gather_bucket_elems_);
      comm_.all_gather_v(store_.weight_at(b), weight_partition_.counts_in(b, e), t);
    }
  comm_.join();
}

template <class Take>
void ZeroSync::gather_through(Device& dev, const ZeroPartition& p, DType type, const void* own,
                              bool own_on_host, std::pair<void*, size_t> scratch, Take take) {
  const size_t n = p.cuts().back(), elem = dtype_bytes(type, 1);
  const ParamRange mine = p.shard(comm_.rank());
  ANVIL_REQUIRE(scratch.first, "ZeRO: gathering the model needs the gradient memory, not planned");
  char* staging = static_cast<char*>(scratch.first);
  const size_t chunk = scratch.second / elem;
  ANVIL_ASSERT(chunk > 0, "ZeRO: no staging room to gather the model");
  for (size_t b = 0; b < n; b += chunk) {
    const size_t e = std::min(n, b + chunk);
    const size_t lo = std::max(b, mine.begin), hi = std::min(e, mine.end);
    if (lo < hi) {
      const char* src = static_cast<const char*>(own) + (lo - mine.begin) * elem;
      if (own_on_host)
        dev.copy_to_device(staging + (lo - b) * elem, src, (hi - lo) * elem);
      else
        dev.copy_on_device(staging + (lo - b) * elem, src, (hi - lo) * elem);
    }
    comm_.all_gather_v(staging, p.counts_in(b, e), type);
    comm_.join();
    take(b, e, staging);
  }
  comm_.check();
}

void ZeroSync::gather_master(Device& dev, float* host) {
  if (store_.trainable_only()) {
    gather_trainable_only(dev, host);
    return;
  }
  if (store_.precision().compute == DType::F32 && !store_.weights_sharded()) {
    // the weights are the master weights, whole on every rank
    if (host) dev.copy_to_host(host, store_.weights(), store_.numel() * sizeof(float));
    return;
  }
  // (Optimizer offload: the shard's master weights are in host memory.)
  gather_through(dev, partition_, DType::F32, store_.master(), store_.master_on_host(),
                 store_.gradient_scratch(), [&](size_t b, size_t e, const void* staging) {
                   if (host) dev.copy_to_host(host + b, staging, (e - b) * sizeof(float));
                 });
}

void ZeroSync::gather_trainable_only(Device& dev, float* host) {
  // Every tensor as the compute-type weights hold it (stage 3: every rank's shard, through the weight slots).
  if (!store_.weights_sharded()) {
    if (host) store_.read_own_weights(dev, host);
  } else {
    const DType t = store_.precision().compute;
    std::vector<uint16_t> half;
    gather_through(dev, weight_partition_, t, store_.weights(), store_.weights_on_host(),
                   store_.weight_scratch(), [&](size_t b, size_t e, const void* staging) {
                     if (!host) return;
                     if (t == DType::F32) {
                       dev.copy_to_host(host + b, staging, (e - b) * sizeof(float));
                       return;
                     }
                     half.resize(e - b);
                     dev.copy_to_host(half.data(), staging, half.size() * sizeof(uint16_t));
                     for (size_t i = 0; i < half.size(); ++i)
                       host[b + i] = t == DType::BF16 ? bf16_to_float(half[i]) : fp16_to_float(half[i]);
                   });
  }
  // The trainable tensors from the master weights, packed in the optimizer layout, into their places.
  std::vector<float> packed(host ? store_.optimizer_layout().total_numel() : 0);
  gather_trainable(dev, host ? packed.data() : nullptr);
  if (!host) return;
  size_t at = 0;
  for (const ParamRange& r : gather_runs_) {  // (the trainable runs, in order)
    std::copy_n(packed.data() + at, r.numel(), host + r.begin);
    at += r.numel();
  }
}

void ZeroSync::gather_trainable(Device& dev, float* packed) {
  gather_through(dev, partition_, DType::F32, store_.master(), false, store_.gradient_scratch(),
                 [&](size_t b, size_t e, const void* staging) {
                   if (packed) dev.copy_to_host(packed + b, staging, (e - b) * sizeof(float));
                 });
}

}  // namespace anvil::dist
