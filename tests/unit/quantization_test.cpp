// Quantized weight storage (kernels/quantization.hpp, model/quantized_weights.hpp): the int8 and NF4
// formats (the NF4 table, bitsandbytes' nibble order, block and row scales, partial blocks, zero blocks,
// error bounds), the CPU dequantize op, and decoders whose block Linear weights are stored quantized: their
// logits and greedy generations equal those of the same decoder given the dequantized weights densely (bit
// for bit, fp32 and bf16), the memory plan keeps the matrices in 4 or 8 bits, download returns the
// dequantized values, and the errors (training, BERT, an unknown name) say what to do. Also `anvil generate`
// and `anvil logits` with --quantization on the golden Llama fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "io/safetensors.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"
#include "train/sampler.hpp"

namespace anvil {
namespace {

std::vector<float> normal_values(size_t n, float std, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, std);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  QuantizedMatrix view(WeightStorage s, int64_t rows, int64_t cols) const {
    return {s, codes.data(), scales.data(), rows, cols};
  }
};

Quantized quantize(WeightStorage s, const std::vector<float>& w, int64_t rows, int64_t cols) {
  Quantized q;
  q.codes.resize(quantized_code_bytes(s, rows, cols));
  q.scales.resize(quantized_scale_count(s, rows, cols));
  quantize_host(s, w.data(), rows, cols, q.codes.data(), q.scales.data());
  return q;
}

std::vector<float> dequantize(WeightStorage s, const Quantized& q, int64_t rows, int64_t cols) {
  std::vector<float> out(size_t(rows * cols));
  dequantize_host(q.view(s, rows, cols), out.data());
  return out;
}

TEST(QuantFormat, Nf4TableIsQloRasNormalFloat) {
  EXPECT_EQ(kNf4Code[0], -1.0f);
  EXPECT_EQ(kNf4Code[7], 0.0f);
  EXPECT_EQ(kNf4Code[15], 1.0f);
  for (int i = 0; i < 15; ++i) EXPECT_LT(kNf4Code[i], kNf4Code[i + 1]) << i;
  // Asymmetric: 7 negative values, 8 positive ones.
  EXPECT_NEAR(kNf4Code[8], 0.0796, 1e-4);
  EXPECT_NEAR(kNf4Code[1], -0.6962, 1e-4);
}

TEST(QuantFormat, Nf4PacksTheFirstElementInTheHighNibble) {
  std::vector<float> w(64, 0.0f);
  w[0] = 1.0f, w[1] = -1.0f, w[2] = 0.0f, w[3] = 0.5f;  // 0.5: nearest code 0.4407 (12), not 0.5626 (13)
  w[4] = -0.3f;                                         // nearest -0.2844 (4)
  const Quantized q = quantize(WeightStorage::NF4, w, 1, 64);
  ASSERT_EQ(q.codes.size(), 32u);
  ASSERT_EQ(q.scales.size(), 1u);
  EXPECT_EQ(q.scales[0], 1.0f);
  EXPECT_EQ(q.codes[0], 0xF0);
  EXPECT_EQ(q.codes[1], 0x7C);
  EXPECT_EQ(q.codes[2] >> 4, 4);
  const std::vector<float> d = dequantize(WeightStorage::NF4, q, 1, 64);
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(d[1], -1.0f);
  EXPECT_EQ(d[3], kNf4Code[12]);
  EXPECT_EQ(d[4], kNf4Code[4]);
}

TEST(QuantFormat, CodeValuesRoundTripExactly) {
  // Every element a code times its block's absmax (one element of each block at +-absmax): dequantize
  // gives the values back bit for bit.
  const int64_t rows = 4, cols = 48;  // 192 elements: 3 blocks
  std::mt19937 rng(3);
  std::vector<float> w(size_t(rows * cols));
  for (size_t b = 0; b < 3; ++b) {
    const float scale = 0.25f * float(b + 1);
    for (size_t i = 0; i < 64; ++i) w[b * 64 + i] = kNf4Code[rng() % 16] * scale;
    w[b * 64 + 5] = -scale;
  }
  EXPECT_EQ(dequantize(WeightStorage::NF4, quantize(WeightStorage::NF4, w, rows, cols), rows, cols), w);
  // int8: integers times absmax / 127.
  std::vector<float> v(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      v[size_t(r * cols + c)] = float(int(rng() % 255) - 127) * (float(r + 1) * kInt8Step);
  for (int64_t r = 0; r < rows; ++r) v[size_t(r * cols)] = 127.0f * (float(r + 1) * kInt8Step);
  EXPECT_EQ(dequantize(WeightStorage::Int8, quantize(WeightStorage::Int8, v, rows, cols), rows, cols), v);
}

TEST(QuantFormat, ErrorsStayWithinHalfAStep) {
  const int64_t rows = 96, cols = 80;
  const std::vector<float> w = normal_values(size_t(rows * cols), 0.05f, 4);
  // int8: half of absmax / 127 per row (and a little for fp32 rounding).
  const Quantized q8 = quantize(WeightStorage::Int8, w, rows, cols);
  ASSERT_EQ(q8.scales.size(), size_t(rows));
  const std::vector<float> d8 = dequantize(WeightStorage::Int8, q8, rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = size_t(r * cols + c);
      ASSERT_LE(std::fabs(d8[i] - w[i]), q8.scales[size_t(r)] / 254.0f * 1.0001f) << r << "," << c;
    }
  // NF4: half of the widest gap between neighbouring codes, times the block's absmax.
  float gap = 0;
  for (int i = 0; i < 15; ++i) gap = std::max(gap, kNf4Code[i + 1] - kNf4Code[i]);
  const Quantized q4 = quantize(WeightStorage::NF4, w, rows, cols);
  ASSERT_EQ(q4.scales.size(), size_t(rows * cols / 64));
  const std::vector<float> d4 = dequantize(WeightStorage::NF4, q4, rows, cols);
  double sq = 0, ref = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    ASSERT_LE(std::fabs(d4[i] - w[i]), q4.scales[i / 64] * gap / 2 * 1.0001f) << i;
    sq += double(d4[i] - w[i]) * (d4[i] - w[i]), ref += double(w[i]) * w[i];
  }
  // And on average much better than the bound: NF4 of normal weights keeps about 10% relative RMS error.
  EXPECT_LT(std::sqrt(sq / ref), 0.12);
}

TEST(QuantFormat, PartialLastBlockOddCountAndZeroBlocks) {
  // 3 x 25 = 75 elements: a block of 64 and one of 11; 38 bytes, the last low nibble unused (0).
  std::vector<float> w = normal_values(75, 1.0f, 5);
  const Quantized q = quantize(WeightStorage::NF4, w, 3, 25);
  ASSERT_EQ(q.codes.size(), 38u);
  ASSERT_EQ(q.scales.size(), 2u);
  float m = 0;
  for (size_t i = 64; i < 75; ++i) m = std::max(m, std::fabs(w[i]));
  EXPECT_EQ(q.scales[1], m);
  EXPECT_EQ(q.codes[37] & 0xF, 0);
  EXPECT_EQ(quantized_bits_per_weight(WeightStorage::NF4, 1024, 1024), 4.5);
  // A block and a row of zeros: scale 0, zeros back (no division by zero).
  std::vector<float> z(128, 0.0f);
  for (size_t i = 64; i < 128; ++i) z[i] = 0.01f * float(i);
  const Quantized qz = quantize(WeightStorage::NF4, z, 2, 64);
  EXPECT_EQ(qz.scales[0], 0.0f);
  const std::vector<float> dz = dequantize(WeightStorage::NF4, qz, 2, 64);
  for (size_t i = 0; i < 64; ++i) EXPECT_EQ(dz[i], 0.0f);
  const Quantized q8 = quantize(WeightStorage::Int8, z, 2, 64);
  EXPECT_EQ(q8.scales[0], 0.0f);
  EXPECT_EQ(dequantize(WeightStorage::Int8, q8, 2, 64)[3], 0.0f);
}

// Double quantization (bnb_4bit_use_double_quant): the 4-bit codes are NF4's (made from the exact block
// absmax); the scales come back as offset + map[code] * absmax2, within half the dynamic map's widest gap
// (0.0071) of each block of 256 scales' absmax2 of the exact ones; about 4.127 bits a weight.
TEST(QuantFormat, DoubleQuantizedScalesStayWithinTheMapsStep) {
  const int64_t rows = 96, cols = 640;  // 960 blocks of 64: 3 blocks of 256 scales and a partial one
  const std::vector<float> w = normal_values(size_t(rows * cols), 0.05f, 8);
  const Quantized q4 = quantize(WeightStorage::NF4, w, rows, cols);
  const Quantized dq = quantize(WeightStorage::NF4DoubleQuant, w, rows, cols);
  const size_t blocks = q4.scales.size();
  ASSERT_EQ(blocks, 960u);
  ASSERT_EQ(dq.codes.size(), q4.codes.size() + blocks);
  ASSERT_EQ(dq.scales.size(), 1u + 4u);
  EXPECT_TRUE(std::equal(q4.codes.begin(), q4.codes.end(), dq.codes.begin()));
  double mean = 0;
  for (float s : q4.scales) mean += s;
  EXPECT_NEAR(dq.scales[0], mean / double(blocks), 1e-6);
  const QuantizedMatrix m = dq.view(WeightStorage::NF4DoubleQuant, rows, cols);
  const std::array<float, 256> map = dynamic_quant_map(true);
  double worst = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const float absmax2 = dq.scales[1 + b / kNf4ScaleBlock];
    const float got = nf4_double_quant_scale(m, b);
    EXPECT_EQ(got, map[m.scale_codes()[b]] * absmax2 + dq.scales[0]) << b;
    EXPECT_LE(std::fabs(got - q4.scales[b]), 0.0071f * absmax2 + 1e-7f) << "block " << b;
    worst = std::max(worst, double(std::fabs(got - q4.scales[b]) / q4.scales[b]));
    // Each weight is its code's value times the block's decoded scale.
    const size_t i = b * kNf4BlockSize + 5;
    const uint8_t byte = m.codes[i / 2];
    EXPECT_EQ(dequantized_value(m, i), kNf4Code[byte & 0xF] * got);
  }
  EXPECT_LT(worst, 0.05) << "relative error of the worst scale";
  EXPECT_NEAR(quantized_bits_per_weight(WeightStorage::NF4DoubleQuant, 1024, 1024), 4.127, 1e-3);
  // Zeros stay zeros.
  const std::vector<float> z(256, 0.0f);
  const std::vector<float> dz =
      dequantize(WeightStorage::NF4DoubleQuant, quantize(WeightStorage::NF4DoubleQuant, z, 4, 64), 4, 64);
  for (float v : dz) EXPECT_EQ(v, 0.0f);
}

