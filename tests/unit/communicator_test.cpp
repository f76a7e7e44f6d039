// The CPU communicators (dist/communicator.hpp) and the in-process store: Gloo with threads acting as ranks
// (world sizes 2 and 3, one MemoryStore, one CPU device per rank), on values whose exact results are known,
// including the 16-bit types; the failure paths (a rank that skips a collective, a rank that never joins);
// and the single-process communicator.
#include "dist/communicator.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "anvil/error.hpp"
#include "core/half.hpp"
#include "dist/dist_env.hpp"
#include "dist/memory_store.hpp"
#include "runtime/device.hpp"

namespace anvil::dist {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// ---------------------------------------------------------------------------------------------------------
// MemoryStore

TEST(MemoryStore, SetGetTryGetAndBinaryValues) {
  MemoryStore store;
  EXPECT_FALSE(store.try_get("a").has_value());
  const std::string bytes("x\0y", 3);
  store.set("a", bytes);
  EXPECT_EQ(store.get("a", 10ms), bytes);
  EXPECT_EQ(store.try_get("a").value(), bytes);
  store.set("a", "second");
  EXPECT_EQ(store.get("a", 10ms), "second");
}

TEST(MemoryStore, GetWaitsForAnotherThreadsSet) {
  MemoryStore store;
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    store.set("late", "value");
  });
  EXPECT_EQ(store.get("late", 5s), "value");
  setter.join();
  std::thread waiter_setter([&] {
    std::this_thread::sleep_for(50ms);
    store.set("k1", "");
    store.set("k2", "");
  });
  store.wait({"k1", "k2"}, 5s);
  waiter_setter.join();
}

TEST(MemoryStore, TimeoutsNameTheKeys) {
  MemoryStore store;
  store.set("present", "1");
  const auto t0 = Clock::now();
  try {
    store.get("missing/key", 100ms);
    FAIL() << "get of a key never set returned";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'missing/key'"), std::string::npos) << e.what();
  }
  EXPECT_GE(seconds_since(t0), 0.09);
  try {
    store.wait({"present", "absent1", "absent2"}, 50ms);
    FAIL() << "wait for keys never set returned";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'absent1', 'absent2'"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("'present'"), std::string::npos) << msg;
  }
}

TEST(MemoryStore, AddIsAtomicAndReadableAsText) {
  MemoryStore store;
  EXPECT_EQ(store.add("n", 5), 5);
  EXPECT_EQ(store.add("n", -7), -2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) store.add("count", 1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(store.get("count", 10ms), "4000");
  EXPECT_EQ(store.add("count", 0), 4000);
  store.set("text", "abc");
  EXPECT_THROW(store.add("text", 1), Error);
}

// ---------------------------------------------------------------------------------------------------------
// Gloo, threads as ranks

DistEnv env_of(int rank, int world) {
  DistEnv env;
  env.rank = rank;
  env.world_size = world;
  env.local_rank = rank;
  env.local_world_size = world;
  return env;
}

// Runs `fn` on `world` threads, each a rank with its own CPU device and Gloo communicator over one store.
// A rank that throws is reported as a test failure (the others then fail by timeout, not hang).
void run_ranks(int world, const std::function<void(Communicator&, Device&)>& fn,
               std::chrono::milliseconds timeout = 5s) {
  MemoryStore store;
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto dev = make_cpu_device();
        auto comm = make_gloo_communicator(env_of(r, world), store, "test", timeout);
        EXPECT_EQ(comm->rank(), r);
        EXPECT_EQ(comm->world_size(), world);
        fn(*comm, *dev);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(errors[r].empty()) << "rank " << r << ": " << errors[r];
}

// A typed view of device memory (CPU device memory is host memory).
template <class T>
class Buf {
 public:
  Buf(Device& dev, size_t n) : mem_(dev, n * sizeof(T)), n_(n) {}
  T* data() const { return static_cast<T*>(mem_.get()); }
  T& operator[](size_t i) const { return data()[i]; }
  size_t size() const { return n_; }

 private:
  DeviceBuffer mem_;
  size_t n_;
};

// Values are small integers or quarters, so that every sum of them is exact in every type.
void encode(DType t, void* p, size_t i, double v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(p)[i] = float(v);
      return;
    case DType::F16:
      static_cast<uint16_t*>(p)[i] = float_to_fp16(float(v));
      return;
    case DType::BF16:
      static_cast<uint16_t*>(p)[i] = float_to_bf16(float(v));
      return;
    case DType::I32:
      static_cast<int32_t*>(p)[i] = int32_t(v);
      return;
    default:
      FAIL() << "no encoding for " << dtype_name(t);
  }
}
double decode(DType t, const void* p, size_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(p)[i];
    case DType::F16:
      return fp16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::BF16:
      return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::I32:
      return static_cast<const int32_t*>(p)[i];
    default:
      ADD_FAILURE() << "no decoding for " << dtype_name(t);
      return 0;
  }
}

