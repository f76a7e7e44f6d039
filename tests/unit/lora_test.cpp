// LoRA (peft/lora_config.hpp, peft/lora_adapter.hpp, io/peft_adapter.hpp) on the CPU: the strided GEMM op the
// adapters run on, the configuration and PEFT's adapter_config.json, the layout's adapter tensors, the
// decoder with adapters against the same decoder with the update merged into its weights (outputs, and
// gradients by the chain rule through W + s B A), training runs whose base stays put and whose checkpoints
// hold PEFT's files, and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/rng.hpp"
#include "anvil/trainer.hpp"
#include "core/half.hpp"
#include "dist/communicator.hpp"
#include "io/checkpoint.hpp"
#include "io/peft_adapter.hpp"
#include "io/safetensors.hpp"
#include "lora_test_util.hpp"
#include "peft/lora_adapter.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

std::vector<float> randn(Rng& rng, size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (float& x : v) x = scale * rng.normal();
  return v;
}

// ---------------------------------------------------------------------------------------------------------
// Ops::gemm against a plain triple loop: transposes, row strides (column blocks of wider matrices), alpha and
// beta, 16-bit storage and fp32 gradient outputs.

struct GemmCase {
  bool ta, tb;
  int64_t lda_pad, ldb_pad, ldc_pad;  // extra columns of the stored matrices
  float alpha, beta;
  DType act;
  bool c_grad;
};

float rounded(float v, DType t) {
  if (t == DType::BF16) return bf16_to_float(float_to_bf16(v));
  if (t == DType::F16) return fp16_to_float(float_to_fp16(v));
  return v;
}

std::vector<uint16_t> to_half(const std::vector<float>& v, DType t) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = t == DType::BF16 ? float_to_bf16(v[i]) : float_to_fp16(v[i]);
  return h;
}

class GemmOp : public ::testing::TestWithParam<GemmCase> {};

TEST_P(GemmOp, MatchesTheDefinition) {
  const GemmCase c = GetParam();
  const int m = 5, n = 7, k = 6;
  const int64_t a_rows = c.ta ? k : m, a_cols = c.ta ? m : k, b_rows = c.tb ? n : k, b_cols = c.tb ? k : n;
  const int64_t lda = a_cols + c.lda_pad, ldb = b_cols + c.ldb_pad, ldc = n + c.ldc_pad;
  Rng rng(3);
  // Values exactly representable in the storage type, so the reference sees what the op sees.
  auto stored = [&](size_t count, DType t) {
    std::vector<float> v = randn(rng, count);
    for (float& x : v) x = rounded(x, t);
    return v;
  };
  const DType ct = c.c_grad ? DType::F32 : c.act;
  const std::vector<float> a = stored(size_t(a_rows * lda), c.act), b = stored(size_t(b_rows * ldb), c.act);
  const std::vector<float> c0 = stored(size_t(m * ldc), ct);
  std::vector<float> want = c0;
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int p = 0; p < k; ++p)
        s += double(c.ta ? a[size_t(p * lda + i)] : a[size_t(i * lda + p)]) *
             double(c.tb ? b[size_t(j * ldb + p)] : b[size_t(p * ldb + j)]);
      want[size_t(i * ldc + j)] = float(c.alpha * s + c.beta * c0[size_t(i * ldc + j)]);
    }
  auto dev = make_cpu_device();
  auto ops = make_cpu_ops(*dev, {c.act, c.c_grad ? DType::F32 : c.act});
  std::vector<float> got(c0.size());
  GemmSpec g{.trans_a = c.ta,
             .trans_b = c.tb,
             .c_grad = c.c_grad,
             .m = m,
             .n = n,
             .k = k,
             .lda = lda,
             .ldb = ldb,
             .ldc = ldc,
             .alpha = c.alpha,
             .beta = c.beta};
  if (c.act == DType::F32) {
    got = c0;
    g.a = a.data(), g.b = b.data(), g.c = got.data();
    ops->gemm(g);
  } else {
    const std::vector<uint16_t> ha = to_half(a, c.act), hb = to_half(b, c.act);
    std::vector<uint16_t> hc = to_half(c0, c.act);
    g.a = ha.data(), g.b = hb.data();
    if (c.c_grad) {
      got = c0;
      g.c = got.data();
      ops->gemm(g);
    } else {
      g.c = hc.data();
      ops->gemm(g);
      for (size_t i = 0; i < hc.size(); ++i)
        got[i] = c.act == DType::BF16 ? bf16_to_float(hc[i]) : fp16_to_float(hc[i]);
    }
  }
  for (int i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldc; ++j) {
      const size_t at = size_t(i * ldc + j);
      if (j >= n) {
        EXPECT_EQ(got[at], c0[at]) << "a padding column was written at " << i << "," << j;
        continue;
      }
      const float tol = ct == DType::F32 ? 1e-5f : (ct == DType::BF16 ? 1e-2f : 2e-3f);
      EXPECT_NEAR(got[at], want[at], tol * (1 + std::abs(want[at]))) << i << "," << j;
    }
}

INSTANTIATE_TEST_SUITE_P(Cases, GemmOp,
                         ::testing::Values(GemmCase{false, false, 0, 0, 0, 1.f, 0.f, DType::F32, false},
                                           GemmCase{false, true, 3, 2, 5, 0.5f, 1.f, DType::F32, false},
                                           GemmCase{true, false, 1, 0, 2, 2.f, 1.f, DType::F32, true},
                                           GemmCase{true, true, 2, 3, 0, -1.f, 0.25f, DType::F32, false},
                                           GemmCase{false, true, 4, 0, 3, 0.5f, 1.f, DType::BF16, false},
                                           GemmCase{true, false, 0, 2, 1, 1.f, 1.f, DType::BF16, true},
                                           GemmCase{false, false, 1, 1, 1, 1.5f, 0.f, DType::F16, false},
                                           GemmCase{true, false, 0, 0, 0, 1.f, 1.f, DType::F16, true}));

// ---------------------------------------------------------------------------------------------------------
// Configuration, layout, PEFT's adapter_config.json.

