// Finite-difference gradient checks of a whole tiny BERT with a classification head on the CPU: backward()
// must give the gradient of the mean loss over the valid labels with respect to every parameter, through the
// classifier, the tanh pooler, every post-LayerNorm block (exact GELU), the embedding LayerNorm and the three
// embedding tables, with padded sequences. Checkpointing must change no result bit, padding must be
// invisible, and the pad token's word-embedding row gets no gradient (Hugging Face's padding_idx).
//
// The loss is evaluated in fp32 and differenced in double (tests/unit/gradcheck_util.hpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "anvil/model_config.hpp"
#include "anvil/rng.hpp"
#include "bert_harness.hpp"
#include "gradcheck_util.hpp"
#include "memory/memory_trace.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

using test::BertBatch;
using test::BertHarness;
using test::gradient_matches;

TransformerConfig tiny_bert() {
  TransformerConfig c = TransformerConfig::preset("bert-tiny");
  c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.intermediate_size = 24, c.vocab_size = 37, c.block_size = 12;
  c.type_vocab_size = 3, c.num_labels = 3, c.pad_token_id = 0;
  c.hidden_dropout_prob = c.attention_probs_dropout_prob =
      0;  // the network's math; dropout has its own tests
  return c;
}

TransformerConfig tiny_bert_with_dropout() {
  TransformerConfig c = tiny_bert();
  c.hidden_dropout_prob = 0.2, c.attention_probs_dropout_prob = 0.3, c.classifier_dropout = 0.25;
  return c;
}

// Random weights larger than BERT's init (std 0.02 leaves the network nearly linear), so every term of the
// backward matters; LayerNorm weights around 1. The pad row of the word embedding stays as it is.
void randomize(BertHarness& h, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> p(h.model().layout().total_numel());
  for (const ParamTensor& t : h.model().layout().tensors()) {
    using I = ParamTensor::Init;
    const float mean = t.init == I::Ones ? 1.0f : 0.0f;
    const float stddev = t.init == I::Normal ? 0.3f : t.init == I::Ones ? 0.2f : 0.1f;
    for (size_t i = 0; i < t.numel(); ++i) p[t.offset + i] = mean + stddev * rng.normal();
  }
  h.model().upload_weights(h.device(), p.data());
}

// Four sequences of lengths 8, 5, 3, 6 (padding filled with the pad token), token types 0..2, labels with one
// ignored. Real positions never hold the pad token (see PadTokenRowGetsNoGradient for that case).
BertBatch make_batch(const TransformerConfig& c, uint64_t seed, int T = 8) {
  Rng rng(seed);
  BertBatch b;
  b.B = 4, b.T = T;
  b.lengths = {T, std::min(T, 5), std::min(T, 3), std::min(T, 6)};
  for (int s = 0; s < b.B; ++s)
    for (int t = 0; t < T; ++t) {
      const bool real = t < b.lengths[s];
      b.tokens.push_back(real ? int32_t(1 + rng.below(c.vocab_size - 1)) : c.pad_token_id);
      b.types.push_back(real ? int32_t(rng.below(c.type_vocab_size)) : 0);
    }
  b.labels = {2, 0, kIgnoreIndex, 1};
  for (int s = 0; s < b.B; ++s) b.labels_f.push_back(rng.normal());
  return b;
}

int valid_labels(const TransformerConfig& c, const BertBatch& b) {
  if (c.is_regression()) return b.B;
  return int(std::count_if(b.labels.begin(), b.labels.end(), [](int32_t l) { return l != kIgnoreIndex; }));
}

class GradCheckBert : public ::testing::Test {
 protected:
  void init(const TransformerConfig& c, CheckpointPolicy policy = {}) {
    h_ = std::make_unique<BertHarness>(c, 4, 8, true, DeviceKind::CPU, policy);
    randomize(*h_, 99);
    batch_ = make_batch(c, 5);
    h_->upload(batch_);
    valid_ = valid_labels(c, batch_);
  }
  size_t numel() { return h_->model().layout().total_numel(); }
  std::span<float> params() { return {h_->model().params(), numel()}; }  // CPU memory: perturbed in place
  // With dropout, every forward draws the masks of micro-batch 1 of seed 77: the loss is a deterministic
  // function of the parameters, as a training step sees it.
  double loss() {
    const bool drop = h_->model().dropout_state() != nullptr;
    if (drop) h_->set_dropout(77, 0);
    const std::vector<float> l = h_->forward(4, 8, 0.0f, drop);
    double s = 0;
    for (float v : l) s += v;
    return s / valid_;
  }
  std::vector<float> forward_backward() {
    if (h_->model().dropout_state()) h_->set_dropout(77, 0);
    h_->forward(4, 8, 1.0f / float(valid_), true);
    h_->backward(4, 8);
    return h_->grads();
  }
  std::unique_ptr<BertHarness> h_;
  BertBatch batch_;
  int valid_ = 0;
};