// Rank r's element i for all_reduce: exact in its type, and the sum over 3 ranks too.
double ar_value(DType t, int r, size_t i) {
  switch (t) {
    case DType::F32:
      return (r + 1) * 0.25 + double(i % 1000);
    case DType::I32:
      return (r - 1) * 100000.0 + double(i);
    default:  // 16-bit: small integers, negative and positive
      return -(r + 1) + double(i % 5) * 8;
  }
}

TEST(CommunicatorGloo, AllReduceSumAndMaxForEachType) {
  if (!gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_ranks(world, [&](Communicator& comm, Device& dev) {
      const int r = comm.rank();
      for (DType t : {DType::F32, DType::BF16, DType::F16, DType::I32})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
          // 1001: chunks of unequal length; 300001 floats: several of Gloo's 1 MiB segments per rank.
          for (size_t n : {size_t(1001), t == DType::F32 ? size_t(300001) : size_t(7)}) {
            Buf<uint8_t> buf(dev, dtype_bytes(t, n));
            // Filled by an OpenMP team of this rank's thread, as the CPU kernels would: the communicator
            // itself uses no OpenMP, so ranks as threads each with a team are independent.
#pragma omp parallel for
            for (size_t i = 0; i < n; ++i) encode(t, buf.data(), i, ar_value(t, r, i));
            comm.all_reduce(buf.data(), n, t, op);
            size_t wrong = 0;
            for (size_t i = 0; i < n; ++i) {
              double want = ar_value(t, 0, i);
              for (int q = 1; q < world; ++q)
                want = op == ReduceOp::Sum ? want + ar_value(t, q, i) : std::max(want, ar_value(t, q, i));
              if (decode(t, buf.data(), i) != want && wrong++ < 3)
                ADD_FAILURE() << dtype_name(t) << (op == ReduceOp::Sum ? " sum" : " max") << " n " << n
                              << " rank " << r << " [" << i << "] = " << decode(t, buf.data(), i) << ", want "
                              << want;
            }
            EXPECT_EQ(wrong, 0u);
          }
    });
  }
}

// ZeRO's uneven in-place collectives: pieces of different lengths, empty ones, and the even case (which
// takes reduce_scatter / all_gather).
TEST(CommunicatorGloo, ReduceScatterVAndAllGatherV) {
  if (!gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    const std::vector<std::vector<size_t>> shapes =
        world == 2 ? std::vector<std::vector<size_t>>{{5, 9}, {0, 7}, {6, 6}}
                   : std::vector<std::vector<size_t>>{{5, 0, 9}, {3, 3, 3}, {0, 0, 4}, {1, 2, 3}};
    run_ranks(world, [&](Communicator& comm, Device& dev) {
      const int r = comm.rank();
      for (const std::vector<size_t>& counts : shapes)
        for (DType t : {DType::F32, DType::BF16}) {
          size_t total = 0, mine = 0;
          for (int q = 0; q < world; ++q) {
            if (q == r) mine = total;
            total += counts[size_t(q)];
          }
          Buf<uint8_t> buf(dev, dtype_bytes(t, total) + 1);
          for (size_t i = 0; i < total; ++i) encode(t, buf.data(), i, double(r + 1) + double(i % 7));
          comm.reduce_scatter_v(buf.data(), counts, t);
          for (size_t i = mine; i < mine + counts[size_t(r)]; ++i) {
            double want = 0;
            for (int q = 0; q < world; ++q) want += double(q + 1) + double(i % 7);
            EXPECT_EQ(decode(t, buf.data(), i), want) << dtype_name(t) << " reduce_scatter_v [" << i << "]";
          }
          // all_gather_v: each rank's own piece holds its values; afterwards every piece holds its owner's.
          size_t at = 0;
          for (int q = 0; q < world; ++q) {
            for (size_t i = at; i < at + counts[size_t(q)]; ++i)
              encode(t, buf.data(), i, q == r ? double(10 * q) + double(i % 5) : -1.0);
            at += counts[size_t(q)];
          }
          comm.all_gather_v(buf.data(), counts, t);
          at = 0;
          for (int q = 0; q < world; ++q) {
            for (size_t i = at; i < at + counts[size_t(q)]; ++i)
              EXPECT_EQ(decode(t, buf.data(), i), double(10 * q) + double(i % 5))
                  << dtype_name(t) << " all_gather_v piece " << q << " [" << i << "]";
            at += counts[size_t(q)];
          }
        }
      // A count list of the wrong length is an error naming the collective.
      Buf<float> one(dev, 4);
      try {
        comm.all_gather_v(one.data(), {4}, DType::F32);
        ADD_FAILURE() << "all_gather_v took 1 count in a world of " << world;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("all_gather_v"), std::string::npos) << e.what();
      }
    });
  }
}

