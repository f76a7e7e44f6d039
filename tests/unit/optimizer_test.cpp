// The optimizer layer: parameter groups from the layout, the fused AdamW (fp32 and bf16 moments) and SGD
// against reference formulas, per-group learning-rate multipliers, the state bytes each optimizer plans,
// every optimizer training the tiny model with falling loss, exact resume for each, and clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "anvil/rng.hpp"
#include "anvil/trainer.hpp"
#include "data/byte_corpus.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

TransformerConfig tiny_model() {
  TransformerConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.vocab_size = 40, c.block_size = 8;
  return c;
}

TEST(ParamGroups, FromTheLayout) {
  const ParamLayout layout = ParamLayout::decoder(tiny_model());
  const ParamRangeTable t = ParamRangeTable::from_layout(layout);
  ASSERT_EQ(t.begins.size(), t.groups.size());
  EXPECT_EQ(t.begins.front(), 0u);
  // Every element's group matches its tensor: embeddings, decayed matrices, no-decay vectors.
  for (const ParamTensor& p : layout.tensors()) {
    size_t r = 0;
    while (r + 1 < t.begins.size() && t.begins[r + 1] <= p.offset) ++r;
    const ParamGroup want =
        !p.decay ? ParamGroup::NoDecay
        : p.name.find(".wte.") != std::string::npos || p.name.find(".wpe.") != std::string::npos
            ? ParamGroup::Embedding
            : ParamGroup::Decay;
    EXPECT_EQ(ParamGroup(t.groups[r]), want) << p.name;
    // The whole tensor is inside range r.
    const size_t end = r + 1 < t.begins.size() ? t.begins[r + 1] : layout.total_numel();
    EXPECT_LE(p.offset + p.numel(), end) << p.name;
  }
  for (size_t r = 1; r < t.groups.size(); ++r) EXPECT_NE(t.groups[r], t.groups[r - 1]) << "unmerged ranges";
}

// An engine over the tiny model with random weights and gradients, to drive one optimizer directly.
struct Rig {
  std::unique_ptr<Engine> e;
  std::vector<float> p0, g;
  Rig(OptimizerKind kind, const OptimizerHyper& h) {
    EngineOptions o;
    o.device = DeviceKind::CPU, o.batch_size = 1, o.seq_len = 8, o.training = true;
    o.optimizer = kind, o.optim = h;
    e = std::make_unique<Engine>(tiny_model(), o);
    const size_t n = e->model().layout().total_numel();
    Rng rng(3);
    p0.resize(n), g.resize(n);
    for (float& x : p0) x = 0.5f * rng.normal();
    e->device().copy_to_device(e->model().params(), p0.data(), n * sizeof(float));
  }
  void step(float lr, int64_t t, uint64_t grad_seed) {
    Rng rng(grad_seed);
    for (float& x : g) x = rng.normal();
    e->device().copy_to_device(e->model().grads(), g.data(), g.size() * sizeof(float));
    e->optimizer().step(e->ops(), e->model().params(), e->model().grads(), lr, t, 0.5f);
  }
  std::vector<float> params() {
    std::vector<float> p(p0.size());
    e->device().copy_to_host(p.data(), e->model().params(), p.size() * sizeof(float));
    return p;
  }
  ParamGroup group_of(size_t i) const {
    const ParamRangeTable t = ParamRangeTable::from_layout(e->model().layout());
    size_t r = 0;
    while (r + 1 < t.begins.size() && t.begins[r + 1] <= i) ++r;
    return ParamGroup(t.groups[r]);
  }
};

