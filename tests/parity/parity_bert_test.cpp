// BERT on CUDA against the CPU reference: the ops BERT added (its embedding with token types, exact GELU,
// tanh, first-token rows, the classification losses, LayerNorm with BERT's epsilon) in fp32, bf16 and fp16
// storage (with fp32 and 16-bit gradients), and whole forward/backward steps of a small BertModel with padded
// sequences, token types and checkpointing. Fresh random inputs each run (ANVIL_PARITY_SEED replays one;
// ANVIL_PARITY_VERBOSE=1 prints every error). Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../unit/bert_harness.hpp"
#include "kernels/ops.hpp"
#include "parity_fixture.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

struct Case {
  DType compute;
  DType grad;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return std::string(dtype_name(info.param.compute)) + "Grads" + std::string(dtype_name(info.param.grad));
}

class BertOpsParity : public parity::TypedParityFixture<Case> {
 protected:
  OpsPrecision precision() const override { return {GetParam().compute, GetParam().grad}; }
};

TEST_P(BertOpsParity, Embedding) {
  // Token types in runs (segments) and scattered; padding with the pad token, which is also skipped in dwte.
  const int B = 4, T = 100, C = 72, V = 60, maxT = 128, TV = 3, pad = 0;
  std::vector<int32_t> tok = rand_ints(size_t(B) * T, 0, V), types(size_t(B) * T);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) types[b * T + t] = b == 3 ? int32_t(rng_() % TV) : t < T / 2 ? 0 : 1 + b % 2;
  Buf tokens = ints(tok), tt = ints(types);
  Buf wte = act(randn(size_t(V) * C)), wpe = act(randn(size_t(maxT) * C)), wtt = act(randn(size_t(TV) * C));
  Buf out = act(randn(size_t(B) * T * C, 100.f));
  for (const bool with_types : {true, false}) {
    SCOPED_TRACE(with_types ? "token types" : "no token types");
    cpu_->bert_embedding_fwd(out.cpu(), tokens.cpu_as<int32_t>(), with_types ? tt.cpu_as<int32_t>() : nullptr,
                             wte.cpu(), wpe.cpu(), wtt.cpu(), B, T, C);
    gpu_->bert_embedding_fwd(out.gpu(), tokens.gpu_as<int32_t>(), with_types ? tt.gpu_as<int32_t>() : nullptr,
                             wte.gpu(), wpe.gpu(), wtt.gpu(), B, T, C);
    EXPECT_TRUE(same("bert_embedding_fwd", out, ulps(act_, 1)));
    Buf dout = act(randn(size_t(B) * T * C));
    Buf dwte = grad(randn(size_t(V) * C)), dwpe = grad(randn(size_t(maxT) * C)),
        dwtt = grad(randn(size_t(TV) * C));
    cpu_->bert_embedding_bwd(dwte.cpu(), dwpe.cpu(), dwtt.cpu(), dout.cpu(), tokens.cpu_as<int32_t>(),
                             with_types ? tt.cpu_as<int32_t>() : nullptr, B, T, C, pad);
    gpu_->bert_embedding_bwd(dwte.gpu(), dwpe.gpu(), dwtt.gpu(), dout.gpu(), tokens.gpu_as<int32_t>(),
                             with_types ? tt.gpu_as<int32_t>() : nullptr, B, T, C, pad);
    // 16-bit gradients take one rounding per atomic add on the GPU (per token, per run of a type).
    const double tol = grad_ == DType::F32 ? 1e-5 : ulps(grad_, 8);
    EXPECT_TRUE(same("bert_embedding_bwd dwte", dwte, tol));
    EXPECT_TRUE(same("bert_embedding_bwd dwpe", dwpe, tol));
    EXPECT_TRUE(same("bert_embedding_bwd dwtt", dwtt, tol));
  }
}

