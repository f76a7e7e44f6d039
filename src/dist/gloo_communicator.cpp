// Gloo (Debian libgloo-dev) collectives over TCP for the CPU backend (communicator.hpp). Every collective
// runs on the calling thread and returns when this rank's part is done.
//
// Rendezvous: each rank publishes its transport addresses in the job's Store under `prefix` (keys
// "<prefix>/<rank>") and connects to every other rank (a full mesh). The keys stay in the store, so every
// communicator of a job needs its own prefix.
//
// Ordering safety: each collective carries a sequence number as its Gloo tag, so ranks that disagree on
// the order of collectives wait (and time out) instead of exchanging the wrong buffers.
//
// Failure: when a collective times out, Gloo closes every connection of this rank, which makes the peers'
// pending collectives fail at once. The communicator is then unusable: later calls throw straight away.
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "anvil/error.hpp"
#include "dist/communicator.hpp"
#include "dist/dist_env.hpp"
#include "dist/store.hpp"

#if ANVIL_WITH_GLOO
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/half.hpp"
#endif

namespace anvil::dist {

#if ANVIL_WITH_GLOO

namespace {

using std::chrono::milliseconds;

// The job's Store seen as Gloo's rendezvous store: Gloo's get() must wait until the key is set, which
// Store::get does up to the communicator's timeout.
class RendezvousStore final : public gloo::rendezvous::Store {
 public:
  RendezvousStore(dist::Store& store, std::string prefix, milliseconds timeout)
      : store_(store), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_.set(full(key), std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string value = store_.get(full(key), timeout_);
    return {value.begin(), value.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const milliseconds& timeout) override {
    std::vector<std::string> full_keys;
    for (const auto& k : keys) full_keys.push_back(full(k));
    store_.wait(full_keys, timeout);
  }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }

  dist::Store& store_;
  const std::string prefix_;
  const milliseconds timeout_;
};

// Element types of the reductions: storage type T, accumulated as Acc. 16-bit floats are summed in fp32
// and rounded to nearest even (core/half.hpp); int32 sums wrap around as NCCL's do (accumulated in int64,
// truncated).
struct F32T {
  using T = float;
  using Acc = float;
  static Acc load(T v) { return v; }
  static T store(Acc a) { return a; }
};
struct F16T {
  using T = uint16_t;
  using Acc = float;
  static Acc load(T v) { return fp16_to_float(v); }
  static T store(Acc a) { return float_to_fp16(a); }
};
struct BF16T {
  using T = uint16_t;
  using Acc = float;
  static Acc load(T v) { return bf16_to_float(v); }
  static T store(Acc a) { return float_to_bf16(a); }
};
struct I32T {
  using T = int32_t;
  using Acc = int64_t;
  static Acc load(T v) { return v; }
  static T store(Acc a) { return static_cast<T>(static_cast<uint32_t>(a)); }  // modulo 2^32 (C++20)
};
struct F64T {
  using T = double;
  using Acc = double;
  static Acc load(T v) { return v; }
  static T store(Acc a) { return a; }
};

struct SumOp {
  template <class A>
  A operator()(A a, A b) const {
    return a + b;
  }
};
struct MaxOp {
  // A NaN on either side wins (an overflow flag reduced with Max must not be lost).
  template <class A>
  A operator()(A a, A b) const {
    if constexpr (std::is_floating_point_v<A>)
      if (std::isnan(a)) return a;
    return a > b ? a : b;
  }
};

// Gloo's reduction callback: c[i] = op(a[i], b[i]); c may alias a or b.
template <class Ty, class Op>
void reduce_pair(void* c, const void* a, const void* b, size_t n) {
  using T = typename Ty::T;
  auto* pc = static_cast<T*>(c);
  const auto* pa = static_cast<const T*>(a);
  const auto* pb = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) pc[i] = Ty::store(Op{}(Ty::load(pa[i]), Ty::load(pb[i])));
}

// reduce_scatter's local step: out[i] = op over ranks r (in rank order) of chunks[r * n + i], rounded once.
template <class Ty, class Op>
void reduce_chunks(void* out, const void* chunks, size_t n, int world) {
  using T = typename Ty::T;
  auto* po = static_cast<T*>(out);
  const auto* pc = static_cast<const T*>(chunks);
  for (size_t i = 0; i < n; ++i) {
    typename Ty::Acc acc = Ty::load(pc[i]);
    for (int r = 1; r < world; ++r) acc = Op{}(acc, Ty::load(pc[size_t(r) * n + i]));
    po[i] = Ty::store(acc);
  }
}

// Calls f(Ty{}, Op{}) for a reducible dtype and op.
template <class F>
void dispatch_reduce(const char* collective, DType dtype, ReduceOp op, F&& f) {
  const auto with_op = [&](auto ty) {
    if (op == ReduceOp::Max)
      f(ty, MaxOp{});
    else
      f(ty, SumOp{});
  };
  switch (dtype) {
    case DType::F32:
      return with_op(F32T{});
    case DType::F16:
      return with_op(F16T{});
    case DType::BF16:
      return with_op(BF16T{});
    case DType::I32:
      return with_op(I32T{});
    case DType::F64:
      return with_op(F64T{});
    default:
      ANVIL_THROW("gloo {}: cannot reduce {} values: reductions take F32, F16, BF16, F64 or I32 buffers",
                  collective, dtype_name(dtype));
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> ctx, milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}

  int rank() const override { return ctx_->rank; }
  int world_size() const override { return ctx_->size; }
  const char* backend() const override { return "gloo"; }

  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    dispatch_reduce("all_reduce", dtype, op, [&](auto ty, auto red) {
      using Ty = decltype(ty);
      using T = typename Ty::T;
      run("all_reduce", count, dtype, [&](uint32_t tag) {
        gloo::AllreduceOptions opts(ctx_);
        opts.setTag(tag);
        opts.setTimeout(timeout_);
        opts.setOutput(static_cast<T*>(data), count);  // no input: in place
        opts.setReduceFunction(&reduce_pair<Ty, decltype(red)>);
        gloo::allreduce(opts);
      });
    });
  }