TEST(LoraConfig, TargetsMatchAsPeftDoes) {
  EXPECT_TRUE(lora_targets_module({"q_proj"}, "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(lora_targets_module({"self_attn.q_proj"}, "model.layers.0.self_attn.q_proj"));
  EXPECT_FALSE(lora_targets_module({"proj"}, "model.layers.0.self_attn.q_proj"));  // whole name parts only
  EXPECT_TRUE(lora_targets_module({"c_proj"}, "transformer.h.1.mlp.c_proj"));
  EXPECT_TRUE(lora_targets_module({"all-linear"}, "transformer.h.1.mlp.c_fc"));
  EXPECT_EQ(default_lora_targets("llama"), (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(default_lora_targets("gpt2"), std::vector<std::string>{"c_attn"});
  LoraConfig c;
  c.r = 4, c.alpha = 8;
  EXPECT_FLOAT_EQ(c.scale(), 2.0f);
  c.rslora = true;
  EXPECT_FLOAT_EQ(c.scale(), 4.0f);
}

TEST(LoraConfig, PeftJsonRoundTripAndErrors) {
  LoraConfig c;
  c.r = 16, c.alpha = 32, c.rslora = true;
  const json j = peft_adapter_config(
      c,
      {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "model.layers.1.self_attn.q_proj"},
      "");
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["target_modules"], json({"q_proj", "down_proj"}));
  const LoraConfig back = lora_config_from_peft(j, "a.json");
  EXPECT_EQ(back.r, 16);
  EXPECT_EQ(back.alpha, 32);
  EXPECT_TRUE(back.rslora);
  EXPECT_EQ(back.target_modules, (std::vector<std::string>{"q_proj", "down_proj"}));
  auto with = [&](const char* key, json v) {
    json k = j;
    k[key] = std::move(v);
    return k;
  };
  test::expect_error([&] { lora_config_from_peft(with("peft_type", "IA3"), "a.json"); }, {"a.json", "IA3"});
  test::expect_error([&] { lora_config_from_peft(with("r", 0), "a.json"); }, {"a.json", "'r'"});
  test::expect_error([&] { lora_config_from_peft(with("bias", "all"), "a.json"); }, {"a.json", "bias"});
  test::expect_error([&] { lora_config_from_peft(with("use_dora", true), "a.json"); }, {"use_dora"});
  test::expect_error([&] { lora_config_from_peft(with("modules_to_save", {"lm_head"}), "a.json"); },
                     {"modules_to_save", "lm_head"});
  test::expect_error(
      [&] {
        lora_config_from_peft(with("rank_pattern", {{"q_proj", 4}}), "a.json");
      },
      {"rank_pattern"});
  EXPECT_EQ(lora_config_from_peft(with("lora_dropout", 0.1), "a.json").dropout, 0.1);
  test::expect_error([&] { lora_config_from_peft(with("lora_dropout", 1.0), "a.json"); },
                     {"lora_dropout must be in [0, 1)"});
}

LoraConfig lora(int r, std::vector<std::string> targets = {}, double alpha = 8) {
  LoraConfig c;
  c.r = r, c.alpha = alpha, c.target_modules = std::move(targets);
  return c;
}

TEST(LoraLayout, FactorsBesideTheirWeightsTheRestFrozen) {
  const TransformerConfig cfg = TransformerConfig::preset("llama-tiny");
  const ParamLayout plain = ParamLayout::decoder(cfg);
  const ParamLayout l = ParamLayout::decoder(cfg, lora(4));
  size_t adapters = 0, adapter_numel = 0;
  for (const ParamTensor& t : l.tensors()) {
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.trainable, t.is_adapter());
    if (!t.is_adapter()) {
      const ParamTensor* p = plain.find(t.name);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(p->numel(), t.numel());
      continue;
    }
    ++adapters, adapter_numel += t.numel();
    const ParamTensor& w = l.tensors()[size_t(t.adapts)];
    const std::string module = w.name.substr(0, w.name.size() - 7);
    EXPECT_TRUE(module.ends_with("q_proj") || module.ends_with("v_proj")) << module;
    EXPECT_TRUE(t.decay);
    EXPECT_EQ(t.layer, w.layer);
    if (t.role == TensorRole::LoraA) {
      EXPECT_EQ(t.name, "base_model.model." + module + ".lora_A.weight");
      EXPECT_EQ(t.shape[0], 4);
      EXPECT_EQ(t.shape[1], w.shape[1]);
    } else {
      EXPECT_EQ(t.name, "base_model.model." + module + ".lora_B.weight");
      EXPECT_EQ(t.shape[0], w.shape[0]);
      EXPECT_EQ(t.shape[1], 4);
    }
    // In its block's unit, among the weight-decayed tensors.
    const ParamUnit& u = l.units()[size_t(l.unit_of(t.offset))];
    EXPECT_EQ(u.name, "block." + std::to_string(t.layer));
    EXPECT_LE(t.offset + t.numel(), u.offset + u.decay_numel);
  }
  EXPECT_EQ(adapters, size_t(4 * cfg.n_layer));
  EXPECT_EQ(l.total_numel(), plain.total_numel() + adapter_numel);
  EXPECT_EQ(l.lora_modules().size(), size_t(2 * cfg.n_layer));
  EXPECT_EQ(l.first_trainable_unit(), 1);  // the embedding needs no gradient

  EXPECT_EQ(ParamLayout::decoder(cfg, lora(2, {"all-linear"})).lora_modules().size(),
            size_t(7 * cfg.n_layer));
  const TransformerConfig gpt2 = TransformerConfig::preset("tiny");
  EXPECT_EQ(ParamLayout::decoder(gpt2, lora(2, {"c_proj"})).lora_modules().size(), size_t(2 * gpt2.n_layer));
  test::expect_error(
      [&] {
        ParamLayout::decoder(cfg, lora(2, {"q_proj", "c_attn"}));
      },
      {"'c_attn' names no Linear module", "llama", "q_proj"});
}

// PEFT's adapter files: written and read back exactly; GPT-2's Conv1D marked fan_in_fan_out; malformed or
// mismatched files are errors naming the file and what is wrong, for reading into adapters and for merging.
TEST(LoraFiles, RoundTripAndMalformedInput) {
  test::TempDir dir;
  for (const char* preset : {"llama-tiny", "tiny"}) {
    const ParamLayout l = ParamLayout::decoder(TransformerConfig::preset(preset), lora(4, {"all-linear"}, 8));
    Rng rng(9);
    const std::vector<float> host = randn(rng, l.total_numel());
    io::write_peft_adapter(dir.str(), l, host.data());
    const json config = json::parse(test::read_file(dir / io::kAdapterConfigFile));
    EXPECT_EQ(config["fan_in_fan_out"], std::string(preset) == "tiny") << preset;
    std::vector<float> back(l.total_numel(), 0.0f);
    io::read_peft_adapter(dir.str(), l, back.data());
    for (const ParamTensor& t : l.tensors())
      for (size_t i = t.offset; i < t.offset + t.numel(); ++i)
        ASSERT_EQ(back[i], t.is_adapter() ? host[i] : 0.0f) << preset << " " << t.name;
  }
  const ParamLayout l = ParamLayout::decoder(TransformerConfig::preset("llama-tiny"), lora(4, {"q_proj"}, 8));
  std::vector<float> host(l.total_numel(), 0.5f);
  const std::string weights = dir / io::kAdapterWeightsFile, config = dir / io::kAdapterConfigFile;
  auto rewrite = [&](const std::function<void(io::SafeTensorsWriter&, const ParamTensor&)>& each) {
    io::SafeTensorsWriter w;
    for (const ParamTensor& t : l.tensors())
      if (t.is_adapter()) each(w, t);
    w.write(weights);
  };
  io::write_peft_adapter(dir.str(), l, host.data());
  // Another rank than the run's.
  const ParamLayout r8 =
      ParamLayout::decoder(TransformerConfig::preset("llama-tiny"), lora(8, {"q_proj"}, 8));
  std::vector<float> h8(r8.total_numel());
  test::expect_error([&] { io::read_peft_adapter(dir.str(), r8, h8.data()); }, {config, "r 4", "lora_r 8"});
  // A missing factor, a factor of the wrong shape, a tensor that is no factor of the run.
  rewrite([&](io::SafeTensorsWriter& w, const ParamTensor& t) {
    if (t.role == TensorRole::LoraA) w.add(t.name, DType::F32, t.hf_shape(), host.data() + t.offset);
  });
  test::expect_error([&] { io::read_peft_adapter(dir.str(), l, host.data()); },
                     {weights, "lora_B.weight", "missing"});
  rewrite([&](io::SafeTensorsWriter& w, const ParamTensor& t) {
    std::vector<int64_t> shape = t.hf_shape();
    if (t.role == TensorRole::LoraB) shape = {shape[0] / 2, shape[1]};
    w.add(t.name, DType::F32, shape, host.data() + t.offset);
  });
  test::expect_error([&] { io::read_peft_adapter(dir.str(), l, host.data()); },
                     {weights, "has shape", "needs"});
  test::expect_error(
      [&] {
        io::merge_peft_adapter(dir.str(), ParamLayout::decoder(TransformerConfig::preset("llama-tiny")),
                               host.data());
      },
      {weights, "has shape"});
  rewrite([&](io::SafeTensorsWriter& w, const ParamTensor& t) {
    w.add(t.name, DType::F32, t.hf_shape(), host.data() + t.offset);
    if (t.role == TensorRole::LoraA && t.layer == 0)
      w.add("base_model.model.model.layers.0.mlp.c_fc.lora_A.weight", DType::F32, t.hf_shape(), host.data());
  });
  test::expect_error([&] { io::read_peft_adapter(dir.str(), l, host.data()); },
                     {weights, "mlp.c_fc", "not an adapter"});
  test::expect_error(
      [&] {
        io::merge_peft_adapter(dir.str(), ParamLayout::decoder(TransformerConfig::preset("llama-tiny")),
                               host.data());
      },
      {weights, "mlp.c_fc.weight", "does not have"});
  // A config that is not JSON, or not a LoRA.
  test::write_file(config, "{not json");
  test::expect_error([&] { io::read_peft_adapter(dir.str(), l, host.data()); }, {config, "not valid JSON"});
  test::write_file(config, R"({"peft_type": "PREFIX_TUNING", "r": 4})");
  test::expect_error([&] { io::merge_peft_adapter(dir.str(), l, host.data()); }, {config, "PREFIX_TUNING"});
}

// ---------------------------------------------------------------------------------------------------------
// The decoder with adapters against the decoder given W + s B A.

struct Fixture {
  TransformerConfig cfg;
  LoraConfig lc;
  int B = 2, T = 8;
  std::vector<int32_t> tokens, targets;
};

Fixture fixture(const std::string& preset, LoraConfig lc) {
  Fixture f;
  f.cfg = TransformerConfig::preset(preset);
  f.lc = std::move(lc);
  Rng rng(11);
  for (int i = 0; i < f.B * f.T; ++i) {
    f.tokens.push_back(int32_t(rng.next_u64() % uint64_t(f.cfg.vocab_size)));
    f.targets.push_back(int32_t(rng.next_u64() % uint64_t(f.cfg.vocab_size)));
  }
  return f;
}

EngineOptions options(const Fixture& f, bool training, Precision p = Precision::FP32) {
  EngineOptions o;
  o.batch_size = f.B, o.seq_len = f.T, o.training = training, o.precision = p;
  return o;
}

// Weights of the adapted model: its base from a seed, random (nonzero) factors.
std::vector<float> adapted_weights(Engine& e, uint64_t seed) {
  e.model().init_weights(seed, e.device());
  std::vector<float> w(e.model().layout().total_numel());
  e.model().download_weights(e.device(), w.data());
  Rng rng(seed + 1);
  for (const ParamTensor& t : e.model().layout().tensors())
    if (t.role == TensorRole::LoraB)
      for (size_t i = 0; i < t.numel(); ++i) w[t.offset + i] = 0.05f * rng.normal();
  return w;
}

// The adapted model's weights as the plain model's flat layout, with s B A merged in (or not).
std::vector<float> merged(const ParamLayout& adapted, const ParamLayout& plain, const std::vector<float>& w,
                          float s, bool merge) {
  std::vector<float> out(plain.total_numel());
  for (const ParamTensor& t : plain.tensors()) {
    const ParamTensor& a = adapted.get(t.name);
    std::copy_n(w.begin() + long(a.offset), t.numel(), out.begin() + long(t.offset));
  }
  if (!merge) return out;
  for (const ParamTensor& a : adapted.tensors()) {
    if (a.role != TensorRole::LoraA) continue;
    const ParamTensor& b = adapted.tensors()[size_t(&a - adapted.tensors().data()) + 1];
    const ParamTensor& wt = plain.get(adapted.tensors()[size_t(a.adapts)].name);
    const int64_t rows = wt.shape[0], in = wt.shape[1], r = a.shape[0];
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k)
          d += double(w[b.offset + size_t(o * r + k)]) * w[a.offset + size_t(k * in + i)];
        out[wt.offset + size_t(o * in + i)] += float(s * d);
      }
  }
  return out;
}

