// A store of the trainable tensors only (ParamStore::keep_trainable_only), what LoRA without ZeRO uses: the
// layout of its trainable part, where the gradient views point, what the plan holds, and training with it
// equal to training with the whole layout's master weights and gradients (as ZeRO keeps them), every
// optimizer, fp32 and bf16, with the same optimizer state (checkpoints move between the two).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "anvil/rng.hpp"
#include "core/half.hpp"
#include "lora_test_util.hpp"
#include "model/param_layout.hpp"
#include "model/param_store.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

LoraConfig all_linear(int r) {
  LoraConfig c;
  c.r = r, c.alpha = 8, c.target_modules = {"all-linear"};
  return c;
}

EngineOptions lora_options(bool trainable_only, Precision p = Precision::FP32,
                           OptimizerKind k = OptimizerKind::AdamW) {
  EngineOptions o;
  o.batch_size = 2, o.seq_len = 16, o.training = true, o.precision = p, o.optimizer = k;
  o.lora = all_linear(4);
  o.trainable_only_store = trainable_only;
  o.optim.weight_decay = 0.1f;
  o.optim.momentum = 0.9f;
  o.optim.min_8bit_size = 64;  // so that the tiny model's factors get 8-bit states
  return o;
}

TEST(TrainableOnlyLayout, HoldsTheTrainableTensorsInOrder) {
  const ParamLayout l = ParamLayout::decoder(TransformerConfig::preset("llama-tiny"), all_linear(4));
  const ParamLayout t = l.trainable_part();
  size_t at = 0, i = 0;
  for (const ParamTensor& p : l.tensors()) {
    if (!p.trainable) continue;
    ASSERT_LT(i, t.tensors().size());
    const ParamTensor& q = t.tensors()[i++];
    EXPECT_EQ(q.name, p.name);
    EXPECT_EQ(q.numel(), p.numel());
    EXPECT_EQ(q.decay, p.decay);
    EXPECT_EQ(q.role, p.role);
    EXPECT_EQ(q.offset, at) << q.name;
    EXPECT_EQ(q.adapts, -1);
    EXPECT_TRUE(q.trainable);
    at += p.numel();
  }
  EXPECT_EQ(i, t.tensors().size());
  EXPECT_EQ(t.total_numel(), at);
  // Units without a trainable tensor (the embedding, the final norm) are left out; each block keeps its name.
  ASSERT_EQ(t.units().size(), size_t(TransformerConfig::preset("llama-tiny").n_layer));
  EXPECT_EQ(t.units()[0].name, "block.0");
  EXPECT_EQ(t.units()[0].offset, 0u);
}

TEST(TrainableOnlyStore, GradientViewsAndPlan) {
  const TransformerConfig cfg = TransformerConfig::preset("tiny");  // GPT-2: LayerNorm biases too
  Engine e(cfg, lora_options(true));
  ParamStore& s = e.model().param_store();
  ASSERT_TRUE(s.trainable_only());
  const ParamLayout& l = s.layout();
  const ParamLayout& kept = s.optimizer_layout();
  const char* grads = static_cast<const char*>(s.grads());
  size_t adapters = 0, sink_views = 0;
  for (const ParamTensor& t : l.tensors()) {
    SCOPED_TRACE(t.name);
    const char* g = static_cast<const char*>(s.grad_at(t.offset));
    if (t.trainable) {  // packed in layout order
      ++adapters;
      EXPECT_EQ(g, grads + kept.get(t.name).offset * sizeof(float));
    } else if (t.shape.ndim == 1) {  // a norm's or bias's: the sink, outside the kept gradients
      ASSERT_NE(g, nullptr);
      EXPECT_TRUE(g < grads || g >= grads + s.grad_bytes());
      ++sink_views;
    } else {
      EXPECT_EQ(g, nullptr);
    }
  }
  EXPECT_GT(adapters, 0u);
  EXPECT_GT(sink_views, 0u);
  EXPECT_EQ(s.master_range(), kept.all());
  EXPECT_EQ(s.grad_range(), kept.all());
  EXPECT_EQ(s.grad_bytes(), kept.total_numel() * sizeof(float));
  EXPECT_EQ(s.reduced_grad_at(0), s.grads());
  // The plan: fp32 master weights of the adapters beside the (fp32) weights; gradients of the adapters and
  // the sink (at most a block's 1-D tensors: a few times the width).
  const MemoryPlan& plan = e.plan();
  EXPECT_EQ(plan.requested_bytes(MemoryCategory::MasterWeights), kept.total_numel() * sizeof(float));
  EXPECT_EQ(plan.requested_bytes(MemoryCategory::Weights), l.total_numel() * sizeof(float));
  const size_t sink = plan.requested_bytes(MemoryCategory::Gradients) - s.grad_bytes();
  EXPECT_GT(sink, 0u);
  EXPECT_LE(sink, 16 * size_t(cfg.n_embd) * sizeof(float));

  // Upload and download: every tensor as given (fp32), the adapters from the master weights.
  std::vector<float> w(l.total_numel());
  Rng rng(3);
  for (float& v : w) v = rng.normal();
  s.upload(e.device(), w.data());
  std::vector<float> back(w.size());
  s.download(e.device(), back.data());
  EXPECT_EQ(back, w);
}

