// anvil bench-gemm: the dense GEMM throughput a device reaches through Anvil's own matmul (cuBLASLt on
// CUDA, OpenBLAS on the CPU) at a given size and precision: the measured peak that MFU can be set
// against (`--peak_flops`, docs/performance.md).
#include <chrono>
#include <memory>
#include <vector>

#include "anvil/rng.hpp"
#include "cli/command.hpp"
#include "core/half.hpp"
#include "kernels/ops.hpp"
#include "train/engine.hpp"

namespace anvil::cli {
namespace {

struct GemmArgs {
  std::string precision = "bf16", device = "auto";
  int size = 8192, iters = 20;
  bool json = false;
};

int run_bench_gemm(const GemmArgs& a) {
  ANVIL_REQUIRE(a.precision == "fp32" || a.precision == "tf32" || a.precision == "3xtf32" ||
                    a.precision == "bf16" || a.precision == "fp16",
                "--precision must be fp32, tf32, 3xtf32, bf16 or fp16, got '{}'", a.precision);
  ANVIL_REQUIRE(a.size >= 64 && a.size <= 65536 && a.iters >= 1, "--size must be 64..65536 and --iters >= 1");
  const DeviceKind kind = resolve_device(a.device);
  std::unique_ptr<Device> dev = make_device(kind);
  const DType t = a.precision == "bf16" ? DType::BF16 : a.precision == "fp16" ? DType::F16 : DType::F32;
  const size_t n = size_t(a.size), elems = n * n;
  DeviceBuffer A(*dev, dtype_bytes(t, elems)), B(*dev, dtype_bytes(t, elems)), C(*dev, dtype_bytes(t, elems));
  DeviceBuffer ws, split;
  std::unique_ptr<Ops> ops;
  if (kind == DeviceKind::CUDA) {
    ws = DeviceBuffer(*dev, kCudaGemmWorkspaceBytes);
    CudaGemmBuffers buffers{ws.get(), ws.size()};
    const bool fp32 = t == DType::F32;
    if (fp32 && a.precision == "3xtf32") {
      // The whole GEMM in one chunk: both operands' big and small parts.
      split = DeviceBuffer(*dev, 4 * elems * sizeof(float) + (1 << 20));
      buffers.split_scratch = static_cast<float*>(split.get()), buffers.split_scratch_bytes = split.size();
    }
    ops = make_cuda_ops(*dev, fp32 ? parse_fp32_matmul(a.precision) : Fp32Matmul::Native, buffers,
                        {t, DType::F32});
  } else {
    ops = make_cpu_ops(*dev, {t, DType::F32});
  }
  // Random inputs of unit scale (the values do not change the speed, but denormals or zeros could).
  {
    Rng rng(3);
    std::vector<float> host(elems);
    for (float& x : host) x = rng.normal();
    std::vector<uint16_t> half(t == DType::F32 ? 0 : elems);
    for (size_t i = 0; i < half.size(); ++i)
      half[i] = t == DType::BF16 ? float_to_bf16(host[i]) : float_to_fp16(host[i]);
    const void* src = t == DType::F32 ? static_cast<const void*>(host.data()) : half.data();
    dev->copy_to_device(A.get(), src, dtype_bytes(t, elems));
    dev->copy_to_device(B.get(), src, dtype_bytes(t, elems));
  }
  ops->matmul_fwd(C.get(), A.get(), B.get(), nullptr, a.size, a.size, a.size);  // warm-up (algorithm choice)
  dev->synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.iters; ++i)
    ops->matmul_fwd(C.get(), A.get(), B.get(), nullptr, a.size, a.size, a.size);
  dev->synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / a.iters;
  const double flops = 2.0 * double(n) * double(n) * double(n) / s;
  if (a.json)
    fmt::print(
        "{{\"device\": \"{}\", \"precision\": \"{}\", \"size\": {}, \"seconds\": {:.6e}, \"flops\": "
        "{:.6e}}}\n",
        dev->name(), a.precision, a.size, s, flops);
  else
    fmt::print("{}: {} GEMM {}^3: {:.3f} ms, {}\n", dev->name(), a.precision, a.size, s * 1e3,
               flops >= 1e12 ? fmt::format("{:.1f} TFLOP/s", flops / 1e12)
                             : fmt::format("{:.1f} GFLOP/s", flops / 1e9));
  return 0;
}

Command make_bench_gemm(CLI::App& parent) {
  auto a = std::make_shared<GemmArgs>();
  CLI::App* app = parent.add_subcommand("bench-gemm", "measure dense GEMM throughput (the peak for MFU)");
  app->add_option("--precision", a->precision,
                  "fp32 | tf32 | 3xtf32 | bf16 | fp16 (default bf16; tf32 and 3xtf32 are fp32 on CPU)");
  app->add_option("--size", a->size, "M = N = K (default 8192)");
  app->add_option("--iters", a->iters, "timed GEMMs (default 20)");
  app->add_option("--device", a->device, "auto | cpu | cuda");
  app->add_flag("--json", a->json, "one JSON line");
  return {app, [a] { return run_bench_gemm(*a); }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(75, make_bench_gemm);

}  // namespace anvil::cli