// The gradients of every tensor of the layout (zero for frozen ones without): a store of the trainable
// tensors only (ParamStore::keep_trainable_only) keeps theirs packed.
std::vector<float> layout_grads(Engine& e) {
  Model& m = e.model();
  const ParamStore& store = m.param_store();
  const ParamLayout& kept = store.optimizer_layout();
  std::vector<float> g(kept.total_numel());
  e.device().copy_to_host(g.data(), m.grads(), g.size() * sizeof(float));
  if (!store.trainable_only()) return g;
  std::vector<float> out(m.layout().total_numel(), 0.0f);
  for (const ParamTensor& t : kept.tensors())
    std::copy_n(g.begin() + long(t.offset), t.numel(), out.begin() + long(m.layout().get(t.name).offset));
  return out;
}

std::vector<float> logits(Engine& e, const Fixture& f) {
  e.device().copy_to_device(e.tokens(0), f.tokens.data(), f.tokens.size() * sizeof(int32_t));
  e.decoder().forward(e.ops(), e.tokens(0), nullptr, f.B, f.T, 0, false);
  std::vector<float> out(f.tokens.size() * size_t(f.cfg.padded_vocab_size()));
  e.decoder().copy_logits_to_host(e.device(), out.data(), 0, f.tokens.size());
  return out;
}

