// Parity of the CUDA generation ops (kernels/ops.hpp, "generation (KV cache)") with the CPU reference in
// fp32, bf16 and fp16: the embedding and RoPE at per-sequence positions, the cache write, and the attention
// over the cache (one-token steps over long caches, which split the keys across blocks, and several new
// tokens per sequence; grouped-query heads, groups wider than a block's heads, sliding windows, head sizes
// from 34 to 320, with and without scratch for splits). Then whole generations: greedy ids on CUDA equal the
// CPU's for GPT-2 and Llama-shaped random models, and (ANVIL_PARITY_VERBOSE) the decoding speed at batch 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.hpp"
#include "parity_fixture.hpp"
#include "runtime/device.hpp"
#include "train/sampler.hpp"

namespace anvil {
namespace {

std::vector<float> inv_freq_for(int HS, double theta) {
  std::vector<float> f(size_t(HS / 2));
  for (int i = 0; i < HS / 2; ++i) f[i] = float(1.0 / std::pow(theta, 2.0 * i / HS));
  return f;
}

std::string dtype_case(const ::testing::TestParamInfo<DType>& info) {
  return info.param == DType::F32 ? "Fp32" : info.param == DType::BF16 ? "Bf16" : "Fp16";
}

std::string shape_name(const AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " Tn=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " NKV=" + std::to_string(s.NKV) + " HS=" + std::to_string(s.HS);
}

class KvCacheParity : public parity::TypedParityFixture<DType> {
 protected:
  OpsPrecision precision() const override { return {GetParam(), DType::F32}; }
  double elementwise_tol(double ulp_count) const { return act_ == DType::F32 ? 1e-5 : ulps(act_, ulp_count); }
  static int32_t* ip(const Buf& b, bool gpu) { return static_cast<int32_t*>(gpu ? b.gpu() : b.cpu()); }
  static float* fp(const Buf& b, bool gpu) { return static_cast<float*>(gpu ? b.gpu() : b.cpu()); }
};

TEST_P(KvCacheParity, EmbeddingAtPositions) {
  const int B = 3, Tn = 5, C = 96, V = 50, maxT = 64;
  Buf tokens = ints(rand_ints(size_t(B) * Tn, 0, V)), pos = ints({0, 17, maxT - Tn});
  Buf wte = act(randn(size_t(V) * C)), wpe = act(randn(size_t(maxT) * C));
  for (const bool learned : {true, false}) {
    SCOPED_TRACE(learned ? "with wpe" : "without wpe");
    Buf out = act(randn(size_t(B) * Tn * C, 100.f));
    const void* w = learned ? wpe.cpu() : nullptr;
    const void* wg = learned ? wpe.gpu() : nullptr;
    cpu_->embedding_fwd_at(out.cpu(), ip(tokens, false), wte.cpu(), w, ip(pos, false), B, Tn, C);
    gpu_->embedding_fwd_at(out.gpu(), ip(tokens, true), wte.gpu(), wg, ip(pos, true), B, Tn, C);
    EXPECT_TRUE(same("embedding_fwd_at", out, 0.0));  // one rounded sum of stored values
  }
  // At position 0 it is embedding_fwd.
  Buf zero = ints({0, 0, 0}), at = act(randn(size_t(B) * Tn * C)), plain = act(randn(size_t(B) * Tn * C));
  gpu_->embedding_fwd_at(at.gpu(), ip(tokens, true), wte.gpu(), wpe.gpu(), ip(zero, true), B, Tn, C);
  gpu_->embedding_fwd(plain.gpu(), ip(tokens, true), wte.gpu(), wpe.gpu(), B, Tn, C);
  EXPECT_EQ(read(at, true), read(plain, true));
}

TEST_P(KvCacheParity, RopeAtPositions) {
  struct S {
    AttentionShape s;
    std::vector<int32_t> pos;
    double theta;
  };
  const S shapes[] = {
      {{4, 3, 8, 2, 128}, {0, 5, 8000, 131000}, 500000.0},  // Llama heads, far positions
      {{2, 1, 32, 8, 64}, {1, 4095}, 10000.0},              // a decode step
      {{3, 7, 4, 4, 6}, {0, 11, 99}, 10000.0},              // half heads of 3: element by element
  };
  for (const S& k : shapes) {
    const AttentionShape& s = k.s;
    SCOPED_TRACE(shape_name(s));
    Buf inv_freq = f32(inv_freq_for(s.HS, k.theta)), pos = ints(k.pos);
    Buf qkv = act(randn(size_t(s.B) * s.T * s.qkv_width()));
    cpu_->rope_fwd_at(qkv.cpu(), fp(inv_freq, false), s, ip(pos, false));
    gpu_->rope_fwd_at(qkv.gpu(), fp(inv_freq, true), s, ip(pos, true));
    EXPECT_TRUE(same("rope_fwd_at", qkv, elementwise_tol(1)));
  }
  // Every sequence at p0: exactly rope_fwd with pos_offset p0.
  const AttentionShape s{2, 9, 4, 2, 64};
  Buf inv_freq = f32(inv_freq_for(s.HS, 10000.0)), pos = ints({37, 37});
  const std::vector<float> init = randn(size_t(s.B) * s.T * s.qkv_width());
  Buf a = act(init), b = act(init);
  gpu_->rope_fwd_at(a.gpu(), fp(inv_freq, true), s, ip(pos, true));
  gpu_->rope_fwd(b.gpu(), fp(inv_freq, true), s, 37);
  EXPECT_EQ(read(a, true), read(b, true));
}

TEST_P(KvCacheParity, CacheWrite) {
  struct S {
    AttentionShape s;
    int S_;
    std::vector<int32_t> pos;
  };
  const S shapes[] = {
      {{3, 4, 8, 2, 128}, 40, {0, 17, 36}}, {{2, 1, 4, 4, 6}, 9, {8, 0}}, {{1, 5, 3, 1, 34}, 5, {0}}};
  for (const S& k : shapes) {
    const AttentionShape& s = k.s;
    SCOPED_TRACE(shape_name(s));
    const size_t cache_n = size_t(s.B) * k.S_ * s.NKV * s.HS;
    Buf qkv = act(randn(size_t(s.B) * s.T * s.qkv_width())), pos = ints(k.pos);
    Buf kc = act(randn(cache_n)), vc = act(randn(cache_n));
    cpu_->kv_cache_write({kc.cpu(), vc.cpu(), k.S_}, qkv.cpu(), ip(pos, false), s);
    gpu_->kv_cache_write({kc.gpu(), vc.gpu(), k.S_}, qkv.gpu(), ip(pos, true), s);
    EXPECT_TRUE(same("kv_cache_write k", kc, 0.0));
    EXPECT_TRUE(same("kv_cache_write v", vc, 0.0));
  }
}

TEST_P(KvCacheParity, CachedAttention) {
  struct S {
    AttentionShape s;
    int S_, window;
  };
  const S shapes[] = {
      {{1, 1, 12, 12, 64}, 3000, 0},   // GPT-2 heads, one token over a long cache: split keys
      {{2, 1, 32, 8, 128}, 2100, 0},   // Llama 3 heads (groups of 4)
      {{2, 3, 16, 16, 128}, 1500, 0},  // multi-head, head size 128
      {{3, 6, 8, 2, 128}, 300, 50},    // several new tokens, sliding window
      {{2, 4, 12, 1, 80}, 200, 0},     // a group of 12 query heads: two blocks per key/value head
      {{1, 1, 4, 2, 256}, 1000, 0},    // head size 256
      {{2, 2, 4, 4, 320}, 150, 7},     // head size 320
      {{3, 3, 6, 3, 34}, 90, 0},       // 34: no 16-byte vectors
      {{4, 1, 14, 2, 64}, 700, 4096},  // Qwen2-0.5B heads (groups of 7), a window past every key
  };
  for (const S& k : shapes) {
    const AttentionShape& s = k.s;
    SCOPED_TRACE(shape_name(s) + " S=" + std::to_string(k.S_) + " window=" + std::to_string(k.window));
    // Sequences at the start, at the end and in between of the cache.
    std::vector<int32_t> p = rand_ints(size_t(s.B), 0, k.S_ - s.T + 1);
    p[0] = k.S_ - s.T;
    if (s.B > 1) p[1] = 0;
    const int max_keys = *std::max_element(p.begin(), p.end()) + s.T;
    const size_t cache_n = size_t(s.B) * k.S_ * s.NKV * s.HS;
    Buf pos = ints(p), qkv = act(randn(size_t(s.B) * s.T * s.qkv_width()));
    Buf kc = act(randn(cache_n)), vc = act(randn(cache_n, 2.f));
    const KvCacheLayer cpu_cache{kc.cpu(), vc.cpu(), k.S_}, gpu_cache{kc.gpu(), vc.gpu(), k.S_};
    const size_t scratch_bytes = cached_attention_scratch_bytes(DeviceKind::CUDA, s);
    DeviceBuffer scratch(*gpu_dev_, scratch_bytes);
    Buf out = act(randn(size_t(s.B) * s.T * s.q_width(), 100.f));
    cpu_->cached_attention_fwd(out.cpu(), qkv.cpu(), cpu_cache, ip(pos, false), max_keys, k.window, nullptr,
                               0, s);
    gpu_->cached_attention_fwd(out.gpu(), qkv.gpu(), gpu_cache, ip(pos, true), max_keys, k.window,
                               scratch.get(), scratch_bytes, s);
    const double tol = act_ == DType::F32 ? 1e-4 : ulps(act_, 2);
    EXPECT_TRUE(same("cached_attention_fwd", out, tol));
    // Without scratch: no splits, the same result.
    Buf out2 = act(randn(size_t(s.B) * s.T * s.q_width(), 100.f));
    gpu_->cached_attention_fwd(out2.gpu(), qkv.gpu(), gpu_cache, ip(pos, true), max_keys, k.window, nullptr,
                               0, s);
    EXPECT_TRUE(close("cached_attention_fwd without splits", read(out, false), read(out2, true), tol));
  }
}

INSTANTIATE_TEST_SUITE_P(KvCacheOps, KvCacheParity, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         dtype_case);

// --- whole generations
// --------------------------------------------------------------------------------------

TransformerConfig gpt2_config() {
  TransformerConfig c;
  c.n_layer = 3, c.n_head = 4, c.n_embd = 64, c.vocab_size = 300, c.block_size = 96;
  return c;
}

TransformerConfig llama_config() {
  TransformerConfig c;
  c.family = "llama";
  c.n_layer = 3, c.n_head = 8, c.n_kv_head = 2, c.n_embd = 128, c.head_dim = 32;
  c.intermediate_size = 160, c.vocab_size = 300, c.block_size = 96;
  c.tie_word_embeddings = false, c.hidden_act = "silu";
  return c;
}

// Greedy ids of a batch of prompts of different lengths, and the logits after the prefill, on `device`.
struct GenerationRun {
  std::vector<std::vector<int32_t>> ids;
  std::vector<float> logits;  // prompt 0's after the prefill
};
GenerationRun generate_on(DeviceKind device, Precision precision, const TransformerConfig& cfg,
                          const std::vector<float>& weights, const std::vector<std::vector<int32_t>>& prompts,
                          int new_tokens) {
  GeneratorOptions o;
  o.device = device, o.precision = precision, o.max_batch = int(prompts.size()), o.prefill_chunk = 16;
  Generator gen(cfg, o);
  gen.decoder().upload_weights(gen.device(), weights.data());
  gen.prefill(prompts);
  GenerationRun r;
  r.logits.assign(gen.logits(0), gen.logits(0) + cfg.vocab_size);
  SampleOptions so;
  so.max_new_tokens = new_tokens, so.temperature = 0;
  Rng rng(0);
  r.ids = gen.generate(prompts, so, rng);
  return r;
}

class KvCacheGeneration : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  }
};