TEST_P(BertOpsParity, GeluErfTanhFirstToken) {
  const size_t n = 100003;
  Buf x = act(randn(n, 3.f)), y = act(randn(n, 100.f));
  cpu_->gelu_erf_fwd(y.cpu(), x.cpu(), n);
  gpu_->gelu_erf_fwd(y.gpu(), x.gpu(), n);
  EXPECT_TRUE(same("gelu_erf_fwd", y, act_ == DType::F32 ? 1e-6 : ulps(act_, 1)));
  Buf dout = act(randn(n)), dinp = act(randn(n, 100.f));
  cpu_->gelu_erf_bwd(dinp.cpu(), x.cpu(), dout.cpu(), n);
  gpu_->gelu_erf_bwd(dinp.gpu(), x.gpu(), dout.gpu(), n);
  EXPECT_TRUE(same("gelu_erf_bwd", dinp, act_ == DType::F32 ? 1e-6 : ulps(act_, 1)));
  // Both in one pass (vectorised, then unaligned: the element-wise kernel), the gradient in place over dout.
  for (const size_t off : {size_t{0}, size_t{1}}) {
    SCOPED_TRACE(off ? "unaligned" : "aligned");
    Buf g = act(randn(n)), y2 = act(randn(n, 100.f));
    auto at = [&](void* base) { return static_cast<char*>(base) + dtype_bytes(act_, off); };
    cpu_->gelu_erf_fwd_bwd(at(y2.cpu()), at(g.cpu()), at(x.cpu()), at(g.cpu()), n - off);
    gpu_->gelu_erf_fwd_bwd(at(y2.gpu()), at(g.gpu()), at(x.gpu()), at(g.gpu()), n - off);
    EXPECT_TRUE(same("gelu_erf_fwd_bwd out", y2, act_ == DType::F32 ? 1e-6 : ulps(act_, 1)));
    EXPECT_TRUE(same("gelu_erf_fwd_bwd dinp", g, act_ == DType::F32 ? 1e-6 : ulps(act_, 1)));
  }
  // With the bias gradient (the column sums of dinp, onto nonzero values; 16-bit dinp may differ by an ulp
  // per element between the backends, which the sums carry): rows the fused fp32 kernel takes (several row
  // blocks, a partial last one) and ones it leaves to the two ops (columns not a multiple of 4).
  for (const auto& [rows, cols] : {std::pair{37, 4096}, std::pair{130, 512}, std::pair{9, 1030}}) {
    SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols));
    const size_t m = size_t(rows) * cols;
    Buf xi = act(randn(m, 3.f)), g2 = act(randn(m)), y3 = act(randn(m, 100.f));
    Buf dbias = grad(randn(size_t(cols)));
    cpu_->gelu_erf_fwd_bwd_bias(y3.cpu(), g2.cpu(), dbias.cpu(), xi.cpu(), g2.cpu(), rows, cols);
    gpu_->gelu_erf_fwd_bwd_bias(y3.gpu(), g2.gpu(), dbias.gpu(), xi.gpu(), g2.gpu(), rows, cols);
    EXPECT_TRUE(same("gelu_erf_fwd_bwd_bias out", y3, act_ == DType::F32 ? 1e-6 : ulps(act_, 1)));
    EXPECT_TRUE(same("gelu_erf_fwd_bwd_bias dinp", g2, act_ == DType::F32 ? 1e-6 : ulps(act_, 1)));
    EXPECT_TRUE(same("gelu_erf_fwd_bwd_bias dbias", dbias, act_ == DType::F32 ? 1e-5 : ulps(act_, 8)));
  }

  cpu_->tanh_fwd(y.cpu(), x.cpu(), n);
  gpu_->tanh_fwd(y.gpu(), x.gpu(), n);
  EXPECT_TRUE(same("tanh_fwd", y, act_ == DType::F32 ? 1e-6 : ulps(act_, 1)));
  copy_cpu_to_gpu(y);
  cpu_->tanh_bwd(dinp.cpu(), y.cpu(), dout.cpu(), n);
  gpu_->tanh_bwd(dinp.gpu(), y.gpu(), dout.gpu(), n);
  // The same fp32 arithmetic, up to a fused multiply-add on the GPU.
  EXPECT_TRUE(same("tanh_bwd", dinp, act_ == DType::F32 ? 1e-6 : ulps(act_, 1)));

  const int B = 5, T = 33, C = 40;
  Buf seq = act(randn(size_t(B) * T * C)), rows = act(randn(size_t(B) * C, 100.f));
  cpu_->first_token_fwd(rows.cpu(), seq.cpu(), B, T, C);
  gpu_->first_token_fwd(rows.gpu(), seq.gpu(), B, T, C);
  EXPECT_TRUE(same("first_token_fwd", rows, 0.0));
  Buf dseq = act(randn(size_t(B) * T * C, 100.f));
  cpu_->first_token_bwd(dseq.cpu(), rows.cpu(), B, T, C);
  gpu_->first_token_bwd(dseq.gpu(), rows.gpu(), B, T, C);
  EXPECT_TRUE(same("first_token_bwd", dseq, 0.0));
}

