// GradSync (src/dist/grad_sync.hpp) with one process: the reduction of one rank is the identity, so what
// the gradients hold after a step's reduction is exactly what the communication type made of them. fp32
// gradients reduced in bf16 or fp16 (communication_data_type) come back rounded once to that type, for whole
// gradients in buckets and for gradients by unit (ZeRO-2's slots added into the shard); in their own type
// they come back unchanged. The store plans the staging buffer in the communication type.
#include "dist/grad_sync.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "anvil/rng.hpp"
#include "core/half.hpp"
#include "dist/zero_partition.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

float rounded(DType t, float v) {
  return t == DType::F32    ? v
         : t == DType::BF16 ? bf16_to_float(float_to_bf16(v))
                            : fp16_to_float(float_to_fp16(v));
}

std::vector<float> random_values(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = rng.normal() * 1e-2f;
  return v;
}

ParamLayout layout() {
  return ParamLayout::decoder(TransformerConfig::preset("llama-tiny"));
}

// One step's reduction of whole gradients `g` (fp32) on one process: `store` (unplanned) set to reduce in
// `comm`, planned and bound on `dev`, its units completed last to first. Returns the store's memory (read
// the gradients while it lives) and the collectives queued.
struct Reduced {
  std::unique_ptr<Arena> arena;
  int64_t collectives = 0;
};
Reduced reduce_whole_gradients(Device& dev, ParamStore& store, DType comm, size_t bucket_bytes,
                               const std::vector<float>& g) {
  store.set_comm_type(comm);
  MemoryPlan plan;
  store.plan_memory(plan);
  Reduced r{std::make_unique<Arena>(dev, plan)};
  store.bind(*r.arena);
  auto ops = make_cpu_ops(dev, store.precision());
  auto one = dist::make_single_process_communicator(dev);
  std::copy(g.begin(), g.end(), store.grads_f32());
  dist::GradSync sync(*one, store, bucket_bytes, nullptr, ops.get());
  sync.begin_micro_batch(true, true);
  for (int u = int(store.layout().units().size()) - 1; u >= 0; --u) store.grads_ready(u);
  sync.finish();
  r.collectives = sync.buckets_queued();
  return r;
}

// The staging buffer (a communication buffer of the plan): the whole gradients' size in the communication
// type, or the unit slots' (sharded gradients); none when the communication type is the gradients'.
TEST(GradSyncCommType, TheStorePlansTheStagingBuffer) {
  const std::vector<ParamUnit> units = layout().units();
  auto al = [](size_t b) { return MemoryPlan::aligned(b); };
  {
    ParamStore store(layout(), {DType::BF16, DType::F32}, true);
    store.set_comm_type(DType::F32);
    EXPECT_FALSE(store.comm_staged());
    MemoryPlan plan;
    store.plan_memory(plan);
    EXPECT_EQ(plan.bytes(MemoryCategory::Gradients), store.numel() * 4);
    EXPECT_EQ(plan.bytes(MemoryCategory::Communication), 0u);
  }
  {
    ParamStore store(layout(), {DType::BF16, DType::F32}, true);
    store.set_comm_type(DType::BF16);
    EXPECT_TRUE(store.comm_staged());
    MemoryPlan plan;
    store.plan_memory(plan);
    EXPECT_EQ(plan.bytes(MemoryCategory::Gradients), store.numel() * 4);
    EXPECT_EQ(plan.bytes(MemoryCategory::Communication), al(store.numel() * 2));
    bool named = false;
    for (const PlannedBuffer& b : plan.buffers())
      named |= b.name == "gradients in the communication type (bf16)";
    EXPECT_TRUE(named);
    auto dev = make_cpu_device();
    Arena arena(*dev, plan);
    store.bind(arena);
    EXPECT_NE(store.comm_grad_at(0), store.grad_at(0));
    EXPECT_EQ(static_cast<char*>(store.comm_grad_at(10)) - static_cast<char*>(store.comm_grad_at(0)), 20);
  }
  {
    ParamStore store(layout(), {DType::BF16, DType::F32}, true);
    const ParamRange shard{0, store.numel() / 2};
    store.set_grad_shard(shard);
    store.set_comm_type(DType::F16);
    MemoryPlan plan;
    store.plan_memory(plan);
    const size_t block = units[1].numel;
    const size_t slots4 = al(units.front().numel * 4) + al(units.back().numel * 4) + 2 * al(block * 4);
    const size_t slots2 = al(units.front().numel * 2) + al(units.back().numel * 2) + 2 * al(block * 2);
    EXPECT_EQ(plan.bytes(MemoryCategory::Gradients), shard.numel() * 4 + slots4);
    EXPECT_EQ(plan.bytes(MemoryCategory::Communication), slots2);
  }
}