TEST(Sgd, MatchesPyTorchFormulas) {
  struct Case {
    float momentum, dampening;
    bool nesterov;
    float wd;
  };
  for (const Case c : {Case{0, 0, false, 0}, Case{0, 0, false, 0.1f}, Case{0.9f, 0, false, 0.01f},
                       Case{0.9f, 0.3f, false, 0}, Case{0.9f, 0, true, 0.01f}}) {
    SCOPED_TRACE(testing::Message() << "momentum " << c.momentum << " dampening " << c.dampening
                                    << " nesterov " << c.nesterov << " wd " << c.wd);
    OptimizerHyper h;
    h.momentum = c.momentum, h.dampening = c.dampening, h.nesterov = c.nesterov, h.weight_decay = c.wd;
    h.lr_multiplier[int(ParamGroup::NoDecay)] = 0.5f;
    h.lr_multiplier[int(ParamGroup::Embedding)] = 2.0f;
    Rig rig(OptimizerKind::SGD, h);
    std::vector<double> p(rig.p0.begin(), rig.p0.end()), buf(p.size(), 0.0);
    const float lr = 0.1f;
    for (int64_t t = 1; t <= 3; ++t) {
      rig.step(lr, t, 100 + t);
      for (size_t i = 0; i < p.size(); ++i) {
        const ParamGroup grp = rig.group_of(i);
        const double glr = lr * h.lr_multiplier[int(grp)];
        double d = double(rig.g[i]) * 0.5 + (grp == ParamGroup::NoDecay ? 0.0 : c.wd) * p[i];
        if (c.momentum != 0) {
          buf[i] = t == 1 ? d : c.momentum * buf[i] + (1 - c.dampening) * d;
          d = c.nesterov ? d + c.momentum * buf[i] : buf[i];
        }
        p[i] -= glr * d;
      }
    }
    const std::vector<float> got = rig.params();
    for (size_t i = 0; i < p.size(); ++i) ASSERT_NEAR(got[i], p[i], 1e-5 * (1 + std::fabs(p[i]))) << i;
    EXPECT_EQ(rig.e->optimizer().state_bytes() > 4 * p.size(), c.momentum != 0);
  }
}

TEST(Sgd, NesterovWithoutMomentumIsAnError) {
  OptimizerHyper h;
  h.nesterov = true;
  test::expect_error([&] { Rig rig(OptimizerKind::SGD, h); }, {"Nesterov", "momentum"});
}

TEST(FusedAdamW, GroupMultipliersAndBf16Moments) {
  OptimizerHyper h;
  h.weight_decay = 0.1f;
  h.lr_multiplier[int(ParamGroup::Embedding)] = 0.0f;  // embeddings frozen: no update, no decay
  Rig a(OptimizerKind::AdamW, h);
  h.adamw_bf16_moments = true;
  Rig b(OptimizerKind::AdamW, h);
  for (int64_t t = 1; t <= 5; ++t) a.step(1e-2f, t, 7 + t), b.step(1e-2f, t, 7 + t);
  const std::vector<float> pa = a.params(), pb = b.params();
  double max_move = 0, max_diff = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    if (a.group_of(i) == ParamGroup::Embedding) {
      ASSERT_EQ(pa[i], a.p0[i]) << "embedding element " << i << " moved with lr multiplier 0";
      continue;
    }
    max_move = std::max(max_move, double(std::fabs(pa[i] - a.p0[i])));
    max_diff = std::max(max_diff, double(std::fabs(pa[i] - pb[i])));
  }
  EXPECT_GT(max_move, 1e-2);
  // bf16 moments (8 bits of mantissa, stochastic rounding) follow the fp32 ones closely.
  EXPECT_LT(max_diff, 0.05 * max_move);
  const size_t n = pa.size();
  EXPECT_GE(a.e->optimizer().state_bytes(), 8 * n);
  EXPECT_LT(a.e->optimizer().state_bytes(), 8 * n + 4096);
  EXPECT_GE(b.e->optimizer().state_bytes(), 4 * n);
  EXPECT_LT(b.e->optimizer().state_bytes(), 4 * n + 4096);
}

// --- through the trainer: every optimizer trains, resumes exactly, and is planned ---------------------

using Corpus = test::ByteCorpus;