TEST_F(GradCheckBert, WholeParameterVector) {
  init(tiny_bert());
  const std::vector<float> g = forward_backward();
  EXPECT_TRUE(gradient_matches([&] { return loss(); }, params(), g,
                               {.eps = 1e-2, .directions = 6, .coordinates = 0}));
}

TEST_F(GradCheckBert, EachTensor) {
  init(tiny_bert());
  const std::vector<float> g = forward_backward();
  double gmax = 0;
  for (float v : g) gmax = std::max(gmax, double(std::fabs(v)));
  uint64_t seed = 1;
  for (const ParamTensor& t : h_->model().layout().tensors()) {
    if (t.name.ends_with("attention.self.key.bias")) {
      // The key bias adds q.b to every score of a query: softmax ignores it, so its true gradient is 0 and a
      // finite difference sees only rounding. The backward must give (nearly) 0.
      for (size_t i = t.offset; i < t.offset + t.numel(); ++i)
        EXPECT_LT(std::fabs(g[i]), 1e-6 * gmax) << t.name;
      continue;
    }
    EXPECT_TRUE(gradient_matches([&] { return loss(); }, params().subspan(t.offset, t.numel()),
                                 std::span<const float>(g).subspan(t.offset, t.numel()),
                                 {.eps = 1e-2, .directions = 2, .coordinates = 3, .seed = seed++}))
        << t.name;
  }
}

// Dropout on the embedding, attention probabilities, both output projections and the classifier input: the
// backward applies the forward's masks, so the gradient is that of the loss with those masks.
TEST_F(GradCheckBert, WithDropout) {
  init(tiny_bert_with_dropout());
  const std::vector<float> g = forward_backward();
  EXPECT_TRUE(gradient_matches([&] { return loss(); }, params(), g,
                               {.eps = 1e-2, .directions = 8, .coordinates = 0}));
  uint64_t seed = 1;
  for (const char* name :
       {"bert.embeddings.LayerNorm.weight", "bert.encoder.layer.0.attention.self.query.weight",
        "bert.encoder.layer.1.attention.output.dense.weight", "bert.encoder.layer.1.output.dense.weight",
        "bert.pooler.dense.weight"}) {
    const ParamTensor& t = h_->model().layout().get(name);
    EXPECT_TRUE(gradient_matches([&] { return loss(); }, params().subspan(t.offset, t.numel()),
                                 std::span<const float>(g).subspan(t.offset, t.numel()),
                                 {.eps = 1e-2, .directions = 2, .coordinates = 3, .seed = seed++}))
        << name;
  }
}

// The last block computes its post-attention half for the [CLS] rows only (the default): the losses, logits
// and every gradient are those of the whole block, with every dropout site on (the rows draw the whole
// tensors' masks) and with the last block checkpointed; last_hidden_state needs the whole block.
TEST_F(GradCheckBert, FirstRowsLastBlockIsTheWholeBlock) {
  for (const CheckpointPolicy policy : {CheckpointPolicy{}, CheckpointPolicy{CheckpointMode::Full, 1},
                                        CheckpointPolicy{CheckpointMode::Selective, 1}}) {
    SCOPED_TRACE(policy.checkpointed(1) ? "checkpointed" : "stored");
    init(tiny_bert_with_dropout(), policy);
    std::vector<float> losses[2], logits[2], grads[2];
    for (int full = 0; full < 2; ++full) {
      h_->model().set_full_last_hidden_state(full == 1);
      h_->zero_grads();
      h_->set_dropout(77, 0);
      losses[full] = h_->forward(4, 8, 1.0f / float(valid_), true);
      logits[full] = h_->logits(4);
      h_->backward(4, 8);
      grads[full] = h_->grads();
      if (full == 0) {
        EXPECT_THROW(h_->model().last_hidden_state(), Error);
      }
    }
    auto max_rel = [](const std::vector<float>& a, const std::vector<float>& b) {
      double m = 0, d = 0;
      for (size_t i = 0; i < a.size(); ++i)
        m = std::max(m, double(std::fabs(a[i]))), d = std::max(d, double(std::fabs(a[i] - b[i])));
      return m > 0 ? d / m : d;
    };
    EXPECT_LT(max_rel(losses[1], losses[0]), 1e-6);
    EXPECT_LT(max_rel(logits[1], logits[0]), 1e-6);
    for (const ParamTensor& t : h_->model().layout().tensors()) {
      if (t.name.ends_with("attention.self.key.bias")) continue;  // true gradient 0: only rounding
      const std::vector<float> a(grads[1].begin() + t.offset, grads[1].begin() + t.offset + t.numel());
      const std::vector<float> b(grads[0].begin() + t.offset, grads[0].begin() + t.offset + t.numel());
      EXPECT_LT(max_rel(a, b), 1e-5) << t.name;
    }
    // Dropout changed something: the dropped run differs from an evaluation forward.
    const std::vector<float> eval = h_->forward(4, 8, 0.0f, false);
    EXPECT_NE(eval, losses[0]);
  }
}

