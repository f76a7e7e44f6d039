// 8-bit AdamW (bitsandbytes AdamW8bit semantics): the dynamic quantisation maps, block-wise quantisation
// round trips, the fused adamw8bit_step op (requantisation to the nearest code, m's sign kept, non-finite
// gradients, 16-bit gradients), the AdamW8bit optimizer against fp32 AdamW (close on 8-bit elements,
// identical on the fp32 fallback elements), its exact state bytes, a state save/load round trip, and a
// training curve against AdamW.
#include "optim/adamw_8bit.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <vector>

#include "anvil/model_config.hpp"
#include "anvil/rng.hpp"
#include "anvil/trainer.hpp"
#include "core/half.hpp"
#include "data/byte_corpus.hpp"
#include "kernels/cpu/cpu_kernels.hpp"
#include "kernels/ops.hpp"
#include "model/param_layout.hpp"
#include "optim/adamw.hpp"
#include "runtime/arena.hpp"
#include "runtime/device.hpp"
#include "test_util.hpp"

namespace anvil {
namespace {

constexpr size_t kB = kAdamW8bitBlockSize;

// --- maps ------------------------------------------------------------------------------------------------

TEST(DynamicMap, SignedHas256SortedValuesCoveringMinusOneToOneWithZero) {
  const auto m = dynamic_quant_map(true);
  ASSERT_EQ(m.size(), 256u);
  for (size_t i = 1; i < 256; ++i) EXPECT_LT(m[i - 1], m[i]) << i;
  EXPECT_EQ(m[255], 1.0f);
  EXPECT_NEAR(m[0], -0.99296875f, 1e-7);  // the midpoint of the top bin of the finest level, negated
  EXPECT_EQ(m[127], 0.0f);                // 127 negative values, 0, 127 positive values and 1
  for (size_t i = 0; i < 127; ++i) EXPECT_EQ(m[i], -m[254 - i]) << i;  // symmetric apart from the 1
  EXPECT_NEAR(m[128], 0.55e-6f, 1e-12);  // the smallest magnitude: 10^-6 times the midpoint of [0.1, 1]
  // Dynamic: every decade from 1e-6 to 1 has values, the finer the larger.
  for (int k = 0; k < 7; ++k) {
    const float lo = std::pow(10.0f, float(k - 6)) * 0.1f, hi = std::pow(10.0f, float(k - 6));
    const auto n = std::count_if(m.begin(), m.end(), [&](float x) { return x > lo && x < hi; });
    EXPECT_EQ(n, 1 << k) << "decade " << k;
  }
}

TEST(DynamicMap, UnsignedHas256SortedValuesCoveringZeroToOne) {
  const auto m = dynamic_quant_map(false);
  ASSERT_EQ(m.size(), 256u);
  for (size_t i = 1; i < 256; ++i) EXPECT_LT(m[i - 1], m[i]) << i;
  EXPECT_EQ(m[0], 0.0f);
  EXPECT_EQ(m[255], 1.0f);
  EXPECT_NEAR(m[1], 0.325e-6f, 1e-12);      // the finest level has two bins: midpoints 0.325 and 0.775
  EXPECT_NEAR(m[254], 0.996484375f, 1e-7);  // 128 bins at the top level
  for (int k = 0; k < 7; ++k) {
    const float lo = std::pow(10.0f, float(k - 6)) * 0.1f, hi = std::pow(10.0f, float(k - 6));
    const auto n = std::count_if(m.begin(), m.end(), [&](float x) { return x > lo && x < hi; });
    EXPECT_EQ(n, 2 << k) << "decade " << k;
  }
}

// The CPU kernel's bucket index gives the binary search's code for every float: at each bucket's edges and
// inside it, at every map value, between neighbours (the ties and the floats beside them), at the signed
// zeros, the infinities and NaN.
TEST(DynamicMap, IndexedQuantizationEqualsTheBinarySearch) {
  for (bool is_signed : {true, false}) {
    const auto map = dynamic_quant_map(is_signed);
    std::vector<float> xs = {0.0f,
                             -0.0f,
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN(),
                             std::numeric_limits<float>::denorm_min(),
                             -std::numeric_limits<float>::denorm_min()};
    for (uint32_t hi = 0; hi < (1u << 16); ++hi)
      for (uint32_t lo : {0u, 1u, 0x7fffu, 0x8000u, 0xfffeu, 0xffffu}) {
        const uint32_t u = hi << 16 | lo;
        float x;
        std::memcpy(&x, &u, sizeof(x));
        xs.push_back(x);
      }
    for (size_t i = 0; i < 256; ++i) {
      for (float d : {-1.0f, 0.0f, 1.0f}) xs.push_back(std::nextafter(map[i], map[i] + d));
      if (i + 1 < 256) {
        const float mid = 0.5f * (map[i] + map[i + 1]);
        for (float x = std::nextafter(mid, -2.0f), k = 0; k < 3; ++k, x = std::nextafter(x, 2.0f))
          xs.push_back(x);
      }
    }
    Rng rng(5);
    for (int i = 0; i < 200000; ++i) xs.push_back(float(rng.normal()) * std::pow(10.0f, float(i % 9 - 7)));
    for (float x : xs)
      ASSERT_EQ(cpu::quantize_to_map_indexed(map.data(), x), cpu::quantize_to_map(map.data(), x))
          << (is_signed ? "signed" : "unsigned") << " map, x = " << x;
  }
}

// --- block-wise quantisation -----------------------------------------------------------------------------

// Half the gap between the map values around y (the worst rounding error of a nearest-value quantiser there).
float half_gap(const std::array<float, 256>& map, float y) {
  const auto it = std::lower_bound(map.begin(), map.end(), y);
  if (it == map.begin()) return 0.5f * (map[1] - map[0]);
  if (it == map.end()) return 0.5f * (map[255] - map[254]);
  return 0.5f * (*it - *(it - 1));
}

TEST(BlockwiseQuantization, RoundTripErrorIsWithinTheMapResolution) {
  for (const bool is_signed : {true, false}) {
    const auto map = dynamic_quant_map(is_signed);
    const size_t n = 10 * kB + 77;  // a partial last block
    Rng rng(11);
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) {
      // Heavy-tailed: most values small, a few outliers per block (what block-wise scaling is for).
      const float r =
          rng.normal() * (rng.uniform() < 0.02f ? 50.0f : 1.0f) * std::pow(10.0f, -3.0f * rng.uniform());
      x[i] = is_signed ? r : r * r;
    }
    std::fill(x.begin() + 3 * kB, x.begin() + 4 * kB, 0.0f);  // an all-zero block
    const size_t nb = (n + kB - 1) / kB;
    std::vector<uint8_t> codes(n);
    std::vector<float> absmax(nb), y(n);
    quantize_blockwise(x.data(), n, map.data(), kB, codes.data(), absmax.data());
    dequantize_blockwise(codes.data(), absmax.data(), n, map.data(), kB, y.data());
    for (size_t b = 0; b < nb; ++b) {
      float mx = 0, worst = 0;
      for (size_t i = b * kB; i < std::min(n, (b + 1) * kB); ++i) mx = std::max(mx, std::abs(x[i]));
      ASSERT_EQ(absmax[b], mx) << "block " << b;
      for (size_t i = b * kB; i < std::min(n, (b + 1) * kB); ++i) {
        const float err = std::abs(x[i] - y[i]);
        if (mx == 0) {
          ASSERT_EQ(y[i], 0.0f);
          continue;
        }
        // Nearest: within half the local gap of the map (relative to absmax), up to float rounding.
        ASSERT_LE(err, (half_gap(map, x[i] / mx) + 1e-6f) * mx) << "element " << i;
        worst = std::max(worst, err / mx);
      }
      // The map's coarsest step is at the top (0.9/64 signed, 0.9/128 unsigned): half of it bounds every
      // block.
      EXPECT_LE(worst, (is_signed ? 0.9f / 128 : 0.9f / 256) + 1e-6f) << "block " << b;
    }
  }
}

// --- the op ----------------------------------------------------------------------------------------------

// One 8-bit range over a buffer of n elements (state from 0), for calling the op directly.
struct OneRange {
  std::vector<uint64_t> begins{0}, state_begins{0};
  std::vector<uint8_t> groups{0};
  ParamGroupTable table() const { return {begins.data(), groups.data(), state_begins.data(), 1}; }
};

struct OpState {
  size_t n, nb;
  std::vector<float> p, m_absmax, v_absmax;
  std::vector<uint8_t> m_codes, v_codes;
  std::array<float, 256> m_map = dynamic_quant_map(true), v_map = dynamic_quant_map(false);
  explicit OpState(size_t n_)
      : n(n_),
        nb((n_ + kB - 1) / kB),
        p(n_),
        m_absmax(nb),
        v_absmax(nb),
        m_codes(nb * kB),
        v_codes(nb * kB) {}
  float m(size_t i) const { return m_map[m_codes[i]] * m_absmax[i / kB]; }
  float v(size_t i) const { return v_map[v_codes[i]] * v_absmax[i / kB]; }
  void step(Ops& ops, const void* grad, const AdamW8bitArgs& a) {
    OneRange r;
    ops.adamw8bit_step(p.data(), grad, m_codes.data(), m_absmax.data(), v_codes.data(), v_absmax.data(),
                       m_map.data(), v_map.data(), n, nb, r.table(), a);
  }
};

AdamW8bitArgs op_args(float lr, float wd, int64_t step) {
  AdamW8bitArgs a;
  a.beta1 = 0.9f, a.beta2 = 0.99f, a.eps = 1e-8f, a.step = step;
  a.lr[0] = lr, a.weight_decay[0] = wd;
  return a;
}

TEST(AdamW8bitOp, FirstStepIsExactAdamWAndRequantisesToTheNearestCodeKeepingMsSign) {
  auto dev = make_cpu_device();
  auto ops = make_cpu_ops(*dev);
  const size_t n = 3 * kB + 40;
  OpState s(n);
  Rng rng(7);
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = rng.normal();
    g[i] = rng.normal() * std::pow(10.0f, -4.0f * rng.uniform());
  }
  g[5] = -1e-9f;  // far below the block's absmax: nearest code is 0, but m must stay negative
  g[6] = 1e-9f;
  const std::vector<float> p0 = s.p;
  const AdamW8bitArgs a = op_args(1e-2f, 0.1f, 1);
  s.step(*ops, g.data(), a);
  for (size_t i = 0; i < n; ++i) {
    // From zero state, step 1 uses the exact moments: the PyTorch AdamW step, in double.
    const double m = 0.1 * g[i], v = 0.01 * double(g[i]) * g[i];
    const double ref = p0[i] * (1 - 1e-3) - 1e-2 / 0.1 * m / (std::sqrt(v) / std::sqrt(0.01) + 1e-8);
    ASSERT_NEAR(s.p[i], ref, 2e-6 * (std::abs(ref) + 1e-2)) << i;
    // Requantised: the stored m is the nearest representable value of m's sign (v: the nearest one).
    const float mq = s.m(i), mf = (1.0f - 0.9f) * g[i];
    ASSERT_TRUE((mq < 0) == (mf < 0) || mq == 0) << i;
    if (mf < 0) {
      ASSERT_LT(mq, 0.0f) << i;
    }
    for (const int d : {-1, 1}) {
      const int c = int(s.m_codes[i]) + d;
      if (c < 0 || c > 255 || (mf < 0 && s.m_map[c] >= 0)) continue;
      ASSERT_LE(std::abs(mf - mq), std::abs(mf - s.m_map[c] * s.m_absmax[i / kB]) * (1 + 1e-6f)) << i;
    }
    const float vq = s.v(i), vf = (1.0f - 0.99f) * (g[i] * g[i]);
    for (const int d : {-1, 1}) {
      const int c = int(s.v_codes[i]) + d;
      if (c < 0 || c > 255) continue;
      ASSERT_LE(std::abs(vf - vq), std::abs(vf - s.v_map[c] * s.v_absmax[i / kB]) * (1 + 1e-6f)) << i;
    }
  }
  EXPECT_LT(s.m(5), 0.0f);
  // Block absmax is the largest |m| (v) of the block; the padding of the last block is left untouched.
  for (size_t b = 0; b < s.nb; ++b) {
    float mm = 0, vm = 0;
    for (size_t i = b * kB; i < std::min(n, (b + 1) * kB); ++i) {
      mm = std::max(mm, std::abs((1.0f - 0.9f) * g[i]));  // the kernel's float arithmetic
      vm = std::max(vm, (1.0f - 0.99f) * (g[i] * g[i]));
    }
    EXPECT_EQ(s.m_absmax[b], mm);
    EXPECT_EQ(s.v_absmax[b], vm);
  }
  for (size_t i = n; i < s.nb * kB; ++i) ASSERT_EQ(s.m_codes[i] | s.v_codes[i], 0) << i;
}

