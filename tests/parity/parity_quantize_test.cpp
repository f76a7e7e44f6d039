// Parity of the CUDA quantized-weight ops (kernels/ops/quant_ops.hpp) with the CPU reference: int8 and NF4
// matrices (an odd element count with a partial last block, and a large one over many grid strides)
// dequantized into fp32, bf16 and fp16 give the same bytes on both backends; quantized_matmul_fwd (CUDA's
// GEMV on the codes) equals the CPU's dequantize + matmul within the storage type's rounding. Then quantized
// decoders: greedy ids of an NF4 / int8 Llama-shaped model on CUDA equal the CPU's, and
// (ANVIL_BENCH_GENERATION) decoding speed at batch 1 of the Llama-3.2-1B shape in bf16, int8 and NF4.
#include <gtest/gtest.h>

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

class DequantizeParity : public parity::ParityFixture<::testing::TestWithParam<DequantCase>> {
 protected:
  OpsPrecision precision() const override { return {GetParam().dtype, DType::F32}; }
};

TEST_P(DequantizeParity, SameBytesOnBothBackends) {
  const DequantCase c = GetParam();
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 53}, {4096, 1024}}) {
    const std::vector<float> w = randn(size_t(rows * cols), 0.05f);
    std::vector<uint8_t> codes(quantized_code_bytes(c.storage, rows, cols));
    std::vector<float> scales(quantized_scale_count(c.storage, rows, cols));
    quantize_host(c.storage, w.data(), rows, cols, codes.data(), scales.data());
    const size_t out_bytes = dtype_bytes(c.dtype, size_t(rows * cols));
    std::vector<uint8_t> got[2];
    for (int b = 0; b < 2; ++b) {
      Device& dev = b == 0 ? *cpu_dev_ : *gpu_dev_;
      Ops& ops = b == 0 ? *cpu_ : *gpu_;
      DeviceBuffer dc(dev, codes.size()), ds(dev, scales.size() * sizeof(float)), dout(dev, out_bytes);
      dev.copy_to_device(dc.get(), codes.data(), codes.size());
      dev.copy_to_device(ds.get(), scales.data(), scales.size() * sizeof(float));
      ops.dequantize(dout.get(), {c.storage, static_cast<const uint8_t*>(dc.get()),
                                  static_cast<const float*>(ds.get()), rows, cols});
      got[b].resize(out_bytes);
      dev.copy_to_host(got[b].data(), dout.get(), out_bytes);
    }
    const size_t elem = dtype_bytes(c.dtype, 1);
    for (size_t i = 0; i < out_bytes; i += elem)
      ASSERT_EQ(std::memcmp(got[0].data() + i, got[1].data() + i, elem), 0)
          << weight_storage_name(c.storage) << " -> " << dtype_name(c.dtype) << " [" << rows << ", " << cols
          << "] element " << i / elem << "; seed " << seed_;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, DequantizeParity,
                         ::testing::Values(DequantCase{WeightStorage::NF4, DType::F32},
                                           DequantCase{WeightStorage::NF4, DType::BF16},
                                           DequantCase{WeightStorage::NF4, DType::F16},
                                           DequantCase{WeightStorage::Int8, DType::F32},
                                           DequantCase{WeightStorage::Int8, DType::BF16},
                                           DequantCase{WeightStorage::Int8, DType::F16}),
                         [](const auto& info) {
                           return std::string(weight_storage_name(info.param.storage)) + "_" +
                                  std::string(dtype_name(info.param.dtype));
                         });

// quantized_matmul_fwd (the CUDA GEMV on the codes) against the CPU's dequantize + matmul, for 1 to 16
// input rows (one and two passes of 8), with and without bias; decoding's widths (K a multiple of 64).
TEST_P(DequantizeParity, QuantizedMatmulEqualsDequantizeThenMatmul) {
  const DequantCase c = GetParam();
  const double tol = c.dtype == DType::F32 ? 1e-5 : c.dtype == DType::BF16 ? 2 * 0.0078125 : 2 * 0.0009765625;
  for (const auto& [O, K] : {std::pair<int64_t, int64_t>{100, 128}, {2048, 2048}, {512, 8192}}) {
    const std::vector<float> w = randn(size_t(O * K), 0.05f);
    std::vector<uint8_t> codes(quantized_code_bytes(c.storage, O, K));
    std::vector<float> scales(quantized_scale_count(c.storage, O, K));
    quantize_host(c.storage, w.data(), O, K, codes.data(), scales.data());
    for (const int N : {1, 3, 8, 9, 16}) {
      for (const bool with_bias : {false, true}) {
        const std::vector<float> x = randn(size_t(N * K)), b = randn(size_t(O), 0.5f);
        std::vector<float> out[2];
        for (int side = 0; side < 2; ++side) {
          Device& dev = side == 0 ? *cpu_dev_ : *gpu_dev_;
          Ops& ops = side == 0 ? *cpu_ : *gpu_;
          auto put = [&](const std::vector<float>& v) {
            std::vector<uint8_t> bytes(dtype_bytes(c.dtype, v.size()));
            for (size_t i = 0; i < v.size(); ++i) {
              if (c.dtype == DType::F32)
                std::memcpy(bytes.data() + 4 * i, &v[i], 4);
              else {
                const uint16_t h = c.dtype == DType::BF16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
                std::memcpy(bytes.data() + 2 * i, &h, 2);
              }
            }
            DeviceBuffer buf(dev, bytes.size());
            dev.copy_to_device(buf.get(), bytes.data(), bytes.size());
            return buf;
          };
          DeviceBuffer dx = put(x), db = put(b), dc(dev, codes.size()), ds(dev, scales.size() * 4),
                       dy(dev, dtype_bytes(c.dtype, size_t(N * O)));
          dev.copy_to_device(dc.get(), codes.data(), codes.size());
          dev.copy_to_device(ds.get(), scales.data(), scales.size() * 4);
          const QuantizedMatrix m{c.storage, static_cast<const uint8_t*>(dc.get()),
                                  static_cast<const float*>(ds.get()), O, K};
          if (side == 1) {
            EXPECT_TRUE(ops.quantized_matmul_preferred(m, N));
          }
          ops.quantized_matmul_fwd(dy.get(), dx.get(), m, with_bias ? db.get() : nullptr, N);
          std::vector<uint8_t> bytes(dtype_bytes(c.dtype, size_t(N * O)));
          dev.copy_to_host(bytes.data(), dy.get(), bytes.size());
          out[side].resize(size_t(N * O));
          for (size_t i = 0; i < out[side].size(); ++i) {
            if (c.dtype == DType::F32) {
              std::memcpy(&out[side][i], bytes.data() + 4 * i, 4);
            } else {
              uint16_t h;
              std::memcpy(&h, bytes.data() + 2 * i, 2);
              out[side][i] = c.dtype == DType::BF16 ? bf16_to_float(h) : fp16_to_float(h);
            }
          }
        }
        EXPECT_TRUE(close("quantized_matmul_fwd [" + std::to_string(O) + ", " + std::to_string(K) +
                              "] N=" + std::to_string(N) + (with_bias ? " bias" : ""),
                          out[0], out[1], tol));
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
  for (WeightStorage s : {WeightStorage::NF4, WeightStorage::Int8})
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