// The gradient norm of ZeRO stage 2 is a sum of fp64 partial sums.
TEST(CommunicatorGloo, AllReduceF64) {
  if (!gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  run_ranks(3, [&](Communicator& comm, Device& dev) {
    Buf<double> buf(dev, 2);
    buf[0] = 1e-17 * (comm.rank() + 1);
    buf[1] = 1.0 + comm.rank();
    comm.all_reduce(buf.data(), 2, DType::F64);
    EXPECT_DOUBLE_EQ(buf[0], 6e-17);
    EXPECT_EQ(buf[1], 6.0);
  });
}

TEST(CommunicatorGloo, AllReduceMaxKeepsNaN) {
  if (!gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  run_ranks(3, [&](Communicator& comm, Device& dev) {
    Buf<float> buf(dev, 2);
    buf[0] = comm.rank() == 1 ? std::nanf("") : 1.0f;  // an overflow flag must survive Max
    buf[1] = float(comm.rank());
    comm.all_reduce(buf.data(), 2, DType::F32, ReduceOp::Max);
    EXPECT_TRUE(std::isnan(buf[0]));
    EXPECT_EQ(buf[1], 2.0f);
  });
}

// Rank q's element i of chunk j for reduce_scatter: small integers, exact in bf16 when summed.
double rs_value(int q, int j, size_t i) {
  return q * 3 + j * 10 + double(i % 4);
}

TEST(CommunicatorGloo, ReduceScatterInPlaceAndNot) {
  if (!gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_ranks(world, [&](Communicator& comm, Device& dev) {
      const int r = comm.rank();
      const size_t n = 257;
      for (DType t : {DType::F32, DType::BF16})
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max})
          for (bool in_place : {false, true}) {
            Buf<uint8_t> send(dev, dtype_bytes(t, n * world)), out(dev, dtype_bytes(t, n));
            for (int j = 0; j < world; ++j)
              for (size_t i = 0; i < n; ++i) encode(t, send.data(), j * n + i, rs_value(r, j, i));
            void* recv = in_place ? send.data() + dtype_bytes(t, n * r) : out.data();
            comm.reduce_scatter(send.data(), recv, n, t, op);
            size_t wrong = 0;
            for (size_t i = 0; i < n; ++i) {
              double want = rs_value(0, r, i);
              for (int q = 1; q < world; ++q)
                want = op == ReduceOp::Sum ? want + rs_value(q, r, i) : std::max(want, rs_value(q, r, i));
              wrong += decode(t, recv, i) != want;
            }
            EXPECT_EQ(wrong, 0u) << dtype_name(t) << " in place " << in_place << " rank " << r;
          }
    });
  }
}

TEST(CommunicatorGloo, AllGatherInPlaceAndNot) {
  if (!gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_ranks(world, [&](Communicator& comm, Device& dev) {
      const int r = comm.rank();
      const size_t n = 1001;
      for (bool in_place : {false, true}) {
        Buf<float> send(dev, n), recv(dev, n * world);
        for (size_t i = 0; i < n * world; ++i) recv[i] = -1.0f;
        float* mine = in_place ? recv.data() + r * n : send.data();
        for (size_t i = 0; i < n; ++i) mine[i] = float(r * 10000 + int(i));
        comm.all_gather(mine, recv.data(), n, DType::F32);
        size_t wrong = 0;
        for (int q = 0; q < world; ++q)
          for (size_t i = 0; i < n; ++i) wrong += recv[q * n + i] != float(q * 10000 + int(i));
        EXPECT_EQ(wrong, 0u) << "in place " << in_place << " rank " << r;
      }
      // Any whole-byte type moves: 3 bytes of I8 per rank.
      Buf<int8_t> bytes(dev, 3 * world);
      for (int k = 0; k < 3; ++k) bytes[r * 3 + k] = int8_t(-r * 3 - k);
      comm.all_gather(bytes.data() + r * 3, bytes.data(), 3, DType::I8);
      for (int k = 0; k < 3 * world; ++k) EXPECT_EQ(bytes[k], int8_t(-k));
    });
  }
}