TEST(AdamW8bitOp, NonFiniteGradientResetsThatElementOnly) {
  auto dev = make_cpu_device();
  auto ops = make_cpu_ops(*dev);
  const size_t n = 2 * kB;
  OpState s(n);
  std::vector<float> g(n, 0.5f);
  for (size_t i = 0; i < n; ++i) s.p[i] = 1.0f;
  s.step(*ops, g.data(), op_args(1e-2f, 0.0f, 1));
  const std::vector<float> p1 = s.p;
  g[3] = std::numeric_limits<float>::quiet_NaN();
  g[kB + 4] = std::numeric_limits<float>::infinity();
  s.step(*ops, g.data(), op_args(1e-2f, 0.0f, 2));
  for (const size_t i : {size_t(3), kB + 4}) {
    EXPECT_EQ(s.p[i], p1[i]) << i;
    EXPECT_EQ(s.m(i), 0.0f) << i;
    EXPECT_EQ(s.v(i), 0.0f) << i;
  }
  EXPECT_TRUE(std::isfinite(s.m_absmax[0]) && std::isfinite(s.v_absmax[1]));
  EXPECT_LT(s.p[2], p1[2]);  // its neighbours still step
  EXPECT_NEAR(s.m(2), 0.5f * (1 - 0.81f), 2e-3f);
}