// Whole gradients (data parallelism, ZeRO-1): buckets converted, reduced, converted back at finish.
TEST(GradSyncCommType, WholeGradientsComeBackRoundedOnce) {
  auto dev = make_cpu_device();
  for (const DType comm : {DType::F32, DType::BF16, DType::F16}) {
    ParamStore store(layout(), {DType::F32, DType::F32}, true);
    const std::vector<float> g = random_values(store.numel(), 11);
    const Reduced r = reduce_whole_gradients(*dev, store, comm, 4096, g);  // small buckets
    EXPECT_GT(r.collectives, 1);
    const float* got = store.grads_f32();
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_EQ(got[i], rounded(comm, g[i])) << dtype_name(comm) << " " << i;
  }
}

// Frozen tensors' gradients are not reduced: with LoRA (every base tensor frozen) one bucket of the whole
// step makes one collective per block (its factors are one run), and only the factors come back through the
// bf16 communication type; the frozen gradients keep what backward wrote (the step zeroes them).
TEST(GradSyncCommType, OnlyTrainableRunsAreReduced) {
  auto dev = make_cpu_device();
  LoraConfig lora;
  lora.r = 4, lora.target_modules = {"all-linear"};
  ParamStore store(ParamLayout::decoder(TransformerConfig::preset("llama-tiny"), lora),
                   {DType::F32, DType::F32}, true);
  const std::vector<float> g = random_values(store.numel(), 12);
  const Reduced r = reduce_whole_gradients(*dev, store, DType::BF16, 0, g);  // one bucket after backward
  EXPECT_EQ(r.collectives, TransformerConfig::preset("llama-tiny").n_layer);
  const float* got = store.grads_f32();
  size_t rounded_count = 0;
  for (const ParamTensor& t : store.layout().tensors())
    for (size_t i = t.offset; i < t.offset + t.numel(); ++i) {
      ASSERT_EQ(got[i], t.trainable ? rounded(DType::BF16, g[i]) : g[i]) << t.name;
      rounded_count += t.trainable && got[i] != g[i];
    }
  EXPECT_GT(rounded_count, 0u);
}

// Gradients by unit (ZeRO-2 with one rank: the shard is everything): each unit's slot converted into its
// staging slot, reduce-scattered there, added into the shard's fp32 gradients over two micro-batches.
TEST(GradSyncCommType, GradientsByUnitAddRoundedPiecesInFp32) {
  auto dev = make_cpu_device();
  for (const DType comm : {DType::F32, DType::BF16}) {
    ParamStore store(layout(), {DType::F32, DType::F32}, true);
    const dist::ZeroPartition partition(store.layout(), 1, dist::ShardCuts::Anywhere);
    store.set_grad_shard(partition.shard(0));
    store.set_comm_type(comm);
    MemoryPlan plan;
    store.plan_memory(plan);
    Arena arena(*dev, plan);
    store.bind(arena);
    dev->fill_zero(store.grads(), store.grad_bytes());
    auto ops = make_cpu_ops(*dev, store.precision());
    auto one = dist::make_single_process_communicator(*dev);
    dist::GradSync sync(*one, store, 0, &partition, ops.get());
    const std::vector<ParamUnit>& units = store.layout().units();
    const std::vector<float> a = random_values(store.numel(), 5), b = random_values(store.numel(), 6);
    for (const std::vector<float>* micro : {&a, &b}) {
      sync.begin_micro_batch(micro == &a, micro == &b);
      for (int u = int(units.size()) - 1; u >= 0; --u) {
        const ParamUnit& unit = units[size_t(u)];
        store.begin_grads(*dev, u);
        std::copy(micro->begin() + long(unit.offset), micro->begin() + long(unit.offset + unit.numel),
                  static_cast<float*>(store.grad_at(unit.offset)));
        store.grads_ready(u);
      }
      sync.finish();
    }
    const float* got = store.grads_f32();
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(got[i], rounded(comm, a[i]) + rounded(comm, b[i])) << dtype_name(comm) << " " << i;
  }
}