class LoraDecoder : public ::testing::TestWithParam<const char*> {};

TEST_P(LoraDecoder, StartsAsTheBaseAndEqualsTheMergedModel) {
  const Fixture f = fixture(GetParam(), lora(4, {"all-linear"}, 16));
  EngineOptions o = options(f, false);
  o.lora = f.lc;
  Engine adapted(f.cfg, o);
  Engine plain(f.cfg, options(f, false));
  const ParamLayout &la = adapted.model().layout(), &lp = plain.model().layout();
  // Initialised: B = 0, so the outputs are the base model's exactly.
  adapted.model().init_weights(5, adapted.device());
  std::vector<float> w(la.total_numel());
  adapted.model().download_weights(adapted.device(), w.data());
  for (const ParamTensor& t : la.tensors()) {
    if (t.role == TensorRole::LoraB) {
      EXPECT_TRUE(std::all_of(w.begin() + long(t.offset), w.begin() + long(t.offset + t.numel()),
                              [](float v) { return v == 0; }))
          << t.name;
    }
    if (t.role == TensorRole::LoraA) {
      const float bound = 1.0f / std::sqrt(float(t.shape[1]));
      float most = 0;
      for (size_t i = 0; i < t.numel(); ++i) most = std::max(most, std::abs(w[t.offset + i]));
      EXPECT_LE(most, bound) << t.name;
      EXPECT_GT(most, 0.8f * bound) << t.name;  // spread over the interval, not a constant
    }
  }
  plain.model().upload_weights(plain.device(), merged(la, lp, w, f.lc.scale(), false).data());
  EXPECT_EQ(logits(adapted, f), logits(plain, f));
  // The base tensors draw the same values as without adapters.
  plain.model().init_weights(5, plain.device());
  std::vector<float> pw(lp.total_numel());
  plain.model().download_weights(plain.device(), pw.data());
  EXPECT_EQ(pw, merged(la, lp, w, 1.0f, false));

  // Trained-looking factors: the adapted model equals the plain one with W + s B A.
  w = adapted_weights(adapted, 5);
  adapted.model().upload_weights(adapted.device(), w.data());
  plain.model().upload_weights(plain.device(), merged(la, lp, w, f.lc.scale(), true).data());
  const std::vector<float> a = logits(adapted, f), p = logits(plain, f);
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff = std::max(diff, double(std::abs(a[i] - p[i]))), ref = std::max(ref, double(std::abs(p[i])));
  EXPECT_LT(diff, 1e-5 * ref) << "adapted vs merged logits";
  const std::vector<float> base_only = logits(plain, f);
  plain.model().upload_weights(plain.device(), merged(la, lp, w, f.lc.scale(), false).data());
  EXPECT_NE(logits(plain, f), base_only) << "the factors change nothing: the test would not see them";
}