TEST(AdamW8bitOp, SixteenBitGradientsWidenExactly) {
  auto dev = make_cpu_device();
  const size_t n = kB + 3;
  Rng rng(3);
  std::vector<float> g32(n);
  std::vector<uint16_t> gbf(n), gh(n);
  for (size_t i = 0; i < n; ++i) {
    gbf[i] = float_to_bf16(rng.normal());
    g32[i] = bf16_to_float(gbf[i]);
    gh[i] = float_to_fp16(g32[i]);
  }
  OpState ref(n), bf(n), h(n);
  for (size_t i = 0; i < n; ++i) ref.p[i] = bf.p[i] = h.p[i] = 1.0f + 0.001f * float(i);
  auto ops32 = make_cpu_ops(*dev);
  auto opsbf = make_cpu_ops(*dev, {DType::BF16, DType::BF16});
  for (int64_t t = 1; t <= 2; ++t) {
    ref.step(*ops32, g32.data(), op_args(1e-2f, 0.1f, t));
    bf.step(*opsbf, gbf.data(), op_args(1e-2f, 0.1f, t));
  }
  EXPECT_EQ(ref.p, bf.p);
  EXPECT_EQ(ref.m_codes, bf.m_codes);
  EXPECT_EQ(ref.v_absmax, bf.v_absmax);
  // fp16 gradients (values representable in both): the same again.
  OpState ref2(n);
  for (size_t i = 0; i < n; ++i) {
    g32[i] = fp16_to_float(gh[i]);
    ref2.p[i] = h.p[i] = 1.0f;
  }
  auto opsh = make_cpu_ops(*dev, {DType::F16, DType::F16});
  ref2.step(*ops32, g32.data(), op_args(1e-2f, 0.1f, 1));
  h.step(*opsh, gh.data(), op_args(1e-2f, 0.1f, 1));
  EXPECT_EQ(ref2.p, h.p);
}

