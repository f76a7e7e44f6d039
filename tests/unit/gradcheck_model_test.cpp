// Finite-difference gradient check of a whole tiny GPT-2 on the CPU: GptModel::backward must give the
// gradient of the mean cross-entropy over valid targets with respect to every parameter, through the
// tied head, every block and the final norm.
//
// The loss is evaluated in fp32 and differenced in double. Random directions over the whole flat
// parameter vector check the gradient as a whole; a direction and a few coordinates inside each tensor
// check every tensor on its own (a small tensor's error would hide inside a whole-vector direction).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "anvil/model_config.hpp"
#include "anvil/rng.hpp"
#include "kernels/ops.hpp"
#include "model/gpt_model.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

using Loss = std::function<double()>;

double dot(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// Central difference of `loss` along `dir` at x (restored afterwards), next to the analytic
// prediction. x + eps*dir is rounded to fp32, so the prediction uses the steps actually taken.
struct Probe {
  double analytic, numeric;
};
Probe probe(const Loss& loss, std::span<float> x, std::span<const float> g, const std::vector<double>& dir,
            double eps) {
  const std::vector<float> x0(x.begin(), x.end());
  double predicted = 0, lp = 0, lm = 0;
  for (int sign : {1, -1}) {
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = float(x0[i] + sign * eps * dir[i]);
      predicted += sign * double(g[i]) * (double(x[i]) - x0[i]);
    }
    (sign > 0 ? lp : lm) = loss();
  }
  std::copy(x0.begin(), x0.end(), x.begin());
  return {predicted / (2 * eps), (lp - lm) / (2 * eps)};
}

struct CheckOptions {
  double eps = 1e-2;
  int directions = 4;
  int coordinates = 0;
  uint64_t seed = 1;
};

// Observed errors stay below ~1e-3 (fp32 rounding through two blocks plus truncation); a gradient 10%
// off fails (the negative controls below check that it does).
constexpr double kRtol = 1e-2;

// Analytic gradient g of `loss` w.r.t. x against central differences along random unit directions
// (redrawn while the analytic derivative is accidentally small next to |g|/sqrt(n)) and at random
// coordinates (error relative to max(|derivative|, 0.1 * rms(g))); fails naming the worst probe.
::testing::AssertionResult gradient_matches(const Loss& loss, std::span<float> x, std::span<const float> g,
                                            const CheckOptions& o) {
  const size_t n = x.size();
  const double typical = std::sqrt(dot(g, g) / double(n));
  Rng rng(o.seed);
  double worst = 0;
  std::string worst_what = "no probe";
  auto account = [&](const Probe& p, double floor, const std::string& what) {
    const double err = std::abs(p.analytic - p.numeric) / std::max({std::abs(p.analytic), floor, 1e-30});
    if (err >= worst) {
      worst = err;
      worst_what = fmt::format("{}: analytic {:.8g}, numeric {:.8g}", what, p.analytic, p.numeric);
    }
  };
  std::vector<double> dir(n);
  for (int k = 0; k < o.directions; ++k) {
    for (int attempt = 0; attempt < 100; ++attempt) {
      double norm = 0;
      for (double& d : dir) {
        d = rng.normal();
        norm += d * d;
      }
      double gd = 0;
      for (size_t i = 0; i < n; ++i) gd += g[i] * (dir[i] /= std::sqrt(norm));
      if (std::abs(gd) >= 0.5 * typical) break;
    }
    account(probe(loss, x, g, dir, o.eps), 0.0, fmt::format("direction {}", k));
  }
  for (int k = 0; k < o.coordinates; ++k) {
    std::fill(dir.begin(), dir.end(), 0.0);
    const size_t i = rng.below(n);
    dir[i] = 1.0;
    account(probe(loss, x, g, dir, o.eps), 0.1 * typical, fmt::format("coordinate {}", i));
  }
  if (worst < kRtol) return ::testing::AssertionSuccess() << "worst relative error " << worst;
  return ::testing::AssertionFailure()
         << "relative error " << worst << " > " << kRtol << " at " << worst_what;
}

class GradCheckModel : public ::testing::Test {
 protected:
  static constexpr int B = 2, T = 8;

  static TransformerConfig config() {
    TransformerConfig c;
    c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.vocab_size = 37, c.block_size = 8;
    return c;
  }

