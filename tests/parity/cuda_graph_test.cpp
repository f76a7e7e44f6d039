// CUDA graphs (the trainer's --cuda_graphs): a micro-batch's forward + backward recorded with
// Device::capture and replayed must compute what the same calls compute eagerly, on the inputs present in
// the recorded buffers at replay time. Forward kernels are deterministic, so the per-position losses must
// match bit for bit; gradients may differ in the last bits where backward kernels reduce with atomics.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "train/engine.hpp"

namespace anvil {
namespace {

struct StepResult {
  std::vector<float> losses, grads;
};

template <class T>
std::vector<T> to_host(Device& dev, const T* p, size_t n) {
  std::vector<T> v(n);
  dev.copy_to_host(v.data(), p, n * sizeof(T));
  return v;
}

class CudaGraphTest : public ::testing::TestWithParam<Precision> {};

TEST_P(CudaGraphTest, ReplayMatchesEagerOnNewInputs) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  const uint32_t seed = std::random_device{}();
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::mt19937 rng(seed);
  TransformerConfig cfg;
  cfg.n_layer = 2, cfg.n_head = 4, cfg.n_embd = 64, cfg.vocab_size = 300, cfg.block_size = 64;
  EngineOptions o;
  o.device = DeviceKind::CUDA, o.batch_size = 4, o.seq_len = 64, o.training = true, o.precision = GetParam();
  Engine e(cfg, o);
  Decoder& m = e.decoder();
  m.init_weights(seed, e.device());
  const int B = o.batch_size, T = o.seq_len;
  const size_t bt = size_t(B) * T;

  std::uniform_int_distribution<int32_t> tok(0, cfg.vocab_size - 1);
  auto upload_batch = [&] {
    std::vector<int32_t> x(bt), y(bt);
    for (size_t i = 0; i < bt; ++i) x[i] = tok(rng), y[i] = tok(rng);
    y[3] = kIgnoreIndex;
    e.device().copy_to_device(e.tokens(0), x.data(), bt * sizeof(int32_t));
    e.device().copy_to_device(e.targets(0), y.data(), bt * sizeof(int32_t));
  };
  const float grad_scale = 1.0f / float(bt);
  auto micro_batch = [&] {
    m.forward(e.ops(), e.tokens(0), e.targets(0), B, T, grad_scale, true);
    m.backward(e.ops(), e.tokens(0), B, T);
  };
  auto result = [&] {
    e.device().synchronize();
    StepResult r{to_host(e.device(), m.losses(), bt), {}};
    const size_t n = m.layout().total_numel();
    r.grads = to_host(e.device(), static_cast<const float*>(m.grad_buffer()), n);  // fp32 gradients
    return r;
  };

  upload_batch();
  micro_batch();  // warm-up: attention plans and GEMM algorithms are chosen outside the recording
  std::unique_ptr<Device::Graph> graph = e.device().capture(micro_batch);
  ASSERT_TRUE(graph) << "the CUDA device must record graphs";

  for (int round = 0; round < 2; ++round) {
    upload_batch();  // new inputs in the recorded buffers
    e.device().fill_zero(m.grad_buffer(), m.grad_bytes());
    micro_batch();
    const StepResult eager = result();
    e.device().fill_zero(m.grad_buffer(), m.grad_bytes());
    graph->launch();
    const StepResult replay = result();
    EXPECT_EQ(eager.losses, replay.losses) << "round " << round;
    double max_ref = 0, max_diff = 0;
    for (size_t i = 0; i < eager.grads.size(); ++i) {
      max_ref = std::max(max_ref, double(std::fabs(eager.grads[i])));
      max_diff = std::max(max_diff, double(std::fabs(eager.grads[i] - replay.grads[i])));
    }
    EXPECT_GT(max_ref, 0.0);
    EXPECT_LE(max_diff, 1e-5 * max_ref) << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaGraphTest,
                         ::testing::Values(Precision::FP32, Precision::BF16, Precision::FP16),
                         [](const auto& info) { return std::string(precision_name(info.param)); });

TEST(CudaGraphTest, CaptureAbandonedWhenRecordingThrows) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  std::unique_ptr<Device> dev = make_cuda_device();
  DeviceBuffer buf(*dev, 1024);
  EXPECT_THROW(dev->capture([&] {
    dev->fill_zero(buf.get(), 1024);
    ANVIL_THROW("stop");
  }),
               Error);
  // The stream is usable again: ordinary work and a new recording both succeed.
  dev->fill_zero(buf.get(), 1024);
  dev->synchronize();
  std::unique_ptr<Device::Graph> g = dev->capture([&] { dev->fill_zero(buf.get(), 512); });
  ASSERT_TRUE(g);
  g->launch();
  dev->synchronize();
}

}  // namespace
}  // namespace anvil