// The CUDA kernel against the CPU one (skipped without a GPU): a table with two 8-bit ranges in different
// groups, a skipped range between them, padded blocks, a non-finite gradient, BF16 gradients and a gradient
// scale from device memory. Both kernels round every operation the same way (no FMA contraction), so the
// results agree bit for bit.
TEST(AdamW8bitOp, CudaMatchesCpuBitForBit) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  auto cpu_dev = make_cpu_device();
  auto gpu_dev = make_cuda_device(0);
  DeviceBuffer ws(*gpu_dev, kCudaGemmWorkspaceBytes);
  const size_t n = 868 + 500 + 1000;
  const std::vector<uint64_t> begins = {0, 868, 1368}, state_begins = {0, 1024, 1024};
  const std::vector<uint8_t> groups = {0, kSkipGroup, 2};
  const size_t nb = 8;  // 4 blocks per 8-bit range
  for (const DType gtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(std::string(dtype_name(gtype)));
    auto cpu_ops = make_cpu_ops(*cpu_dev, {gtype, gtype});
    auto gpu_ops = make_cuda_ops(*gpu_dev, false, ws.get(), ws.size(), {gtype, gtype});
    std::vector<DeviceBuffer> keep;
    auto up = [&](const void* host, size_t bytes) {
      keep.emplace_back(*gpu_dev, bytes);
      gpu_dev->copy_to_device(keep.back().get(), host, bytes);
      return keep.back().get();
    };
    OpState c(n);
    c.nb = nb, c.m_absmax.assign(nb, 0), c.v_absmax.assign(nb, 0), c.m_codes.assign(nb * kB, 0);
    c.v_codes.assign(nb * kB, 0);
    Rng rng(21);
    for (float& x : c.p) x = rng.normal();
    const std::vector<float> p0 = c.p;
    const ParamGroupTable ct{begins.data(), groups.data(), state_begins.data(), 3};
    const ParamGroupTable gpu_t{static_cast<const uint64_t*>(up(begins.data(), 24)),
                                static_cast<const uint8_t*>(up(groups.data(), 3)),
                                static_cast<const uint64_t*>(up(state_begins.data(), 24)), 3};
    auto* p = static_cast<float*>(up(c.p.data(), n * 4));
    auto* mc = static_cast<uint8_t*>(up(c.m_codes.data(), nb * kB));
    auto* vc = static_cast<uint8_t*>(up(c.v_codes.data(), nb * kB));
    auto* ma = static_cast<float*>(up(c.m_absmax.data(), nb * 4));
    auto* va = static_cast<float*>(up(c.v_absmax.data(), nb * 4));
    auto* mm = static_cast<float*>(up(c.m_map.data(), 1024));
    auto* vm = static_cast<float*>(up(c.v_map.data(), 1024));
    for (int64_t t = 1; t <= 4; ++t) {
      std::vector<float> g(n);
      for (float& x : g) x = rng.normal() * std::pow(10.0f, -3.0f * rng.uniform());
      if (t == 3) g[100] = std::numeric_limits<float>::infinity();
      std::vector<uint16_t> g16(n);
      for (size_t i = 0; i < n; ++i) g16[i] = float_to_bf16(g[i]);
      const void* gh = gtype == DType::F32 ? static_cast<const void*>(g.data()) : g16.data();
      const void* gd = up(gh, n * dtype_bytes(gtype, 1));
      AdamW8bitArgs a = op_args(3e-3f, 0.1f, t);
      a.lr[2] = 1e-3f, a.weight_decay[2] = 0.05f, a.grad_scale = 0.5f;
      cpu_ops->adamw8bit_step(c.p.data(), gh, c.m_codes.data(), c.m_absmax.data(), c.v_codes.data(),
                              c.v_absmax.data(), c.m_map.data(), c.v_map.data(), n, nb, ct, a);
      // Even steps hand the GPU its scale through device memory (1 x 0.5: the trainer's clip factor path).
      AdamW8bitArgs ga = a;
      if (t % 2 == 0) {
        ga.grad_scale = 1.f;
        ga.grad_scale_device = static_cast<const float*>(up(&a.grad_scale, sizeof(float)));
      }
      gpu_ops->adamw8bit_step(p, gd, mc, ma, vc, va, mm, vm, n, nb, gpu_t, ga);
    }
    auto down = [&](const void* d, size_t bytes) {
      std::vector<char> h(bytes);
      gpu_dev->copy_to_host(h.data(), d, bytes);
      return h;
    };
    auto bytes_of = [](const auto& v) {
      const auto* b = reinterpret_cast<const char*>(v.data());
      return std::vector<char>(b, b + v.size() * sizeof(v[0]));
    };
    EXPECT_TRUE(down(p, n * 4) == bytes_of(c.p)) << "params";
    EXPECT_TRUE(down(mc, nb * kB) == bytes_of(c.m_codes)) << "m codes";
    EXPECT_TRUE(down(vc, nb * kB) == bytes_of(c.v_codes)) << "v codes";
    EXPECT_TRUE(down(ma, nb * 4) == bytes_of(c.m_absmax)) << "m absmax";
    EXPECT_TRUE(down(va, nb * 4) == bytes_of(c.v_absmax)) << "v absmax";
    for (size_t i = 868; i < 1368; ++i) ASSERT_EQ(c.p[i], p0[i]) << "skipped range updated at " << i;
  }
}

