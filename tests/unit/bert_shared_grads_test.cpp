// Gradients in dead activation memory (BertModel with share_grad_memory, what a run of one micro-batch per
// step uses): the plan puts each unit's gradients only where no data is live while they are, the arena
// shrinks by what they share, and training computes exactly what separate gradient memory computes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "anvil/rng.hpp"
#include "bert_harness.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

using test::BertBatch;
using test::BertHarness;

TransformerConfig small_bert(int layers = 3) {
  TransformerConfig c = TransformerConfig::preset("bert-tiny");
  c.n_layer = layers, c.n_head = 2, c.n_embd = 32, c.intermediate_size = 48, c.vocab_size = 53;
  c.block_size = 16, c.type_vocab_size = 2, c.num_labels = 3, c.pad_token_id = 0;
  return c;
}

BertBatch random_batch(const TransformerConfig& c, uint64_t seed, int B, int T) {
  Rng rng(seed);
  BertBatch b;
  b.B = B, b.T = T;
  for (int s = 0; s < B; ++s) {
    b.lengths.push_back(1 + int(rng.below(uint64_t(T))));
    for (int t = 0; t < T; ++t) {
      const bool real = t < b.lengths.back();
      b.tokens.push_back(real ? int32_t(1 + rng.below(c.vocab_size - 1)) : c.pad_token_id);
      b.types.push_back(real ? int32_t(rng.below(c.type_vocab_size)) : 0);
    }
    b.labels.push_back(int32_t(rng.below(c.num_labels)));
  }
  return b;
}

struct Range {
  size_t begin, end;
  bool overlaps(const Range& o) const { return begin < o.end && o.begin < end; }
};
Range range_of(const PlannedBuffer& b) {
  return {b.offset, b.offset + MemoryPlan::aligned(b.bytes)};
}

struct Case {
  std::string name;
  int B, T;
  OpsPrecision precision;
  CheckpointPolicy checkpointing;
};

std::vector<Case> cases() {
  const OpsPrecision fp32{}, bf16{DType::BF16, DType::F32}, bf16_grads{DType::BF16, DType::BF16};
  return {{"fp32", 4, 16, fp32, {}},
          {"bf16", 4, 16, bf16, {}},
          {"bf16 with bf16 gradients", 4, 16, bf16_grads, {}},
          {"fp32, one short sequence (gradients larger than a block's activations)", 1, 3, fp32, {}},
          {"fp32, full checkpointing every 2", 4, 16, fp32, {CheckpointMode::Full, 2}},
          {"bf16, selective checkpointing", 4, 16, bf16, {CheckpointMode::Selective, 1}}};
}

// Backward writes the final unit's gradients while every activation is live, block l's while the embedding
// output, the recompute buffers and blocks 0..l are, and the embedding's while the embedding activations
// are; the losses stay live after backward (the trainer sums them then): each unit's gradients must lie
// clear of those, and of every buffer of another category.
TEST(BertSharedGradients, PlanPutsEachUnitsGradientsInMemoryDeadWhenTheyAreWritten) {
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.name);
    const TransformerConfig cfg = small_bert();
    BertModel separate(cfg, k.B, k.T, true, k.checkpointing, k.precision, false);
    BertModel shared(cfg, k.B, k.T, true, k.checkpointing, k.precision, true);
    EXPECT_FALSE(separate.grads_share_activations());
    EXPECT_TRUE(shared.grads_share_activations());
    MemoryPlan ps, pt;
    separate.plan_memory(ps, DeviceKind::CPU);
    shared.plan_memory(pt, DeviceKind::CPU);
    EXPECT_EQ(ps.shared_bytes(), 0u);
    EXPECT_GT(pt.shared_bytes(), 0u);
    EXPECT_LT(pt.total_bytes(), ps.total_bytes());
    // The same buffers and categories; the arena is the categories less what is shared.
    size_t sum = 0;
    for (int c = 0; c < kMemoryCategories; ++c) {
      EXPECT_EQ(pt.bytes(MemoryCategory(c)), ps.bytes(MemoryCategory(c)))
          << memory_category_name(MemoryCategory(c));
      sum += pt.bytes(MemoryCategory(c));
    }
    EXPECT_EQ(sum - pt.shared_bytes(), pt.total_bytes());
    EXPECT_EQ(ps.total_bytes() - pt.total_bytes(), pt.shared_bytes());

    const PlannedBuffer* grads = nullptr;
    for (const PlannedBuffer& b : pt.buffers())
      if (b.category == MemoryCategory::Gradients) grads = &b;
    ASSERT_NE(grads, nullptr);
    EXPECT_EQ(grads->bytes, shared.grad_bytes());
    EXPECT_EQ(grads->shared_bytes, pt.shared_bytes());
    const size_t ge = dtype_bits(k.precision.grad) / 8;
    const std::vector<ParamUnit>& units = shared.layout().units();
    ASSERT_EQ(units.size(), size_t(cfg.n_layer) + 2);
    for (size_t u = 0; u < units.size(); ++u) {
      const Range g{grads->offset + units[u].offset * ge,
                    grads->offset + (units[u].offset + units[u].numel) * ge};
      const bool embedding = u == 0, final = u + 1 == units.size();
      const int block = embedding || final ? -1 : int(u) - 1;
      for (const PlannedBuffer& b : pt.buffers()) {
        if (&b == grads) continue;
        bool live = true;  // while this unit's gradients are
        // The losses are read after backward (the trainer's loss sum): live throughout.
        if ((b.category == MemoryCategory::Activations || b.category == MemoryCategory::Recompute) &&
            b.name != "losses") {
          const bool embedding_act = b.name.rfind("embedding", 0) == 0;
          int b_block = -1;
          if (std::sscanf(b.name.c_str(), "block %d activations", &b_block) != 1) b_block = -1;
          if (final)
            live = true;
          else if (embedding)
            live = embedding_act;
          else
            live = embedding_act || b.category == MemoryCategory::Recompute ||
                   (b_block >= 0 && b_block <= block);
        }
        if (live) {
          EXPECT_FALSE(g.overlaps(range_of(b))) << units[u].name << " gradients overlap " << b.name;
        }
      }
    }
    // Most of the gradients reuse activation memory: all but about one block's and the head's (with
    // activations at least as large as gradients per block).
    if (k.B == 4 && k.checkpointing.mode == CheckpointMode::None) {
      const size_t block_grads = units[1].numel * ge;
      EXPECT_GE(pt.shared_bytes() + block_grads + units.back().numel * ge + 256 * units.size(), grads->bytes);
    }
  }
}

