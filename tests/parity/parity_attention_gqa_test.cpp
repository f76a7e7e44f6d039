// CUDA attention against the CPU reference in its general shape (kernels/ops.hpp AttentionShape): grouped-
// query heads, head sizes that are not C / NH of a model, and the sliding window, in fp32, bf16 and fp16, on
// both CUDA paths: cuDNN's flash attention (where the build and head size allow it: 16-bit, HS a multiple of
// 8 up to 128, T > 1) and the materialised one (ANVIL_ATTENTION=materialized). The CPU runs once per case and
// both paths are compared with it. Shapes: Llama-3.2-1B's heads (NH 32, NKV 8, HS 64) at T 2048,
// Qwen2.5-0.5B's (NH 14, NKV 2, HS 64), HS 128, Mistral's 4096-key window over T 8192, a head size of 24, and
// T = 1. ANVIL_PARITY_SEED replays a run; ANVIL_PARITY_VERBOSE=1 prints every error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/ops.hpp"
#include "parity_fixture.hpp"
#include "runtime/device.hpp"

namespace anvil {
namespace {

class GqaParity : public parity::TypedParityFixture<DType> {
 protected:
  OpsPrecision precision() const override { return {GetParam(), DType::F32}; }

  struct Mask {
    bool causal = true;
    int window = 0;
    bool padded = false;
  };

  // Relative tolerances (of the largest |CPU value|): fp32 as the multi-head parity tests (summation order),
  // 16-bit a few units of the storage type's last place, doubled for rows of thousands of keys.
  double out_tol(int T) const { return act_ == DType::F32 ? 5e-4 : ulps(act_, T >= 2048 ? 8 : 4); }
  double grad_tol(int T) const { return act_ == DType::F32 ? 5e-4 : ulps(act_, T >= 2048 ? 12 : 6); }

