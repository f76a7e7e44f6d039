// The NCCL communicator (communicator.hpp): collectives among the GPUs of a job, on a stream of their own.
// Rank 0 makes the NCCL unique id and hands it to the others through the job's store; each collective waits
// for the compute queued before it through an event, and join() makes compute wait for the communication
// stream the same way. Both are plain stream work, so a CUDA graph captures them (NCCL supports capture).
//
// Host-side reductions (counts and losses: all_reduce_host, barrier) run on a second communicator split
// from the first, with its own stream: a collective of the first queued behind a backward that has not
// run yet would otherwise hold them up, and NCCL needs the operations of one communicator in one order.
// Their waits poll, so that a peer that died or hangs becomes an error after the timeout, not a hang.
#include <nccl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "anvil/error.hpp"
#include "dist/communicator.hpp"
#include "dist/cuda/comm_clock.hpp"
#include "dist/dist_env.hpp"
#include "dist/store.hpp"
#include "runtime/cuda/cuda_check.hpp"
#include "runtime/cuda/cuda_device.hpp"

namespace anvil::dist {

#if ANVIL_WITH_NCCL
namespace {

#define ANVIL_NCCL_CHECK(call, what)                                                                  \
  do {                                                                                                \
    const ncclResult_t anvil_nccl_res_ = (call);                                                      \
    if (anvil_nccl_res_ != ncclSuccess)                                                               \
      ANVIL_THROW("NCCL {} failed: {}: {} ({}:{})", what, #call, ncclGetErrorString(anvil_nccl_res_), \
                  __FILE__, __LINE__);                                                                \
  } while (0)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F16:
      return ncclFloat16;
    case DType::BF16:
      return ncclBfloat16;
    case DType::I32:
      return ncclInt32;
    case DType::I8:
      return ncclInt8;
    case DType::F64:
      return ncclFloat64;
    default:
      ANVIL_THROW("NCCL collectives do not take {} elements", dtype_name(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::Max ? ncclMax : ncclSum;
}

// NCCL's start-up calls block until every rank has joined, and a rank that never comes (it died before, or
// hangs) would keep the others there forever, before the job's watchdog (watchdog.hpp) exists. This guard
// ends the process after the timeout with an error naming the rank and the call, as the watchdog does for
// steps (std::_Exit: the blocked NCCL call cannot be unwound); the launcher then stops the other ranks.
class StartupGuard {
 public:
  StartupGuard(int rank, int world, std::chrono::milliseconds timeout) {
    thread_ = std::thread([this, rank, world, timeout] {
      std::unique_lock<std::mutex> lock(mutex_);
      if (wake_.wait_for(lock, timeout, [this] { return done_; })) return;
      std::fprintf(
          stderr,
          "error: rank %d of %d: NCCL start-up (%s) did not complete within %.0f s: another rank has "
          "not started, has exited or hangs (see its output); raise ddp_timeout if the job is just "
          "slow to start\n",
          rank, world, step_, double(timeout.count()) / 1000.0);
      std::fflush(stderr);
      std::_Exit(1);
    });
  }
  ~StartupGuard() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  StartupGuard(const StartupGuard&) = delete;
  StartupGuard& operator=(const StartupGuard&) = delete;
  // The call in progress (a string literal), for the message.
  void at(const char* step) {
    std::lock_guard<std::mutex> lock(mutex_);
    step_ = step;
  }

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  const char* step_ = "ncclCommInitRank";
  std::thread thread_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const DistEnv& env, Device& dev, Store& store, std::chrono::milliseconds timeout)
      : rank_(env.rank), world_(env.world_size), timeout_(timeout), compute_(cuda_compute_stream(dev)) {
    ANVIL_CUDA_CHECK(cudaSetDevice(cuda_device_ordinal(dev)));
    ncclUniqueId id;
    const std::string key = "nccl/unique_id";
    if (rank_ == 0) {
      ANVIL_NCCL_CHECK(ncclGetUniqueId(&id), "start-up");
      store.set(key, std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
    } else {
      const std::string got = store.get(key, timeout);
      ANVIL_REQUIRE(got.size() == sizeof(id), "NCCL start-up: the unique id from rank 0 has {} bytes, not {}",
                    got.size(), sizeof(id));
      std::memcpy(&id, got.data(), sizeof(id));
    }
    {
      StartupGuard guard(rank_, world_, timeout);
      ANVIL_NCCL_CHECK(ncclCommInitRank(&comm_, world_, id, rank_), "start-up (ncclCommInitRank)");
      guard.at("ncclCommSplit");
      ANVIL_NCCL_CHECK(ncclCommSplit(comm_, 0, rank_, &host_comm_, nullptr), "start-up (ncclCommSplit)");
    }
    // Communication first when both are ready: the backward's next kernels can wait, a bucket cannot.
    int least = 0, greatest = 0;
    ANVIL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    ANVIL_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    ANVIL_CUDA_CHECK(cudaStreamCreateWithFlags(&host_stream_, cudaStreamNonBlocking));
    ANVIL_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
    ANVIL_CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
    for (cudaEvent_t& e : marks_) ANVIL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ANVIL_CUDA_CHECK(cudaMalloc(&host_scratch_, kHostValues * sizeof(double)));
    ANVIL_CUDA_CHECK(cudaMalloc(&clock_, kClockBytes));
    ANVIL_CUDA_CHECK(cudaMemset(clock_, 0, kClockBytes));
  }

  ~NcclCommunicator() override {
    ANVIL_CUDA_WARN(cudaStreamSynchronize(stream_));
    ANVIL_CUDA_WARN(cudaStreamSynchronize(host_stream_));
    if (aborted_) {
      ncclCommAbort(host_comm_);
      ncclCommAbort(comm_);
    } else {
      ncclCommDestroy(host_comm_);
      ncclCommDestroy(comm_);
    }
    ANVIL_CUDA_WARN(cudaFree(host_scratch_));
    ANVIL_CUDA_WARN(cudaFree(clock_));
    for (cudaEvent_t e : marks_) ANVIL_CUDA_WARN(cudaEventDestroy(e));
    ANVIL_CUDA_WARN(cudaEventDestroy(comm_done_));
    ANVIL_CUDA_WARN(cudaEventDestroy(compute_done_));
    ANVIL_CUDA_WARN(cudaStreamDestroy(host_stream_));
    ANVIL_CUDA_WARN(cudaStreamDestroy(stream_));
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* backend() const override { return "nccl"; }

  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    const Busy busy(*this, "all_reduce", dtype_bytes(dtype, count));
    ANVIL_NCCL_CHECK(ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), comm_, stream_),
                     "all_reduce");
  }