TEST_P(KvCacheGeneration, GreedyIdsOnCudaEqualTheCpu) {
  const TransformerConfig cfg = std::string(GetParam()) == "gpt2" ? gpt2_config() : llama_config();
  std::mt19937 rng(parity::choose_seed());
  std::normal_distribution<float> dist(0.f, 0.3f);
  std::vector<float> w(ParamLayout::decoder(cfg).total_numel());
  for (float& x : w) x = dist(rng);
  std::uniform_int_distribution<int32_t> tok(0, cfg.vocab_size - 1);
  std::vector<std::vector<int32_t>> prompts;
  for (const int len : {5, 37, 1, 16}) {
    prompts.emplace_back(size_t(len));
    for (int32_t& t : prompts.back()) t = tok(rng);
  }
  const GenerationRun cpu = generate_on(DeviceKind::CPU, Precision::FP32, cfg, w, prompts, 40);
  const GenerationRun gpu = generate_on(DeviceKind::CUDA, Precision::FP32, cfg, w, prompts, 40);
  double err = 0, ref = 0;
  for (size_t i = 0; i < cpu.logits.size(); ++i) {
    err = std::max(err, std::fabs(double(cpu.logits[i]) - gpu.logits[i]));
    ref = std::max(ref, std::fabs(double(cpu.logits[i])));
  }
  EXPECT_LT(err / ref, 1e-4) << "logits after the prefill";
  EXPECT_EQ(gpu.ids, cpu.ids);
  // bf16 runs too, its logits within bf16 rounding of the CPU's emulation.
  const GenerationRun cpu16 = generate_on(DeviceKind::CPU, Precision::BF16, cfg, w, prompts, 4);
  const GenerationRun gpu16 = generate_on(DeviceKind::CUDA, Precision::BF16, cfg, w, prompts, 4);
  err = 0, ref = 0;
  for (size_t i = 0; i < cpu16.logits.size(); ++i) {
    err = std::max(err, std::fabs(double(cpu16.logits[i]) - gpu16.logits[i]));
    ref = std::max(ref, std::fabs(double(cpu16.logits[i])));
  }
  EXPECT_LT(err / ref, 5e-2) << "bf16 logits after the prefill";
}