// --- the optimizer ---------------------------------------------------------------------------------------

// A GPT-2 layout with tensors on both sides of min_8bit_size = 4096, one 8-bit tensor not a multiple of the
// block size (c_attn: 120 x 40 = 4800), and embeddings (10240 and 2560 elements).
TransformerConfig test_model() {
  TransformerConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 40, c.vocab_size = 200, c.block_size = 64;
  return c;
}

OptimizerHyper test_hyper() {
  OptimizerHyper h;
  h.weight_decay = 0.1f;
  h.beta1 = 0.9f, h.beta2 = 0.999f, h.eps = 1e-8f;
  h.lr_multiplier[2] = 0.5f;  // the embedding group's own rate
  return h;
}

// An optimizer over host buffers on the CPU device, its state planned and bound as the Engine does.
struct Harness {
  std::unique_ptr<Device> dev = make_cpu_device();
  std::unique_ptr<Ops> ops;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<Arena> arena;
  Harness(std::unique_ptr<Optimizer> o, OpsPrecision prec = {})
      : ops(make_cpu_ops(*dev, prec)), opt(std::move(o)) {
    MemoryPlan plan;
    opt->plan_memory(plan);
    arena = std::make_unique<Arena>(*dev, std::move(plan));
    opt->bind(*arena);
    opt->reset(*dev);
  }
  const MemoryPlan& plan() const { return arena->plan(); }
};

std::vector<float> random_params(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> p(n);
  for (float& x : p) x = 0.02f * rng.normal();
  return p;
}

// Gradients of step t: per-tensor scales spread over decades, like a real model's.
std::vector<float> random_grads(const ParamLayout& l, int64_t t) {
  Rng rng(1000 + uint64_t(t));
  std::vector<float> g(l.total_numel());
  for (const ParamTensor& pt : l.tensors()) {
    const float scale = std::pow(10.0f, -1.0f - 2.0f * rng.uniform());
    for (size_t i = pt.offset; i < pt.offset + pt.numel(); ++i) g[i] = scale * rng.normal();
  }
  return g;
}

TEST(AdamW8bitOptimizer, ChoosesStatesLikeBitsandbytes) {
  const ParamLayout l = ParamLayout::decoder(test_model());
  AdamW8bit opt(l, test_hyper());
  for (const ParamTensor& t : l.tensors()) {
    const bool embedding =
        t.name.find(".wte.") != std::string::npos || t.name.find(".wpe.") != std::string::npos;
    EXPECT_EQ(opt.quantized(t), t.numel() >= 4096 && !embedding) << t.name;
  }
  OptimizerHyper h = test_hyper();
  h.embedding_fp32_states = false;
  AdamW8bit opt2(l, h);
  EXPECT_TRUE(opt2.quantized(l.get("transformer.wte.weight")));
  EXPECT_FALSE(opt2.quantized(l.get("transformer.wpe.weight")));  // 2560 < 4096
  h.min_8bit_size = 2000;
  AdamW8bit opt3(l, h);
  EXPECT_TRUE(opt3.quantized(l.get("transformer.wpe.weight")));
  EXPECT_FALSE(opt3.quantized(l.get("transformer.h.0.attn.c_proj.weight")));  // 1600 < 2000
}