TEST(CommunicatorGloo, BroadcastFromRootOne) {
  if (!gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_ranks(world, [&](Communicator& comm, Device& dev) {
      const size_t n = 100003;
      Buf<uint16_t> data(dev, n);
      for (size_t i = 0; i < n; ++i) data[i] = comm.rank() == 1 ? uint16_t(i * 7) : uint16_t(0xffff);
      comm.broadcast(data.data(), n, DType::BF16, 1);
      size_t wrong = 0;
      for (size_t i = 0; i < n; ++i) wrong += data[i] != uint16_t(i * 7);
      EXPECT_EQ(wrong, 0u) << "rank " << comm.rank();
      EXPECT_THROW(comm.broadcast(data.data(), n, DType::BF16, world), Error);  // not a rank: nothing sent
    });
  }
}

TEST(CommunicatorGloo, AllToAll) {
  if (!gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    run_ranks(world, [&](Communicator& comm, Device& dev) {
      const int r = comm.rank();
      const size_t n = 33;
      Buf<int32_t> send(dev, n * world), recv(dev, n * world);
      for (int j = 0; j < world; ++j)
        for (size_t k = 0; k < n; ++k) send[j * n + k] = r * 10000 + j * 100 + int32_t(k);
      comm.all_to_all(send.data(), recv.data(), n, DType::I32);
      // Chunk i of rank r's recv is chunk r of rank i's send.
      for (int i = 0; i < world; ++i)
        for (size_t k = 0; k < n; ++k) EXPECT_EQ(recv[i * n + k], i * 10000 + r * 100 + int32_t(k));
    });
  }
}

TEST(CommunicatorGloo, AllReduceHostAndBarrier) {
  if (!gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    std::atomic<int> arrived{0};
    run_ranks(world, [&](Communicator& comm, Device&) {
      const int r = comm.rank();
      double v[3] = {r + 0.5, 1e-3 * r, 1.0};
      comm.all_reduce_host(v, 3);
      const double sum_r = world * (world - 1) / 2.0;
      EXPECT_DOUBLE_EQ(v[0], sum_r + 0.5 * world);
      EXPECT_DOUBLE_EQ(v[1], 1e-3 * sum_r);
      EXPECT_EQ(v[2], double(world));
      for (int round = 1; round <= 3; ++round) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20 * r));  // the last rank arrives last
        arrived.fetch_add(1);
        comm.barrier();
        EXPECT_GE(arrived.load(), round * world) << "rank " << r << " left barrier " << round << " early";
      }
    });
  }
}

TEST(CommunicatorGloo, EmptyAndUnsupportedCallsLeaveItUsable) {
  if (!gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  run_ranks(2, [&](Communicator& comm, Device& dev) {
    Buf<float> buf(dev, 4);
    for (int i = 0; i < 4; ++i) buf[i] = 1.0f;
    comm.all_reduce(buf.data(), 0, DType::F32);  // nothing to do
    try {
      comm.all_reduce(buf.data(), 4, DType::I8);
      ADD_FAILURE() << "an I8 all_reduce ran";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("I8"), std::string::npos) << e.what();
    }
    comm.all_reduce(buf.data(), 4, DType::F32);
    EXPECT_EQ(buf[3], 2.0f);
  });
}

