// Step values (kernels/step_values.hpp): every optimizer, the clip factor and the weight cast give the same
// bits when they read the step's learning rate, bias terms, seeds and unscale factor from the engine's
// step-values buffer as when they take them as arguments. This is what lets the trainer record a whole
// step into a CUDA graph and replay it with new values; here on the CPU backend (its "device" memory is
// host memory), on CUDA in tests/parity/step_graph_test.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "anvil/rng.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

TransformerConfig tiny_model() {
  TransformerConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.vocab_size = 40, c.block_size = 8;
  return c;
}

struct Case {
  const char* name;
  OptimizerKind kind;
  OptimizerHyper hyper;
};

std::vector<Case> cases() {
  OptimizerHyper adamw;
  adamw.weight_decay = 0.1f;
  adamw.lr_multiplier[int(ParamGroup::Embedding)] = 0.5f;
  OptimizerHyper bf16 = adamw;
  bf16.adamw_bf16_moments = true;
  OptimizerHyper sgd;
  sgd.momentum = 0.9f, sgd.dampening = 0.1f, sgd.weight_decay = 0.01f;
  OptimizerHyper eight = adamw;
  eight.min_8bit_size = 64;  // the tiny model's matrices go 8-bit, its vectors keep fp32 states
  OptimizerHyper adafactor;
  adafactor.weight_decay = 0.01f;
  OptimizerHyper adafactor_lr = adafactor;
  adafactor_lr.relative_step = false, adafactor_lr.scale_parameter = false,
  adafactor_lr.adafactor_beta1 = 0.9f;
  return {{"adamw", OptimizerKind::AdamW, adamw},
          {"adamw_bf16_moments", OptimizerKind::AdamW, bf16},
          {"sgd_momentum", OptimizerKind::SGD, sgd},
          {"adamw_8bit", OptimizerKind::AdamW8bit, eight},
          {"adafactor", OptimizerKind::Adafactor, adafactor},
          {"adafactor_external_lr", OptimizerKind::Adafactor, adafactor_lr}};
}

std::unique_ptr<Engine> make_engine(const Case& c) {
  EngineOptions o;
  o.device = DeviceKind::CPU, o.batch_size = 1, o.seq_len = 8, o.training = true;
  o.optimizer = c.kind, o.optim = c.hyper;
  auto e = std::make_unique<Engine>(tiny_model(), o);
  const size_t n = e->model().layout().total_numel();
  std::vector<float> p(n);
  Rng rng(3);
  for (float& x : p) x = 0.5f * rng.normal();
  e->device().copy_to_device(e->model().params(), p.data(), n * sizeof(float));
  return e;
}

std::vector<float> params_of(Engine& e) {
  std::vector<float> p(e.model().layout().total_numel());
  e.device().copy_to_host(p.data(), e.model().params(), p.size() * sizeof(float));
  return p;
}

TEST(StepValues, OptimizersReadThemAsTheyTakeArguments) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    std::unique_ptr<Engine> by_args = make_engine(c), by_values = make_engine(c);
    const size_t n = by_args->model().layout().total_numel();
    std::vector<float> g(n);
    for (int64_t t = 1; t <= 4; ++t) {
      Rng rng(100 + uint64_t(t));
      for (float& x : g) x = rng.normal();
      by_args->device().copy_to_device(by_args->model().grads(), g.data(), n * sizeof(float));
      by_values->device().copy_to_device(by_values->model().grads(), g.data(), n * sizeof(float));
      const float lr = 1e-2f / float(t);  // a different learning rate every step
      by_args->optimizer().step(by_args->ops(), by_args->model().params(), by_args->model().grads(), lr, t,
                                0.5f);
      // The values go through the engine's buffers as in training: host copy, upload, device pointer. The
      // lr argument is ignored in favour of them (a wrong one proves it).
      StepValues& v = by_values->step_values_host();
      v = StepValues{};
      by_values->optimizer().fill_step_values(lr, t, v);
      by_values->upload_step_values();
      by_values->optimizer().step(by_values->ops(), by_values->model().params(), by_values->model().grads(),
                                  123.0f, t, 0.5f, nullptr, by_values->step_values());
    }
    const std::vector<float> a = params_of(*by_args), b = params_of(*by_values);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "updates differ";
    // The parameters did move.
    std::unique_ptr<Engine> fresh = make_engine(c);
    EXPECT_NE(params_of(*fresh), a);
  }
}

TEST(StepValues, ClipFactorAndWeightCastReadThem) {
  EngineOptions o;
  o.device = DeviceKind::CPU, o.batch_size = 1, o.seq_len = 8, o.training = true;
  o.precision = Precision::BF16;
  Engine e(tiny_model(), o);
  Ops& ops = e.ops();
  // grad_clip_scale: the unscale factor from the step values.
  const double ss = 40.0;
  float scale_a = 0, scale_b = 0;
  double norm_a = 0, norm_b = 0;
  ops.grad_clip_scale(&scale_a, &norm_a, &ss, 0.25, 1.0, nullptr);
  e.step_values_host().unscale = 0.25;
  e.upload_step_values();
  ops.grad_clip_scale(&scale_b, &norm_b, &ss, 99.0, 1.0, e.step_values());
  EXPECT_EQ(norm_a, norm_b);
  EXPECT_EQ(scale_a, scale_b);
  EXPECT_DOUBLE_EQ(norm_a, std::sqrt(40.0) * 0.25);
  // cast_weights: the stochastic-rounding seed from the step values; a nonzero argument only selects it.
  std::vector<float> master(1000);
  Rng rng(5);
  for (float& x : master) x = rng.normal();
  std::vector<uint16_t> a(master.size()), b(master.size()), nearest(master.size());
  ops.cast_weights(a.data(), master.data(), master.size(), 4242, nullptr);
  e.step_values_host().cast_seed = 4242;
  e.upload_step_values();
  ops.cast_weights(b.data(), master.data(), master.size(), 1, e.step_values());
  EXPECT_EQ(a, b);
  ops.cast_weights(nearest.data(), master.data(), master.size(), 0, e.step_values());
  EXPECT_NE(a, nearest) << "a zero seed argument still means round to nearest";
}

}  // namespace
}  // namespace anvil