// A store of offloaded gradients (ParamStore::set_grads_on_host) with one rank's ZeRO-2 shard (everything),
// its host gradients starting at `fill`, and the GradSync that writes them; `freeze`: patterns frozen first.
struct OffloadedStore {
  explicit OffloadedStore(float fill, const std::vector<std::string>& freeze = {})
      : dev(make_cpu_device()),
        store(layout(), {DType::F32, DType::F32}, true),
        partition(store.layout(), 1, dist::ShardCuts::Anywhere) {
    if (!freeze.empty()) store.freeze(freeze);
    store.set_master_range(partition.shard(0));
    store.set_grad_shard(partition.shard(0));
    store.set_master_on_host();
    store.set_grads_on_host();
    master.resize(store.numel());
    host_grads.assign(store.numel(), fill);
    store.bind_host_master(master.data());
    store.bind_host_grads(host_grads.data());
    store.plan_memory(plan);
    arena = std::make_unique<Arena>(*dev, plan);
    store.bind(*arena);
    ops = make_cpu_ops(*dev, store.precision());
    comm = dist::make_single_process_communicator(*dev);
    sync = std::make_unique<dist::GradSync>(*comm, store, 0, &partition, ops.get());
  }
  // One micro-batch whose backward writes `g` (the flat layout), units last to first.
  void micro_batch(const std::vector<float>& g, bool first, bool last) {
    sync->begin_micro_batch(first, last);
    const std::vector<ParamUnit>& units = store.layout().units();
    for (int u = int(units.size()) - 1; u >= 0; --u) {
      const ParamUnit& unit = units[size_t(u)];
      store.begin_grads(*dev, u);
      std::copy(g.begin() + long(unit.offset), g.begin() + long(unit.offset + unit.numel),
                static_cast<float*>(store.grad_at(unit.offset)));
      store.grads_ready(u);
    }
    sync->finish();
  }
  std::unique_ptr<Device> dev;
  ParamStore store;
  dist::ZeroPartition partition;
  std::vector<float> master, host_grads;
  MemoryPlan plan;
  std::unique_ptr<Arena> arena;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<dist::Communicator> comm;
  std::unique_ptr<dist::GradSync> sync;
};

// The shard's gradients are host memory outside the plan, never zeroed by the step; the first micro-batch's
// pieces overwrite whatever it held (here NaN) and the second's add, so the step's gradients are the two
// micro-batches' sum, exactly as with device gradients. The last micro-batch sums the norm's squares as it
// writes them (the norm sink).
TEST(GradSyncOffload, FirstMicroBatchOverwritesTheHostGradients) {
  OffloadedStore o(std::nanf(""));
  for (const PlannedBuffer& b : o.plan.buffers())
    EXPECT_EQ(b.name.find("this rank's shard, reduced"), std::string::npos);
  ASSERT_EQ(o.store.grads(), o.host_grads.data());
  EXPECT_TRUE(o.sync->first_micro_batch_differs());
  double sum_squares = 0;
  o.sync->set_norm_sink(&sum_squares);
  EXPECT_TRUE(o.sync->sums_norm());
  const std::vector<float> a = random_values(o.store.numel(), 9), b = random_values(o.store.numel(), 10);
  for (int step = 0; step < 2; ++step) {  // the second step overwrites the first's sums too
    sum_squares = 0;
    o.micro_batch(a, true, false);
    o.micro_batch(b, false, true);
  }
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(o.host_grads[i], a[i] + b[i]) << i;
  const double whole = cpu::sum_squares(DType::F32, o.host_grads.data(), o.host_grads.size());
  EXPECT_NEAR(sum_squares, whole, 1e-12 * whole);
}

