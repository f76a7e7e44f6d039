#include "dist/zero_sync.hpp"

#include <algorithm>

#include "anvil/error.hpp"
#include "runtime/device.hpp"

namespace anvil::dist {

ZeroSync::ZeroSync(Communicator& comm, ParamStore& store, ZeroPartition partition, int stage,
                   size_t gather_bucket_elems)
    : comm_(comm),
      store_(store),
      partition_(std::move(partition)),
      stage_(stage),
      gather_bucket_elems_(std::max<size_t>(1, gather_bucket_elems)) {
  ANVIL_REQUIRE(stage >= 1 && stage <= 2, "ZeRO stage {}: this synchroniser runs stages 1 and 2", stage);
  ANVIL_REQUIRE(partition_.world() == comm.world_size(), "ZeRO partition of {} ranks in a world of {}",
                partition_.world(), comm.world_size());
  ANVIL_REQUIRE(store.master_range() == shard(),
                "ZeRO: the parameter store keeps master weights [{}, {}) but rank {}'s shard is [{}, {})",
                store.master_range().begin, store.master_range().end, comm.rank(), shard().begin,
                shard().end);
  store_.set_master_gather([this](Device& dev, float* host) { gather_master(dev, host); });
}

ZeroSync::~ZeroSync() {
  store_.set_master_gather(nullptr);
}

void ZeroSync::reduce_norm(double* sum_squares) {
  if (stage_ < 2) return;
  comm_.all_reduce(sum_squares, 1, DType::F64);
  comm_.join();
}

void ZeroSync::gather_weights() {
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
  if (store_.precision().compute == DType::F32) {  // the weights are the master weights, whole on every rank
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
    if (lo < hi)
      dev.copy_on_device(staging + (lo - b), store_.master() + (lo - mine.begin), (hi - lo) * sizeof(float));
    comm_.all_gather_v(staging, partition_.counts_in(b, e), DType::F32);
    comm_.join();
    dev.copy_to_host(host + b, staging, (e - b) * sizeof(float));
  }
  comm_.check();
}

}  // namespace anvil::dist