  void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, ReduceOp op) override {
    const Busy busy(*this, "reduce_scatter", dtype_bytes(dtype, recv_count) * size_t(world_));
    ANVIL_NCCL_CHECK(ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), nccl_op(op), comm_, stream_),
                     "reduce_scatter");
  }

  void all_gather(const void* send, void* recv, size_t send_count, DType dtype) override {
    const Busy busy(*this, "all_gather", dtype_bytes(dtype, send_count) * size_t(world_));
    ANVIL_NCCL_CHECK(ncclAllGather(send, recv, send_count, nccl_type(dtype), comm_, stream_), "all_gather");
  }

  void broadcast(void* data, size_t count, DType dtype, int root) override {
    const Busy busy(*this, "broadcast", dtype_bytes(dtype, count));
    ANVIL_NCCL_CHECK(ncclBroadcast(data, data, count, nccl_type(dtype), root, comm_, stream_), "broadcast");
  }

  // Uneven pieces: one reduce (broadcast) per rank that owns some, rooted there, in one group: each moves
  // its piece once around the ring, (world - 1) / world of the buffer per rank in all, as the even forms.
  void reduce_scatter_v(void* data, const std::vector<size_t>& counts, DType dtype, ReduceOp op) override {
    if (even_pieces(counts, "reduce_scatter_v"))
      return Communicator::reduce_scatter_v(data, counts, dtype, op);
    const Busy busy(*this, "reduce_scatter_v",
                    dtype_bytes(dtype, std::accumulate(counts.begin(), counts.end(), size_t{0})));
    ANVIL_NCCL_CHECK(ncclGroupStart(), "reduce_scatter_v");
    for_pieces(data, counts, dtype, [&](char* piece, size_t n, int root) {
      ANVIL_NCCL_CHECK(ncclReduce(piece, piece, n, nccl_type(dtype), nccl_op(op), root, comm_, stream_),
                       "reduce_scatter_v (ncclReduce)");
    });
    ANVIL_NCCL_CHECK(ncclGroupEnd(), "reduce_scatter_v");
  }

  void all_gather_v(void* data, const std::vector<size_t>& counts, DType dtype) override {
    if (even_pieces(counts, "all_gather_v")) return Communicator::all_gather_v(data, counts, dtype);
    const Busy busy(*this, "all_gather_v",
                    dtype_bytes(dtype, std::accumulate(counts.begin(), counts.end(), size_t{0})));
    ANVIL_NCCL_CHECK(ncclGroupStart(), "all_gather_v");
    for_pieces(data, counts, dtype, [&](char* piece, size_t n, int root) {
      ANVIL_NCCL_CHECK(ncclBroadcast(piece, piece, n, nccl_type(dtype), root, comm_, stream_),
                       "all_gather_v (ncclBroadcast)");
    });
    ANVIL_NCCL_CHECK(ncclGroupEnd(), "all_gather_v");
  }

  void all_to_all(const void* send, void* recv, size_t count_per_rank, DType dtype) override {
    const Busy busy(*this, "all_to_all", dtype_bytes(dtype, count_per_rank) * size_t(world_));
    const ncclDataType_t t = nccl_type(dtype);
    const size_t chunk = dtype_bytes(dtype, count_per_rank);
    ANVIL_NCCL_CHECK(ncclGroupStart(), "all_to_all");
    for (int peer = 0; peer < world_; ++peer) {
      ANVIL_NCCL_CHECK(
          ncclSend(static_cast<const char*>(send) + peer * chunk, count_per_rank, t, peer, comm_, stream_),
          "all_to_all");
      ANVIL_NCCL_CHECK(
          ncclRecv(static_cast<char*>(recv) + peer * chunk, count_per_rank, t, peer, comm_, stream_),
          "all_to_all");
    }
    ANVIL_NCCL_CHECK(ncclGroupEnd(), "all_to_all");
  }

  void join() override {
    ANVIL_CUDA_CHECK(cudaEventRecord(comm_done_, stream_));
    compute_waits_for(comm_done_);
  }

  uint64_t mark() override {
    ANVIL_CUDA_CHECK(cudaEventRecord(marks_[marks_made_ % kMarks], stream_));
    return marks_made_++;
  }

  void join_until(uint64_t mark) override {
    if (mark >= marks_made_ || marks_made_ - mark > kMarks) return join();  // unknown or re-recorded since
    compute_waits_for(marks_[mark % kMarks]);
  }

  // The stamps of the step: zeroed on the compute stream before anything of the step (a pair left zero was
  // not stamped in this step), then the origin of the spans stamped there.
  void begin_timing(bool spans) override {
    busy_pairs_ = exposed_pairs_ = 0;
    spans_ = spans;
    span_names_.clear();
    span_bytes_.clear();
    ANVIL_CUDA_CHECK(cudaMemsetAsync(clock_, 0, kClockBytes, compute_));
    cuda::stamp_clock(compute_, clock_ + kOriginStamp);
  }

  CommTimes end_timing() override {
    std::vector<uint64_t> t(kClockBytes / sizeof(uint64_t));
    ANVIL_CUDA_CHECK(cudaMemcpy(t.data(), clock_, kClockBytes, cudaMemcpyDeviceToHost));
    CommTimes out;
    auto sum = [&](size_t first_pair, double& seconds, bool count) {
      for (size_t p = first_pair; p < first_pair + kClockPairs; ++p) {
        const uint64_t begin = t[2 * p], end = t[2 * p + 1];
        if (begin == 0 || end < begin) continue;
        seconds += double(end - begin) * 1e-9;
        out.collectives += count;
      }
    };
    sum(0, out.busy_seconds, true);
    sum(kClockPairs, out.exposed_seconds, false);
    if (!spans_) return out;
    const uint64_t origin = t[kOriginStamp];
    auto ms = [&](uint64_t stamp) { return (double(stamp) - double(origin)) * 1e-6; };
    for (size_t p = 0; p < std::min(busy_pairs_, kClockPairs); ++p)
      if (t[2 * p] != 0 && t[2 * p + 1] >= t[2 * p])
        out.spans.push_back({span_names_[p], ms(t[2 * p]), ms(t[2 * p + 1]), false, span_bytes_[p]});
    for (size_t p = kClockPairs; p < kClockPairs + std::min(exposed_pairs_, kClockPairs); ++p)
      if (t[2 * p] != 0 && t[2 * p + 1] >= t[2 * p])
        out.spans.push_back({"wait", ms(t[2 * p]), ms(t[2 * p + 1]), true, 0});
    return out;
  }

  void all_reduce_host(double* values, size_t n) override {
    ANVIL_REQUIRE(n <= kHostValues, "all_reduce_host takes at most {} values, got {}", kHostValues, n);
    ANVIL_CUDA_CHECK(
        cudaMemcpyAsync(host_scratch_, values, n * sizeof(double), cudaMemcpyHostToDevice, host_stream_));
    ANVIL_NCCL_CHECK(
        ncclAllReduce(host_scratch_, host_scratch_, n, ncclFloat64, ncclSum, host_comm_, host_stream_),
        "all_reduce_host");
    ANVIL_CUDA_CHECK(
        cudaMemcpyAsync(values, host_scratch_, n * sizeof(double), cudaMemcpyDeviceToHost, host_stream_));
    wait(host_stream_, "all_reduce_host");
  }

  void barrier() override {
    double one = 1;
    all_reduce_host(&one, 1);
  }

  void check() override {
    for (ncclComm_t c : {comm_, host_comm_}) {
      ncclResult_t async = ncclSuccess;
      ANVIL_NCCL_CHECK(ncclCommGetAsyncError(c, &async), "error check");
      if (async != ncclSuccess && async != ncclInProgress) {
        aborted_ = true;
        ANVIL_THROW("NCCL reported an error on rank {} of {}: {} ({}); a peer rank may have exited", rank_,
                    world_, ncclGetErrorString(async), ncclGetLastError(c));
      }
    }
  }

 private:
  static constexpr size_t kHostValues = 512;
  static constexpr uint64_t kMarks = 16;  // marks kept (events recorded in turn)
  // Clock stamps per step: kClockPairs (begin, end) pairs for collectives, as many for compute's waits, and
  // the spans' origin.
  static constexpr size_t kClockPairs = 2048;
  static constexpr size_t kOriginStamp = 4 * kClockPairs;
  static constexpr size_t kClockBytes = (4 * kClockPairs + 1) * sizeof(uint64_t);

  template <class F>
  void for_pieces(void* data, const std::vector<size_t>& counts, DType dtype, F&& f) {
    size_t at = 0;
    for (int r = 0; r < world_; ++r) {
      if (counts[size_t(r)]) f(static_cast<char*>(data) + dtype_bytes(dtype, at), counts[size_t(r)], r);
      at += counts[size_t(r)];
    }
  }

  void after_compute() {
    ANVIL_CUDA_CHECK(cudaEventRecord(compute_done_, compute_));
    ANVIL_CUDA_CHECK(cudaStreamWaitEvent(stream_, compute_done_, 0));
  }

  // A collective on stream_, after the compute queued before it, between two clock stamps (busy time).
  struct Busy {
    Busy(NcclCommunicator& c, const char* name, size_t bytes)
        : c(c), pair(c.busy_pairs_ < kClockPairs ? int(c.busy_pairs_++) : -1) {
      c.after_compute();
      if (pair >= 0) cuda::stamp_clock(c.stream_, c.clock_ + 2 * pair);
      if (pair >= 0 && c.spans_) c.span_names_.push_back(name), c.span_bytes_.push_back(bytes);
    }
    ~Busy() {
      if (pair >= 0) cuda::stamp_clock(c.stream_, c.clock_ + 2 * pair + 1);
    }
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;
    NcclCommunicator& c;
    const int pair;
  };

  // Compute waits for `event` of stream_, between two clock stamps on the compute stream (exposed time).
  void compute_waits_for(cudaEvent_t event) {
    const int pair = exposed_pairs_ < kClockPairs ? int(kClockPairs + exposed_pairs_++) : -1;
    if (pair >= 0) cuda::stamp_clock(compute_, clock_ + 2 * pair);
    ANVIL_CUDA_CHECK(cudaStreamWaitEvent(compute_, event, 0));
    if (pair >= 0) cuda::stamp_clock(compute_, clock_ + 2 * pair + 1);
  }

  // Waits for `stream`, polling NCCL's asynchronous errors; after the timeout, aborts the communicators (so
  // the stuck kernels exit) and throws naming the collective.
  void wait(cudaStream_t stream, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) ANVIL_CUDA_CHECK(q);
      check();
      if (std::chrono::steady_clock::now() - start > timeout_) {
        aborted_ = true;
        ncclCommAbort(host_comm_);
        ncclCommAbort(comm_);
        host_comm_ = comm_ = nullptr;
        ANVIL_THROW(
            "rank {} of {}: the NCCL {} did not complete within {} s: another rank has exited, hangs or "
            "diverged (see its output); raise dist_timeout if a rank is just slow",
            rank_, world_, what, timeout_.count() / 1000.0);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  int rank_, world_;
  std::chrono::milliseconds timeout_;
  cudaStream_t compute_;
  ncclComm_t comm_ = nullptr, host_comm_ = nullptr;
  cudaStream_t stream_ = nullptr, host_stream_ = nullptr;
  cudaEvent_t compute_done_ = nullptr, comm_done_ = nullptr;
  std::array<cudaEvent_t, kMarks> marks_{};
  uint64_t marks_made_ = 0;
  uint64_t* clock_ = nullptr;  // device: the step's stamps (begin_timing)
  size_t busy_pairs_ = 0, exposed_pairs_ = 0;
  bool spans_ = false;                   // this step's spans are asked for (begin_timing)
  std::vector<const char*> span_names_;  // per busy pair, with spans_
  std::vector<size_t> span_bytes_;
  void* host_scratch_ = nullptr;
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const DistEnv& env, Device& dev, Store& store,
                                                     std::chrono::milliseconds timeout) {
  return std::make_unique<NcclCommunicator>(env, dev, store, timeout);
}

#else

std::unique_ptr<Communicator> make_nccl_communicator(const DistEnv&, Device&, Store&,
                                                     std::chrono::milliseconds) {
  ANVIL_THROW(
      "this Anvil was built without NCCL, so it cannot train on several GPUs (install NCCL with the CUDA "
      "toolkit or the pip package nvidia-nccl and reconfigure)");
}

#endif

}  // namespace anvil::dist
