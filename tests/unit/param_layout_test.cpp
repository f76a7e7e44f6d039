// The flat GPT-2 parameter layout: sizes (against Hugging Face's parameter count), contiguity, the
// decayed-first order inside each unit, and Hugging Face names and shapes.
#include "model/param_layout.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "anvil/error.hpp"
#include "anvil/model_config.hpp"

namespace anvil {
namespace {

TransformerConfig small_config() {
  TransformerConfig c;
  c.n_layer = 3, c.n_head = 2, c.n_embd = 12, c.vocab_size = 37, c.block_size = 8;
  return c;
}

// What GPT2LMHeadModel.named_parameters() lists, with Hugging Face's shapes (Conv1D weights are
// [in, out]; the head is tied to wte and not listed).
std::map<std::string, std::vector<int64_t>> hf_gpt2_parameters(const TransformerConfig& c) {
  const int64_t C = c.n_embd;
  std::map<std::string, std::vector<int64_t>> p = {{"transformer.wte.weight", {c.vocab_size, C}},
                                                   {"transformer.wpe.weight", {c.block_size, C}},
                                                   {"transformer.ln_f.weight", {C}},
                                                   {"transformer.ln_f.bias", {C}}};
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    p[h + "ln_1.weight"] = {C};
    p[h + "ln_1.bias"] = {C};
    p[h + "attn.c_attn.weight"] = {C, 3 * C};
    p[h + "attn.c_attn.bias"] = {3 * C};
    p[h + "attn.c_proj.weight"] = {C, C};
    p[h + "attn.c_proj.bias"] = {C};
    p[h + "ln_2.weight"] = {C};
    p[h + "ln_2.bias"] = {C};
    p[h + "mlp.c_fc.weight"] = {C, 4 * C};
    p[h + "mlp.c_fc.bias"] = {4 * C};
    p[h + "mlp.c_proj.weight"] = {4 * C, C};
    p[h + "mlp.c_proj.bias"] = {C};
  }
  return p;
}

std::vector<int64_t> dims(const Shape& s) {
  return {s.dims.begin(), s.dims.begin() + s.ndim};
}

// Elements Hugging Face counts: every tensor, with wte's real rows only.
int64_t hf_count(const ParamLayout& l, const TransformerConfig& c) {
  int64_t n = 0;
  for (const ParamTensor& t : l.tensors())
    n += t.name == "transformer.wte.weight" ? int64_t(c.vocab_size) * c.n_embd : int64_t(t.numel());
  return n;
}

TEST(ParamLayout, TotalIsHfCountPlusPaddedVocabRows) {
  for (const TransformerConfig& c :
       {small_config(), TransformerConfig::preset("tiny"), TransformerConfig::preset("d12")}) {
    const ParamLayout l = ParamLayout::decoder(c);
    const int64_t padded_rows = c.padded_vocab_size() - c.vocab_size;
    EXPECT_EQ(int64_t(l.total_numel()), c.num_parameters() + padded_rows * c.n_embd) << c.n_layer;
    EXPECT_EQ(hf_count(l, c), c.num_parameters()) << c.n_layer;
  }
}

TEST(ParamLayout, D12HasGpt2SmallParameterCount) {
  const TransformerConfig c = TransformerConfig::preset("d12");
  EXPECT_EQ(c.num_parameters(), 124'439'808);  // GPT2LMHeadModel("gpt2").num_parameters()
  const ParamLayout l = ParamLayout::decoder(c);
  EXPECT_EQ(hf_count(l, c), 124'439'808);
  EXPECT_EQ(c.padded_vocab_size(), 50304);
  EXPECT_EQ(l.total_numel(), 124'439'808u + (50304u - 50257u) * 768u);
}

TEST(ParamLayout, TensorsAndUnitsAreContiguousAndDisjoint) {
  const ParamLayout l = ParamLayout::decoder(small_config());
  // Tensors tile [0, total) in order: no gap, no overlap.
  size_t end = 0;
  for (const ParamTensor& t : l.tensors()) {
    EXPECT_EQ(t.offset, end) << t.name;
    EXPECT_GT(t.numel(), 0u) << t.name;
    end = t.offset + t.numel();
  }
  EXPECT_EQ(end, l.total_numel());

  // Units tile the buffer too, each one made of its tensors back to back, and every tensor belongs to
  // exactly one unit.
  ASSERT_EQ(l.units().size(), size_t(small_config().n_layer) + 2);
  std::vector<int> owner(l.tensors().size(), 0);
  size_t unit_end = 0;
  for (const ParamUnit& u : l.units()) {
    EXPECT_EQ(u.offset, unit_end) << u.name;
    size_t at = u.offset;
    for (size_t k : u.tensors) {
      ASSERT_LT(k, l.tensors().size());
      ++owner[k];
      EXPECT_EQ(l.tensors()[k].offset, at) << u.name << " / " << l.tensors()[k].name;
      at += l.tensors()[k].numel();
    }
    EXPECT_EQ(at - u.offset, u.numel) << u.name;
    unit_end = u.offset + u.numel;
  }
  EXPECT_EQ(unit_end, l.total_numel());
  for (size_t k = 0; k < owner.size(); ++k) EXPECT_EQ(owner[k], 1) << l.tensors()[k].name;

  EXPECT_EQ(l.units().front().name, "embedding");
  EXPECT_EQ(l.units()[1].name, "block.0");
  EXPECT_EQ(l.units()[3].name, "block.2");
  EXPECT_EQ(l.units().back().name, "final");
}

TEST(ParamLayout, DecayedTensorsComeFirstInEachUnit) {
  const ParamLayout l = ParamLayout::decoder(small_config());
  for (const ParamUnit& u : l.units()) {
    // The optimizer updates [offset, offset + decay_numel) with decay and the rest without.
    size_t decayed = 0;
    bool seen_undecayed = false;
    for (size_t k : u.tensors) {
      const ParamTensor& t = l.tensors()[k];
      if (t.decay) {
        EXPECT_FALSE(seen_undecayed) << t.name << " is decayed but follows an undecayed tensor";
        EXPECT_LT(t.offset, u.offset + u.decay_numel) << t.name;
        decayed += t.numel();
      } else {
        seen_undecayed = true;
        EXPECT_GE(t.offset, u.offset + u.decay_numel) << t.name;
      }
    }
    EXPECT_EQ(u.decay_numel, decayed) << u.name;
  }
  EXPECT_EQ(l.units().back().decay_numel, 0u);  // ln_f only
}

TEST(ParamLayout, NamesAndShapesMatchHuggingFace) {
  const TransformerConfig c = small_config();
  const ParamLayout l = ParamLayout::decoder(c);
  const auto hf = hf_gpt2_parameters(c);
  EXPECT_EQ(l.tensors().size(), hf.size());
  for (const ParamTensor& t : l.tensors()) {
    const auto it = hf.find(t.name);
    ASSERT_NE(it, hf.end()) << t.name << " is not a Hugging Face GPT-2 parameter";
    std::vector<int64_t> shape = dims(t.shape);
    if (t.hf_transposed) shape = {shape[1], shape[0]};
    if (t.name == "transformer.wte.weight") {
      EXPECT_EQ(shape[0], c.padded_vocab_size());
      shape[0] = c.vocab_size;
    }
    EXPECT_EQ(shape, it->second) << t.name;
    // Only the Conv1D matrices are stored transposed relative to Hugging Face.
    const bool conv1d = t.name.ends_with("c_attn.weight") || t.name.ends_with("c_proj.weight") ||
                        t.name.ends_with("c_fc.weight");
    EXPECT_EQ(t.hf_transposed, conv1d) << t.name;
  }
  for (const auto& [name, shape] : hf) EXPECT_NE(l.find(name), nullptr) << name << " is missing";
}

TEST(ParamLayout, InitKindsFollowGpt2) {
  using I = ParamTensor::Init;
  const ParamLayout l = ParamLayout::decoder(small_config());
  EXPECT_EQ(l.get("transformer.wte.weight").init, I::Normal);
  EXPECT_EQ(l.get("transformer.wpe.weight").init, I::Normal);
  EXPECT_EQ(l.get("transformer.h.1.attn.c_attn.weight").init, I::Normal);
  EXPECT_EQ(l.get("transformer.h.1.mlp.c_fc.weight").init, I::Normal);
  // The projections into the residual stream get GPT-2's scaled initialisation.
  EXPECT_EQ(l.get("transformer.h.1.attn.c_proj.weight").init, I::NormalResidual);
  EXPECT_EQ(l.get("transformer.h.1.mlp.c_proj.weight").init, I::NormalResidual);
  EXPECT_EQ(l.get("transformer.h.2.ln_2.weight").init, I::Ones);
  EXPECT_EQ(l.get("transformer.ln_f.weight").init, I::Ones);
  EXPECT_EQ(l.get("transformer.h.0.attn.c_attn.bias").init, I::Zeros);
  EXPECT_EQ(l.get("transformer.ln_f.bias").init, I::Zeros);
}

TEST(ParamLayout, LookupOfUnknownName) {
  const ParamLayout l = ParamLayout::decoder(small_config());
  EXPECT_EQ(l.find("lm_head.weight"), nullptr);  // tied to wte, not a tensor of its own
  EXPECT_EQ(l.find("transformer.h.3.ln_1.weight"), nullptr);
  EXPECT_THROW(l.get("transformer.h.3.ln_1.weight"), Error);
}

}  // namespace
}  // namespace anvil
