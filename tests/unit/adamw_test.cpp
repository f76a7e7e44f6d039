// AdamW: the fused AdamW op (one range) against an independent double-precision transcription of PyTorch's
// AdamW (decoupled weight decay, bias corrections, eps added after the bias-corrected sqrt(v)), and the AdamW
// class's two parameter groups over the GPT-2 layout.
#include "optim/adamw.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "anvil/model_config.hpp"
#include "anvil/rng.hpp"
#include "kernels/ops.hpp"
#include "model/param_layout.hpp"
#include "runtime/device.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

// torch.optim.AdamW (amsgrad=False, maximize=False) for one element, in double.
struct RefElement {
  double p, m = 0, v = 0;
  void step(double grad, double lr, double wd, double b1, double b2, double eps, int64_t t,
            double grad_scale) {
    const double g = grad * grad_scale;
    p *= 1 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double bc1 = 1 - std::pow(b1, double(t)), bc2 = 1 - std::pow(b2, double(t));
    p -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + eps);
  }
};

// fp32 state against the double reference: a few fp32 roundings per step, relative to `scale`, the
// magnitude of the terms that were summed (cancellation can leave a result much smaller than them).
::testing::AssertionResult close(float actual, double expected, double scale) {
  if (std::abs(actual - expected) <= 2e-6 * (std::abs(expected) + scale))
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << actual << " vs reference " << expected;
}

TEST(AdamWStep, MatchesPyTorchFormulaOverSeveralSteps) {
  auto dev = make_cpu_device();
  auto ops = make_cpu_ops(*dev);
  const size_t n = 257;
  Rng rng(3);
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f), g(n);
  std::vector<RefElement> ref(n);
  for (size_t i = 0; i < n; ++i) ref[i].p = p[i] = rng.normal();

  // One range in group 0 (host memory is the CPU device's memory).
  const uint64_t begin0 = 0;
  const uint8_t group0 = 0;
  const ParamGroupTable one_range{&begin0, &group0, nullptr, 1};
  FusedAdamWArgs a;
  a.beta1 = 0.8f, a.beta2 = 0.95f, a.eps = 1e-8f, a.weight_decay[0] = 0.1f, a.grad_scale = 0.5f;
  for (int64_t t = 1; t <= 6; ++t) {
    a.step = t;
    a.lr[0] = 1e-2f / float(t);  // a varying rate, as a schedule gives
    for (size_t i = 0; i < n; ++i) g[i] = 3.0f * rng.normal();
    g[0] = 0.0f;                  // no gradient: only the decay moves it
    g[1] = 1e-9f;                 // |g| far below eps: the update depends on where eps is added
    g[2] = 1e4f;                  // large: the update saturates near lr
    g[3] = t % 2 ? 1.0f : -1.0f;  // alternating sign: the moments matter
    ops->adamw_fused_step(p.data(), g.data(), m.data(), v.data(), DType::F32, n, one_range, a);
    for (size_t i = 0; i < n; ++i) {
      ref[i].step(g[i], a.lr[0], a.weight_decay[0], a.beta1, a.beta2, a.eps, t, a.grad_scale);
      // v sums positive terms; m's terms are of the order of sqrt(v); p's of the order of 1.
      ASSERT_TRUE(close(v[i], ref[i].v, 0.0)) << "v[" << i << "] at step " << t;
      ASSERT_TRUE(close(m[i], ref[i].m, std::sqrt(ref[i].v))) << "m[" << i << "] at step " << t;
      ASSERT_TRUE(close(p[i], ref[i].p, 1.0)) << "p[" << i << "] at step " << t;
    }
  }
}

// A tiny GPT-2 through the Engine, so the optimizer's state is planned and bound as in training.
class AdamWGroups : public ::testing::Test {
 protected:
  static constexpr float kWeightDecay = 0.1f;