// Sequences of one token, in a model planned for one: the [CLS]-rows block's queries, keys and values share
// the QKV buffers with no room to spare (its query-path input gradient lives elsewhere), and the results are
// still the whole block's; the gradient matches finite differences.
TEST_F(GradCheckBert, FirstRowsLastBlockWithOneToken) {
  const TransformerConfig c = tiny_bert_with_dropout();
  BertHarness h(c, 4, 1, true);
  randomize(h, 99);
  h.upload(make_batch(c, 5, 1));
  std::vector<float> grads[2];
  for (int full = 0; full < 2; ++full) {
    h.model().set_full_last_hidden_state(full == 1);
    h.zero_grads();
    h.set_dropout(77, 0);
    h.forward(4, 1, 1.0f / 3.0f, true);
    h.backward(4, 1);
    grads[full] = h.grads();
  }
  double m = 0, d = 0;
  for (size_t i = 0; i < grads[0].size(); ++i)
    m = std::max(m, double(std::fabs(grads[1][i]))),
    d = std::max(d, double(std::fabs(grads[1][i] - grads[0][i])));
  EXPECT_LT(d, 1e-5 * m);
  h.model().set_full_last_hidden_state(false);
  const auto loss = [&] {
    h.set_dropout(77, 0);
    double sum = 0;
    for (const float v : h.forward(4, 1, 0.0f, true)) sum += v;
    return sum / 3.0;
  };
  EXPECT_TRUE(gradient_matches(loss, std::span<float>(h.model().params(), grads[0].size()), grads[0],
                               {.eps = 1e-2, .directions = 6, .coordinates = 0}));
}

// What dropout does to a training forward: it changes the loss; the same seed and micro-batch give the same
// masks; the next micro-batch (each training forward advances the counter) or another seed give others; an
// evaluation forward (no write_grad) applies none.
TEST_F(GradCheckBert, DropoutMasksFollowSeedAndMicroBatch) {
  const TransformerConfig c = tiny_bert_with_dropout();
  BertHarness plain(tiny_bert(), 4, 8, true);
  init(c);
  plain.model().upload_weights(plain.device(), h_->params().data());
  plain.upload(batch_);
  const std::vector<float> none = plain.forward(4, 8, 1.0f, true);
  EXPECT_EQ(h_->forward(4, 8, 1.0f, false), none);
  h_->set_dropout(5, 0);
  const std::vector<float> a = h_->forward(4, 8, 1.0f, true);
  EXPECT_NE(a, none);
  const std::vector<float> next = h_->forward(4, 8, 1.0f, true);  // micro-batch 2
  EXPECT_NE(next, a);
  h_->set_dropout(5, 0);
  EXPECT_EQ(h_->forward(4, 8, 1.0f, true), a);
  h_->set_dropout(6, 0);
  EXPECT_NE(h_->forward(4, 8, 1.0f, true), a);
  EXPECT_EQ(h_->forward(4, 8, 1.0f, false), none);
}

// hidden_act "gelu_new": the tanh GELU through the fused GEMM-epilogue ops.
TEST_F(GradCheckBert, TanhGeluVariant) {
  TransformerConfig c = tiny_bert();
  c.hidden_act = "gelu_new";
  init(c);
  const std::vector<float> g = forward_backward();
  EXPECT_TRUE(gradient_matches([&] { return loss(); }, params(), g,
                               {.eps = 1e-2, .directions = 6, .coordinates = 0}));
}