TEST(AdamW8bitOptimizer, CloseToFp32AdamWAndIdenticalOnFp32StateElements) {
  const ParamLayout l = ParamLayout::decoder(test_model());
  const size_t n = l.total_numel();
  auto* o8 = new AdamW8bit(l, test_hyper());
  Harness h8{std::unique_ptr<Optimizer>(o8)}, h32{std::make_unique<AdamW>(l, test_hyper())};
  const std::vector<float> p0 = random_params(n, 1);
  std::vector<float> p8 = p0, p32 = p0;
  std::vector<double> rel;  // relative difference of the total update of the 8-bit elements, per step
  for (int64_t t = 1; t <= 10; ++t) {
    const std::vector<float> g = random_grads(l, t);
    const float lr = 1e-3f;
    const std::vector<float> before = p32;
    h8.opt->step(*h8.ops, p8.data(), g.data(), lr, t, 1.0f);
    h32.opt->step(*h32.ops, p32.data(), g.data(), lr, t, 1.0f);
    double num = 0, den = 0;
    for (const ParamTensor& pt : l.tensors()) {
      for (size_t i = pt.offset; i < pt.offset + pt.numel(); ++i) {
        if (!o8->quantized(pt)) {
          ASSERT_EQ(p8[i], p32[i]) << pt.name << " step " << t;  // the same fp32 AdamW
          continue;
        }
        if (t == 1) {
          // Step 1 uses exact moments: only the bias-correction form and rounding differ.
          ASSERT_NEAR(p8[i] - before[i], p32[i] - before[i], 1e-5 * std::abs(p32[i] - before[i]) + 1e-9)
              << pt.name;
        }
        const double d = double(p8[i]) - p32[i], u = double(p32[i]) - p0[i];
        num += d * d, den += u * u;
      }
    }
    ASSERT_GT(den, 0);
    rel.push_back(std::sqrt(num / den));
  }
  // Then the quantised moments act: the total update of the 8-bit elements stays close to fp32 AdamW's
  // (with these uncorrelated random gradients: about 0.4% after step 2, 1.5% after step 10).
  EXPECT_LT(rel[1], 1e-2);
  EXPECT_LT(rel[9], 3e-2);
  EXPECT_GT(rel[1], 1e-4) << "the 8-bit states had no effect";
}

TEST(AdamW8bitOptimizer, AllFp32WhenEveryTensorIsBelowMin8bitSize) {
  const ParamLayout l = ParamLayout::decoder(test_model());
  OptimizerHyper h = test_hyper();
  h.min_8bit_size = size_t(1) << 40;
  auto* o8 = new AdamW8bit(l, h);
  EXPECT_EQ(o8->num_blocks(), 0u);
  EXPECT_EQ(o8->fp32_numel(), l.total_numel());
  Harness h8{std::unique_ptr<Optimizer>(o8)}, h32{std::make_unique<AdamW>(l, h)};
  std::vector<float> p8 = random_params(l.total_numel(), 2), p32 = p8;
  for (int64_t t = 1; t <= 3; ++t) {
    const std::vector<float> g = random_grads(l, t);
    h8.opt->step(*h8.ops, p8.data(), g.data(), 1e-3f, t, 0.5f);
    h32.opt->step(*h32.ops, p32.data(), g.data(), 1e-3f, t, 0.5f);
  }
  EXPECT_EQ(p8, p32);
}

