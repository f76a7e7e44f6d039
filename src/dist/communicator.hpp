// Collectives among the processes of a job (DESIGN: "Communicator"): NCCL for CUDA devices
// (nccl_communicator.cpp), Gloo for the CPU backend (gloo_communicator.cpp), and one process
// (single_process_communicator.cpp) so that every code path also runs with one rank.
//
// Ordering. A collective reads and writes memory of the communicator's device. It is queued after all
// compute work queued on that device before the call, and runs on the communicator's own stream, so it
// overlaps compute queued after it; join() makes compute queued afterwards wait for every collective
// queued so far. Until then the caller must not touch a collective's buffers. (The CPU backends run each
// collective on the calling thread before returning; join() is then a no-op.) Every rank must issue the
// same collectives, with the same counts and types, in the same order.
//
// Reductions sum (or take the maximum) in the buffer's type: NCCL reduces 16-bit types in fp32 per step
// and rounds; Gloo sums fp32 and fp16, and bf16 through fp32.
//
// Failures. A collective that cannot complete (a peer died, the network failed, or the communicator's
// timeout passed) throws anvil::Error naming the collective, where the backend can tell at the call
// (Gloo); NCCL reports asynchronously: check() throws the first error seen, naming the collective.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "anvil/dtype.hpp"

namespace anvil {
class Device;
}

namespace anvil::dist {

class Store;
struct DistEnv;

enum class ReduceOp { Sum, Max };

// One collective of a timed step, or one wait of compute for collectives (the profiler's communication
// tracks): milliseconds from the step's timing origin (begin_timing: a stamp on the compute stream, NCCL; the
// host clock, Gloo).
struct CommSpan {
  const char* name = "";  // the collective ("all_reduce", "reduce_scatter_v", ...); waits: "wait"
  double begin_ms = 0, end_ms = 0;
  bool wait = false;  // compute waiting for communication (exposed time), not a collective
  size_t bytes = 0;   // a collective's buffer on this rank
};

// What a step's device collectives cost this rank (Communicator::end_timing).
struct CommTimes {
  double busy_seconds = 0;      // the collectives' own running time, summed
  double exposed_seconds = 0;   // the part compute waited for (not overlapped with it)
  int64_t collectives = 0;      // how many were timed
  std::vector<CommSpan> spans;  // each collective and wait, when begin_timing asked for them
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual const char* backend() const = 0;  // "nccl", "gloo", "single process"

  // In place: every rank's `data` becomes the reduction of all ranks' `data` (`count` elements).
  virtual void all_reduce(void* data, size_t count, DType dtype, ReduceOp op = ReduceOp::Sum) = 0;
  // `send` holds world_size() chunks of `recv_count` elements; rank r's `recv` receives the reduction of
  // every rank's chunk r. `recv` may be `send` + rank() * recv_count (in place).
  virtual void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                              ReduceOp op = ReduceOp::Sum) = 0;
  // Every rank's `recv` (world_size() x `send_count` elements) receives every rank's `send`, in rank order.
  // `send` may be `recv` + rank() * send_count (in place).
  virtual void all_gather(const void* send, void* recv, size_t send_count, DType dtype) = 0;
  // Every rank's `data` becomes `root`'s.
  virtual void broadcast(void* data, size_t count, DType dtype, int root) = 0;
  // The uneven, in-place forms ZeRO uses (a shard's pieces of a buffer). `data` holds world_size()
  // consecutive pieces, piece r of `counts[r]` elements (zero allowed; the same counts on every rank).
  // reduce_scatter_v: piece rank() of `data` becomes the reduction of every rank's piece rank(); the other
  // pieces are left undefined. all_gather_v: every rank's piece r becomes rank r's piece r.
  // The defaults use reduce_scatter / all_gather when the counts are equal, else an all_reduce of the whole
  // buffer and one broadcast per rank; NCCL groups one reduce / broadcast per rank instead.
  virtual void reduce_scatter_v(void* data, const std::vector<size_t>& counts, DType dtype,
                                ReduceOp op = ReduceOp::Sum);
  virtual void all_gather_v(void* data, const std::vector<size_t>& counts, DType dtype);
  // For the v-collectives: throws unless there is one count per rank (naming `what`); whether all are equal.
  bool even_pieces(const std::vector<size_t>& counts, const char* what) const;
  // `send` and `recv` hold world_size() chunks of `count_per_rank` elements: chunk j of rank i's `send`
  // arrives as chunk i of rank j's `recv`. Not in place.
  virtual void all_to_all(const void* send, void* recv, size_t count_per_rank, DType dtype) = 0;
  // Compute queued after this call waits for every collective queued before it.
  virtual void join() = 0;
  // A point in the queue of collectives: join_until(mark()) makes compute queued after it wait for the
  // collectives queued before mark() was called, not for later ones (so compute may overlap them). A backend
  // keeps a few marks: an old mark waits for more (at worst everything, as join()). Under CUDA graph capture,
  // a mark must be joined within the capture that made it. The CPU backends complete every collective before
  // returning, so their marks wait for nothing.
  virtual uint64_t mark() { return 0; }
  virtual void join_until(uint64_t /*mark*/) { join(); }

  // Host-side, blocking: sums `n` doubles over the ranks (counts, losses; small). Ordered after the
  // collectives queued before it on the same communicator only as far as the backend says (NCCL: its own
  // stream and communicator, so it does not wait for queued device collectives).
  virtual void all_reduce_host(double* values, size_t n) = 0;
  // Host-side, blocking: returns once every rank has called it.
  virtual void barrier() = 0;
  // Throws the first asynchronous error seen (NCCL), naming the collective; no-op elsewhere.
  virtual void check() {}

  // Timing of a step's collectives (the host-side ones, all_reduce_host and barrier, are not counted):
  // begin_timing() before the step queues anything, end_timing() after its final synchronisation. NCCL
  // stamps the device clock around each collective on its stream and around each wait of compute for one
  // (so a step replayed from a CUDA graph is timed too); the CPU backends run collectives on the calling
  // thread, all of it exposed. The single-process communicator has none. With `spans` (profiled steps)
  // end_timing also lists each collective and wait, in order.
  virtual void begin_timing(bool /*spans*/ = false) {}
  virtual CommTimes end_timing() { return {}; }
};

// The single-process communicator (world size 1): reductions are copies or nothing.
std::unique_ptr<Communicator> make_single_process_communicator(Device& dev);

// Gloo over TCP for CPU devices: rendezvous through `store` (keys under `prefix`), each collective failing
// after `timeout`. Throws anvil::Error when Anvil was built without Gloo.
std::unique_ptr<Communicator> make_gloo_communicator(const DistEnv& env, Store& store,
                                                     const std::string& prefix,
                                                     std::chrono::milliseconds timeout);
bool gloo_compiled();

// NCCL for a CUDA device: the unique id goes from rank 0 to the others through `store`. Throws anvil::Error
// when Anvil was built without CUDA / NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(const DistEnv& env, Device& dev, Store& store,
                                                     std::chrono::milliseconds timeout);

}  // namespace anvil::dist