// One output: mean squared error against fp32 labels (BertForSequenceClassification's regression).
TEST_F(GradCheckBert, Regression) {
  TransformerConfig c = tiny_bert();
  c.num_labels = 1;
  init(c);
  ASSERT_EQ(h_->model().label_dtype(), DType::F32);
  const std::vector<float> g = forward_backward();
  const std::vector<float> losses = h_->forward(4, 8, 0.0f, false), logits = h_->logits(4);
  for (int b = 0; b < 4; ++b) {
    const double d = double(logits[b]) - batch_.labels_f[b];
    EXPECT_NEAR(losses[b], d * d, 1e-6 * (1 + d * d)) << b;
  }
  EXPECT_TRUE(gradient_matches([&] { return loss(); }, params(), g,
                               {.eps = 1e-2, .directions = 6, .coordinates = 0}));
}

// The per-sequence losses are the cross-entropy of the logits (0 for the ignored label).
TEST_F(GradCheckBert, LossesAreCrossEntropyOfLogits) {
  init(tiny_bert());
  const std::vector<float> losses = h_->forward(4, 8, 0.0f, false), logits = h_->logits(4);
  for (int b = 0; b < 4; ++b) {
    if (batch_.labels[b] == kIgnoreIndex) {
      EXPECT_EQ(losses[b], 0.0f);
      continue;
    }
    const float* z = logits.data() + b * 3;
    const double mx = *std::max_element(z, z + 3);
    double s = 0;
    for (int j = 0; j < 3; ++j) s += std::exp(double(z[j]) - mx);
    EXPECT_NEAR(losses[b], mx + std::log(s) - z[batch_.labels[b]], 1e-5) << b;
  }
}

TEST_F(GradCheckBert, TwoPassesAccumulate) {
  init(tiny_bert());
  const std::vector<float> once = forward_backward(), twice = forward_backward();
  double gmax = 0;
  for (float v : once) gmax = std::max(gmax, double(std::fabs(v)));
  ASSERT_GT(gmax, 0.0);
  for (size_t i = 0; i < once.size(); ++i) ASSERT_NEAR(twice[i], 2.0 * once[i], 1e-6 * gmax) << i;
}

// Negative control: a gradient 10% off fails the same check, and so does one small tensor's 10% error in
// that tensor's own check.
TEST_F(GradCheckBert, NegativeControlWrongGradientFails) {
  init(tiny_bert());
  std::vector<float> g = forward_backward();
  std::vector<float> wrong = g;
  for (float& v : wrong) v *= 1.1f;
  EXPECT_FALSE(gradient_matches([&] { return loss(); }, params(), wrong,
                                {.eps = 1e-2, .directions = 6, .coordinates = 0}));
  const ParamTensor& t = h_->model().layout().get("classifier.bias");
  std::vector<float> gb(g.begin() + t.offset, g.begin() + t.offset + t.numel());
  for (float& v : gb) v *= 1.1f;
  EXPECT_FALSE(gradient_matches([&] { return loss(); }, params().subspan(t.offset, t.numel()), gb,
                                {.eps = 1e-2, .directions = 2, .coordinates = 3}));
}

struct StepResult {
  std::vector<float> losses, grads;
  size_t activation_bytes = 0;
};

StepResult run_step(const TransformerConfig& c, CheckpointPolicy policy) {
  BertHarness h(c, 4, 8, true, DeviceKind::CPU, policy);
  randomize(h, 3);
  const BertBatch b = make_batch(c, 11);
  h.upload(b);
  if (h.model().dropout_state()) h.set_dropout(9, 0);
  StepResult r;
  r.losses = h.forward(4, 8, 0.5f, true);
  h.backward(4, 8);
  r.grads = h.grads();
  r.activation_bytes =
      h.plan().bytes(MemoryCategory::Activations) + h.plan().bytes(MemoryCategory::Recompute);
  return r;
}