TrainConfig config(const Corpus& c, const std::string& out, const std::string& optim) {
  json j = {
      {"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 256}, {"block_size", 32}}},
      {"train_data", c.dir / "data/train.bin"},
      {"per_device_train_batch_size", 8},
      {"max_steps", 30},
      {"learning_rate", optim == "sgd" ? 0.3 : 3e-3},
      {"warmup_steps", 3},
      {"lr_scheduler_type", "cosine"},
      {"weight_decay", 0.01},
      {"logging_steps", 1},
      {"device", "cpu"},
      {"seed", 9},
      {"optim", optim},
      {"output_dir", out}};
  if (optim == "sgd") j["momentum"] = 0.9;
  return TrainConfig::from_json(j, "test");
}

std::vector<double> losses(const std::string& out) {
  std::vector<double> v;
  std::istringstream in(test::read_file(out + "/metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    if (j.contains("loss")) v.push_back(j["loss"].get<double>());
  }
  return v;
}

class EveryOptimizer : public testing::TestWithParam<std::string> {};

TEST_P(EveryOptimizer, TrainsWithFallingLoss) {
  Corpus c;
  const TrainConfig cfg = config(c, c.dir / "run", GetParam());
  train(cfg);
  const std::vector<double> l = losses(cfg.output_dir);
  ASSERT_EQ(l.size(), 30u);
  double end = 0;
  for (size_t i = l.size() - 5; i < l.size(); ++i) end += l[i] / 5;
  EXPECT_LT(end, l.front() - 1.5) << GetParam() << " did not train";
}

TEST_P(EveryOptimizer, ResumeIsExact) {
  Corpus c;
  TrainConfig full = config(c, c.dir / "full", GetParam());
  full.max_steps = 12, full.save_steps = 6;
  train(full);
  TrainConfig resumed = full;
  resumed.output_dir = c.dir / "resumed";
  resumed.resume_from_checkpoint = c.dir / "full/checkpoint-6";
  train(resumed);
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(test::read_file(c.dir / "full/checkpoint-12/" + std::string(f)) ==
                test::read_file(c.dir / "resumed/checkpoint-12/" + std::string(f)))
        << f << " differs after resume with " << GetParam();
}

TEST_P(EveryOptimizer, PlanHasTheOptimizersState) {
  Corpus c;
  const TrainConfig cfg = config(c, c.dir / "run", GetParam());
  EngineOptions o = training_engine_options(cfg, DeviceKind::CPU);
  const MemoryPlan plan = plan_engine_memory(cfg.model, o);
  std::unique_ptr<Optimizer> opt = make_optimizer(o.optimizer, ParamLayout::decoder(cfg.model), o.optim);
  EXPECT_EQ(plan.bytes(MemoryCategory::OptimizerState), opt->state_bytes());
  const double per_param = double(opt->state_bytes()) / double(opt->numel());
  const std::string name = GetParam();
  if (name == "adamw_torch_fused") {
    EXPECT_NEAR(per_param, 8.0, 0.1);
  } else if (name == "sgd") {
    EXPECT_NEAR(per_param, 4.0, 0.1);  // momentum buffer
  } else if (name == "adafactor") {
    EXPECT_LT(per_param, 2.0);  // factored: rows + columns per matrix
  } else {
    EXPECT_LT(per_param, 8.0);  // 8-bit: small tensors and embeddings keep fp32 states
  }
}

// A training step computes its clip factor on the device and hands it to the optimizer as
// grad_scale_device (no host read of the gradient norm inside the step). The update must be the one the
// same factor gives on the host, bit for bit, in the parameters and in every state buffer: host s equals
// (host 1, device s) and (host 1/4, device 4s), all products being exact.
TEST_P(EveryOptimizer, DeviceGradScaleEqualsHostGradScale) {
  OptimizerHyper h;
  h.weight_decay = 0.1f;
  h.momentum = 0.9f;         // SGD: a momentum buffer that carries the scale
  h.min_8bit_size = 256;     // 8-bit AdamW: the tiny model's matrices get 8-bit states (the rest fp32)
  h.adafactor_beta1 = 0.9f;  // Adafactor: a first moment too
  const OptimizerKind kind = parse_optimizer(GetParam());
  const float s = 0.37f;
  struct Variant {
    float host;
    float device;
    bool use_device;
  };
  const auto run = [&](Variant v) {
    Rig rig(kind, h);
    Device& dev = rig.e->device();
    DeviceBuffer scalar(dev, sizeof(float));
    dev.copy_to_device(scalar.get(), &v.device, sizeof(float));
    const auto* device_scale = v.use_device ? static_cast<const float*>(scalar.get()) : nullptr;
    for (int64_t t = 1; t <= 3; ++t) {
      Rng rng(40 + uint64_t(t));
      for (float& x : rig.g) x = rng.normal();
      dev.copy_to_device(rig.e->model().grads(), rig.g.data(), rig.g.size() * sizeof(float));
      rig.e->optimizer().step(rig.e->ops(), rig.e->model().params(), rig.e->model().grads(), 1e-2f, t, v.host,
                              device_scale);
    }
    // Parameters, then every state buffer, as bytes.
    std::vector<char> bytes(rig.g.size() * sizeof(float));
    dev.copy_to_host(bytes.data(), rig.e->model().params(), bytes.size());
    for (const OptimizerStateTensor& st : rig.e->optimizer().state_tensors()) {
      const size_t at = bytes.size(), size = dtype_bytes(st.dtype, st.count);
      bytes.resize(at + size);
      dev.copy_to_host(bytes.data() + at, st.data, size);
    }
    return bytes;
  };
  const std::vector<char> host = run({s, 0.f, false});
  EXPECT_TRUE(host == run({1.f, s, true})) << GetParam() << ": device scale s differs from host scale s";
  EXPECT_TRUE(host == run({0.25f, 4 * s, true})) << GetParam() << ": the two scales are not multiplied";
  // The comparison can see a wrong scale: an unscaled run differs (at least in the states).
  EXPECT_FALSE(host == run({1.f, 0.f, false})) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Optimizers, EveryOptimizer,
                         testing::Values("adamw_torch_fused", "adafactor", "adamw_8bit", "sgd"));

TEST(OptimizerConfig, ErrorsNameTheKey) {
  test::expect_error(
      [] {
        TrainConfig::from_json({{"optim", "lion"}}, "cfg");
      },
      {"cfg", "optim", "lion", "sgd"});
  test::expect_error([] { TrainConfig::from_json({{"optim", "paged_adamw_8bit"}}, "cfg"); }, {"paged"});
  test::expect_error([] { TrainConfig::from_json({{"momentum", 0.9}}, "cfg"); }, {"momentum", "sgd"});
  test::expect_error(
      [] {
        TrainConfig::from_json({{"optim", "sgd"}, {"nesterov", true}}, "cfg");
      },
      {"nesterov", "momentum"});
  test::expect_error(
      [] {
        TrainConfig::from_json({{"optim", "sgd"}, {"adamw_bf16_moments", true}}, "cfg");
      },
      {"adamw_bf16_moments"});
}

TEST(OptimizerConfig, DeepSpeedOptimizerBlockSelectsAdamWAndConflictsWithAnotherOptim) {
  test::TempDir dir;
  test::write_file(dir / "ds.json", R"({"optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})");
  const std::string ds = dir / "ds.json";
  test::expect_error(
      [&] {
        TrainConfig::from_json({{"optim", "sgd"}, {"momentum", 0.9}, {"deepspeed", ds}}, "cfg");
      },
      {"optimizer.type=AdamW", "optim=sgd"});
  // Without an optim key the block selects AdamW.
  const TrainConfig c = TrainConfig::from_json({{"deepspeed", ds}}, "cfg");
  EXPECT_EQ(parse_optimizer(c.optim), OptimizerKind::AdamW);
  EXPECT_DOUBLE_EQ(c.learning_rate, 1e-4);
}

TEST(OptimizerConfig, ResumingWithAnotherOptimizerIsAnError) {
  Corpus c;
  TrainConfig a = config(c, c.dir / "a", "adamw_torch_fused");
  a.max_steps = 4, a.save_steps = 2;
  train(a);
  TrainConfig b = config(c, c.dir / "b", "sgd");
  b.max_steps = 4;
  b.resume_from_checkpoint = c.dir / "a/checkpoint-2";
  test::expect_error([&] { train(b); }, {"optimizer.safetensors", "adamw_torch_fused", "sgd", "--optim"});
}

}  // namespace
}  // namespace anvil