TEST_P(BertOpsParity, ClassificationLoss) {
  for (const int NL : {2, 3, 37, 1}) {
    SCOPED_TRACE("num_labels " + std::to_string(NL));
    const int N = 45;
    Buf logits = act(randn(size_t(N) * NL, 3.f)), dlogits = act(randn(size_t(N) * NL, 100.f));
    Buf losses = f32(randn(N, 100.f));
    Buf labels;
    if (NL == 1) {
      labels = f32(randn(N));
    } else {
      std::vector<int32_t> l = rand_ints(N, 0, NL);
      l[3] = l[17] = kIgnoreIndex;
      l[0] = NL - 1;
      labels = ints(l);
    }
    const float scale = act_ == DType::F16 ? 1024.f / N : 1.f / N;  // fp16 gradients carry a loss scale
    cpu_->classification_loss(losses.cpu_as<float>(), dlogits.cpu(), logits.cpu(), labels.cpu(), N, NL,
                              scale);
    gpu_->classification_loss(losses.gpu_as<float>(), dlogits.gpu(), logits.gpu(), labels.gpu(), N, NL,
                              scale);
    EXPECT_TRUE(same("classification_loss losses", losses, 1e-5));
    EXPECT_TRUE(same("classification_loss dlogits", dlogits, act_ == DType::F32 ? 1e-5 : ulps(act_, 2)));
    // Without a gradient buffer only the losses are written.
    cpu_->classification_loss(losses.cpu_as<float>(), nullptr, logits.cpu(), labels.cpu(), N, NL, scale);
    gpu_->classification_loss(losses.gpu_as<float>(), nullptr, logits.gpu(), labels.gpu(), N, NL, scale);
    EXPECT_TRUE(same("classification_loss losses only", losses, 1e-5));
  }
}

TEST_P(BertOpsParity, LayerNormBertEpsilon) {
  // Rows of small variance, where eps = 1e-12 and 1e-5 differ.
  for (const int C : {128, 100}) {
    SCOPED_TRACE("C=" + std::to_string(C));
    const int N = 67;
    std::vector<float> x = randn(size_t(N) * C, 1e-3f, 0.5f);
    Buf inp = act(x), w = act(randn(C, 0.5f, 1.f)), b = act(randn(C, 0.5f));
    Buf out = act(randn(size_t(N) * C, 100.f)), mean = f32(randn(N)), rstd = f32(randn(N));
    cpu_->layernorm_fwd(out.cpu(), mean.cpu_as<float>(), rstd.cpu_as<float>(), inp.cpu(), w.cpu(), b.cpu(), N,
                        C, 1e-12f);
    gpu_->layernorm_fwd(out.gpu(), mean.gpu_as<float>(), rstd.gpu_as<float>(), inp.gpu(), w.gpu(), b.gpu(), N,
                        C, 1e-12f);
    EXPECT_TRUE(same("layernorm_fwd eps 1e-12 out", out, act_ == DType::F32 ? 1e-4 : ulps(act_, 2)));
    EXPECT_TRUE(same("layernorm_fwd eps 1e-12 rstd", rstd, 1e-4));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, BertOpsParity,
                         ::testing::Values(Case{DType::F32, DType::F32}, Case{DType::BF16, DType::F32},
                                           Case{DType::BF16, DType::BF16}, Case{DType::F16, DType::F32},
                                           Case{DType::F16, DType::F16}),
                         case_name);

double rel_error(const std::vector<float>& ref, const std::vector<float>& got) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_ref = std::max(max_ref, double(std::fabs(ref[i])));
    max_diff = std::max(max_diff, double(std::fabs(ref[i] - got[i])));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i)
    ab += double(a[i]) * b[i], aa += double(a[i]) * a[i], bb += double(b[i]) * b[i];
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : (aa == bb ? 1.0 : 0.0);
}