  // Gloo's functional API has no reduce-scatter, so this is an all-to-all (rank j receives every rank's
  // chunk j, the same bytes a ring reduce-scatter moves) into a scratch buffer of the send buffer's size,
  // kept between calls, then a local reduction in rank order. 16-bit sums are rounded once, not per step.
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override {
    dispatch_reduce("reduce_scatter", dtype, op, [&](auto ty, auto red) {
      using Ty = decltype(ty);
      const size_t chunk_bytes = dtype_bytes(dtype, recv_count);
      const size_t total = chunk_bytes * size_t(world_size());
      run("reduce_scatter", recv_count, dtype, [&](uint32_t tag) {
        if (scratch_.size() < total) scratch_.resize(total);
        gloo::AlltoallOptions opts(ctx_);
        opts.setTag(tag);
        opts.setTimeout(timeout_);
        opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)), total);  // read only
        opts.setOutput(scratch_.data(), total);
        gloo::alltoall(opts);
      });
      // After the exchange: `recv` may lie inside `send`, which is no longer read.
      reduce_chunks<Ty, decltype(red)>(recv, scratch_.data(), recv_count, world_size());
    });
  }

  void all_gather(const void* send, void* recv, size_t send_count, DType dtype) override {
    const size_t bytes = movable_bytes("all_gather", send_count, dtype);
    run("all_gather", send_count, dtype, [&](uint32_t tag) {
      gloo::AllgatherOptions opts(ctx_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      auto* out = static_cast<uint8_t*>(recv);
      if (send != out + size_t(rank()) * bytes)  // without an input Gloo gathers in place
        opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)), bytes);
      opts.setOutput(out, bytes * size_t(world_size()));
      gloo::allgather(opts);
    });
  }

  void broadcast(void* data, size_t count, DType dtype, int root) override {
    ANVIL_REQUIRE(root >= 0 && root < world_size(),
                  "gloo broadcast from root {}: the root must be a rank, 0..{}", root, world_size() - 1);
    const size_t bytes = movable_bytes("broadcast", count, dtype);
    run("broadcast", count, dtype, [&](uint32_t tag) {
      gloo::BroadcastOptions opts(ctx_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      opts.setRoot(root);
      opts.setOutput(static_cast<uint8_t*>(data), bytes);  // the root's output is its input
      gloo::broadcast(opts);
    });
  }

  void all_to_all(const void* send, void* recv, size_t count_per_rank, DType dtype) override {
    ANVIL_REQUIRE(send != recv,
                  "gloo all_to_all: send and recv are the same buffer; it does not run in place");
    const size_t total = movable_bytes("all_to_all", count_per_rank, dtype) * size_t(world_size());
    run("all_to_all", count_per_rank, dtype, [&](uint32_t tag) {
      gloo::AlltoallOptions opts(ctx_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(send)), total);  // read only
      opts.setOutput(static_cast<uint8_t*>(recv), total);
      gloo::alltoall(opts);
    });
  }

  void join() override {}

  void begin_timing(bool spans) override {
    times_ = {};
    spans_ = spans;
    origin_ = std::chrono::steady_clock::now();
  }
  CommTimes end_timing() override { return times_; }

  void all_reduce_host(double* values, size_t n) override {
    run("all_reduce_host", n, DType::F64, [&](uint32_t tag) {
      gloo::AllreduceOptions opts(ctx_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      opts.setOutput(values, n);
      opts.setReduceFunction(&reduce_pair<F64T, SumOp>);
      gloo::allreduce(opts);
    });
  }

  void barrier() override {
    run("barrier", 0, std::nullopt, [&](uint32_t tag) {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  // Bytes of `count` elements for the data-movement collectives, which take any dtype of whole bytes.
  static size_t movable_bytes(const char* collective, size_t count, DType dtype) {
    ANVIL_REQUIRE(dtype_bits(dtype) * count % 8 == 0,
                  "gloo {}: {} elements of {} do not fill whole bytes: pass an even count of 4-bit values",
                  collective, count, dtype_name(dtype));
    return dtype_bytes(dtype, count);
  }

  // Runs one collective (`body(tag)`) of `count` elements of `type` (none: the barrier, which moves no
  // data), turning Gloo's failures into anvil::Error. A collective of 0 elements runs nothing: every rank
  // passes the same count, so every rank skips it alike.
  template <class Body>
  void run(const char* collective, size_t count, std::optional<DType> type, Body&& body) {
    ANVIL_REQUIRE(
        failed_.empty(),
        "gloo {} on rank {} of {}: this communicator failed earlier ({}); it cannot run collectives "
        "any more: stop this process and restart the job",
        collective, rank(), world_size(), failed_);
    if (count == 0 && type) return;
    const uint32_t tag = next_tag_++;
    const std::string peer = fmt::format(
        "a peer rank exited, or did not issue the same collective within the {} s timeout (every rank must "
        "issue the same collectives in the same order); the first error in the other ranks' logs says which",
        double(timeout_.count()) / 1000.0);
    std::string what, cause = peer;
    try {
      const auto t0 = std::chrono::steady_clock::now();
      body(tag);
      // On the calling thread: all of it is exposed. (The host-side ones are not the step's collectives.)
      if (std::string_view(collective) != "all_reduce_host" && std::string_view(collective) != "barrier") {
        const auto t1 = std::chrono::steady_clock::now();
        const double s = std::chrono::duration<double>(t1 - t0).count();
        times_.busy_seconds += s;
        times_.exposed_seconds += s;
        ++times_.collectives;
        if (spans_) {
          using ms = std::chrono::duration<double, std::milli>;
          const double b = ms(t0 - origin_).count(), e = ms(t1 - origin_).count();
          times_.spans.push_back({collective, b, e, false, type ? dtype_bytes(*type, count) : 0});
          times_.spans.push_back({"wait", b, e, true, 0});
        }
      }
      return;
    } catch (const gloo::IoException& e) {  // timeouts, closed connections
      what = e.what();
    } catch (const gloo::EnforceNotMet& e) {  // Gloo's checks: sizes, missing connections
      what = e.what();
      cause = "the ranks disagree on the collective's size (a bug in Anvil), or " + peer;
    } catch (const std::exception& e) {
      what = e.what();
    }
    failed_ = std::string(collective) + ": " + what;
    const std::string size = type ? fmt::format(" of {} x {}", count, dtype_name(*type)) : std::string();
    ANVIL_THROW("gloo {}{} failed on rank {} of {}: {}. Likely cause: {}", collective, size, rank(),
                world_size(), what, cause);
  }

  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  const milliseconds timeout_;
  uint32_t next_tag_ = 0;
  std::string failed_;                            // the first failure; non-empty = unusable
  std::vector<uint8_t> scratch_;                  // reduce_scatter's exchange buffer
  CommTimes times_;                               // since begin_timing
  bool spans_ = false;                            // begin_timing asked for the spans
  std::chrono::steady_clock::time_point origin_;  // of the spans
};

// The address this rank's Gloo transport listens on: the interface named by GLOO_SOCKET_IFNAME (as
// PyTorch reads it; the first of a comma-separated list), else loopback on one node, else this host's name
// (which must resolve to an address the other nodes reach).
gloo::transport::tcp::attr transport_attr(const DistEnv& env) {
  gloo::transport::tcp::attr attr;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname) {
    const std::string names = ifname;
    attr.iface = names.substr(0, names.find(','));
  } else if (env.num_nodes == 1) {
    attr.hostname = "127.0.0.1";
  } else {
    char host[256] = {};
    ANVIL_REQUIRE(
        gethostname(host, sizeof host - 1) == 0,
        "gloo: gethostname failed; set GLOO_SOCKET_IFNAME to the network interface the nodes share");
    attr.hostname = host;
  }
  return attr;
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const DistEnv& env, Store& store,
                                                     const std::string& prefix,
                                                     std::chrono::milliseconds timeout) {
  ANVIL_REQUIRE(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size,
                "gloo: rank {} of world size {} is not a rank of the job", env.rank, env.world_size);
  ANVIL_REQUIRE(timeout.count() > 0, "gloo: the collective timeout must be positive, not {} ms",
                timeout.count());
  // Gloo adds the timeout to the clock: keep "forever" from overflowing.
  timeout = std::min(timeout, milliseconds(std::chrono::hours(24 * 365)));
  const auto attr = transport_attr(env);
  try {
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(env.rank, env.world_size);
    ctx->setTimeout(timeout);
    RendezvousStore rendezvous(store, prefix, timeout);
    ctx->connectFullMesh(rendezvous, device);
    return std::make_unique<GlooCommunicator>(std::move(ctx), timeout);
  } catch (const std::exception& e) {  // anvil::Error from the store, gloo::IoException, EnforceNotMet
    ANVIL_THROW(
        "gloo: rank {} of {} could not connect to its peers (address {}, store keys under '{}'): {}. Check "
        "that "
        "every rank started, reaches the others on that address (multi-node: set GLOO_SOCKET_IFNAME to the "
        "interface the nodes share) and that the {} s timeout is long enough",
        env.rank, env.world_size, attr.iface.empty() ? attr.hostname : "interface " + attr.iface, prefix,
        e.what(), double(timeout.count()) / 1000.0);
  }
}

bool gloo_compiled() {
  return true;
}

#else  // !ANVIL_WITH_GLOO

std::unique_ptr<Communicator> make_gloo_communicator(const DistEnv& env, Store&, const std::string&,
                                                     std::chrono::milliseconds) {
  ANVIL_THROW(
      "rank {} of {}: this Anvil was built without Gloo, which multi-process CPU runs need: install "
      "libgloo-dev (scripts/setup.sh does), reconfigure with cmake and rebuild, or run one process",
      env.rank, env.world_size);
}

bool gloo_compiled() {
  return false;
}

#endif

}  // namespace anvil::dist
