// ParamStore (src/model/param_store.hpp): what it plans for training and for inference, and that its
// weights go up and come back down.
#include "model/param_store.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "anvil/model_config.hpp"
#include "anvil/rng.hpp"
#include "core/half.hpp"
#include "runtime/device.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

std::vector<float> random_weights(size_t n) {
  Rng rng(3);
  std::vector<float> w(n);
  for (float& x : w) x = rng.normal();
  return w;
}

TEST(ParamStore, TrainingInBf16KeepsFp32MasterWeights) {
  ParamStore store(ParamLayout::decoder(TransformerConfig::preset("llama-tiny")), {DType::BF16, DType::F32},
                   true);
  MemoryPlan plan;
  store.plan_memory(plan);
  const size_t P = store.numel();
  EXPECT_EQ(plan.requested_bytes(MemoryCategory::MasterWeights), P * 4);
  EXPECT_EQ(plan.requested_bytes(MemoryCategory::Weights), P * 2);
  EXPECT_EQ(plan.requested_bytes(MemoryCategory::Gradients), P * 4);
  auto dev = make_cpu_device();
  Arena arena(*dev, plan);
  store.bind(arena);
  const std::vector<float> w = random_weights(P);
  store.upload(*dev, w.data());
  std::vector<float> back(P);
  store.download(*dev, back.data());
  EXPECT_EQ(back, w);  // the master weights, exactly
}

// Inference needs no fp32 copy beside the 16-bit weights (a 1B-parameter model in bf16 saves 5 GB): the
// store plans none, and download widens the 16-bit weights.
TEST(ParamStore, InferenceIn16BitKeepsTheComputeTypeOnly) {
  for (DType t : {DType::BF16, DType::F16}) {
    ParamStore store(ParamLayout::decoder(TransformerConfig::preset("llama-tiny")), {t, DType::F32}, false);
    MemoryPlan plan;
    store.plan_memory(plan);
    const size_t P = store.numel();
    EXPECT_EQ(plan.requested_bytes(MemoryCategory::MasterWeights), 0u);
    EXPECT_EQ(plan.requested_bytes(MemoryCategory::Gradients), 0u);
    EXPECT_EQ(plan.total_bytes(), MemoryPlan::aligned(P * 2));
    auto dev = make_cpu_device();
    Arena arena(*dev, plan);
    store.bind(arena);
    EXPECT_EQ(store.master(), nullptr);
    const std::vector<float> w = random_weights(P);
    store.upload(*dev, w.data());
    std::vector<float> back(P);
    store.download(*dev, back.data());
    for (size_t i = 0; i < P; ++i) {
      const float rounded =
          t == DType::BF16 ? bf16_to_float(float_to_bf16(w[i])) : fp16_to_float(float_to_fp16(w[i]));
      ASSERT_EQ(back[i], rounded) << i;
    }
  }
}

TEST(ParamStore, Fp32InferenceWeightsAreTheMasterWeights) {
  ParamStore store(ParamLayout::decoder(TransformerConfig::preset("tiny")), {}, false);
  MemoryPlan plan;
  store.plan_memory(plan);
  auto dev = make_cpu_device();
  Arena arena(*dev, plan);
  store.bind(arena);
  EXPECT_EQ(static_cast<void*>(store.master()), store.weights());
  EXPECT_EQ(plan.requested_bytes(MemoryCategory::Weights), store.numel() * 4);
}