// The state bytes, from the layout: 2 bytes per padded 8-bit element, 4 bytes per block per moment, 8 bytes
// per fp32 element, two 256-float maps and the range tables (8 + 8 + 1 bytes per range, groups padded to 8).
TEST(AdamW8bitOptimizer, StateBytesAreExact) {
  const ParamLayout l = ParamLayout::decoder(test_model());
  const OptimizerHyper hp = test_hyper();
  auto* o8 = new AdamW8bit(l, hp);
  Harness h{std::unique_ptr<Optimizer>(o8)};
  size_t n8 = 0, padded = 0, nf = 0, ranges8 = 0, rangesf = 0;
  int prev = -1;  // 0: fp32 tensor, 1: 8-bit
  std::string prev_group;
  for (const ParamTensor& t : l.tensors()) {
    const bool emb = t.name.find(".wte.") != std::string::npos || t.name.find(".wpe.") != std::string::npos;
    const std::string group = emb ? "emb" : t.decay ? "decay" : "no_decay";
    const bool q = t.numel() >= 4096 && !emb;
    if (q) {
      n8 += t.numel(), padded += (t.numel() + kB - 1) / kB * kB;
      ++ranges8;                 // one 8-bit range per tensor
      if (prev != 1) ++rangesf;  // a skipped run in the fp32 table
    } else {
      nf += t.numel();
      if (prev != 0) ++ranges8;                         // a skipped run in the 8-bit table
      if (prev != 0 || group != prev_group) ++rangesf;  // fp32 neighbours of one group share a range
    }
    prev = q, prev_group = group;
  }
  EXPECT_EQ(o8->quantized_numel(), n8);
  EXPECT_EQ(o8->padded_quantized_numel(), padded);
  EXPECT_EQ(o8->fp32_numel(), nf);
  EXPECT_EQ(n8 + nf, l.total_numel());
  auto table = [](size_t c) { return 16 * c + (c + 7) / 8 * 8; };
  const size_t blocks = padded / kB;
  const size_t own = 2 * padded + 2 * 4 * blocks + 8 * nf + 2 * 256 * 4 + table(ranges8) + table(rangesf);
  const size_t base_table = ParamRangeTable::from_layout(l).device_bytes();
  EXPECT_EQ(h.plan().requested_bytes(MemoryCategory::OptimizerState), own + base_table);
  size_t aligned = 0;
  for (const PlannedBuffer& b : h.plan().buffers()) aligned += MemoryPlan::aligned(b.bytes);
  EXPECT_EQ(o8->state_bytes(), aligned);
  EXPECT_EQ(h.plan().bytes(MemoryCategory::OptimizerState), aligned);
  // Far less than fp32 AdamW's 8 bytes per element on the 8-bit part.
  EXPECT_LT(double(2 * padded + 8 * blocks) / double(n8), 2.1);
}

std::vector<std::vector<char>> read_state(Harness& h) {
  std::vector<std::vector<char>> out;
  for (const OptimizerStateTensor& t : h.opt->state_tensors()) {
    out.emplace_back(dtype_bytes(t.dtype, t.count));
    h.dev->copy_to_host(out.back().data(), t.data, out.back().size());
  }
  return out;
}

TEST(AdamW8bitOptimizer, StateSaveLoadRoundTripContinuesIdentically) {
  const ParamLayout l = ParamLayout::decoder(test_model());
  Harness a(std::make_unique<AdamW8bit>(l, test_hyper()));
  std::vector<float> pa = random_params(l.total_numel(), 3);
  for (int64_t t = 1; t <= 3; ++t) a.opt->step(*a.ops, pa.data(), random_grads(l, t).data(), 1e-3f, t, 1.0f);

  // Names are stable, dtypes and sizes as documented.
  const std::vector<OptimizerStateTensor> ts = a.opt->state_tensors();
  std::vector<std::string> names;
  for (const auto& t : ts) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"adamw8bit.m_codes", "adamw8bit.m_absmax", "adamw8bit.v_codes",
                                             "adamw8bit.v_absmax", "adamw8bit.m_fp32", "adamw8bit.v_fp32"}));
  const auto& o8 = static_cast<const AdamW8bit&>(*a.opt);
  EXPECT_EQ(ts[0].dtype, DType::I8);
  EXPECT_EQ(ts[0].count, o8.padded_quantized_numel());
  EXPECT_EQ(ts[1].count, o8.num_blocks());
  EXPECT_EQ(ts[4].count, o8.fp32_numel());

  // A fresh optimizer, reset, then loaded with the saved state, continues exactly as the original.
  const std::vector<std::vector<char>> saved = read_state(a);
  Harness b(std::make_unique<AdamW8bit>(l, test_hyper()));
  const std::vector<OptimizerStateTensor> tb = b.opt->state_tensors();
  ASSERT_EQ(tb.size(), saved.size());
  for (size_t i = 0; i < tb.size(); ++i) b.dev->copy_to_device(tb[i].data, saved[i].data(), saved[i].size());
  std::vector<float> pb = pa;
  for (int64_t t = 4; t <= 6; ++t) {
    const std::vector<float> g = random_grads(l, t);
    a.opt->step(*a.ops, pa.data(), g.data(), 1e-3f, t, 1.0f);
    b.opt->step(*b.ops, pb.data(), g.data(), 1e-3f, t, 1.0f);
  }
  EXPECT_EQ(pa, pb);
  EXPECT_EQ(read_state(a), read_state(b));
}

