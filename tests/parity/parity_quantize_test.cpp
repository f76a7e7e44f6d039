// Parity of the CUDA quantized-weight ops (kernels/ops/quant_ops.hpp) with the CPU reference: int8 and NF4
// matrices (an odd element count with a partial last block, and a large one over many grid strides)
// dequantized into fp32, bf16 and fp16 give the same bytes on both backends; quantized_matmul_fwd (CUDA's
// GEMV on the codes) equals the CPU's dequantize + matmul within the storage type's rounding. Then quantized
// decoders: greedy ids of an NF4 / int8 Llama-shaped model on CUDA equal the CPU's, and
// (ANVIL_BENCH_GENERATION) decoding speed at batch 1 of the Llama-3.2-1B shape in bf16, int8 and NF4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "parity_fixture.hpp"
#include "train/sampler.hpp"

namespace anvil {
namespace {

struct DequantCase {
  WeightStorage storage;
  DType dtype;
};

class DequantizeParity : public parity::TypedParityFixture<DequantCase> {
 protected:
  OpsPrecision precision() const override { return {GetParam().dtype, DType::F32}; }

  // w [rows, cols] quantized on the host, its codes and scales on both backends.
  struct Quantized {
    DeviceBuffer codes[2];
    Buf scales;
    QuantizedMatrix on(bool gpu) const {
      return {storage, static_cast<const uint8_t*>(codes[gpu].get()),
              static_cast<const float*>(gpu ? scales.gpu() : scales.cpu()), rows, cols};
    }
    WeightStorage storage;
    int64_t rows, cols;
  };
  Quantized quantize(const std::vector<float>& w, int64_t rows, int64_t cols) {
    const WeightStorage s = GetParam().storage;
    std::vector<uint8_t> codes(quantized_code_bytes(s, rows, cols));
    std::vector<float> scales(quantized_scale_count(s, rows, cols));
    quantize_host(s, w.data(), rows, cols, codes.data(), scales.data());
    Quantized q{{DeviceBuffer(*cpu_dev_, codes.size()), DeviceBuffer(*gpu_dev_, codes.size())},
                f32(scales),
                s,
                rows,
                cols};
    cpu_dev_->copy_to_device(q.codes[0].get(), codes.data(), codes.size());
    gpu_dev_->copy_to_device(q.codes[1].get(), codes.data(), codes.size());
    return q;
  }
};

TEST_P(DequantizeParity, SameBytesOnBothBackends) {
  const DequantCase c = GetParam();
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 53}, {4096, 1024}}) {
    const Quantized q = quantize(randn(size_t(rows * cols), 0.05f), rows, cols);
    Buf out = act(std::vector<float>(size_t(rows * cols)));
    cpu_->dequantize(out.cpu(), q.on(false));
    gpu_->dequantize(out.gpu(), q.on(true));
    const std::vector<float> a = read(out, false), b = read(out, true);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(std::memcmp(&a[i], &b[i], sizeof(float)), 0)
          << weight_storage_name(c.storage) << " -> " << dtype_name(c.dtype) << " [" << rows << ", " << cols
          << "] element " << i << "; seed " << seed_;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, DequantizeParity,
                         ::testing::Values(DequantCase{WeightStorage::NF4, DType::F32},
                                           DequantCase{WeightStorage::NF4, DType::BF16},
                                           DequantCase{WeightStorage::NF4, DType::F16},
                                           DequantCase{WeightStorage::NF4DoubleQuant, DType::F32},
                                           DequantCase{WeightStorage::NF4DoubleQuant, DType::BF16},
                                           DequantCase{WeightStorage::Int8, DType::F32},
                                           DequantCase{WeightStorage::Int8, DType::BF16},
                                           DequantCase{WeightStorage::Int8, DType::F16}),
                         [](const auto& info) {
                           std::string storage = weight_storage_name(info.param.storage);
                           std::replace(storage.begin(), storage.end(), '-', '_');  // (gtest names)
                           return storage + "_" + std::string(dtype_name(info.param.dtype));
                         });