// ZeRO stage 2 (set_grad_shard): the gradients kept for the optimizer are the shard's; backward writes into
// unit slots (the first and last units' own, two shared in turn by the units between), each handed out
// zeroed by begin_grads, after the slot-reuse hook saw the unit that held it.
TEST(ParamStore, ShardedGradientsLiveInUnitSlots) {
  ParamStore store(ParamLayout::decoder(TransformerConfig::preset("llama-tiny")), {DType::BF16, DType::F32},
                   true);
  const std::vector<ParamUnit>& units = store.layout().units();
  ASSERT_GE(units.size(), 5u);  // embedding, >= 3 blocks, final
  const ParamRange shard{store.numel() / 4, store.numel() / 2};
  store.set_grad_shard(shard);
  EXPECT_TRUE(store.grads_sharded());
  MemoryPlan plan;
  store.plan_memory(plan);
  const size_t block = units[1].numel;
  auto al = [](size_t b) { return MemoryPlan::aligned(b); };
  EXPECT_EQ(plan.requested_bytes(MemoryCategory::Gradients),
            shard.numel() * 4 + al(units.front().numel * 4) + al(units.back().numel * 4) + 2 * al(block * 4));
  EXPECT_LT(plan.requested_bytes(MemoryCategory::Gradients), store.numel() * 4);
  auto dev = make_cpu_device();
  Arena arena(*dev, plan);
  store.bind(arena);
  EXPECT_EQ(store.grad_bytes(), shard.numel() * 4);
  EXPECT_EQ(store.reduced_grad_at(shard.begin), store.grads());
  test::expect_error([&] { (void)store.reduced_grad_at(shard.end + 1); }, {"outside this rank's shard"});

  std::vector<int> reused;
  store.set_slot_reuse_hook([&](int u) { reused.push_back(u); });
  // Backward order of a decoder with a tied head: the embedding begins in forward, then final, blocks from
  // the last, embedding again (a no-op: it is still being written).
  const int n = int(units.size());
  store.begin_grads(*dev, 0);
  static_cast<float*>(store.grad_at(units[0].offset))[0] = 7.f;
  store.begin_grads(*dev, n - 1);
  store.grads_ready(n - 1);
  for (int u = n - 2; u >= 1; --u) {
    store.begin_grads(*dev, u);
    const float* g = static_cast<const float*>(store.grad_at(units[size_t(u)].offset));
    for (size_t i = 0; i < units[size_t(u)].numel; i += 97) ASSERT_EQ(g[i], 0.f) << "unit " << u;  // zeroed
    static_cast<float*>(store.grad_at(units[size_t(u)].offset))[0] = float(u);
    store.grads_ready(u);
  }
  store.begin_grads(*dev, 0);
  EXPECT_EQ(static_cast<float*>(store.grad_at(units[0].offset))[0], 7.f);  // not zeroed again
  store.grads_ready(0);
  // Block u's slot went to block u - 2: the hook saw blocks n-2 .. 3, in that order.
  std::vector<int> want;
  for (int u = n - 2; u >= 3; --u) want.push_back(u);
  EXPECT_EQ(reused, want);
  // The slots of blocks 1 and 2 still hold them; block 3's went to block 1.
  EXPECT_EQ(static_cast<float*>(store.grad_at(units[1].offset))[0], 1.f);
  test::expect_error([&] { (void)store.grad_at(units[3].offset); }, {"whose slot it does not hold"});
  // The next micro-batch: a slot's own unit is seen by the hook too (its piece may still be unsent).
  reused.clear();
  store.begin_grads(*dev, 0);
  EXPECT_EQ(reused, std::vector<int>{0});
  EXPECT_EQ(static_cast<float*>(store.grad_at(units[0].offset))[0], 0.f);
}

// init draws each element's value from its place in the seed's stream, so a ZeRO-3 store, which draws its
// shard only, holds exactly the whole store's values there (and the whole store's are those of drawing the
// stream in order, which the golden tests pin).
TEST(ParamStore, ShardedInitIsTheWholeInitsSlice) {
  const ParamLayout layout = ParamLayout::decoder(TransformerConfig::preset("llama-tiny"));
  auto dev = make_cpu_device();
  ParamStore whole(layout, {DType::BF16, DType::F32}, true);
  MemoryPlan pw;
  whole.plan_memory(pw);
  Arena aw(*dev, pw);
  whole.bind(aw);
  ParamInit how;
  how.residual_std = 0.005f;
  how.zero_row = 3;
  whole.init(42, how, *dev);
  std::vector<float> all(whole.numel());
  whole.download(*dev, all.data());
  const ParamRange shard{whole.numel() / 3 + 5, 2 * whole.numel() / 3 + 1};
  ParamStore part(layout, {DType::BF16, DType::F32}, true);
  part.set_master_range(shard);
  part.set_grad_shard(shard);
  part.set_weight_shard(shard);
  MemoryPlan pp;
  part.plan_memory(pp);
  Arena ap(*dev, pp);
  part.bind(ap);
  part.init(42, how, *dev);
  std::vector<float> mine(shard.numel());
  dev->copy_to_host(mine.data(), part.master(), mine.size() * sizeof(float));
  EXPECT_EQ(mine, std::vector<float>(all.begin() + long(shard.begin), all.begin() + long(shard.end)));
  // The shard's bf16 weights are its master weights rounded.
  std::vector<uint16_t> w(shard.numel());
  dev->copy_to_host(w.data(), part.weights(), w.size() * sizeof(uint16_t));
  for (size_t i = 0; i < w.size(); i += 101) EXPECT_EQ(w[i], float_to_bf16(mine[i])) << i;
}

}  // namespace
}  // namespace anvil