TEST(QuantFormat, NamesAndErrors) {
  EXPECT_EQ(parse_weight_storage("none", "--quantization"), WeightStorage::Compute);
  EXPECT_EQ(parse_weight_storage("int8", "--quantization"), WeightStorage::Int8);
  EXPECT_EQ(parse_weight_storage("nf4", "--quantization"), WeightStorage::NF4);
  EXPECT_EQ(parse_weight_storage("nf4-dq", "--quantization"), WeightStorage::NF4DoubleQuant);
  EXPECT_STREQ(weight_storage_name(WeightStorage::NF4DoubleQuant), "nf4-dq");
  try {
    parse_weight_storage("fp4", "--quantization");
    FAIL() << "fp4 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--quantization 'fp4'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nf4"), std::string::npos) << e.what();
  }
}

// CpuOps::dequantize: the host formula rounded to the compute type, in each type.
TEST(QuantOps, CpuDequantizeRoundsTheFormatsValues) {
  const int64_t rows = 24, cols = 40;
  const std::vector<float> w = normal_values(size_t(rows * cols), 0.1f, 6);
  for (WeightStorage s : {WeightStorage::Int8, WeightStorage::NF4, WeightStorage::NF4DoubleQuant}) {
    const Quantized q = quantize(s, w, rows, cols);
    const std::vector<float> ref = dequantize(s, q, rows, cols);
    for (DType t : {DType::F32, DType::BF16, DType::F16}) {
      auto dev = make_device(DeviceKind::CPU);
      auto ops = make_cpu_ops(*dev, {t, DType::F32});
      std::vector<uint8_t> out(dtype_bytes(t, ref.size()));
      ops->dequantize(out.data(), q.view(s, rows, cols));
      for (size_t i = 0; i < ref.size(); ++i) {
        float got;
        if (t == DType::F32)
          std::memcpy(&got, out.data() + 4 * i, 4);
        else {
          uint16_t h;
          std::memcpy(&h, out.data() + 2 * i, 2);
          got = t == DType::BF16 ? bf16_to_float(h) : fp16_to_float(h);
        }
        const float want = t == DType::F32    ? ref[i]
                           : t == DType::BF16 ? bf16_to_float(float_to_bf16(ref[i]))
                                              : fp16_to_float(float_to_fp16(ref[i]));
        ASSERT_EQ(got, want) << weight_storage_name(s) << " " << dtype_name(t) << " element " << i;
      }
    }
  }
}