// A rank that skips a collective: the others fail within about the timeout, with an error naming the
// collective; the skipping rank's next collective fails too (its peers closed their connections) instead of
// hanging; and every communicator is destroyed cleanly afterwards.
TEST(CommunicatorGloo, TimeoutWhenARankSkipsACollective) {
  if (!gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  const int world = 3;
  MemoryStore store;
  std::latch connected(world), others_failed(world - 1);
  std::vector<std::string> errors(world), second_errors(world);
  std::vector<double> elapsed(world, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto dev = make_cpu_device();
      std::unique_ptr<Communicator> comm;
      try {
        comm = make_gloo_communicator(env_of(r, world), store, "timeout", 1s);
      } catch (const std::exception& e) {
        errors[r] = std::string("setup: ") + e.what();
      }
      connected.arrive_and_wait();
      if (!comm) {
        if (r != world - 1) others_failed.count_down();
        return;
      }
      Buf<float> buf(*dev, 1000);
      const auto t0 = Clock::now();
      try {
        if (r != world - 1) {
          comm->all_reduce(buf.data(), 1000, DType::F32);
        } else {
          others_failed.wait();  // skip the all_reduce; go on once the others have given up
          comm->barrier();
        }
      } catch (const Error& e) {
        errors[r] = e.what();
      }
      elapsed[r] = seconds_since(t0);
      if (r != world - 1) others_failed.count_down();
      try {  // a failed communicator refuses further work at once
        comm->all_reduce(buf.data(), 1000, DType::F32);
      } catch (const Error& e) {
        second_errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    const std::string want = r == world - 1 ? "gloo barrier" : "gloo all_reduce of 1000 x F32";
    EXPECT_NE(errors[r].find(want), std::string::npos) << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("of 3"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("1 s timeout"), std::string::npos) << errors[r];
    EXPECT_NE(second_errors[r].find("failed earlier"), std::string::npos)
        << "rank " << r << ": " << second_errors[r];
  }
  EXPECT_LT(std::max(elapsed[0], elapsed[1]), 4.0);  // about the 1 s timeout
  EXPECT_LT(elapsed[world - 1], 2.5);                // peers gone: fails on closure or its own timeout
}

TEST(CommunicatorGloo, RendezvousTimeoutWhenAPeerNeverJoins) {
  if (!gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  MemoryStore store;
  const auto t0 = Clock::now();
  try {
    make_gloo_communicator(env_of(0, 2), store, "lonely", 500ms);
    FAIL() << "rank 0 connected to a rank that never started";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rank 0 of 2 could not connect"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lonely/1"), std::string::npos) << msg;  // the store key it waited for
  }
  EXPECT_LT(seconds_since(t0), 3.0);
}

TEST(CommunicatorGloo, WithoutGlooSaysHowToGetIt) {
  if (gloo_compiled()) GTEST_SKIP() << "built with Gloo";
  MemoryStore store;
  try {
    make_gloo_communicator(env_of(0, 2), store, "x", 1s);
    FAIL() << "a build without Gloo made a Gloo communicator";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("libgloo-dev"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------------------------------------------------
// Single process

TEST(CommunicatorSingleProcess, CollectivesAreCopiesOrNothing) {
  auto dev = make_cpu_device();
  auto comm = make_single_process_communicator(*dev);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_STREQ(comm->backend(), "single process");
  const size_t n = 5;
  Buf<float> a(*dev, n), b(*dev, n);
  for (size_t i = 0; i < n; ++i) a[i] = float(i) + 0.5f, b[i] = -1.0f;

  comm->all_reduce(a.data(), n, DType::F32, ReduceOp::Sum);
  comm->all_reduce(a.data(), n, DType::F32, ReduceOp::Max);
  comm->broadcast(a.data(), n, DType::F32, 0);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(a[i], float(i) + 0.5f);
  EXPECT_THROW(comm->broadcast(a.data(), n, DType::F32, 1), Error);

  comm->reduce_scatter(a.data(), b.data(), n, DType::F32);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(b[i], a[i]);
  for (size_t i = 0; i < n; ++i) b[i] = -1.0f;
  comm->all_gather(a.data(), b.data(), n, DType::F32);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(b[i], a[i]);
  for (size_t i = 0; i < n; ++i) b[i] = -1.0f;
  comm->all_to_all(a.data(), b.data(), n, DType::F32);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(b[i], a[i]);
  comm->reduce_scatter(a.data(), a.data(), n, DType::F32);  // in place
  comm->all_gather(a.data(), a.data(), n, DType::F32);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(a[i], float(i) + 0.5f);

  double host[2] = {1.5, -2.0};
  comm->all_reduce_host(host, 2);
  EXPECT_EQ(host[0], 1.5);
  EXPECT_EQ(host[1], -2.0);
  comm->barrier();
  comm->join();
  comm->check();
}

}  // namespace
}  // namespace anvil::dist