// Checkpointing changes memory, never results: every policy gives bit-identical losses and gradients.
TEST(BertCheckpointing, EveryPolicyGivesIdenticalGradients) {
  TransformerConfig c = tiny_bert();
  c.n_layer = 4;
  const StepResult none = run_step(c, {});
  for (const CheckpointPolicy p :
       {CheckpointPolicy{CheckpointMode::Full, 1}, CheckpointPolicy{CheckpointMode::Full, 2},
        CheckpointPolicy{CheckpointMode::Selective, 1}, CheckpointPolicy{CheckpointMode::Selective, 3}}) {
    SCOPED_TRACE(checkpoint_mode_name(p.mode) + " every " + std::to_string(p.every));
    const StepResult r = run_step(c, p);
    EXPECT_EQ(r.losses, none.losses);
    ASSERT_EQ(r.grads.size(), none.grads.size());
    size_t differ = 0;
    for (size_t i = 0; i < r.grads.size(); ++i) differ += r.grads[i] != none.grads[i];
    EXPECT_EQ(differ, 0u);
    EXPECT_LT(r.activation_bytes, none.activation_bytes);
  }
  // The tanh-GELU variant recomputes through the fused epilogue ops.
  c.hidden_act = "gelu_new";
  EXPECT_EQ(run_step(c, {CheckpointMode::Full, 1}).grads, run_step(c, {}).grads);
  // With dropout, the recompute draws the forward's masks again.
  TransformerConfig d = tiny_bert_with_dropout();
  d.n_layer = 4;
  const StepResult dn = run_step(d, {});
  for (const CheckpointPolicy p :
       {CheckpointPolicy{CheckpointMode::Full, 1}, CheckpointPolicy{CheckpointMode::Selective, 2}}) {
    const StepResult r = run_step(d, p);
    EXPECT_EQ(r.losses, dn.losses);
    EXPECT_EQ(r.grads, dn.grads);
  }
  EXPECT_NE(dn.losses, none.losses);
}

// What sits in the padding (tokens, token types) changes nothing: not the logits, losses or any gradient.
// And each sequence gives the same logits run alone at its own length, without padding.
TEST(BertPadding, PaddingIsInvisible) {
  const TransformerConfig c = tiny_bert();
  BertHarness h(c, 4, 8, true);
  randomize(h, 21);
  BertBatch a = make_batch(c, 8);
  h.upload(a);
  const std::vector<float> losses_a = h.forward(4, 8, 1.0f, true);
  const std::vector<float> logits_a = h.logits(4);
  h.backward(4, 8);
  const std::vector<float> grads_a = h.grads();

  BertBatch b = a;
  Rng rng(4);
  for (int s = 0; s < b.B; ++s)
    for (int t = b.lengths[s]; t < b.T; ++t) {
      b.tokens[s * b.T + t] = int32_t(1 + rng.below(c.vocab_size - 1));
      b.types[s * b.T + t] = int32_t(rng.below(c.type_vocab_size));
    }
  h.zero_grads();
  h.upload(b);
  EXPECT_EQ(h.forward(4, 8, 1.0f, true), losses_a);
  EXPECT_EQ(h.logits(4), logits_a);
  h.backward(4, 8);
  EXPECT_EQ(h.grads(), grads_a);

  BertHarness one(c, 1, 8, false);
  one.model().upload_weights(one.device(), h.params().data());
  for (int s = 0; s < a.B; ++s) {
    const int len = a.lengths[s];
    BertBatch single;
    single.B = 1, single.T = len;
    single.tokens.assign(a.tokens.begin() + s * a.T, a.tokens.begin() + s * a.T + len);
    single.types.assign(a.types.begin() + s * a.T, a.types.begin() + s * a.T + len);
    single.labels = {0};
    single.labels_f = {0.0f};
    one.upload(single);
    one.model().forward(one.ops(), one.tokens(), one.types(), nullptr, nullptr, 1, len, 0.0f, false);
    const std::vector<float> z = one.logits(1);
    for (int j = 0; j < c.num_labels; ++j)
      EXPECT_NEAR(z[j], logits_a[s * c.num_labels + j], 1e-5 * (1 + std::fabs(z[j]))) << "sequence " << s;
  }
}

// Null token types mean type 0 everywhere.
TEST(BertPadding, NullTokenTypesAreTypeZero) {
  const TransformerConfig c = tiny_bert();
  BertHarness h(c, 4, 8, false);
  randomize(h, 2);
  BertBatch b = make_batch(c, 3);
  std::fill(b.types.begin(), b.types.end(), 0);
  h.upload(b);
  h.forward(4, 8, 0.0f, false);
  const std::vector<float> with_zeros = h.logits(4);
  b.types.clear();
  h.upload(b);
  h.forward(4, 8, 0.0f, false);
  EXPECT_EQ(h.logits(4), with_zeros);
}