// With frozen tensors the norm's squares cover the trainable gradients only, and those hold the step's sums
// (a frozen tensor's gradients in host memory are neither summed nor needed: the optimizer skips them).
TEST(GradSyncOffload, TheNormSumLeavesFrozenTensorsOut) {
  OffloadedStore o(0.0f, {"model.layers.0.*"});
  double sum_squares = 0;
  o.sync->set_norm_sink(&sum_squares);
  const std::vector<float> a = random_values(o.store.numel(), 11);
  o.micro_batch(a, true, true);
  double trainable = 0;
  for (const ParamTensor& t : o.store.layout().tensors()) {
    if (!t.trainable) continue;
    for (size_t i = t.offset; i < t.offset + t.numel(); ++i) {
      ASSERT_EQ(o.host_grads[i], a[i]) << t.name;
      trainable += double(a[i]) * a[i];
    }
  }
  EXPECT_NEAR(sum_squares, trainable, 1e-12 * trainable);
}

// backward_grad_dtype bf16 (ZeRO-2/3): the unit slots hold bf16 (half their memory) and each micro-batch's
// reduced piece is added into the shard's fp32 gradients, so the sum over micro-batches is the fp32 sum of
// the bf16 values. By default the reduction runs in bf16 (no staging); with communication_data_type fp32
// (FSDP2's reduce_dtype) the slots are widened into fp32 staging slots first.
TEST(GradSyncCommType, Bf16UnitGradientsAccumulateInFp32) {
  auto dev = make_cpu_device();
  for (const std::optional<DType> comm : {std::optional<DType>(), std::optional<DType>(DType::F32)}) {
    ParamStore store(layout(), {DType::BF16, DType::F32}, true);
    const std::vector<ParamUnit>& units = store.layout().units();
    const dist::ZeroPartition partition(store.layout(), 1, dist::ShardCuts::Anywhere);
    if (comm) store.set_comm_type(*comm);
    store.set_grad_shard(partition.shard(0), DType::BF16);
    EXPECT_EQ(store.written_grad_type(), DType::BF16);
    EXPECT_EQ(store.comm_type(), comm.value_or(DType::BF16));
    EXPECT_EQ(store.comm_staged(), comm.has_value());
    MemoryPlan plan;
    store.plan_memory(plan);
    auto al = [](size_t b) { return MemoryPlan::aligned(b); };
    auto slots = [&](size_t elem) {
      return al(units.front().numel * elem) + al(units.back().numel * elem) + 2 * al(units[1].numel * elem);
    };
    EXPECT_EQ(plan.bytes(MemoryCategory::Gradients), al(store.numel() * 4) + slots(2));
    EXPECT_EQ(plan.bytes(MemoryCategory::Communication), comm ? slots(4) : 0u);
    Arena arena(*dev, plan);
    store.bind(arena);
    dev->fill_zero(store.grads(), store.grad_bytes());
    auto ops = make_cpu_ops(*dev, {DType::BF16, DType::BF16});
    auto one = dist::make_single_process_communicator(*dev);
    dist::GradSync sync(*one, store, 0, &partition, ops.get());
    const std::vector<float> a = random_values(store.numel(), 7), b = random_values(store.numel(), 8);
    for (const std::vector<float>* micro : {&a, &b}) {
      sync.begin_micro_batch(micro == &a, micro == &b);
      for (int u = int(units.size()) - 1; u >= 0; --u) {
        const ParamUnit& unit = units[size_t(u)];
        store.begin_grads(*dev, u);
        auto* slot = static_cast<uint16_t*>(store.grad_at(unit.offset));
        for (size_t i = 0; i < unit.numel; ++i) slot[i] = float_to_bf16((*micro)[unit.offset + i]);
        store.grads_ready(u);
      }
      sync.finish();
    }
    const float* got = store.grads_f32();
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(got[i], rounded(DType::BF16, a[i]) + rounded(DType::BF16, b[i])) << i;
  }
}

}  // namespace
}  // namespace anvil