  // The CPU forward and backward of one case, then each CUDA path's forward (against the CPU's out and lse)
  // and backward (from the CPU's out and lse, against its dq, dk and dv).
  void check(const AttentionShape& s, const Mask& m) {
    const std::string what = std::string(dtype_name(act_)) + " B=" + std::to_string(s.B) +
                             " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
                             " NKV=" + std::to_string(s.NKV) + " HS=" + std::to_string(s.HS) +
                             (m.causal ? " causal" : " bidirectional") +
                             " window=" + std::to_string(m.window) + (m.padded ? " padded" : "");
    SCOPED_TRACE(what);
    std::vector<int32_t> len_host(size_t(s.B), s.T);
    for (size_t b = 1; b < len_host.size(); ++b) len_host[b] = 1 + int(rng_() % uint32_t(s.T));
    Buf lengths = ints(len_host);
    AttentionMask cpu_mask, gpu_mask;
    cpu_mask.causal = gpu_mask.causal = m.causal;
    cpu_mask.window = gpu_mask.window = m.window;
    cpu_mask.lengths = m.padded ? static_cast<const int32_t*>(lengths.cpu()) : nullptr;
    gpu_mask.lengths = m.padded ? static_cast<const int32_t*>(lengths.gpu()) : nullptr;
    const size_t rows = size_t(s.B) * s.T, n_out = rows * s.q_width(), n_qkv = rows * s.qkv_width();
    const size_t n_lse = size_t(s.B) * s.NH * s.T;
    Buf qkv = act(randn(n_qkv)), dout = act(randn(n_out));
    Buf out = act(randn(n_out, 100.f)), lse = f32(randn(n_lse, 100.f)), dqkv = act(randn(n_qkv, 100.f));
    {
      DeviceBuffer cs(*cpu_dev_, std::max<size_t>(1, cpu_->attention_scratch_bytes(s)));
      cpu_->attention_fwd(out.cpu(), static_cast<float*>(lse.cpu()), qkv.cpu(), cs.get(), s, cpu_mask);
      cpu_->attention_bwd(dqkv.cpu(), dout.cpu(), qkv.cpu(), out.cpu(), static_cast<const float*>(lse.cpu()),
                          cs.get(), s, cpu_mask);
    }
    const std::vector<float> ref_out = read(out, false), ref_lse = read(lse, false);
    const std::vector<float> ref_dqkv = read(dqkv, false);

    for (const char* impl : {"auto", "materialized"}) {
      setenv("ANVIL_ATTENTION", impl, 1);
      SCOPED_TRACE(cuda_attention_path(act_, s.HS));
      DeviceBuffer gs(*gpu_dev_, std::max<size_t>(1, gpu_->attention_scratch_bytes(s)));
      EXPECT_EQ(gpu_->attention_scratch_bytes(s), cuda_attention_scratch_bytes(act_, s));
      gpu_->attention_fwd(out.gpu(), static_cast<float*>(lse.gpu()), qkv.gpu(), gs.get(), s, gpu_mask);
      EXPECT_TRUE(close("attention_fwd out", ref_out, read(out, true), out_tol(s.T)));
      EXPECT_TRUE(close("attention_fwd lse", ref_lse, read(lse, true), 1e-5));
      copy_cpu_to_gpu(out);
      copy_cpu_to_gpu(lse);
      gpu_->attention_bwd(dqkv.gpu(), dout.gpu(), qkv.gpu(), out.gpu(), static_cast<const float*>(lse.gpu()),
                          gs.get(), s, gpu_mask);
      const std::vector<float> got = read(dqkv, true);
      // q, k and v parts separately (their magnitudes differ): columns [begin, end) of each qkv row.
      const int q_end = s.q_width(), k_end = q_end + s.NKV * s.HS, v_end = s.qkv_width();
      const struct {
        const char* name;
        int begin, end;
      } parts[3] = {{"dq", 0, q_end}, {"dk", q_end, k_end}, {"dv", k_end, v_end}};
      for (const auto& part : parts) {
        std::vector<float> r, g;
        for (size_t bt = 0; bt < rows; ++bt)
          for (int c = part.begin; c < part.end; ++c)
            r.push_back(ref_dqkv[bt * s.qkv_width() + c]), g.push_back(got[bt * s.qkv_width() + c]);
        if (s.T == 1 && part.begin < k_end) {
          // One key: the probabilities are exactly 1, so dq and dk are 0 up to the rounding noise of dout.v -
          // dout.out, which a comparison relative to 0 cannot judge.
          for (size_t i = 0; i < g.size(); ++i)
            EXPECT_NEAR(g[i], 0.0f, 1e-4f) << part.name << " [" << i << "] seed " << seed_;
          continue;
        }
        EXPECT_TRUE(close(std::string("attention_bwd ") + part.name, r, g, grad_tol(s.T)));
      }
    }
    unsetenv("ANVIL_ATTENTION");
  }
};

// Grouped heads (two key/value heads, and one), a multi-head control, and a head size of 24 (not a multiple
// of 8: the materialised path even in 16-bit), with every mask kind: causal, padding, bidirectional, windows.
TEST_P(GqaParity, SmallShapesEveryMask) {
  for (const AttentionShape s : {AttentionShape{2, 67, 4, 2, 64}, AttentionShape{2, 67, 4, 1, 32},
                                 AttentionShape{2, 67, 4, 4, 64}, AttentionShape{2, 45, 6, 2, 24}}) {
    for (const Mask m : {Mask{true, 0, false}, Mask{true, 0, true}, Mask{false, 0, true},
                         Mask{true, 16, false}, Mask{true, 5, true}, Mask{true, 67, false}})
      check(s, m);
  }
}

// Llama-3.2-1B's attention (32 query heads, 8 key/value heads of 64) over 2048 tokens.
TEST_P(GqaParity, Llama32OneB) {
  check({1, 2048, 32, 8, 64}, {});
}

// Qwen2.5-0.5B's (14 query heads, 2 key/value heads of 64), with padding too.
TEST_P(GqaParity, Qwen25HalfB) {
  for (const Mask m : {Mask{}, Mask{true, 0, true}}) check({2, 512, 14, 2, 64}, m);
}

// Heads of 128 (cuDNN's largest; the fp32 fused backward's largest multi-head size), grouped and not.
TEST_P(GqaParity, HeadSize128) {
  for (const AttentionShape s : {AttentionShape{2, 256, 8, 2, 128}, AttentionShape{2, 256, 4, 4, 128}})
    for (const Mask m : {Mask{}, Mask{true, 100, true}}) check(s, m);
}

// Mistral's sliding window: 4096 keys over 8192 tokens, grouped heads.
TEST_P(GqaParity, SlidingWindow4096) {
  check({2, 8192, 4, 2, 64}, {true, 4096, false});
}

// One token per sequence (cuDNN rejects it: the materialised path runs either way).
TEST_P(GqaParity, SingleToken) {
  for (const Mask m : {Mask{}, Mask{true, 2, false}, Mask{false, 0, true}}) check({3, 1, 4, 2, 64}, m);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GqaParity, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(info.param == DType::F32    ? "Fp32"
                                              : info.param == DType::BF16 ? "Bf16"
                                                                          : "Fp16");
                         });

}  // namespace
}  // namespace anvil