// A LoRA with an adapter frozen too (freeze_parameters) keeps the whole layout's buffers (its gradient views
// would otherwise need the frozen factor's); under ZeRO too the store keeps the adapters only.
TEST(TrainableOnlyStore, OnlyForLoraWithEveryAdapterTraining) {
  const TransformerConfig cfg = TransformerConfig::preset("llama-tiny");
  EngineOptions o = lora_options(true);
  ParamLayout l = ParamLayout::decoder(cfg, o.lora);
  EXPECT_TRUE(keeps_trainable_only(o, l));
  o.zero_stage = 2, o.zero_world = 2;  // ZeRO shards the trainable part (lora_zero_test.cpp)
  EXPECT_TRUE(keeps_trainable_only(o, l));
  o = lora_options(true);
  o.freeze = {"*layers.0.self_attn.q_proj.lora_A*"};
  Engine e(cfg, o);
  EXPECT_FALSE(e.model().param_store().trainable_only());
  EngineOptions plain;
  plain.training = true;
  EXPECT_FALSE(keeps_trainable_only(plain, ParamLayout::decoder(cfg)));
}

struct Trained {
  std::vector<float> weights;
  std::vector<OptimizerStateTensor> states;
  std::vector<std::vector<char>> state_bytes;
};

// Three optimizer steps of a LoRA model from fixed weights and tokens.
Trained train(const EngineOptions& o) {
  const TransformerConfig cfg = TransformerConfig::preset("llama-tiny");
  Engine e(cfg, o);
  EXPECT_EQ(e.model().param_store().trainable_only(), o.trainable_only_store);
  Model& m = e.model();
  const ParamLayout& l = m.layout();
  Rng rng(5);
  const std::vector<float> w = test::random_weights(l, rng);
  m.upload_weights(e.device(), w.data());
  std::vector<int32_t> tokens, targets;
  for (int i = 0; i < o.batch_size * o.seq_len; ++i) {
    tokens.push_back(int32_t(rng.next_u64() % uint64_t(cfg.vocab_size)));
    targets.push_back(int32_t(rng.next_u64() % uint64_t(cfg.vocab_size)));
  }
  e.device().copy_to_device(e.tokens(0), tokens.data(), tokens.size() * sizeof(int32_t));
  e.device().copy_to_device(e.targets(0), targets.data(), targets.size() * sizeof(int32_t));
  for (int step = 1; step <= 3; ++step) {
    e.device().fill_zero(m.grad_buffer(), m.grad_bytes());
    m.forward(e.ops(), e.inputs(0, o.batch_size, o.seq_len), 1.0f / float(tokens.size()), true);
    m.backward(e.ops(), e.inputs(0, o.batch_size, o.seq_len));
    m.param_store().zero_frozen_grads(e.device());
    e.optimizer().step(e.update_ops(), m.params(), m.grad_buffer(), 1e-2f, step, 1.0f);
    m.sync_weights(e.ops());
  }
  Trained out;
  out.weights.resize(l.total_numel());
  m.download_weights(e.device(), out.weights.data());
  out.states = e.optimizer().state_tensors();
  for (const OptimizerStateTensor& t : out.states) {
    out.state_bytes.emplace_back(dtype_bytes(t.dtype, t.count));
    if (t.count)
      e.device().copy_to_host(out.state_bytes.back().data(), t.data, out.state_bytes.back().size());
  }
  return out;
}

class TrainableOnlyTraining : public ::testing::TestWithParam<std::tuple<OptimizerKind, Precision>> {};

TEST_P(TrainableOnlyTraining, EqualsTheWholeLayoutsBuffers) {
  const auto [kind, precision] = GetParam();
  const Trained packed = train(lora_options(true, precision, kind));
  const Trained whole = train(lora_options(false, precision, kind));
  const ParamLayout l = ParamLayout::decoder(TransformerConfig::preset("llama-tiny"), all_linear(4));
  for (const ParamTensor& t : l.tensors()) {
    for (size_t i = t.offset; i < t.offset + t.numel(); ++i) {
      // The adapters bit for bit; the base as the compute-type weights hold it (a 16-bit store keeps the
      // frozen tensors' fp32 values only with the whole layout's master weights).
      const float want = t.trainable || precision == Precision::FP32
                             ? whole.weights[i]
                             : bf16_to_float(float_to_bf16(whole.weights[i]));
      ASSERT_EQ(packed.weights[i], want) << t.name << " element " << i - t.offset;
    }
  }
  // The same optimizer state, tensor by tensor: a checkpoint of either resumes the other.
  ASSERT_EQ(packed.states.size(), whole.states.size());
  for (size_t i = 0; i < packed.states.size(); ++i) {
    SCOPED_TRACE(packed.states[i].name);
    EXPECT_EQ(packed.states[i].name, whole.states[i].name);
    EXPECT_EQ(packed.states[i].dtype, whole.states[i].dtype);
    EXPECT_EQ(packed.states[i].count, whole.states[i].count);
    EXPECT_EQ(packed.state_bytes[i], whole.state_bytes[i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TrainableOnlyTraining,
                         ::testing::Combine(::testing::Values(OptimizerKind::AdamW, OptimizerKind::AdamW8bit,
                                                              OptimizerKind::Adafactor, OptimizerKind::SGD),
                                            ::testing::Values(Precision::FP32, Precision::BF16)),
                         [](const auto& info) {
                           return std::string(optimizer_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) == Precision::FP32 ? "_fp32" : "_bf16");
                         });

}  // namespace
}  // namespace anvil
