// anvil bench-optimizer: times one optimizer's step on a model's full parameter buffer (random
// gradients) and reports its state memory, for bench/optimizer_bench.py's side-by-side with PyTorch.
#include <chrono>
#include <memory>
#include <vector>

#include "anvil/rng.hpp"
#include "cli/command.hpp"
#include "core/half.hpp"
#include "train/engine.hpp"

namespace anvil::cli {
namespace {

struct BenchArgs {
  std::string model = "d12", optim = "adamw_torch_fused", device = "auto", grad_dtype = "fp32";
  int steps = 50, warmup = 5;
  bool json = false;
};

int run_bench(const BenchArgs& a) {
  ANVIL_REQUIRE(a.steps >= 1 && a.warmup >= 0, "--steps must be >= 1 and --warmup >= 0, got {} and {}",
                a.steps, a.warmup);
  ANVIL_REQUIRE(a.grad_dtype == "fp32" || a.grad_dtype == "bf16",
                "--grad_dtype must be fp32 or bf16, got '{}'", a.grad_dtype);
  TrainConfig cfg;
  cfg.model = TransformerConfig::preset(a.model);
  cfg.optim = a.optim;
  cfg.weight_decay = 0.1;
  if (a.optim == "sgd") cfg.momentum = 0.9;
  cfg.validate("bench-optimizer");
  EngineOptions o;
  o.device = resolve_device(a.device);
  o.batch_size = 1, o.seq_len = 1, o.training = true;
  o.optimizer = parse_optimizer(a.optim);
  o.optim = optimizer_hyper(cfg);
  if (a.grad_dtype == "bf16") o.precision = Precision::BF16, o.half_precision_grads = true;
  Engine e(cfg.model, o);
  Model& m = e.model();
  const size_t n = m.layout().total_numel();
  m.init_weights(1, e.device());
  // Random gradients of a realistic scale, in the gradient type.
  {
    std::vector<float> g(n);
    Rng rng(2);
    for (float& x : g) x = 1e-3f * rng.normal();
    if (a.grad_dtype == "fp32") {
      e.device().copy_to_device(m.grad_buffer(), g.data(), n * sizeof(float));
    } else {
      std::vector<uint16_t> h(n);
      for (size_t i = 0; i < n; ++i) h[i] = float_to_bf16(g[i]);
      e.device().copy_to_device(m.grad_buffer(), h.data(), n * sizeof(uint16_t));
    }
  }
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < a.warmup; ++i)
    e.optimizer().step(e.ops(), m.params(), m.grad_buffer(), 1e-4f, i + 1, 1.f);
  e.device().synchronize();
  const auto t0 = Clock::now();
  for (int i = 0; i < a.steps; ++i)
    e.optimizer().step(e.ops(), m.params(), m.grad_buffer(), 1e-4f, a.warmup + i + 1, 1.f);
  e.device().synchronize();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / a.steps;
  const size_t state = e.optimizer().state_bytes();
  if (a.json) {
    fmt::print(
        "{{\"model\": \"{}\", \"optim\": \"{}\", \"device\": \"{}\", \"parameters\": {}, "
        "\"step_ms\": {:.6f}, \"state_bytes\": {}, \"grad_dtype\": \"{}\"}}\n",
        a.model, optimizer_name(e.optimizer().kind()), e.device().name(), n, ms, state, a.grad_dtype);
  } else {
    fmt::print("{} on {}: {} parameters, {} optimizer step {:.3f} ms, state {} ({:.2f} bytes/param)\n",
               a.model, e.device().name(), n, optimizer_name(e.optimizer().kind()), ms, format_bytes(state),
               double(state) / double(n));
  }
  return 0;
}

Command make_bench_optimizer(CLI::App& parent) {
  auto a = std::make_shared<BenchArgs>();
  CLI::App* app = parent.add_subcommand(
      "bench-optimizer", "time an optimizer step over a model's parameters (random gradients) and its state");
  app->add_option("--model", a->model, "model preset (tiny, d12, d24, d36, d48; default d12)");
  app->add_option("--optim", a->optim, "adamw_torch_fused | adafactor | adamw_8bit | sgd");
  app->add_option("--steps", a->steps, "timed steps (default 50)");
  app->add_option("--warmup", a->warmup, "untimed steps first (default 5)");
  app->add_option("--device", a->device, "auto | cpu | cuda");
  app->add_option("--grad_dtype", a->grad_dtype, "fp32 | bf16 gradients (default fp32)");
  app->add_flag("--json", a->json, "one JSON line instead of text");
  return {app, [a] { return run_bench(*a); }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(70, make_bench_optimizer);

}  // namespace anvil::cli