// CpuOps::quantized_matmul_fwd is its contract's composition: dequantize, then matmul_fwd.
TEST(QuantOps, CpuQuantizedMatmulIsDequantizeThenMatmul) {
  const int64_t rows = 20, cols = 64;
  const int N = 3;
  const std::vector<float> w = normal_values(size_t(rows * cols), 0.1f, 9),
                           x = normal_values(size_t(N * cols), 1.f, 10),
                           b = normal_values(size_t(rows), 0.5f, 11);
  auto dev = make_device(DeviceKind::CPU);
  auto ops = make_cpu_ops(*dev, {DType::F32, DType::F32});
  for (WeightStorage s : {WeightStorage::Int8, WeightStorage::NF4, WeightStorage::NF4DoubleQuant}) {
    const Quantized q = quantize(s, w, rows, cols);
    const QuantizedMatrix m = q.view(s, rows, cols);
    EXPECT_FALSE(ops->quantized_matmul_preferred(m, 1));
    std::vector<float> deq(w.size()), want(size_t(N * rows)), got(size_t(N * rows));
    ops->dequantize(deq.data(), m);
    ops->matmul_fwd(want.data(), x.data(), deq.data(), b.data(), N, int(cols), int(rows));
    ops->quantized_matmul_fwd(got.data(), x.data(), m, b.data(), N);
    EXPECT_EQ(got, want) << weight_storage_name(s);
  }
}

