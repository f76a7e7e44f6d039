// Finite-difference gradient check of a whole tiny GPT-2 on the CPU: Decoder::backward must give the
// gradient of the mean cross-entropy over valid targets with respect to every parameter, through the
// tied head, every block and the final norm.
//
// The loss is evaluated in fp32 and differenced in double. Random directions over the whole flat
// parameter vector check the gradient as a whole; a direction and a few coordinates inside each tensor
// check every tensor on its own (a small tensor's error would hide inside a whole-vector direction).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "anvil/model_config.hpp"
#include "anvil/rng.hpp"
#include "gradcheck_util.hpp"
#include "kernels/ops.hpp"
#include "model/decoder.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

using test::gradient_matches;

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
    Decoder& m = model();
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

  Decoder& model() { return engine_->decoder(); }
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
  EXPECT_TRUE(gradient_matches([&] { return loss(); }, params(), g,
                               {.eps = 1e-2, .directions = 6, .coordinates = 0}));
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
  EXPECT_FALSE(gradient_matches([&] { return loss(); }, params(), g,
                                {.eps = 1e-2, .directions = 6, .coordinates = 0}));

  const ParamTensor& t = model().layout().get("transformer.ln_f.bias");
  std::vector<float> g_lnf(grads().begin() + t.offset, grads().begin() + t.offset + t.numel());
  for (float& v : g_lnf) v *= 1.1f;
  EXPECT_FALSE(gradient_matches([&] { return loss(); }, params().subspan(t.offset, t.numel()), g_lnf,
                                {.eps = 1e-2, .directions = 2, .coordinates = 3}));
}

// A batch of more than Decoder::kLossChunkRows rows runs the LM head, loss and head backward in several
// chunks: its losses and gradients equal those of the same sequences run one by one (one chunk each) and
// accumulated, up to float summation order; and an inference model's full logits give the same losses.
TEST(LossChunks, ManyChunksEqualOneByOne) {
  TransformerConfig c;
  c.n_layer = 1, c.n_head = 2, c.n_embd = 16, c.vocab_size = 40, c.block_size = 1024;
  const int T = 1024, B = int(Decoder::kLossChunkRows / T) + 2;  // B*T rows: two chunks, the last partial
  EngineOptions o;
  o.device = DeviceKind::CPU, o.seq_len = T, o.training = true;
  o.batch_size = B;
  Engine big(c, o);
  o.batch_size = 1;
  Engine one(c, o);
  o.training = false, o.batch_size = B;
  Engine infer(c, o);
  ASSERT_EQ(big.decoder().logits_rows(), Decoder::kLossChunkRows);
  ASSERT_EQ(infer.decoder().logits_rows(), size_t(B) * T);
  big.model().init_weights(3, big.device());
  one.model().init_weights(3, one.device());
  infer.model().init_weights(3, infer.device());
  Rng rng(5);
  std::vector<int32_t> tokens(size_t(B) * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = int32_t(rng.below(c.vocab_size));
    targets[i] = i % 7 == 3 ? kIgnoreIndex : int32_t(rng.below(c.vocab_size));
  }
  const size_t P = big.model().layout().total_numel(), rows = tokens.size();
  std::copy(tokens.begin(), tokens.end(), big.tokens(0));
  std::copy(targets.begin(), targets.end(), big.targets(0));
  std::fill_n(big.model().grads(), P, 0.0f);
  big.decoder().forward(big.ops(), big.tokens(0), big.targets(0), B, T, 1.0f, true);
  big.decoder().backward(big.ops(), big.tokens(0), B, T);
  const std::vector<float> big_losses(big.model().losses(), big.model().losses() + rows);

  std::fill_n(one.model().grads(), P, 0.0f);
  std::vector<float> one_losses;
  for (int b = 0; b < B; ++b) {
    std::copy_n(tokens.begin() + size_t(b) * T, T, one.tokens(0));
    std::copy_n(targets.begin() + size_t(b) * T, T, one.targets(0));
    one.decoder().forward(one.ops(), one.tokens(0), one.targets(0), 1, T, 1.0f, true);
    one.decoder().backward(one.ops(), one.tokens(0), 1, T);
    one_losses.insert(one_losses.end(), one.model().losses(), one.model().losses() + T);
  }
  for (size_t i = 0; i < rows; ++i) ASSERT_NEAR(big_losses[i], one_losses[i], 1e-5) << "row " << i;
  double gmax = 0;
  for (size_t i = 0; i < P; ++i) gmax = std::max(gmax, double(std::abs(one.model().grads()[i])));
  ASSERT_GT(gmax, 0.0);
  for (size_t i = 0; i < P; ++i)
    ASSERT_NEAR(big.model().grads()[i], one.model().grads()[i], 1e-4 * gmax) << i;

  // The inference model's full logits: log-softmax at the target gives the same per-row losses.
  std::copy(tokens.begin(), tokens.end(), infer.tokens(0));
  infer.decoder().forward(infer.ops(), infer.tokens(0), nullptr, B, T, 0.0f, false);
  const int Vp = c.padded_vocab_size();
  const float* logits = static_cast<const float*>(infer.decoder().logits());
  for (size_t r = 0; r < rows; r += 997) {
    if (targets[r] == kIgnoreIndex) continue;
    const float* z = logits + r * Vp;
    const double mx = *std::max_element(z, z + c.vocab_size);
    double sum = 0;
    for (int j = 0; j < c.vocab_size; ++j) sum += std::exp(double(z[j]) - mx);
    EXPECT_NEAR(big_losses[r], mx + std::log(sum) - z[targets[r]], 1e-4) << "row " << r;
  }
  // A training model asked for more rows of logits than one chunk says so.
  test::expect_error([&] { big.decoder().forward(big.ops(), big.tokens(0), nullptr, B, T, 0.0f, false); },
                     {"do not fit"});
}

}  // namespace
}  // namespace anvil