// Hugging Face's nn.Embedding(padding_idx=pad_token_id): the pad token's row of the word embedding receives
// no gradient even where the pad token is a real token (its value does change the loss there); the position
// and token-type rows of that position do receive one.
TEST(BertPadding, PadTokenRowGetsNoGradient) {
  const TransformerConfig c = tiny_bert();
  BertHarness h(c, 4, 8, true);
  randomize(h, 13);
  BertBatch b = make_batch(c, 6);
  b.tokens[1] = c.pad_token_id;  // a real position of sequence 0
  h.upload(b);
  h.forward(4, 8, 1.0f, true);
  h.backward(4, 8);
  const std::vector<float> g = h.grads();
  const size_t wte = h.model().layout().get("bert.embeddings.word_embeddings.weight").offset;
  const size_t wpe = h.model().layout().get("bert.embeddings.position_embeddings.weight").offset;
  const int C = c.n_embd;
  double pad_row = 0, pos_row = 0;
  for (int k = 0; k < C; ++k) {
    pad_row += std::fabs(g[wte + size_t(c.pad_token_id) * C + k]);
    pos_row += std::fabs(g[wpe + size_t(1) * C + k]);
  }
  EXPECT_EQ(pad_row, 0.0);
  EXPECT_GT(pos_row, 0.0);
  // The loss does depend on the pad row (so this is the padding_idx rule, not a vanishing gradient).
  const auto loss = [&] {
    const std::vector<float> l = h.forward(4, 8, 0.0f, false);
    return double(l[0]);
  };
  const double l0 = loss();
  h.model().params()[wte + size_t(c.pad_token_id) * C] += 0.5f;
  EXPECT_NE(loss(), l0);
}

// bf16 and fp16 compute (fp32 master weights, fp32 or 16-bit gradients) stay close to fp32.
TEST(BertMixedPrecision, CloseToFp32) {
  const TransformerConfig c = tiny_bert();
  const BertBatch b = make_batch(c, 9);
  auto run = [&](OpsPrecision p) {
    BertHarness h(c, 4, 8, true, DeviceKind::CPU, CheckpointPolicy{CheckpointMode::Full, 1}, p);
    Rng rng(17);
    std::vector<float> w(h.model().layout().total_numel());
    for (float& v : w) v = 0.2f * rng.normal();
    for (const ParamTensor& t : h.model().layout().tensors())
      if (t.init == ParamTensor::Init::Ones)
        for (size_t i = 0; i < t.numel(); ++i) w[t.offset + i] += 1.0f;
    h.model().upload_weights(h.device(), w.data());
    h.upload(b);
    std::vector<float> losses = h.forward(4, 8, 1.0f / 3, true);
    h.backward(4, 8);
    return std::pair{losses, h.grads()};
  };
  const auto [l32, g32] = run({});
  for (const OpsPrecision p : {OpsPrecision{DType::BF16, DType::F32}, OpsPrecision{DType::BF16, DType::BF16},
                               OpsPrecision{DType::F16, DType::F32}}) {
    SCOPED_TRACE(std::string(dtype_name(p.compute)) + " grads " + std::string(dtype_name(p.grad)));
    const auto [l, g] = run(p);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(l[i], l32[i], 0.05 * (1 + std::fabs(l32[i])));
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < g.size(); ++i)
      ab += double(g[i]) * g32[i], aa += double(g[i]) * g[i], bb += double(g32[i]) * g32[i];
    EXPECT_GT(ab / std::sqrt(aa * bb), 0.99);
  }
}

// The memory history of two micro-batches with checkpointing: every saved activation recorded live is
// released by the end of each backward (a free of something not live would throw).
TEST(BertMemoryTrace, EveryActivationIsReleased) {
  const TransformerConfig c = tiny_bert();
  BertHarness h(c, 4, 8, true, DeviceKind::CPU, {CheckpointMode::Full, 2});
  randomize(h, 1);
  h.upload(make_batch(c, 2));
  test::TempDir tmp;
  MemoryTrace trace(tmp / "trace.jsonl", "cpu", h.plan().total_bytes(), 0, 1);
  for (const PlannedBuffer& b : h.plan().buffers()) trace.buffer(b.name, b.category, b.bytes);
  h.model().set_memory_trace(&trace);
  for (int micro = 0; micro < 2; ++micro) {
    h.forward(4, 8, 1.0f, true);
    EXPECT_GT(trace.live_bytes(), 0u);
    h.backward(4, 8);
    EXPECT_EQ(trace.live_bytes(), 0u) << "micro-batch " << micro;
  }
  EXPECT_GT(trace.peak_live_bytes(), trace.persistent_bytes());
  h.model().set_memory_trace(nullptr);
  trace.finish();
}

}  // namespace
}  // namespace anvil