TransformerConfig llama_config() {
  TransformerConfig c;
  c.family = "llama";
  c.n_layer = 2, c.n_head = 4, c.n_kv_head = 2, c.n_embd = 32, c.head_dim = 12;
  c.intermediate_size = 48, c.vocab_size = 101, c.block_size = 40;
  c.rope_theta = 10000, c.tie_word_embeddings = false, c.hidden_act = "silu";
  return c;
}

TransformerConfig gpt2_config() {
  TransformerConfig c;
  c.family = "gpt2";
  c.n_layer = 2, c.n_head = 4, c.n_embd = 32, c.vocab_size = 97, c.block_size = 32;
  return c;
}

std::vector<int32_t> tokens_of(int n, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = int32_t((i * 37 + 11) % vocab);
  return t;
}

struct LogitsRun {
  std::vector<float> logits;   // [T, padded vocab]
  std::vector<float> weights;  // the weights as download_weights returns them
  MemoryPlan plan;
};

// Full-forward logits of one sequence on the CPU with `weights` uploaded (quantized or not).
LogitsRun run_logits(const TransformerConfig& cfg, Precision p, WeightStorage s,
                     const std::vector<float>& weights, const std::vector<int32_t>& tokens) {
  EngineOptions o;
  o.batch_size = 1, o.seq_len = int(tokens.size()), o.precision = p, o.weight_storage = s;
  Engine e(cfg, o);
  e.decoder().upload_weights(e.device(), weights.data());
  e.device().copy_to_device(e.tokens(0), tokens.data(), tokens.size() * sizeof(int32_t));
  e.decoder().forward(e.ops(), e.tokens(0), nullptr, 1, int(tokens.size()), 0, false);
  LogitsRun r;
  r.logits.resize(tokens.size() * size_t(cfg.padded_vocab_size()));
  e.decoder().copy_logits_to_host(e.device(), r.logits.data(), 0, tokens.size());
  r.weights.resize(e.decoder().layout().total_numel());
  e.decoder().download_weights(e.device(), r.weights.data());
  r.plan = plan_engine_memory(cfg, o);
  return r;
}

size_t plan_bytes(const MemoryPlan& plan, const std::string& prefix) {
  size_t n = 0;
  for (const PlannedBuffer& b : plan.buffers())
    if (b.name.rfind(prefix, 0) == 0) n += b.bytes;
  return n;
}

struct QuantCase {
  const char* family;
  WeightStorage storage;
  Precision precision;
};

class QuantizedDecoder : public ::testing::TestWithParam<QuantCase> {};