INSTANTIATE_TEST_SUITE_P(Decoders, KvCacheGeneration, ::testing::Values("gpt2", "llama"),
                         [](const auto& info) { return std::string(info.param); });

// Decoding speed at batch 1 (GPT-2 124M shape, random weights): printed with ANVIL_PARITY_VERBOSE=1, also the
// 1B-parameter Llama 3.2 shape with ANVIL_BENCH_GENERATION=1. Checks only that it generates.
TEST(KvCacheSpeed, BatchOneDecoding) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  std::vector<std::string> presets = {"d12"};
  if (std::getenv("ANVIL_BENCH_GENERATION")) presets.push_back("llama-1b");
  for (const std::string& name : presets) {
    for (const Precision p : {Precision::FP32, Precision::BF16}) {
      const TransformerConfig cfg = TransformerConfig::preset(name);
      GeneratorOptions o;
      o.device = DeviceKind::CUDA, o.precision = p, o.max_len = 32 + 256;
      Generator gen(cfg, o);
      gen.decoder().init_weights(1, gen.device());
      const std::vector<int32_t> prompt(32, 13);
      SampleOptions so;
      so.max_new_tokens = 256, so.temperature = 0;
      Rng rng(0);
      gen.generate({prompt}, so, rng);  // warm-up (kernel loading, GEMM plans)
      GenerationStats st;
      const auto ids = gen.generate({prompt}, so, rng, &st);
      EXPECT_EQ(ids[0].size(), 256u);
      if (std::getenv("ANVIL_PARITY_VERBOSE") || std::getenv("ANVIL_BENCH_GENERATION"))
        std::printf(
            "  %s %s batch 1: %.1f tokens/s decoding (%d steps in %.3f s), prefill of 32 in %.2f ms\n",
            name.c_str(), precision_name(p), st.decode_steps / st.decode_seconds, st.decode_steps,
            st.decode_seconds, 1e3 * st.prefill_seconds);
    }
  }
}

}  // namespace
}  // namespace anvil
