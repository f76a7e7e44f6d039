// Parity of LoRA on CUDA with the CPU reference: Ops::gemm (cuBLASLt with transposes, row strides, alpha
// and beta; compute-type or fp32-gradient outputs) against CpuOps::gemm for fp32, bf16 and fp16 storage; and
// a Llama-shaped decoder with adapters on every Linear: loss, every factor's gradient, and the factors after
// two AdamW steps agree, while the frozen base stays bit for bit what it was on both backends.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "parity_fixture.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

class GemmParity : public parity::TypedParityFixture<DType> {
 protected:
  OpsPrecision precision() const override { return {GetParam(), DType::F32}; }
};

TEST_P(GemmParity, StridedTransposedAccumulating) {
  struct Shape {
    bool ta, tb, c_grad;
    int m, n, k;
    int64_t pad_a, pad_b, pad_c;
    float alpha, beta;
  };
  // LoRA's shapes: x A^T into [N, r]; s t B^T into a column block of [N, out]; s dy_part B; dB, dA (fp32
  // gradients, accumulated); u A into dx.
  const Shape shapes[] = {{false, true, false, 300, 8, 64, 0, 0, 0, 1.f, 0.f},
                          {false, true, false, 300, 48, 8, 0, 0, 80, 2.f, 1.f},
                          {false, false, false, 300, 8, 48, 80, 0, 0, 0.5f, 0.f},
                          {true, false, true, 48, 8, 300, 80, 0, 0, 2.f, 1.f},
                          {true, false, true, 8, 64, 300, 0, 0, 0, 1.f, 1.f},
                          {false, false, false, 300, 64, 8, 0, 0, 0, 1.f, 1.f}};
  for (const Shape& s : shapes) {
    const int64_t ar = s.ta ? s.k : s.m, ac = (s.ta ? s.m : s.k) + s.pad_a;
    const int64_t br = s.tb ? s.n : s.k, bc = (s.tb ? s.k : s.n) + s.pad_b;
    const int64_t ldc = s.n + s.pad_c;
    Buf a = act(randn(size_t(ar * ac))), b = act(randn(size_t(br * bc)));
    const std::vector<float> c0 = randn(size_t(s.m * ldc));
    Buf c = s.c_grad ? f32(c0) : act(c0);
    GemmSpec g{.trans_a = s.ta,
               .trans_b = s.tb,
               .c_grad = s.c_grad,
               .m = s.m,
               .n = s.n,
               .k = s.k,
               .lda = ac,
               .ldb = bc,
               .ldc = ldc,
               .alpha = s.alpha,
               .beta = s.beta};
    g.a = a.cpu(), g.b = b.cpu(), g.c = c.cpu();
    cpu_->gemm(g);
    g.a = a.gpu(), g.b = b.gpu(), g.c = c.gpu();
    gpu_->gemm(g);
    EXPECT_TRUE(same("gemm", c, ulps(s.c_grad ? DType::F32 : act_, 4) + 2e-5))
        << s.m << "x" << s.n << "x" << s.k << " ta " << s.ta << " tb " << s.tb << "; seed " << seed_;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GemmParity, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

std::vector<float> to_host(Engine& e, const float* p, size_t n) {
  std::vector<float> v(n);
  e.device().copy_to_host(v.data(), p, n * sizeof(float));
  return v;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double max_ref = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    max_ref = std::max(max_ref, double(std::fabs(a[i]))),
    max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

// With lora_dropout both backends draw the same masks from the same state (kernels/dropout.hpp), so the
// comparison is the same. QLoRA (an nf4 base): both quantize the same host values into the same codes, and
// dequantize them before each matmul.
struct LoraParityCase {
  float dropout;
  WeightStorage storage;
};
class LoraModelParity : public ::testing::TestWithParam<LoraParityCase> {};

TEST_P(LoraModelParity, TrainingStepsFp32) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  const char* env = std::getenv("ANVIL_PARITY_SEED");
  const uint32_t seed = env ? uint32_t(std::stoul(env)) : std::random_device{}();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::mt19937 rng(seed);
  TransformerConfig cfg = TransformerConfig::preset("llama-tiny");
  EngineOptions o;
  o.batch_size = 4, o.seq_len = 48, o.training = true;
  o.optim = adamw_hyper({0.9f, 0.95f, 1e-8f, 0.1f});
  o.lora.r = 8, o.lora.alpha = 16, o.lora.target_modules = {"all-linear"},
  o.lora.dropout = GetParam().dropout;
  o.weight_storage = GetParam().storage;
  o.device = DeviceKind::CPU;
  Engine cpu(cfg, o);
  o.device = DeviceKind::CUDA;
  Engine gpu(cfg, o);
  const ParamLayout& layout = cpu.model().layout();
  const size_t n = layout.total_numel();
  // Master weights and gradients of the adapters alone, packed (ParamStore::keep_trainable_only).
  ASSERT_TRUE(cpu.model().param_store().trainable_only() && gpu.model().param_store().trainable_only());
  const ParamLayout& kept = cpu.model().param_store().optimizer_layout();
  const size_t nk = kept.total_numel();
  // B random too, so every gradient is non-trivial from the first step.
  cpu.model().init_weights(seed, cpu.device());
  std::vector<float> w(n);
  cpu.model().download_weights(cpu.device(), w.data());
  std::normal_distribution<float> normal(0.f, 0.05f);
  for (const ParamTensor& t : layout.tensors())
    if (t.role == TensorRole::LoraB)
      for (size_t i = 0; i < t.numel(); ++i) w[t.offset + i] = normal(rng);
  cpu.model().upload_weights(cpu.device(), w.data());
  gpu.model().upload_weights(gpu.device(), w.data());
  cpu.model().download_weights(cpu.device(), w.data());  // the base as kept (nf4: its codes dequantized)

  const int B = o.batch_size, T = o.seq_len, N = B * T;
  std::uniform_int_distribution<int> tok(0, cfg.vocab_size - 1);
  Engine* engines[2] = {&cpu, &gpu};
  for (int step = 1; step <= 2; ++step) {
    std::vector<int32_t> ids(N), targets(N);
    for (int i = 0; i < N; ++i) ids[i] = tok(rng), targets[i] = tok(rng);
    double loss[2];
    for (int k = 0; k < 2; ++k) {
      Engine& e = *engines[k];
      if (e.has_dropout()) {
        e.dropout_state_host() = DropoutState{seed + uint64_t(step), 0, 0};
        e.upload_dropout_state();
      }
      e.device().copy_to_device(e.tokens(0), ids.data(), N * sizeof(int32_t));
      e.device().copy_to_device(e.targets(0), targets.data(), N * sizeof(int32_t));
      e.device().fill_zero(e.model().grads(), nk * sizeof(float));
      e.decoder().forward(e.ops(), e.tokens(0), e.targets(0), B, T, 1.0f / N, true);
      loss[k] = e.ops().sum(e.model().losses(), N) / N;
      e.decoder().backward(e.ops(), e.tokens(0), B, T);
      e.model().param_store().zero_frozen_grads(e.device());
    }
    EXPECT_NEAR(loss[0], loss[1], 1e-5 * loss[0]) << "step " << step << " seed " << seed;
    const std::vector<float> gc = to_host(cpu, cpu.model().grads(), nk),
                             gg = to_host(gpu, gpu.model().grads(), nk);
    for (const ParamTensor& t : layout.tensors()) {
      if (!t.is_adapter()) continue;
      const size_t at = kept.get(t.name).offset;
      const std::vector<float> a(gc.begin() + long(at), gc.begin() + long(at + t.numel()));
      const std::vector<float> b(gg.begin() + long(at), gg.begin() + long(at + t.numel()));
      // Step 1 from the same weights: the ops' rounding alone. Step 2 after AdamW, whose first update is
      // about lr * sign(g) where g is within rounding of 0, so a few factor entries differ by an lr (as
      // ParityModel).
      EXPECT_LT(rel_error(a, b), step == 1 ? 1e-4 : 2e-3)
          << "gradient of " << t.name << ", step " << step << ", seed " << seed;
    }
    for (Engine* e : engines) {
      e->optimizer().step(e->ops(), e->model().params(), e->model().grads(), 1e-3f, step, 1.0f);
      e->model().sync_weights(e->ops());
    }
    std::vector<float> pc(n), pg(n);
    cpu.model().download_weights(cpu.device(), pc.data());
    gpu.model().download_weights(gpu.device(), pg.data());
    size_t off = 0;
    for (const ParamTensor& t : layout.tensors())
      for (size_t i = t.offset; i < t.offset + t.numel(); ++i) {
        if (!t.is_adapter()) {
          ASSERT_EQ(pc[i], w[i]) << "the frozen base moved on the CPU: " << t.name;
          ASSERT_EQ(pg[i], w[i]) << "the frozen base moved on CUDA: " << t.name;
        } else {
          off += std::fabs(pc[i] - pg[i]) > 2e-5;
        }
      }
    EXPECT_LE(off, n / 1000) << "factors differ after step " << step << ", seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, LoraModelParity,
                         ::testing::Values(LoraParityCase{0.0f, WeightStorage::Compute},
                                           LoraParityCase{0.2f, WeightStorage::Compute},
                                           LoraParityCase{0.0f, WeightStorage::NF4}),
                         [](const auto& info) {
                           return std::string(info.param.dropout > 0 ? "dropout" : "none") +
                                  (info.param.storage == WeightStorage::NF4 ? "_nf4" : "");
                         });

}  // namespace
}  // namespace anvil