// The quantized decoder computes exactly what the dense decoder computes with the dequantized weights.
TEST_P(QuantizedDecoder, LogitsEqualTheDenseModelOfTheDequantizedWeights) {
  const QuantCase c = GetParam();
  const TransformerConfig cfg = std::string(c.family) == "llama" ? llama_config() : gpt2_config();
  const ParamLayout layout = ParamLayout::decoder(cfg);
  const std::vector<float> w = normal_values(layout.total_numel(), 0.3f, 7);
  const std::vector<int32_t> tokens = tokens_of(12, cfg.vocab_size);
  const LogitsRun q = run_logits(cfg, c.precision, c.storage, w, tokens);

  // download: the dequantized matrices, every other tensor as uploaded (rounded to the compute type).
  size_t quantized = 0, changed = 0;
  for (const ParamTensor& t : layout.tensors()) {
    const bool matrix = t.layer >= 0 && t.shape.ndim == 2;
    for (size_t i = t.offset; i < t.offset + t.numel(); ++i) {
      const float want = c.precision == Precision::FP32   ? w[i]
                         : c.precision == Precision::BF16 ? bf16_to_float(float_to_bf16(w[i]))
                                                          : fp16_to_float(float_to_fp16(w[i]));
      if (!matrix) {
        ASSERT_EQ(q.weights[i], want) << t.name;
      }
      changed += matrix && q.weights[i] != w[i];
    }
    quantized += matrix ? t.numel() : 0;
  }
  EXPECT_GT(changed, quantized / 2) << "the block matrices were not quantized";

  const LogitsRun dense = run_logits(cfg, c.precision, WeightStorage::Compute, q.weights, tokens);
  ASSERT_EQ(q.logits.size(), dense.logits.size());
  for (size_t i = 0; i < q.logits.size(); ++i) ASSERT_EQ(q.logits[i], dense.logits[i]) << "logit " << i;

  // The plan: the dense weights hold all but the matrices; codes take 4 or 8 bits per element.
  const size_t elem = c.precision == Precision::FP32 ? 4 : 2;
  const size_t total = layout.total_numel();
  EXPECT_EQ(plan_bytes(q.plan, "weights (") + plan_bytes(q.plan, "parameters"), (total - quantized) * elem);
  const size_t codes =
      plan_bytes(q.plan, "quantized weights (" + std::string(weight_storage_name(c.storage)) + " codes");
  const size_t want = c.storage == WeightStorage::Int8  ? quantized
                      : c.storage == WeightStorage::NF4 ? quantized / 2
                                                        : quantized / 2 + quantized / kNf4BlockSize;
  EXPECT_GE(codes, want);
  EXPECT_LE(codes, want + 8 * 16 + 256);
  EXPECT_GT(plan_bytes(q.plan, "dequantized weight"), 0u);
  EXPECT_LT(plan_bytes(q.plan, "quantized weights") + plan_bytes(q.plan, "weights (") +
                plan_bytes(q.plan, "parameters"),
            plan_bytes(dense.plan, "weights (") + plan_bytes(dense.plan, "parameters"));
}

INSTANTIATE_TEST_SUITE_P(Cases, QuantizedDecoder,
                         ::testing::Values(QuantCase{"llama", WeightStorage::NF4, Precision::FP32},
                                           QuantCase{"llama", WeightStorage::Int8, Precision::FP32},
                                           QuantCase{"llama", WeightStorage::NF4, Precision::BF16},
                                           QuantCase{"llama", WeightStorage::NF4DoubleQuant, Precision::BF16},
                                           QuantCase{"gpt2", WeightStorage::NF4, Precision::BF16},
                                           QuantCase{"gpt2", WeightStorage::Int8, Precision::FP16}),
                         [](const auto& info) {
                           std::string storage = weight_storage_name(info.param.storage);
                           std::replace(storage.begin(), storage.end(), '-', '_');  // (gtest names)
                           return std::string(info.param.family) + "_" + storage + "_" +
                                  precision_name(info.param.precision);
                         });

// Generation with the KV cache: greedy ids of the quantized model equal the dense model's given the
// dequantized weights.
TEST(QuantizedGeneration, GreedyEqualsTheDenseModelOfTheDequantizedWeights) {
  const TransformerConfig cfg = llama_config();
  const ParamLayout layout = ParamLayout::decoder(cfg);
  const std::vector<float> w = normal_values(layout.total_numel(), 0.3f, 8);
  GeneratorOptions o;
  o.max_batch = 2, o.max_len = 30, o.prefill_chunk = 4, o.precision = Precision::BF16;
  o.weight_storage = WeightStorage::NF4;
  Generator q(cfg, o);
  q.decoder().upload_weights(q.device(), w.data());
  std::vector<float> deq(layout.total_numel());
  q.decoder().download_weights(q.device(), deq.data());
  o.weight_storage = WeightStorage::Compute;
  Generator dense(cfg, o);
  dense.decoder().upload_weights(dense.device(), deq.data());
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 3}, {40, 2, 9, 77, 1, 60}};
  SampleOptions so;
  so.max_new_tokens = 12, so.temperature = 0;
  Rng r1(1), r2(1);
  const auto a = q.generate(prompts, so, r1), b = dense.generate(prompts, so, r2);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a[0].size() + a[1].size(), 24u) << "stopped early: no eos in this vocabulary";
  EXPECT_LT(plan_bytes(q.plan(), "weights ("), plan_bytes(dense.plan(), "weights ("));
}

