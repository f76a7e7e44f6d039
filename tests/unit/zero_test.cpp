// ZeRO's pieces on the CPU, without processes: the partition of the flat buffer (it covers it, its cuts are
// aligned and follow each optimizer's rule, its shards are balanced), and every optimizer over the shards
// of a partition equal to one optimizer over the whole buffer: the parameters bit for bit, and the state
// tensors that are slices of the whole one equal to it when concatenated in rank order.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <numeric>

#include "anvil/rng.hpp"
#include "dist/zero_partition.hpp"
#include "optim/adamw_8bit.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

using dist::ShardCuts;
using dist::ZeroPartition;

TransformerConfig small_model() {
  TransformerConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 32, c.vocab_size = 72, c.block_size = 16;
  return c;
}

// The tensor holding element `x` strictly inside it (not at its first element), or nullptr.
const ParamTensor* tensor_cut_by(const ParamLayout& l, size_t x) {
  for (const ParamTensor& t : l.tensors())
    if (t.offset < x && x < t.offset + t.numel()) return &t;
  return nullptr;
}

TEST(ZeroPartition, CoversTheBufferInAlignedBalancedShards) {
  const ParamLayout l = ParamLayout::decoder(small_model());
  const size_t n = l.total_numel();
  for (ShardCuts cuts : {ShardCuts::Anywhere, ShardCuts::Blocks8bit, ShardCuts::WholeTensors})
    for (int world : {1, 2, 3, 4, 5}) {
      SCOPED_TRACE(testing::Message() << "cuts " << int(cuts) << " world " << world);
      const ZeroPartition p(l, world, cuts);
      ASSERT_EQ(p.world(), world);
      EXPECT_EQ(p.cuts().front(), 0u);
      EXPECT_EQ(p.cuts().back(), n);
      const std::vector<size_t> counts = p.counts();
      EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), size_t(0)), n);
      for (int r = 0; r < world; ++r) {
        const ParamRange s = p.shard(r);
        EXPECT_LE(s.begin, s.end);
        EXPECT_EQ(s.begin % dist::kShardAlign, 0u) << "rank " << r;
        if (r == 0) continue;
        EXPECT_EQ(s.begin, p.shard(r - 1).end);
        const size_t c = s.begin;
        const ParamTensor* t = tensor_cut_by(l, c);
        if (cuts == ShardCuts::WholeTensors) {
          EXPECT_EQ(t, nullptr) << "a cut at " << c << " splits " << (t ? t->name : "");
        }
        if (cuts == ShardCuts::Blocks8bit && t) {
          EXPECT_EQ((c - t->offset) % kAdamW8bitBlockSize, 0u) << "a cut inside " << t->name;
        }
      }
      // Elementwise optimizers: within one alignment step of the ideal share.
      if (cuts == ShardCuts::Anywhere) {
        for (int r = 0; r < world; ++r)
          EXPECT_NEAR(double(counts[size_t(r)]), double(n) / world, 2.0 * dist::kShardAlign) << "rank " << r;
      }
    }
}

TEST(ZeroPartition, CountsInABucketAndEmptyShards) {
  const ParamLayout l = ParamLayout::decoder(small_model());
  const ZeroPartition p(l, 3, ShardCuts::Anywhere);
  const size_t b = p.shard(0).end - 5, e = p.shard(2).begin + 7;
  const std::vector<size_t> c = p.counts_in(b, e);
  EXPECT_EQ(c, (std::vector<size_t>{5, p.shard(1).numel(), 7}));
  EXPECT_EQ(p.counts_in(0, 3), (std::vector<size_t>{3, 0, 0}));
  // Far more ranks than alignment steps of the biggest tensor: Adafactor's whole tensors leave ranks empty,
  // and the shards still cover everything.
  const ZeroPartition many(l, 200, ShardCuts::WholeTensors);
  size_t empty = 0, total = 0;
  for (size_t n : many.counts()) empty += n == 0, total += n;
  EXPECT_GT(empty, 0u);
  EXPECT_EQ(total, l.total_numel());
  EXPECT_EQ(many.max_shard(), l.get("transformer.wte.weight").numel());
}