  void SetUp() override {
    EngineOptions o;
    o.device = DeviceKind::CPU, o.batch_size = B, o.seq_len = T, o.training = true;
    engine_ = std::make_unique<Engine>(config(), o);
    GptModel& m = model();
    ASSERT_EQ(m.config().padded_vocab_size(), 128);
    m.init_weights(7, engine_->device());
    // GPT-2's init (std 0.02, norms at 1, biases at 0) leaves the network nearly linear with a uniform
    // softmax; larger random values exercise every term of the backward. Padded wte rows stay 0.
    Rng rng(99);
    const size_t vocab_numel = size_t(m.config().vocab_size) * m.config().n_embd;
    for (const ParamTensor& t : m.layout().tensors()) {
      const size_t n = t.name == "transformer.wte.weight" ? vocab_numel : t.numel();
      float* p = m.params() + t.offset;
      using I = ParamTensor::Init;
      const float mean = t.init == I::Ones ? 1.0f : 0.0f;
      const float stddev = t.init == I::Normal           ? 0.3f
                           : t.init == I::NormalResidual ? 0.15f
                           : t.init == I::Ones           ? 0.2f
                                                         : 0.1f;
      for (size_t i = 0; i < n; ++i) p[i] = mean + stddev * rng.normal();
    }
    std::vector<int32_t> tokens(B * T), targets(B * T);
    for (int i = 0; i < B * T; ++i) {
      tokens[i] = int32_t(rng.below(m.config().vocab_size));
      targets[i] = i % 5 == 3 ? kIgnoreIndex : int32_t(rng.below(m.config().vocab_size));
      num_valid_ += targets[i] != kIgnoreIndex;
    }
    engine_->device().copy_to_device(engine_->tokens(0), tokens.data(), tokens.size() * sizeof(int32_t));
    engine_->device().copy_to_device(engine_->targets(0), targets.data(), targets.size() * sizeof(int32_t));
  }

  GptModel& model() { return engine_->model(); }
  size_t numel() { return model().layout().total_numel(); }
  // The CPU device's memory is host memory, so parameters and gradients are perturbed and read in place.
  std::span<float> params() { return {model().params(), numel()}; }
  std::span<const float> grads() { return {model().grads(), numel()}; }

  // Mean loss over the valid targets, summed in double from the fp32 per-position losses.
  double loss() {
    model().forward(engine_->ops(), engine_->tokens(0), engine_->targets(0), B, T, 1.0f, false);
    std::vector<float> losses(B * T);
    engine_->device().copy_to_host(losses.data(), model().losses(), losses.size() * sizeof(float));
    double s = 0;
    for (float l : losses) s += l;
    return s / num_valid_;
  }

  // Adds the gradient of loss() to grads().
  void forward_backward() {
    model().forward(engine_->ops(), engine_->tokens(0), engine_->targets(0), B, T, 1.0f / float(num_valid_),
                    true);
    model().backward(engine_->ops(), engine_->tokens(0), B, T);
  }

  std::unique_ptr<Engine> engine_;
  int num_valid_ = 0;
};

TEST_F(GradCheckModel, WholeParameterVector) {
  forward_backward();
  const std::vector<float> g(grads().begin(), grads().end());
  EXPECT_TRUE(gradient_matches([&] { return loss(); }, params(), g, {.eps = 1e-2, .directions = 6}));
}

TEST_F(GradCheckModel, EachTensor) {
  forward_backward();
  const std::vector<float> g(grads().begin(), grads().end());
  const int V = model().config().vocab_size, C = model().config().n_embd;
  uint64_t seed = 1;
  for (const ParamTensor& t : model().layout().tensors()) {
    // Padded wte rows get no gradient (checked below); probe the real rows only.
    const size_t n = t.name == "transformer.wte.weight" ? size_t(V) * C : t.numel();
    EXPECT_TRUE(gradient_matches([&] { return loss(); }, params().subspan(t.offset, n),
                                 std::span(g).subspan(t.offset, n),
                                 {.eps = 1e-2, .directions = 2, .coordinates = 3, .seed = seed++}))
        << t.name;
  }
}

TEST_F(GradCheckModel, PaddedVocabularyRowsGetZeroGradient) {
  forward_backward();
  const ParamTensor& wte = model().layout().get("transformer.wte.weight");
  const size_t C = model().config().n_embd;
  for (size_t i = size_t(model().config().vocab_size) * C; i < wte.numel(); ++i)
    ASSERT_EQ(grads()[wte.offset + i], 0.0f) << "padded wte element " << i;
}

TEST_F(GradCheckModel, TwoPassesAccumulate) {
  forward_backward();
  const std::vector<float> once(grads().begin(), grads().end());
  forward_backward();
  double max_once = 0;
  for (float v : once) max_once = std::max(max_once, double(std::abs(v)));
  ASSERT_GT(max_once, 0.0);
  for (size_t i = 0; i < numel(); ++i)
    ASSERT_NEAR(grads()[i], 2.0 * once[i], 1e-6 * max_once) << "element " << i;
}

// Negative controls: a gradient 10% off fails the whole-vector check, and so does a 10% error confined
// to one small tensor (ln_f.bias) in that tensor's own check.
TEST_F(GradCheckModel, NegativeControlWrongGradientFails) {
  forward_backward();
  std::vector<float> g(grads().begin(), grads().end());
  for (float& v : g) v *= 1.1f;
  EXPECT_FALSE(gradient_matches([&] { return loss(); }, params(), g, {.eps = 1e-2, .directions = 6}));

  const ParamTensor& t = model().layout().get("transformer.ln_f.bias");
  std::vector<float> g_lnf(grads().begin() + t.offset, grads().begin() + t.offset + t.numel());
  for (float& v : g_lnf) v *= 1.1f;
  EXPECT_FALSE(gradient_matches([&] { return loss(); }, params().subspan(t.offset, t.numel()), g_lnf,
                                {.eps = 1e-2, .directions = 2, .coordinates = 3}));
}

}  // namespace
}  // namespace anvil