// Two forward/backward passes (accumulated) of the same BertModel, weights and padded batch on both backends:
// logits, losses and every gradient agree (fp32: element-wise; 16-bit: loss and gradient direction).
void run_model(OpsPrecision precision, CheckpointPolicy checkpointing, bool regression) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  const uint32_t seed = parity::choose_seed();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::mt19937 rng(seed);
  TransformerConfig c = TransformerConfig::preset("bert-tiny");
  c.n_layer = 2, c.n_head = 4, c.n_embd = 64, c.intermediate_size = 128, c.vocab_size = 300,
  c.block_size = 64;
  c.num_labels = regression ? 1 : 3;
  c.initializer_range = 0.1;  // livelier than 0.02 on a tiny model
  const int B = 4, T = 48;
  test::BertHarness cpu(c, B, T, true, DeviceKind::CPU, checkpointing, precision);
  test::BertHarness gpu(c, B, T, true, DeviceKind::CUDA, checkpointing, precision);
  cpu.model().init_weights(seed, cpu.device());
  gpu.model().init_weights(seed, gpu.device());
  const bool lossy = precision.compute != DType::F32;
  const float scale = precision.compute == DType::F16 ? 1024.f : 1.f;
  for (int pass = 0; pass < 2; ++pass) {
    test::BertBatch b;
    b.B = B, b.T = T;
    for (int s = 0; s < B; ++s) b.lengths.push_back(s == 0 ? T : 1 + int(rng() % T));
    for (int s = 0; s < B; ++s)
      for (int t = 0; t < T; ++t) {
        const bool real = t < b.lengths[s];
        b.tokens.push_back(real ? int32_t(rng() % c.vocab_size) : c.pad_token_id);
        b.types.push_back(real && t >= b.lengths[s] / 2 ? 1 : 0);
      }
    std::normal_distribution<float> nd;
    for (int s = 0; s < B; ++s)
      b.labels.push_back(s == 2 ? kIgnoreIndex : int32_t(rng() % 3)), b.labels_f.push_back(nd(rng));
    const int valid = regression ? B : B - 1;
    std::vector<float> losses[2], logits[2];
    test::BertHarness* sides[2] = {&cpu, &gpu};
    for (int k = 0; k < 2; ++k) {
      sides[k]->upload(b);
      losses[k] = sides[k]->forward(B, T, scale / valid, true);
      logits[k] = sides[k]->logits(B);
      sides[k]->backward(B, T);
    }
    // 16-bit: the two backends round the same values in different orders through every layer; bf16's 8-bit
    // mantissa (ulp 2^-8) drifts to ~8 ulps of the largest logit on this tiny random model (measured 3.2e-2
    // on an H100), fp16's 11 bits stay well inside 3e-2.
    const double tol = !lossy ? 2e-4 : precision.compute == DType::BF16 ? 6e-2 : 3e-2;
    EXPECT_LT(rel_error(logits[0], logits[1]), tol) << "logits, pass " << pass << ", seed " << seed;
    EXPECT_LT(rel_error(losses[0], losses[1]), tol) << "losses, pass " << pass << ", seed " << seed;
  }
  const std::vector<float> gc = cpu.grads(), gg = gpu.grads();
  for (const ParamTensor& t : cpu.model().layout().tensors()) {
    if (t.name.ends_with("attention.self.key.bias")) continue;  // true gradient 0: only rounding noise
    const std::vector<float> a(gc.begin() + t.offset, gc.begin() + t.offset + t.numel());
    const std::vector<float> g(gg.begin() + t.offset, gg.begin() + t.offset + t.numel());
    if (lossy)
      EXPECT_GT(cosine(a, g), 0.99) << "gradient of " << t.name << ", seed " << seed;
    else
      EXPECT_LT(rel_error(a, g), 2e-3) << "gradient of " << t.name << ", seed " << seed;
  }
}

TEST(BertModelParity, Fp32) {
  run_model({}, {}, false);
}
TEST(BertModelParity, Fp32CheckpointedRegression) {
  run_model({}, {CheckpointMode::Full, 1}, true);
}
TEST(BertModelParity, Bf16Selective) {
  run_model({DType::BF16, DType::F32}, {CheckpointMode::Selective, 1}, false);
}
TEST(BertModelParity, Fp16Full) {
  run_model({DType::F16, DType::F32}, {CheckpointMode::Full, 2}, false);
}

}  // namespace
}  // namespace anvil