TEST(QuantizedDecoderErrors, TrainingAndBertAreRefusedWithWhatToDo) {
  EngineOptions o;
  o.batch_size = 1, o.seq_len = 8, o.training = true, o.weight_storage = WeightStorage::NF4;
  try {
    Engine e(llama_config(), o);
    FAIL() << "training a quantized model was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inference"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("QLoRA"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  TransformerConfig bert;
  bert.family = "bert";
  bert.n_layer = 1, bert.n_head = 2, bert.n_embd = 16, bert.vocab_size = 50, bert.block_size = 16;
  bert.intermediate_size = 32, bert.num_labels = 2;
  o.training = false;
  try {
    Engine e(bert, o);
    FAIL() << "a quantized BERT was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("decoder families"), std::string::npos) << e.what();
  }
}

std::string fixture(const std::string& name) {
  return std::string(ANVIL_SOURCE_DIR) + "/tests/golden/" + name;
}

// Through the CLI on the golden Llama fixture: --quantization int8 and nf4 logits stay close to the fp32
// model's (int8 closer), generate prints its ids and the weights line; an unknown name is an error.
TEST(QuantizationCli, LogitsAndGenerateOnTheGoldenLlama) {
  const std::string model = fixture("llama_tiny");
  const test::TempDir dir;
  const std::string inputs = dir.path().string() + "/inputs.safetensors";
  {
    const io::SafeTensorsReader golden(model + "/golden.safetensors");
    io::SafeTensorsWriter w;
    const io::SafeTensorInfo* ids = golden.find("input_ids");
    ASSERT_NE(ids, nullptr);
    w.add("input_ids", ids->dtype, ids->shape, golden.data(*ids));
    w.write(inputs);
  }
  auto logits = [&](const std::string& q) {
    const std::string out = dir.path().string() + "/logits_" + q + ".safetensors";
    const test::CommandResult r = test::run_anvil("logits --checkpoint " + model + " --input_ids " + inputs +
                                                  " --output " + out + " --quantization " + q);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const io::SafeTensorsReader rd(out);
    const io::SafeTensorInfo* t = rd.find("logits");
    std::vector<float> v(size_t(t->numel()));
    std::memcpy(v.data(), rd.data(*t), v.size() * sizeof(float));
    return v;
  };
  const std::vector<float> ref = logits("none"), l8 = logits("int8"), l4 = logits("nf4");
  // RMS error relative to the logits' RMS. Per weight, NF4 of normal values keeps about 10% relative RMS
  // error and int8 about 0.8% (absmax / 127 / sqrt(12) against a 3.5-sigma absmax); through this random
  // model's 8 matrices (initializer_range 0.2) they add up to about 31% and 2%.
  auto rel = [&](const std::vector<float>& got) {
    double err = 0, mag = 0;
    for (size_t i = 0; i < ref.size(); ++i)
      err += (double(got[i]) - ref[i]) * (double(got[i]) - ref[i]), mag += double(ref[i]) * ref[i];
    return std::sqrt(err / mag);
  };
  const double e8 = rel(l8), e4 = rel(l4);
  std::printf("relative RMS logit error: int8 %.4f, nf4 %.4f\n", e8, e4);
  EXPECT_GT(e8, 0.0);
  EXPECT_LT(e8, 0.04);
  EXPECT_LT(e4, 0.5);
  EXPECT_LT(e8, e4);

  const test::CommandResult g = test::run_anvil("generate --checkpoint " + model +
                                                " --prompt_ids \"1 2 3\" --max_new_tokens 5 "
                                                "--temperature 0 --quantization nf4 --device cpu");
  ASSERT_EQ(g.exit_code, 0) << g.output;
  EXPECT_NE(g.output.find("block matrices in nf4"), std::string::npos) << g.output;
  const test::CommandResult bad =
      test::run_anvil("generate --checkpoint " + model + " --prompt_ids \"1 2\" --quantization nf5");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--quantization 'nf5'"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace anvil
