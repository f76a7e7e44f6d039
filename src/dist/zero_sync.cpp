#include "dist/zero_sync.hpp"

#include <algorithm>

#include "anvil/error.hpp"
#include "runtime/device.hpp"

namespace anvil::dist {

ZeroSync::ZeroSync(Communicator& comm, Device& dev, ParamStore& store, ZeroPartition partition, int stage,
                   size_t gather_bucket_elems)
    : comm_(comm),
      dev_(dev),
      store_(store),
      partition_(std::move(partition)),
      stage_(stage),
      gather_bucket_elems_(std::max<size_t>(1, gather_bucket_elems)) {
  ANVIL_REQUIRE(stage >= 1 && stage <= 3, "ZeRO stage {}: this synchroniser runs stages 1 to 3", stage);
  ANVIL_REQUIRE(stage < 3 || store.weights_sharded(),
                "ZeRO stage 3: the parameter store keeps whole weights (set_weight_shard first)");
  ANVIL_REQUIRE(partition_.world() == comm.world_size(), "ZeRO partition of {} ranks in a world of {}",
                partition_.world(), comm.world_size());
  ANVIL_REQUIRE(store.master_range() == shard(),
                "ZeRO: the parameter store keeps master weights [{}, {}) but rank {}'s shard is [{}, {})",
                store.master_range().begin, store.master_range().end, comm.rank(), shard().begin,
                shard().end);
  store_.set_master_gather([this](Device& dev, float* host) { gather_master(dev, host); });
  if (stage_ >= 3) store_.set_weight_gatherer(this);
}

ZeroSync::~ZeroSync() {
  store_.set_master_gather(nullptr);
  if (stage_ >= 3) store_.set_weight_gatherer(nullptr);
}

uint64_t ZeroSync::gather(int unit, void* slot) {
  const ParamUnit& u = store_.layout().units()[size_t(unit)];
  const ParamRange mine = shard();
  const DType t = store_.precision().compute;
  const size_t lo = std::max(u.offset, mine.begin), hi = std::min(u.offset + u.numel, mine.end);
  // The copy is queued on compute, so the collective (queued after it) sends it. Parameter offload: from
  // pinned host memory (a graph replaying the gather copies what the host holds then).
  if (lo < hi) {
    void* dst = static_cast<char*>(slot) + dtype_bytes(t, lo - u.offset);
    const void* src = static_cast<const char*>(store_.weights()) + dtype_bytes(t, lo - mine.begin);
    if (store_.weights_on_host())
      dev_.upload_on_compute(dst, src, dtype_bytes(t, hi - lo));
    else
      dev_.copy_on_device(dst, src, dtype_bytes(t, hi - lo));
  }
  comm_.all_gather_v(slot, partition_.counts_in(u.offset, u.offset + u.numel), t);
  return comm_.mark();
}

void ZeroSync::reduce_norm(double* sum_squares) {
  if (stage_ < 2) return;
  comm_.all_reduce(sum_squares, 1, DType::F64);
  comm_.join();
}

void ZeroSync::gather_weights() {
  if (stage_ >= 3) return;
  const size_t n = store_.numel();
  const DType t = store_.precision().compute;
  for (size_t b = 0; b < n; b += gather_bucket_elems_) {
    const size_t e = std::min(n, b + gather_bucket_elems_);
    comm_.all_gather_v(store_.weight_at(b), partition_.counts_in(b, e), t);
  }
  comm_.join();
}

void ZeroSync::gather_master(Device& dev, float* host) {
  const size_t n = store_.numel();
  const ParamRange mine = shard();
  if (store_.precision().compute == DType::F32 && !store_.weights_sharded()) {
    // the weights are the master weights, whole on every rank
    dev.copy_to_host(host, store_.weights(), n * sizeof(float));
    return;
  }
  const auto [scratch, scratch_bytes] = store_.gradient_scratch();
  ANVIL_REQUIRE(scratch, "ZeRO: gathering the master weights needs the gradient memory, not planned");
  float* staging = static_cast<float*>(scratch);
  const size_t chunk = scratch_bytes / sizeof(float);
  ANVIL_ASSERT(chunk > 0, "ZeRO: no staging room for the master weights");
  for (size_t b = 0; b < n; b += chunk) {
    const size_t e = std::min(n, b + chunk);
    const size_t lo = std::max(b, mine.begin), hi = std::min(e, mine.end);
    if (lo < hi) {
      // (Optimizer offload: the shard's master weights are in host memory.)
      if (store_.master_on_host())
        dev.copy_to_device(staging + (lo - b), store_.master() + (lo - mine.begin),
                           (hi - lo) * sizeof(float));
      else
        dev.copy_on_device(staging + (lo - b), store_.master() + (lo - mine.begin),
                           (hi - lo) * sizeof(float));
    }
    comm_.all_gather_v(staging, partition_.counts_in(b, e), DType::F32);
    comm_.join();
    dev.copy_to_host(host + b, staging, (e - b) * sizeof(float));
  }
  comm_.check();
}

}  // namespace anvil::dist
