// Adafactor, CUDA against the CPU reference (proposal for tests/parity/): the same GPT-2 layout, weights
// and gradients on both devices, several steps, factored and unfactored tensors, beta1, weight decay,
// fp32 and bf16 gradients. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "anvil/model_config.hpp"
#include "anvil/rng.hpp"
#include "core/half.hpp"
#include "kernels/ops.hpp"
#include "model/param_layout.hpp"
#include "optim/adafactor.hpp"
#include "runtime/arena.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

struct Side {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<Adafactor> opt;
  std::unique_ptr<Arena> arena;
  std::unique_ptr<DeviceBuffer> gemm_ws;
  float* params = nullptr;
  void* grads = nullptr;
  Side(DeviceKind kind, const ParamLayout& layout, const OptimizerHyper& h, int64_t vocab, DType grad) {
    dev = kind == DeviceKind::CUDA ? make_cuda_device(0) : make_cpu_device();
    if (kind == DeviceKind::CUDA) {
      gemm_ws = std::make_unique<DeviceBuffer>(*dev, kCudaGemmWorkspaceBytes);
      ops = make_cuda_ops(*dev, false, gemm_ws->get(), kCudaGemmWorkspaceBytes, {grad, grad});
    } else {
      ops = make_cpu_ops(*dev, {grad, grad});
    }
    opt = std::make_unique<Adafactor>(layout, h, vocab);
    const size_t n = layout.total_numel();
    MemoryPlan plan;
    const size_t ip = plan.add("params", MemoryCategory::Weights, n * 4);
    const size_t ig = plan.add("grads", MemoryCategory::Gradients, n * dtype_bits(grad) / 8);
    opt->plan_memory(plan);
    arena = std::make_unique<Arena>(*dev, plan);
    params = arena->get<float>(ip);
    grads = arena->get<void>(ig);
    opt->bind(*arena);
    opt->reset(*dev);
  }
};

// `device_scale`: the GPU gets its gradient scale 0.5 from device memory (host 1 x device 0.5, the
// trainer's clip-factor path), the CPU on the host.
void run_parity(const OptimizerHyper& h, DType grad_type, int n_embd, int vocab, bool device_scale = false) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  TransformerConfig cfg;
  cfg.n_layer = 2, cfg.n_head = 4, cfg.n_embd = n_embd, cfg.vocab_size = vocab, cfg.block_size = 64;
  const ParamLayout layout = ParamLayout::decoder(cfg);
  const size_t n = layout.total_numel();
  Side cpu(DeviceKind::CPU, layout, h, vocab, grad_type), gpu(DeviceKind::CUDA, layout, h, vocab, grad_type);
  Rng rng(1);
  std::vector<float> p(n);
  for (float& x : p) x = 0.02f * rng.normal();
  std::memcpy(cpu.params, p.data(), n * 4);
  gpu.dev->copy_to_device(gpu.params, p.data(), n * 4);
  const size_t gbytes = n * dtype_bits(grad_type) / 8;
  std::vector<char> g(gbytes);
  const float half = 0.5f;
  DeviceBuffer scale(*gpu.dev, sizeof(float));
  gpu.dev->copy_to_device(scale.get(), &half, sizeof(float));
  for (int step = 1; step <= 5; ++step) {
    for (size_t i = 0; i < n; ++i) {
      const float v = 1e-2f * rng.normal() * std::exp(0.5f * rng.normal());
      if (grad_type == DType::F32)
        reinterpret_cast<float*>(g.data())[i] = v;
      else
        reinterpret_cast<uint16_t*>(g.data())[i] = float_to_bf16(v);
    }
    std::memcpy(cpu.grads, g.data(), gbytes);
    gpu.dev->copy_to_device(gpu.grads, g.data(), gbytes);
    cpu.opt->step(*cpu.ops, cpu.params, cpu.grads, 1e-3f, step, 0.5f);
    if (device_scale)
      gpu.opt->step(*gpu.ops, gpu.params, gpu.grads, 1e-3f, step, 1.0f,
                    static_cast<const float*>(scale.get()));
    else
      gpu.opt->step(*gpu.ops, gpu.params, gpu.grads, 1e-3f, step, 0.5f);
  }
  std::vector<float> want(n), got(n);
  std::memcpy(want.data(), cpu.params, n * 4);
  gpu.dev->copy_to_host(got.data(), gpu.params, n * 4);
  for (const ParamTensor& t : layout.tensors()) {
    double max_diff = 0, max_delta = 0;
    for (size_t i = t.offset; i < t.offset + t.numel(); ++i) {
      max_diff = std::max(max_diff, double(std::fabs(got[i] - want[i])));
      max_delta = std::max(max_delta, double(std::fabs(want[i] - p[i])));
    }
    EXPECT_LE(max_diff, 1e-4 * max_delta + 1e-6 * 0.1) << t.name;  // the change, to 1e-4
  }
  const auto sc = cpu.opt->state_tensors(), sg = gpu.opt->state_tensors();
  ASSERT_EQ(sc.size(), sg.size());
  for (size_t k = 0; k < sc.size(); ++k) {
    std::vector<float> a(sc[k].count), b(sg[k].count);
    std::memcpy(a.data(), sc[k].data, a.size() * 4);
    gpu.dev->copy_to_host(b.data(), sg[k].data, b.size() * 4);
    double max_diff = 0, max_ref = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
      max_ref = std::max(max_ref, double(std::fabs(a[i])));
    }
    EXPECT_LE(max_diff, 1e-5 * max_ref) << sc[k].name;
  }
}

TEST(ParityAdafactor, DefaultsFp32Grads) {
  run_parity({}, DType::F32, 96, 300);
}
TEST(ParityAdafactor, Beta1DecayExternalLrBf16Grads) {
  OptimizerHyper h;
  h.adafactor_beta1 = 0.9f, h.weight_decay = 0.1f, h.relative_step = false, h.scale_parameter = false;
  h.lr_multiplier[2] = 0.5f;
  run_parity(h, DType::BF16, 160, 1000);
}
TEST(ParityAdafactor, GradScaleFromDevice) {
  OptimizerHyper h;
  h.adafactor_beta1 = 0.9f, h.weight_decay = 0.1f;
  run_parity(h, DType::F32, 96, 300, /*device_scale=*/true);
}
TEST(ParityAdafactor, WideTensorsAcrossManyTiles) {
  OptimizerHyper h;
  h.clip_threshold = 0.5f;
  run_parity(h, DType::F32, 256, 5000);
}

}  // namespace
}  // namespace anvil