  void SetUp() override {
    TransformerConfig c;
    c.n_layer = 2, c.n_head = 2, c.n_embd = 8, c.vocab_size = 20, c.block_size = 4;
    EngineOptions o;
    o.device = DeviceKind::CPU, o.batch_size = 1, o.seq_len = 4, o.training = true;
    o.optim.beta1 = 0.9f, o.optim.beta2 = 0.999f, o.optim.eps = 1e-8f, o.optim.weight_decay = kWeightDecay;
    engine_ = std::make_unique<Engine>(c, o);
    Rng rng(5);
    params0_.resize(numel());
    for (float& x : params0_) x = 1.0f + rng.normal();
    engine_->device().copy_to_device(engine_->model().params(), params0_.data(), numel() * sizeof(float));
  }

  size_t numel() const { return engine_->model().layout().total_numel(); }
  const ParamLayout& layout() const { return engine_->model().layout(); }
  std::vector<float> params() {
    std::vector<float> h(numel());
    engine_->device().copy_to_host(h.data(), engine_->model().params(), numel() * sizeof(float));
    return h;
  }

  std::unique_ptr<Engine> engine_;
  std::vector<float> params0_;
};

TEST_F(AdamWGroups, DecayAppliesToMatricesAndEmbeddingsOnly) {
  // Embeddings and matrices decay; biases and norm weights (all 1-D) do not.
  for (const ParamTensor& t : layout().tensors()) EXPECT_EQ(t.decay, t.shape.ndim == 2) << t.name;

  // With zero gradients the Adam term is exactly 0, so one step shows the decay alone:
  // p * (1 - lr * wd) where it applies, p untouched elsewhere.
  const float lr = 0.5f;
  engine_->optimizer().step(engine_->ops(), engine_->model().params(), engine_->model().grads(), lr, 1, 1.0f);
  const std::vector<float> p = params();
  for (const ParamTensor& t : layout().tensors()) {
    for (size_t i = t.offset; i < t.offset + t.numel(); ++i) {
      if (t.decay) {
        ASSERT_NEAR(p[i], params0_[i] * (1.0f - lr * kWeightDecay), 1e-6 * std::abs(params0_[i])) << t.name;
      } else {
        ASSERT_EQ(p[i], params0_[i]) << t.name;
      }
    }
  }
  // The representative cases, by name.
  for (const char* name : {"transformer.h.0.attn.c_attn.bias", "transformer.h.1.ln_1.weight",
                           "transformer.ln_f.weight", "transformer.h.1.mlp.c_proj.bias"}) {
    const ParamTensor& t = layout().get(name);
    EXPECT_FALSE(t.decay) << name;
    EXPECT_EQ(p[t.offset], params0_[t.offset]) << name;
  }
  for (const char* name : {"transformer.h.0.mlp.c_fc.weight", "transformer.wte.weight"}) {
    const ParamTensor& t = layout().get(name);
    EXPECT_TRUE(t.decay) << name;
    EXPECT_NE(p[t.offset], params0_[t.offset]) << name;
  }
}

TEST_F(AdamWGroups, EveryElementFollowsItsGroupsFormula) {
  // Against the reference per element, with the weight decay of its tensor's group: an element
  // updated twice, skipped, or put in the wrong group would diverge.
  Rng rng(8);
  std::vector<RefElement> ref(numel());
  for (size_t i = 0; i < numel(); ++i) ref[i].p = params0_[i];
  std::vector<double> wd(numel(), 0.0);
  for (const ParamTensor& t : layout().tensors())
    for (size_t i = t.offset; i < t.offset + t.numel(); ++i) wd[i] = t.decay ? kWeightDecay : 0.0;

  std::vector<float> g(numel());
  const float lr = 1e-2f, grad_scale = 0.25f;
  for (int64_t t = 1; t <= 3; ++t) {
    for (float& x : g) x = rng.normal();
    engine_->device().copy_to_device(engine_->model().grads(), g.data(), numel() * sizeof(float));
    engine_->optimizer().step(engine_->ops(), engine_->model().params(), engine_->model().grads(), lr, t,
                              grad_scale);
    for (size_t i = 0; i < numel(); ++i) ref[i].step(g[i], lr, wd[i], 0.9f, 0.999f, 1e-8f, t, grad_scale);
  }
  const std::vector<float> p = params();
  for (size_t i = 0; i < numel(); ++i) ASSERT_TRUE(close(p[i], ref[i].p, 1.0)) << "p[" << i << "]";
}

}  // namespace
}  // namespace anvil