TEST(BertSharedGradients, MemoryPlanCountsSharedBytesOnce) {
  MemoryPlan p;
  p.add("a", MemoryCategory::Activations, 1000);  // [0, 1024)
  p.add("b", MemoryCategory::Activations, 512);   // [1024, 1536)
  const size_t i = p.add_shared("g", MemoryCategory::Gradients, 1000, 1280);
  EXPECT_EQ(p.buffers()[i].offset, 1280u);
  EXPECT_EQ(p.buffers()[i].shared_bytes, 256u);
  EXPECT_EQ(p.total_bytes(), 2304u);
  EXPECT_EQ(p.shared_bytes(), 256u);
  EXPECT_EQ(p.add("c", MemoryCategory::Workspace, 10), 3u);
  EXPECT_EQ(p.buffers()[3].offset, 2304u);  // after the shared buffer's end
  const std::string report = p.report();
  EXPECT_NE(report.find("shared"), std::string::npos) << report;
}

// Separate gradient memory zeroed before each step and gradients in activation memory (never zeroed by the
// caller; filled with NaN before the forward to show that backward zeroes all it needs) give bit-identical
// losses and gradients, step after step, with the weights updated in between.
TEST(BertSharedGradients, TrainsBitForBitAsSeparateGradientMemory) {
  for (const Case& k : cases()) {
    SCOPED_TRACE(k.name);
    const TransformerConfig cfg = small_bert();
    BertHarness a(cfg, k.B, k.T, true, DeviceKind::CPU, k.checkpointing, k.precision, false, false);
    BertHarness b(cfg, k.B, k.T, true, DeviceKind::CPU, k.checkpointing, k.precision, false, true);
    a.model().init_weights(11, a.device());
    std::vector<float> w = a.params();
    b.model().upload_weights(b.device(), w.data());
    for (int step = 0; step < 3; ++step) {
      const BertBatch batch = random_batch(cfg, 100 + step, k.B, k.T);
      a.upload(batch), b.upload(batch);
      a.zero_grads();
      std::vector<unsigned char> nan(b.model().grad_bytes(), 0xff);
      b.device().copy_to_device(b.model().grad_buffer(), nan.data(), nan.size());
      const std::vector<float> la = a.forward(k.B, k.T, 1.0f / float(k.B), true);
      const std::vector<float> lb = b.forward(k.B, k.T, 1.0f / float(k.B), true);
      a.backward(k.B, k.T), b.backward(k.B, k.T);
      ASSERT_EQ(la, lb) << "step " << step;
      // The trainer sums the losses after backward: the gradients must not have overwritten them.
      ASSERT_EQ(b.losses(k.B), lb) << "step " << step << ": losses after backward";
      const std::vector<float> ga = a.grads(), gb = b.grads();
      ASSERT_EQ(ga.size(), gb.size());
      size_t nonzero = 0;
      for (size_t i = 0; i < ga.size(); ++i) {
        ASSERT_EQ(std::memcmp(&ga[i], &gb[i], sizeof(float)), 0) << "step " << step << " gradient " << i;
        nonzero += ga[i] != 0;
      }
      EXPECT_GT(nonzero, ga.size() / 2);
      for (size_t i = 0; i < w.size(); ++i) w[i] -= 0.05f * ga[i];  // the same update into both
      a.model().upload_weights(a.device(), w.data());
      b.model().upload_weights(b.device(), w.data());
    }
  }
}

// The trainer's choice: gradient memory is shared exactly when a step has one micro-batch.
TEST(BertSharedGradients, OnlyRunsOfOneMicroBatchPerStepShare) {
  TrainConfig cfg;
  cfg.model = small_bert();
  cfg.model_preset.clear();
  cfg.per_device_train_batch_size = 4;
  cfg.device = "cpu";
  cfg.gradient_accumulation_steps = 1;
  EXPECT_TRUE(training_engine_options(cfg).share_grad_memory);
  cfg.gradient_accumulation_steps = 2;
  EXPECT_FALSE(training_engine_options(cfg).share_grad_memory);
}

}  // namespace
}  // namespace anvil
