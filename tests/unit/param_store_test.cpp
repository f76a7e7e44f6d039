// ParamStore (src/model/param_store.hpp): what it plans for training and for inference, and that its
// weights go up and come back down.
#include "model/param_store.hpp"

#include <gtest/gtest.h>

#include <vector>

#include "anvil/model_config.hpp"
#include "anvil/rng.hpp"
#include "core/half.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

size_t bytes_of(const MemoryPlan& plan, MemoryCategory c) {
  size_t n = 0;
  for (const PlannedBuffer& b : plan.buffers()) n += b.category == c ? b.bytes : 0;
  return n;
}

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
  EXPECT_EQ(bytes_of(plan, MemoryCategory::MasterWeights), P * 4);
  EXPECT_EQ(bytes_of(plan, MemoryCategory::Weights), P * 2);
  EXPECT_EQ(bytes_of(plan, MemoryCategory::Gradients), P * 4);
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
    EXPECT_EQ(bytes_of(plan, MemoryCategory::MasterWeights), 0u);
    EXPECT_EQ(bytes_of(plan, MemoryCategory::Gradients), 0u);
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
  EXPECT_EQ(bytes_of(plan, MemoryCategory::Weights), store.numel() * 4);
}

}  // namespace
}  // namespace anvil