// Gradients: with W' = W + s B A, dL/dB = s dL/dW' A^T and dL/dA = s B^T dL/dW', where dL/dW' is the plain
// model's weight gradient at W'.
// With master weights and gradients for the adapters only (the default) and for every tensor (as under ZeRO).
TEST_P(LoraDecoder, FactorGradientsFollowTheChainRule) {
  for (const bool trainable_only : {true, false}) {
    SCOPED_TRACE(trainable_only ? "adapters' gradients only" : "every tensor's gradients");
    const Fixture f = fixture(GetParam(), lora(3, {"all-linear"}, 6));
    EngineOptions o = options(f, true);
    o.lora = f.lc;
    o.trainable_only_store = trainable_only;
    Engine adapted(f.cfg, o);
    ASSERT_EQ(adapted.model().param_store().trainable_only(), trainable_only);
    Engine plain(f.cfg, options(f, true));
    const ParamLayout &la = adapted.model().layout(), &lp = plain.model().layout();
    const std::vector<float> w = adapted_weights(adapted, 9);
    adapted.model().upload_weights(adapted.device(), w.data());
    plain.model().upload_weights(plain.device(), merged(la, lp, w, f.lc.scale(), true).data());
    auto grads = [&](Engine& e) {
      Model& m = e.model();
      e.device().fill_zero(m.grad_buffer(), m.grad_bytes());
      e.device().copy_to_device(e.tokens(0), f.tokens.data(), f.tokens.size() * sizeof(int32_t));
      e.device().copy_to_device(e.targets(0), f.targets.data(), f.targets.size() * sizeof(int32_t));
      m.forward(e.ops(), e.inputs(0, f.B, f.T), 1.0f, true);
      m.backward(e.ops(), e.inputs(0, f.B, f.T));
      return layout_grads(e);
    };
    const std::vector<float> ga = grads(adapted), gp = grads(plain);
    const float s = f.lc.scale();
    size_t checked = 0;
    for (const ParamTensor& a : la.tensors()) {
      if (a.role != TensorRole::LoraA) continue;
      SCOPED_TRACE(a.name);
      const ParamTensor& b = la.tensors()[size_t(&a - la.tensors().data()) + 1];
      const ParamTensor& wt = lp.get(la.tensors()[size_t(a.adapts)].name);
      const int64_t rows = wt.shape[0], in = wt.shape[1], r = a.shape[0];
      const float* gw = gp.data() + wt.offset;
      double scale = 0, err = 0;
      for (int64_t k = 0; k < r; ++k)
        for (int64_t i = 0; i < in; ++i) {  // dA[k, i] = s sum_o B[o, k] dW[o, i]
          double want = 0;
          for (int64_t o2 = 0; o2 < rows; ++o2)
            want += double(w[b.offset + size_t(o2 * r + k)]) * gw[o2 * in + i];
          want *= s;
          err = std::max(err, std::abs(want - ga[a.offset + size_t(k * in + i)])),
          scale = std::max(scale, std::abs(want));
        }
      EXPECT_LT(err, 1e-4 * scale + 1e-9) << "dA";
      scale = err = 0;
      for (int64_t o2 = 0; o2 < rows; ++o2)
        for (int64_t k = 0; k < r; ++k) {  // dB[o, k] = s sum_i dW[o, i] A[k, i]
          double want = 0;
          for (int64_t i = 0; i < in; ++i) want += double(gw[o2 * in + i]) * w[a.offset + size_t(k * in + i)];
          want *= s;
          err = std::max(err, std::abs(want - ga[b.offset + size_t(o2 * r + k)])),
          scale = std::max(scale, std::abs(want));
        }
      EXPECT_LT(err, 1e-4 * scale + 1e-9) << "dB";
      ++checked;
    }
    EXPECT_EQ(checked, la.lora_modules().size());
    // No weight gradient of the frozen base is written (there is none to write with the adapters' only).
    for (const ParamTensor& t : la.tensors()) {
      if (t.trainable || (t.role != TensorRole::QkvWeight && t.role != TensorRole::MlpOutWeight)) continue;
      if (trainable_only) {
        EXPECT_EQ(adapted.model().param_store().grad_at(t.offset), nullptr) << t.name;
      }
      for (size_t i = 0; i < t.numel(); ++i) ASSERT_EQ(ga[t.offset + i], 0.0f) << t.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, LoraDecoder, ::testing::Values("llama-tiny", "tiny"));

// anvil estimate plans the adapters: every base parameter frozen, optimizer state for the factors only
// (AdamW: two fp32 moments), and says so.
TEST(LoraEstimate, PlansTheFactorsAndSaysWhatIsFrozen) {
  const test::CommandResult r = test::run_anvil("estimate --model llama-tiny --device cpu --lora_r 8 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json j = json::parse(r.output);
  const ParamLayout l = ParamLayout::decoder(TransformerConfig::preset("llama-tiny"), lora(8));
  size_t factors = 0;
  for (const ParamTensor& t : l.tensors()) factors += t.is_adapter() ? t.numel() : 0;
  EXPECT_EQ(j["frozen_parameters"].get<size_t>(), l.total_numel() - factors);
  EXPECT_GE(j["optimizer_states"].get<size_t>(), 8 * factors);
  EXPECT_LT(j["optimizer_states"].get<size_t>(), 8 * factors + 4096);  // + the range table
  const test::CommandResult text = test::run_anvil("estimate --model llama-tiny --device cpu --lora_r 8");
  EXPECT_NE(text.output.find("frozen (LoRA r 8: all but the adapters)"), std::string::npos) << text.output;
}

// ---------------------------------------------------------------------------------------------------------
// lora_dropout: training forwards drop each adapter's input (evaluation does not); the masks are fixed by the
// dropout state, and the factors' gradients are those of the loss with that mask (finite differences).

struct DropoutRun {
  Engine& e;
  const Fixture& f;
  // The loss of a training forward with the masks of (seed, micro-batch 1), and optionally its backward.
  double loss(uint64_t seed, bool backward) {
    Model& m = e.model();
    if (e.has_dropout()) {
      e.dropout_state_host() = DropoutState{seed, 0, 0};
      e.upload_dropout_state();
    }
    e.device().fill_zero(m.grad_buffer(), m.grad_bytes());
    e.device().copy_to_device(e.tokens(0), f.tokens.data(), f.tokens.size() * sizeof(int32_t));
    e.device().copy_to_device(e.targets(0), f.targets.data(), f.targets.size() * sizeof(int32_t));
    const int n = f.B * f.T;
    m.forward(e.ops(), e.inputs(0, f.B, f.T), 1.0f / float(n), true);
    const double l = e.ops().sum(m.losses(), size_t(n)) / n;
    if (backward) m.backward(e.ops(), e.inputs(0, f.B, f.T));
    return l;
  }
};

TEST(LoraDropout, TrainingForwardsDropEvaluationDoesNot) {
  const Fixture f = fixture("llama-tiny", lora(4, {"all-linear"}, 8));
  EngineOptions o = options(f, true);
  o.lora = f.lc;
  o.lora.dropout = 0.3;
  Engine e(f.cfg, o);
  ASSERT_TRUE(e.has_dropout());
  EngineOptions plain = options(f, true);
  plain.lora = f.lc;
  Engine nodrop(f.cfg, plain);
  EXPECT_FALSE(nodrop.has_dropout());
  const std::vector<float> w = adapted_weights(e, 3);
  e.model().upload_weights(e.device(), w.data());
  nodrop.model().upload_weights(nodrop.device(), w.data());
  DropoutRun run{e, f};
  const double a = run.loss(11, false), again = run.loss(11, false), other = run.loss(12, false);
  EXPECT_EQ(a, again) << "the same state must draw the same masks";
  EXPECT_NE(a, other) << "another seed must draw other masks";
  DropoutRun plain_run{nodrop, f};
  EXPECT_NE(a, plain_run.loss(0, false));
  // Evaluation (no gradients) runs without dropout: the logits of the model without it.
  EXPECT_EQ(logits(e, f), logits(nodrop, f));
}

TEST(LoraDropout, FactorGradientsMatchFiniteDifferences) {
  const Fixture f = fixture("tiny", lora(4, {"all-linear"}, 8));
  EngineOptions o = options(f, true);
  o.lora = f.lc;
  o.lora.dropout = 0.25;
  Engine e(f.cfg, o);
  std::vector<float> w = adapted_weights(e, 4);
  e.model().upload_weights(e.device(), w.data());
  DropoutRun run{e, f};
  run.loss(21, true);
  const std::vector<float> g = layout_grads(e);
  // The largest factor gradients of each kind (A, B), where finite differences resolve them best.
  std::vector<size_t> picks;
  for (TensorRole role : {TensorRole::LoraA, TensorRole::LoraB}) {
    std::vector<size_t> idx;
    for (const ParamTensor& t : e.model().layout().tensors())
      if (t.role == role)
        for (size_t i = t.offset; i < t.offset + t.numel(); ++i) idx.push_back(i);
    std::partial_sort(idx.begin(), idx.begin() + 4, idx.end(),
                      [&](size_t x, size_t y) { return std::abs(g[x]) > std::abs(g[y]); });
    picks.insert(picks.end(), idx.begin(), idx.begin() + 4);
  }
  const float h = 1e-2f;
  for (size_t i : picks) {
    std::vector<float> p = w;
    p[i] = w[i] + h;
    e.model().upload_weights(e.device(), p.data());
    const double up = run.loss(21, false);
    p[i] = w[i] - h;
    e.model().upload_weights(e.device(), p.data());
    const double down = run.loss(21, false);
    const double fd = (up - down) / (2 * h);
    EXPECT_NEAR(g[i], fd, 0.03 * std::abs(fd) + 1e-4) << "element " << i;
  }
  // Without the mask (another seed) the gradient differs: the test sees the dropout.
  e.model().upload_weights(e.device(), w.data());
  run.loss(22, true);
  const std::vector<float> g2 = layout_grads(e);
  EXPECT_NE(g[picks[0]], g2[picks[0]]);
}

// ---------------------------------------------------------------------------------------------------------
// Training runs.

using test::lora_run;

TEST(LoraTrain, BaseStaysAdaptersTrainCheckpointIsPeft) {
  test::ByteCorpus c;
  const std::string dir = c.dir / "run";
  const TrainConfig cfg = lora_run(c, dir, 40, R"({"save_steps": 30})");
  test::quietly([&] { return train(cfg); });
  const std::vector<double> losses = test::metrics_losses(dir + "/metrics.jsonl");
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_LT(losses.back(), losses.front() - 0.3) << "the adapters do not learn";

  // The base in model.safetensors is the initial one, bit for bit; no adapter tensor is in it.
  Engine init(cfg.model, training_engine_options(cfg, DeviceKind::CPU));
  init.model().init_weights(cfg.seed, init.device());
  std::vector<float> w0(init.model().layout().total_numel());
  init.model().download_weights(init.device(), w0.data());
  const ParamLayout& layout = init.model().layout();
  const std::string ckpt = dir + "/checkpoint-30";
  const io::SafeTensorsReader base(ckpt + "/model.safetensors");
  size_t base_tensors = 0;
  for (const ParamTensor& t : layout.tensors()) {
    if (t.is_adapter()) {
      EXPECT_EQ(base.find(t.name), nullptr) << t.name;
      continue;
    }
    ++base_tensors;
    const io::SafeTensorInfo& info = base.at(t.name);
    std::vector<float> v(size_t(info.numel()));
    std::memcpy(v.data(), base.data(info), info.nbytes);
    EXPECT_TRUE(std::equal(v.begin(), v.end(), w0.begin() + long(t.offset))) << t.name << " moved";
  }
  EXPECT_EQ(base.tensors().size(), base_tensors);
  // PEFT's files: every factor, with the config PEFT reads.
  const io::SafeTensorsReader adapter(ckpt + "/adapter_model.safetensors");
  EXPECT_EQ(adapter.tensors().size(), size_t(14 * cfg.model.n_layer));
  const json ac = json::parse(test::read_file(ckpt + "/adapter_config.json"));
  EXPECT_EQ(ac["r"], 8);
  EXPECT_EQ(ac["lora_alpha"], 16);
  EXPECT_EQ(ac["target_modules"].size(), 7u);
  const io::SafeTensorInfo& b0 = adapter.at("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  std::vector<float> bv(size_t(b0.numel()));
  std::memcpy(bv.data(), adapter.data(b0), b0.nbytes);
  EXPECT_TRUE(std::any_of(bv.begin(), bv.end(), [](float v) { return v != 0; })) << "B did not train";

  // Resume continues the same run: 30 + 10 steps equal the 40 steps in one go.
  TrainConfig resumed = lora_run(c, c.dir / "resumed", 40);
  resumed.resume_from_checkpoint = ckpt;
  test::quietly([&] { return train(resumed); });
  const std::vector<double> r = test::metrics_losses(c.dir / "resumed/metrics.jsonl");
  ASSERT_EQ(r.size(), 10u);
  for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(r[i], losses[30 + i]) << "step " << 31 + i;

  // A model without adapters reading the checkpoint merges them (anvil logits, generate, convert): its
  // logits equal the adapted model's.
  Fixture f = fixture("llama-tiny", lora(8, {"all-linear"}, 16));
  f.cfg = cfg.model;
  EngineOptions o = options(f, false);
  o.lora = lora_config(cfg);
  Engine with(f.cfg, o), without(f.cfg, options(f, false));
  io::load_model_weights(ckpt, with.decoder(), with.device());
  io::load_model_weights(ckpt, without.decoder(), without.device());
  const std::vector<float> la = logits(with, f), lm = logits(without, f);
  double diff = 0, ref = 0;
  for (size_t i = 0; i < la.size(); ++i)
    diff = std::max(diff, double(std::abs(la[i] - lm[i]))), ref = std::max(ref, double(std::abs(la[i])));
  EXPECT_LT(diff, 1e-5 * ref);
  // anvil convert writes the merged model: a plain Hugging Face directory.
  const test::CommandResult conv =
      test::run_anvil("convert --input " + ckpt + " --output " + std::string(c.dir / "merged"));
  ASSERT_EQ(conv.exit_code, 0) << conv.output;
  EXPECT_FALSE(io::has_peft_adapter(c.dir / "merged"));
  Engine again(f.cfg, options(f, false));
  io::load_model_weights(c.dir / "merged", again.decoder(), again.device());
  EXPECT_EQ(logits(again, f), lm);
}

// With lora_dropout the masks follow the step and micro-batch, so a resumed run draws what the uninterrupted
// one drew.
TEST(LoraTrain, DropoutRunResumesExactly) {
  test::ByteCorpus c;
  const TrainConfig full = lora_run(
      c, c.dir / "full", 8, R"({"lora_dropout": 0.1, "save_steps": 5, "gradient_accumulation_steps": 2})");
  test::quietly([&] { return train(full); });
  TrainConfig resumed =
      lora_run(c, c.dir / "resumed", 8, R"({"lora_dropout": 0.1, "gradient_accumulation_steps": 2})");
  resumed.resume_from_checkpoint = c.dir / "full/checkpoint-5";
  test::quietly([&] { return train(resumed); });
  const std::vector<double> a = test::metrics_losses(c.dir / "full/metrics.jsonl"),
                            b = test::metrics_losses(c.dir / "resumed/metrics.jsonl");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i], a[5 + i]) << "step " << 6 + i;
  // And the dropout is there: a run without it differs.
  test::quietly(
      [&] { return train(lora_run(c, c.dir / "nodrop", 8, R"({"gradient_accumulation_steps": 2})")); });
  EXPECT_NE(test::metrics_losses(c.dir / "nodrop/metrics.jsonl"), a);
}

// LoRA on two processes (Gloo): data parallelism (only the factors reduced), with bf16 communication, and
// ZeRO stages 2 and 3 give the loss curve of one process with the same global batch; every run's adapter is a
// PEFT adapter and its base is the initial one.
TEST(LoraTrain, TwoProcessesEqualOne) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  std::vector<std::vector<double>> curves;
  for (const std::string name : {"one", "stage0", "comm", "stage2", "stage3"}) {
    json j = {{"model", "llama-tiny"},
              {"train_data", c.dir / "data/train.bin"},
              {"per_device_train_batch_size", name == "one" ? 4 : 2},
              {"max_seq_length", 32},
              {"max_steps", 6},
              {"learning_rate", 1e-2},
              {"logging_steps", 1},
              {"device", "cpu"},
              {"seed", 5},
              {"dataloader_pin_memory", false},
              {"lora_r", 4},
              {"lora_target_modules", "all-linear"},
              {"zero_stage", name == "stage2"   ? 2
                             : name == "stage3" ? 3
                                                : 0},
              {"output_dir", c.dir / name}};
    if (name == "comm") j.update({{"communication_data_type", "bf16"}, {"ddp_bucket_cap_mb", 0.001}});
    test::write_file(c.dir / (name + ".json"), j.dump());
    const std::string cmd = name == "one"
                                ? "train --config " + c.dir / (name + ".json")
                                : fmt::format("launch --nproc_per_node 2 --master_port 0 train --config {}",
                                              c.dir / (name + ".json"));
    const test::CommandResult r = test::run_anvil(cmd);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    curves.push_back(test::metrics_losses(c.dir / (name + "/metrics.jsonl")));
    EXPECT_TRUE(io::has_peft_adapter(c.dir / (name + "/checkpoint-6"))) << name;
  }
  ASSERT_EQ(curves[0].size(), 6u);
  for (size_t s = 1; s < curves.size(); ++s)
    for (size_t i = 0; i < curves[0].size(); ++i)
      EXPECT_NEAR(curves[s][i], curves[0][i], (s == 2 ? 1e-3 : 1e-5) * curves[0][i])
          << "run " << s << " step " << i + 1;
  // The base did not move in any run.
  const io::SafeTensorsReader one(c.dir / "one/checkpoint-6/model.safetensors");
  for (const char* run : {"stage0", "stage2", "stage3"}) {
    const io::SafeTensorsReader r(c.dir / fmt::format("{}/checkpoint-6/model.safetensors", run));
    for (const io::SafeTensorInfo& t : one.tensors()) {
      const io::SafeTensorInfo& u = r.at(t.name);
      ASSERT_EQ(u.nbytes, t.nbytes);
      EXPECT_EQ(std::memcmp(one.data(t), r.data(u), t.nbytes), 0) << run << ": " << t.name;
    }
  }
}

// examples/lora_llama_tiny.json reads as the LoRA run its README describes.
TEST(LoraTrain, ExampleConfigReads) {
  const std::string path = std::string(ANVIL_SOURCE_DIR) + "/examples/lora_llama_tiny.json";
  const TrainConfig cfg = TrainConfig::from_json(json::parse(test::read_file(path)), path);
  const LoraConfig l = lora_config(cfg);
  EXPECT_EQ(l.r, 8);
  EXPECT_EQ(l.scale(), 2.0f);
  EXPECT_EQ(l.target_modules, std::vector<std::string>{"all-linear"});
  EXPECT_EQ(cfg.init_from, "runs/llama_tiny/checkpoint-240");
}

// A PEFT adapter kept apart from its base (as PEFT saves adapters and the Hub serves them): a run started
// from the base with lora_adapter trains as the run started from the directory holding both, and logits /
// convert with --adapter give what they give for that directory.
TEST(LoraAdapterApart, AsTheDirectoryHoldingBoth) {
  namespace fs = std::filesystem;
  test::ByteCorpus c;
  test::quietly([&] { return train(lora_run(c, c.dir / "first", 3)); });
  const fs::path ckpt = c.dir / "first/checkpoint-3", base = c.dir / "base", adapter = c.dir / "adapter";
  fs::create_directories(base);
  fs::create_directories(adapter);
  for (const char* f : {"model.safetensors", "config.json"}) fs::copy_file(ckpt / f, base / f);
  for (const char* f : {"adapter_model.safetensors", "adapter_config.json"})
    fs::copy_file(ckpt / f, adapter / f);

  TrainConfig both = lora_run(c, c.dir / "both", 3);
  both.init_from = ckpt.string();
  TrainConfig apart = lora_run(c, c.dir / "apart", 3);
  apart.init_from = base.string();
  apart.lora_adapter = adapter.string();
  apart.validate("test");
  test::quietly([&] { return train(both); });
  test::quietly([&] { return train(apart); });
  const std::vector<double> lb = test::metrics_losses(c.dir / "both/metrics.jsonl"),
                            la = test::metrics_losses(c.dir / "apart/metrics.jsonl");
  ASSERT_EQ(lb.size(), 3u);
  EXPECT_EQ(la, lb);
  // (Not the adapter's initialisation: a run from the base alone starts elsewhere.)
  TrainConfig fresh = lora_run(c, c.dir / "fresh", 1);
  fresh.init_from = base.string();
  test::quietly([&] { return train(fresh); });
  EXPECT_NE(test::metrics_losses(c.dir / "fresh/metrics.jsonl")[0], lb[0]);

  const std::string ids = c.dir / "ids.safetensors";
  {
    io::SafeTensorsWriter w;
    const std::vector<int32_t> v = {72, 101, 108, 108, 111, 32, 119, 111};
    w.add("input_ids", DType::I32, {1, 8}, v.data());
    w.write(ids);
  }
  auto logits_of = [&](const std::string& flags, const std::string& out) {
    const test::CommandResult r =
        test::run_anvil("logits --input_ids " + ids + " --output " + out + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return test::read_file(out);
  };
  EXPECT_EQ(logits_of("--checkpoint " + base.string() + " --adapter " + adapter.string(), c.dir / "a.st"),
            logits_of("--checkpoint " + ckpt.string(), c.dir / "b.st"));
  for (const auto& [flags, out] :
       {std::pair{"--input " + base.string() + " --adapter " + adapter.string(), std::string(c.dir / "m1")},
        std::pair{"--input " + ckpt.string(), std::string(c.dir / "m2")}}) {
    const test::CommandResult r = test::run_anvil("convert " + flags + " --output " + out);
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  EXPECT_EQ(test::read_file(c.dir / "m1/model.safetensors"), test::read_file(c.dir / "m2/model.safetensors"));

  // What is refused, and what to do instead.
  auto fails_with = [&](const std::string& flags, const std::string& needle) {
    const test::CommandResult r = test::run_anvil("logits --input_ids " + ids + " --output " +
                                                  std::string(c.dir / "x.st") + " " + flags);
    EXPECT_NE(r.exit_code, 0) << flags;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
  };
  fails_with("--checkpoint " + ckpt.string() + " --adapter " + adapter.string(),
             "holds an adapter of its own");
  fails_with("--checkpoint " + base.string() + " --adapter " + base.string(), "no adapter_config.json");
  fails_with("--checkpoint " + adapter.string(), "holds a PEFT adapter only");
  test::expect_error([&] { lora_run(c, c.dir / "e", 1, R"({"lora_r": 0, "lora_adapter": "x"})"); },
                     {"lora_adapter", "set lora_r"});
  test::expect_error([&] { lora_run(c, c.dir / "e", 1, R"({"lora_adapter": "x"})"); },
                     {"lora_adapter", "model_name_or_path"});
}

TEST(LoraTrain, Errors) {
  test::ByteCorpus c;
  const std::string dir = c.dir / "e";
  test::expect_error([&] { lora_run(c, dir, 1, R"({"lora_dropout": 1.5})"); }, {"lora_dropout", "[0, 1)"});
  test::expect_error([&] { lora_run(c, dir, 1, R"({"lora_r": -1})"); }, {"lora_r", ">= 0"});
  test::expect_error([&] { lora_run(c, dir, 1, R"({"lora_alpha": 0})"); }, {"lora_alpha", "> 0"});
  test::expect_error([&] { lora_run(c, dir, 1, R"({"model": "bert-tiny"})"); }, {"LoRA", "bert"});
  test::expect_error([&] { lora_run(c, dir, 1, R"({"bf16": true, "stochastic_rounding": true})"); },
                     {"stochastic_rounding and LoRA"});
  const TrainConfig bad = lora_run(c, dir, 1, R"({"lora_target_modules": "q_proj,c_fc"})");
  test::expect_error([&] { test::quietly([&] { return train(bad); }); }, {"'c_fc' names no Linear module"});
  // An adapter that does not fit the run is named.
  test::quietly([&] { return train(lora_run(c, c.dir / "r8", 1)); });
  TrainConfig r4 = lora_run(c, c.dir / "r4", 2, R"({"lora_r": 4})");
  r4.init_from = c.dir / "r8/checkpoint-1";
  test::expect_error([&] { test::quietly([&] { return train(r4); }); },
                     {"adapter_config.json", "r 8", "lora_r 4"});
}

}  // namespace
}  // namespace anvil