// quantized_matmul_fwd (the CUDA GEMV on the codes) against the CPU's dequantize + matmul, for 1 to 16
// input rows (one and two passes of 8), with and without bias; decoding's widths (K a multiple of 64).
TEST_P(DequantizeParity, QuantizedMatmulEqualsDequantizeThenMatmul) {
  const double tol = act_ == DType::F32 ? 1e-5 : ulps(act_, 2 * 2);
  for (const auto& [O, K] : {std::pair<int64_t, int64_t>{100, 128}, {2048, 2048}, {512, 8192}}) {
    const Quantized q = quantize(randn(size_t(O * K), 0.05f), O, K);
    for (const int N : {1, 3, 8, 9, 16}) {
      EXPECT_TRUE(gpu_->quantized_matmul_preferred(q.on(true), N));
      for (const bool with_bias : {false, true}) {
        const Buf x = act(randn(size_t(N * K))), b = act(randn(size_t(O), 0.5f));
        Buf y = act(std::vector<float>(size_t(N * O)));
        cpu_->quantized_matmul_fwd(y.cpu(), x.cpu(), q.on(false), with_bias ? b.cpu() : nullptr, N);
        gpu_->quantized_matmul_fwd(y.gpu(), x.gpu(), q.on(true), with_bias ? b.gpu() : nullptr, N);
        EXPECT_TRUE(same("quantized_matmul_fwd [" + std::to_string(O) + ", " + std::to_string(K) +
                             "] N=" + std::to_string(N) + (with_bias ? " bias" : ""),
                         y, tol));
      }
    }
  }
}

TransformerConfig llama_config() {
  TransformerConfig c;
  c.family = "llama";
  c.n_layer = 3, c.n_head = 8, c.n_kv_head = 2, c.n_embd = 128, c.head_dim = 32;
  c.intermediate_size = 160, c.vocab_size = 300, c.block_size = 96;
  c.tie_word_embeddings = false, c.hidden_act = "silu";
  return c;
}

std::vector<std::vector<int32_t>> greedy(DeviceKind device, WeightStorage s, const TransformerConfig& cfg,
                                         const std::vector<float>& w,
                                         const std::vector<std::vector<int32_t>>& prompts) {
  GeneratorOptions o;
  o.device = device, o.max_batch = int(prompts.size()), o.prefill_chunk = 16, o.weight_storage = s;
  Generator gen(cfg, o);
  gen.decoder().upload_weights(gen.device(), w.data());
  SampleOptions so;
  so.max_new_tokens = 30, so.temperature = 0;
  Rng rng(0);
  return gen.generate(prompts, so, rng);
}

TEST(QuantizedGenerationParity, GreedyIdsOnCudaEqualTheCpu) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA GPU visible";
  const TransformerConfig cfg = llama_config();
  std::mt19937 rng(parity::choose_seed());
  std::normal_distribution<float> dist(0.f, 0.3f);
  std::vector<float> w(ParamLayout::decoder(cfg).total_numel());
  for (float& x : w) x = dist(rng);
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 3}, {40, 2, 9, 77, 1, 60, 200, 13}};
  for (WeightStorage s : {WeightStorage::NF4, WeightStorage::NF4DoubleQuant, WeightStorage::Int8})
    EXPECT_EQ(greedy(DeviceKind::CUDA, s, cfg, w, prompts), greedy(DeviceKind::CPU, s, cfg, w, prompts))
        << weight_storage_name(s);
}

// Decoding speed at batch 1 of the Llama-3.2-1B shape (random weights) with the block matrices in bf16,
// int8 and NF4, and the weights' memory: printed with ANVIL_BENCH_GENERATION=1.
TEST(QuantizedGenerationSpeed, BatchOneDecoding) {
  if (!cuda_available() || !std::getenv("ANVIL_BENCH_GENERATION")) GTEST_SKIP() << "ANVIL_BENCH_GENERATION";
  const TransformerConfig cfg = TransformerConfig::preset("llama-1b");
  for (WeightStorage s : {WeightStorage::Compute, WeightStorage::Int8, WeightStorage::NF4}) {
    GeneratorOptions o;
    o.device = DeviceKind::CUDA, o.precision = Precision::BF16, o.max_len = 32 + 256, o.weight_storage = s;
    Generator gen(cfg, o);
    gen.decoder().init_weights(1, gen.device());
    const std::vector<int32_t> prompt(32, 13);
    SampleOptions so;
    so.max_new_tokens = 256, so.temperature = 0;
    Rng rng(0);
    gen.generate({prompt}, so, rng);
    GenerationStats st;
    const auto ids = gen.generate({prompt}, so, rng, &st);
    EXPECT_EQ(ids[0].size(), 256u);
    size_t weights = 0;
    for (const PlannedBuffer& b : gen.plan().buffers())
      if (b.category == MemoryCategory::Weights) weights += b.bytes;
    std::printf("  llama-1b bf16, block matrices %s: %.1f tokens/s decoding at batch 1, weights %.2f GiB\n",
                weight_storage_name(s), st.decode_steps / st.decode_seconds, double(weights) / (1 << 30));
  }
}

}  // namespace
}  // namespace anvil
