// The chunking of 3xTF32 GEMMs into the split scratch (kernels/split_gemm_plan.hpp), the scratch a model
// plans, and the fp32_matmul setting.
#include "kernels/split_gemm_plan.hpp"

#include <gtest/gtest.h>

#include <random>

#include "anvil/error.hpp"
#include "anvil/model_config.hpp"
#include "anvil/train_config.hpp"

namespace anvil {
namespace {

TEST(SplitGemmPlan, WholeGemmsTakeAsManyBatchesAsFit) {
  const SplitGemmChunks one = plan_split_gemm(512, 64, 512, 16, false, 100'000'000);
  EXPECT_EQ(one.mc, 512);
  EXPECT_EQ(one.nc, 64);
  EXPECT_EQ(one.kc, 512);
  EXPECT_EQ(one.nb, 16);
  EXPECT_EQ(one.pieces, 2);
  // Room for three of the sixteen batches.
  SplitGemmChunks c{512, 64, 512, 3, 2};
  const size_t three = split_gemm_chunk_floats(c);
  const SplitGemmChunks some = plan_split_gemm(512, 64, 512, 16, false, three + 10);
  EXPECT_EQ(some.nb, 3);
  EXPECT_EQ(some.kc, 512);
  EXPECT_LE(split_gemm_chunk_floats(some), three + 10);
}

TEST(SplitGemmPlan, ChunksFitAndKeepTheirRules) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int m = 1 + int(rng() % 5000), n = 1 + int(rng() % 5000), k = 1 + int(rng() % 9000);
    const int batch = 1 + int(rng() % 4);
    const bool whole_sum = rng() % 4 == 0;
    const size_t scratch = 4096 + rng() % 20'000'000;
    const SplitGemmChunks c = plan_split_gemm(m, n, k, batch, whole_sum, scratch);
    SCOPED_TRACE(testing::Message() << "M " << m << " N " << n << " K " << k << " batch " << batch
                                    << (whole_sum ? " whole sum" : "") << " scratch " << scratch);
    if (!c.fits()) {
      // Only when even the smallest chunk is too big.
      SplitGemmChunks smallest{std::min(m, 16), whole_sum ? n : std::min(n, 16),
                               whole_sum ? k : std::min(k, 16), 1, whole_sum ? 3 : 2};
      EXPECT_GT(split_gemm_chunk_floats(smallest), scratch);
      continue;
    }
    EXPECT_LE(split_gemm_chunk_floats(c), scratch);
    EXPECT_EQ(c.pieces, whole_sum ? 3 : 2);
    EXPECT_TRUE(c.mc == m || c.mc % 16 == 0);
    EXPECT_TRUE(c.nc == n || c.nc % 16 == 0);
    EXPECT_TRUE(c.kc == k || c.kc % 16 == 0);
    EXPECT_LE(c.mc, m);
    EXPECT_LE(c.nc, n);
    EXPECT_LE(c.kc, k);
    EXPECT_LE(c.nb, batch);
    if (whole_sum) {
      EXPECT_EQ(c.kc, k);
      EXPECT_EQ(c.nc, n);
    }
    if (c.mc < m || c.nc < n || c.kc < k) {
      EXPECT_EQ(c.nb, 1);
    }
  }
}

TEST(SplitGemmPlan, LargeInnerDimensionsAreChunkedAlongKFirst) {
  // A language-model head's input gradient: M tokens, K vocabulary, N width.
  const SplitGemmChunks c = plan_split_gemm(8192, 768, 50257, 1, false, (256u << 20) / 4);
  ASSERT_TRUE(c.fits());
  EXPECT_EQ(c.mc, 8192);
  EXPECT_EQ(c.nc, 768);
  EXPECT_LT(c.kc, 50257);
  EXPECT_GE(c.kc, 256);
}

TEST(SplitGemmPlan, ScratchCoversBertLargeBlockGemmsWhole) {
  TransformerConfig cfg;
  cfg.family = "bert", cfg.n_layer = 24, cfg.n_head = 16, cfg.n_embd = 1024, cfg.intermediate_size = 4096;
  cfg.vocab_size = 30522, cfg.block_size = 512;
  const size_t bytes = split_gemm_scratch_bytes(cfg, 4, 512);
  const size_t floats = bytes / 4;
  const int tok = 4 * 512;
  // Every linear layer's forward, input and weight gradients in one chunk.
  for (const auto& [in, out] : {std::pair{1024, 3072}, {1024, 1024}, {1024, 4096}, {4096, 1024}}) {
    for (const SplitGemmChunks& c :
         {plan_split_gemm(tok, out, in, 1, false, floats), plan_split_gemm(tok, in, out, 1, false, floats),
          plan_split_gemm(out, in, tok, 1, false, floats)}) {
      EXPECT_EQ(c.nb, 1);
      EXPECT_TRUE(c.fits());
    }
    EXPECT_EQ(plan_split_gemm(tok, out, in, 1, false, floats).kc, in);
    EXPECT_EQ(plan_split_gemm(out, in, tok, 1, false, floats).kc, tok);
  }
  EXPECT_LE(bytes, 120u << 20) << "two pieces of the largest linear GEMM's operands, not more";
  // Capped: larger GEMMs run in chunks.
  EXPECT_EQ(split_gemm_scratch_bytes(cfg, 64, 512), kMaxSplitScratchBytes);
}

TEST(Fp32Matmul, ConfigKeyAndItsConflicts) {
  EXPECT_EQ(parse_fp32_matmul("3xtf32"), Fp32Matmul::TF32x3);
  EXPECT_EQ(parse_fp32_matmul("fp32"), Fp32Matmul::Native);
  EXPECT_STREQ(fp32_matmul_name(Fp32Matmul::TF32), "tf32");
  EXPECT_THROW(parse_fp32_matmul("tf32x3"), Error);
  TrainConfig c = TrainConfig::from_json({{"fp32_matmul", "3xtf32"}}, "test");
  EXPECT_EQ(c.fp32_matmul_mode(), "3xtf32");
  EXPECT_EQ(TrainConfig::from_json({{"tf32", true}}, "test").fp32_matmul_mode(), "tf32");
  EXPECT_EQ(TrainConfig::from_json(nlohmann::json::object(), "test").fp32_matmul_mode(), "fp32");
  try {
    TrainConfig::from_json({{"fp32_matmul", "fast"}}, "cfg.json");
    FAIL() << "a bad fp32_matmul was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp32_matmul must be fp32, tf32 or 3xtf32, got 'fast'"),
              std::string::npos)
        << e.what();
  }
  try {
    TrainConfig::from_json({{"fp32_matmul", "3xtf32"}, {"tf32", true}}, "cfg.json");
    FAIL() << "tf32 with fp32_matmul 3xtf32 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tf32 true"), std::string::npos) << e.what();
  }
  // Round trip through the config's JSON.
  EXPECT_EQ(TrainConfig::from_json(c.to_json(), "round trip").fp32_matmul_mode(), "3xtf32");
}

}  // namespace
}  // namespace anvil