TEST(AdamW8bitOptimizer, ResetAndRestartRepeatsTheRun) {
  // reset() zeroes every state buffer, the maps and tables included: the optimizer must upload them again.
  const ParamLayout l = ParamLayout::decoder(test_model());
  Harness h(std::make_unique<AdamW8bit>(l, test_hyper()));
  const std::vector<float> p0 = random_params(l.total_numel(), 4);
  std::vector<std::vector<float>> runs;
  for (int run = 0; run < 2; ++run) {
    h.opt->reset(*h.dev);
    std::vector<float> p = p0;
    for (int64_t t = 1; t <= 3; ++t) h.opt->step(*h.ops, p.data(), random_grads(l, t).data(), 1e-3f, t, 1.0f);
    runs.push_back(p);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_NE(runs[0], p0);
}

// --- training ----------------------------------------------------------------------------------------------

std::vector<double> losses_of(const std::string& metrics_path) {
  std::vector<double> out;
  std::istringstream in(test::read_file(metrics_path));
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

double tail_mean(const std::vector<double>& v, size_t k) {
  double s = 0;
  for (size_t i = v.size() - k; i < v.size(); ++i) s += v[i];
  return s / double(k);
}

TEST(AdamW8bitTraining, LossCurveFollowsAdamW) {
  test::TempDir dir;
  test::write_file(dir / "corpus.txt", test::small_corpus(60000));
  data::prepare_byte_corpus({dir / "corpus.txt"}, dir / "data", 0.1);
  // n_embd 64: every matrix has >= 4096 elements, so all of them get 8-bit states (embeddings stay fp32).
  const nlohmann::json base = {
      {"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 64}, {"vocab_size", 256}, {"block_size", 32}}},
      {"train_data", dir / "data/train.bin"},
      {"per_device_train_batch_size", 4},
      {"max_steps", 60},
      {"learning_rate", 3e-3},
      {"warmup_steps", 5},
      {"lr_scheduler_type", "cosine"},
      {"weight_decay", 0.1},
      {"logging_steps", 1},
      {"device", "cpu"},
      {"seed", 5}};
  // fp32 AdamW; 8-bit AdamW with the defaults; and with every tensor of >= 256 elements in 8 bits, the
  // embeddings included.
  struct Run {
    const char* name;
    const char* optim;
    int64_t min_size;
    bool embedding_fp32;
  };
  const Run runs[] = {{"fp32", "adamw_torch_fused", 4096, true},
                      {"8bit", "adamw_8bit", 4096, true},
                      {"8bit_all", "adamw_8bit", 256, false}};
  std::vector<std::vector<double>> curves;
  for (const Run& r : runs) {
    nlohmann::json j = base;
    j["optim"] = r.optim;
    j["optim_8bit_min_size"] = r.min_size;
    j["optim_8bit_embedding_fp32"] = r.embedding_fp32;
    j["output_dir"] = dir / r.name;
    train(TrainConfig::from_json(j, "test"));
    curves.push_back(losses_of(dir / (std::string(r.name) + "/metrics.jsonl")));
    ASSERT_EQ(curves.back().size(), 60u) << r.name;
  }
  const std::vector<double>&f32 = curves[0], &q8 = curves[1], &all = curves[2];
  EXPECT_LT(tail_mean(q8, 5), q8.front() - 2.0) << "8-bit AdamW loss did not fall";
  // Step 1's loss is before any update; afterwards the curves stay within a small margin of each other
  // (measured: at most 0.017 apart at any step with the defaults).
  EXPECT_EQ(q8[0], f32[0]);
  for (size_t i = 0; i < q8.size(); ++i) {
    EXPECT_NEAR(q8[i], f32[i], 0.05) << "step " << i + 1;
    EXPECT_NEAR(all[i], f32[i], 0.1) << "step " << i + 1;
  }
  EXPECT_NEAR(tail_mean(q8, 5), tail_mean(f32, 5), 0.02);
  EXPECT_NEAR(tail_mean(all, 5), tail_mean(f32, 5), 0.05);
}

TEST(AdamW8bitTraining, ResumeReproducesTheUninterruptedRun) {
  test::TempDir dir;
  test::write_file(dir / "corpus.txt", test::small_corpus(30000));
  data::prepare_byte_corpus({dir / "corpus.txt"}, dir / "data", 0.1);
  nlohmann::json j = {
      {"model", {{"n_layer", 1}, {"n_head", 2}, {"n_embd", 64}, {"vocab_size", 256}, {"block_size", 16}}},
      {"train_data", dir / "data/train.bin"},
      {"per_device_train_batch_size", 2},
      {"max_steps", 8},
      {"save_steps", 4},
      {"learning_rate", 3e-3},
      {"weight_decay", 0.1},
      {"optim", "adamw_8bit"},
      {"optim_8bit_min_size", 1024},
      {"device", "cpu"},
      {"seed", 9},
      {"output_dir", dir / "full"}};
  train(TrainConfig::from_json(j, "test"));
  j["output_dir"] = dir / "resumed";
  j["resume_from_checkpoint"] = dir / "full/checkpoint-4";
  train(TrainConfig::from_json(j, "test"));
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string x = test::read_file(dir / ("full/checkpoint-8/" + std::string(f)));
    const std::string y = test::read_file(dir / ("resumed/checkpoint-8/" + std::string(f)));
    ASSERT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == y) << f << " differs after resume";
  }
  EXPECT_NE(test::read_file(dir / "full/checkpoint-8/optimizer.safetensors").find("adamw8bit.m_codes"),
            std::string::npos);
}

}  // namespace
}  // namespace anvil