// One optimizer over the whole buffer, and one engine per rank of a ZeRO partition, each with its shard's
// optimizer, all fed the same parameters and gradients.
struct ShardRig {
  OptimizerKind kind;
  OptimizerHyper h;
  std::unique_ptr<Engine> whole;
  std::vector<std::unique_ptr<Engine>> shards;
  std::vector<float> p0;
  ShardRig(OptimizerKind k, const OptimizerHyper& hyper, int world) : kind(k), h(hyper) {
    auto options = [&](int stage, int rank) {
      EngineOptions o;
      o.device = DeviceKind::CPU, o.batch_size = 1, o.seq_len = 8, o.training = true;
      o.optimizer = kind, o.optim = h;
      o.zero_stage = stage, o.zero_world = world, o.zero_rank = rank;
      return o;
    };
    whole = std::make_unique<Engine>(small_model(), options(0, 0));
    for (int r = 0; r < world; ++r) shards.push_back(std::make_unique<Engine>(small_model(), options(1, r)));
    const size_t n = whole->model().layout().total_numel();
    Rng rng(3);
    p0.resize(n);
    for (float& x : p0) x = 0.5f * rng.normal();
    whole->model().upload_weights(whole->device(), p0.data());
    for (auto& e : shards) e->model().upload_weights(e->device(), p0.data());
  }
  void step(float lr, int64_t t) {
    std::vector<float> g(p0.size());
    Rng rng(100 + uint64_t(t));
    for (float& x : g) x = rng.normal();
    auto run = [&](Engine& e) {
      Model& m = e.model();
      e.device().copy_to_device(m.grads(), g.data(), g.size() * sizeof(float));
      const ParamRange s = e.optimizer().shard();
      e.optimizer().step(e.ops(), m.params(), m.param_store().grad_at(s.begin), lr, t, 0.5f);
    };
    run(*whole);
    for (auto& e : shards) run(*e);
  }
  std::vector<char> state(Engine& e, const OptimizerStateTensor& t) {
    std::vector<char> host(dtype_bytes(t.dtype, t.count));
    if (!host.empty()) e.device().copy_to_host(host.data(), t.data, host.size());
    return host;
  }
};

class EveryShardedOptimizer : public ::testing::TestWithParam<std::string> {};

TEST_P(EveryShardedOptimizer, ShardsUpdateAsTheWholeBuffer) {
  const std::string name = GetParam();
  OptimizerHyper h;
  h.weight_decay = 0.1f;
  h.momentum = 0.9f;      // SGD: a momentum buffer
  h.min_8bit_size = 256;  // 8-bit AdamW: the small model's matrices get 8-bit states, cut on blocks
  h.adafactor_beta1 = 0.9f;
  h.relative_step = false;
  h.adamw_bf16_moments = name == "adamw_bf16_moments";  // stochastic rounding by element index
  const OptimizerKind kind = parse_optimizer(name == "adamw_bf16_moments" ? "adamw_torch_fused" : name);
  for (int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    ShardRig rig(kind, h, world);
    for (int64_t t = 1; t <= 3; ++t) rig.step(1e-2f, t);
    const size_t n = rig.p0.size();
    std::vector<float> want(n);
    rig.whole->device().copy_to_host(want.data(), rig.whole->model().params(), n * sizeof(float));
    size_t covered = 0;
    for (auto& e : rig.shards) {
      const ParamRange s = e->optimizer().shard();
      std::vector<float> got(s.numel());
      if (!got.empty()) e->device().copy_to_host(got.data(), e->model().params(), got.size() * sizeof(float));
      EXPECT_EQ(0, std::memcmp(got.data(), want.data() + s.begin, got.size() * sizeof(float)))
          << "shard [" << s.begin << ", " << s.end << ") differs from the whole-buffer update";
      covered += s.numel();
    }
    EXPECT_EQ(covered, n);
    // The slices of the state concatenate to the whole state.
    for (const OptimizerStateTensor& t : rig.whole->optimizer().state_tensors()) {
      std::vector<char> joined;
      for (auto& e : rig.shards)
        for (const OptimizerStateTensor& u : e->optimizer().state_tensors())
          if (u.name == t.name) {
            const std::vector<char> piece = rig.state(*e, u);
            joined.insert(joined.end(), piece.begin(), piece.end());
          }
      EXPECT_TRUE(joined == rig.state(*rig.whole, t)) << t.name << " is not the concatenation of its slices";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, EveryShardedOptimizer,
                         ::testing::Values("adamw_torch_fused", "adamw_bf16_moments", "adamw_8bit",
                                           "adafactor", "sgd"));

// A shard that would split what an optimizer keeps per tensor or per block is refused, naming the tensor.
TEST(ZeroShardedOptimizer, RefusesShardsAgainstItsRule) {
  const ParamLayout l = ParamLayout::decoder(small_model());
  const ParamTensor& qkv = l.get("transformer.h.0.attn.c_attn.weight");
  OptimizerHyper h;
  h.min_8bit_size = 256;
  test::expect_error(
      [&] {
        make_optimizer(OptimizerKind::Adafactor, l, h, ParamRange{0, qkv.offset + 32});
      },
      {"adafactor", "transformer.h.0.attn.c_attn.weight", "whole tensors"});
  test::expect_error(
      [&] {
        make_optimizer(OptimizerKind::AdamW8bit, l, h, ParamRange{0, qkv.offset + 32});
      },
      {"adamw_8bit", "transformer.h.0.attn.c_attn.weight", "block"});
  // On a block boundary it is accepted.
  EXPECT_NO_THROW(make_optimizer(OptimizerKind::AdamW8bit, l, h, ParamRange{0, qkv.offset + 256}));
}

}  // namespace
}  // namespace anvil
