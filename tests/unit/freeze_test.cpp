// Freezing parameters (freeze_parameters): the glob patterns, the layout's trainable flags and their
// errors, the optimizers leaving frozen tensors exactly as they are, and training runs (one process; ZeRO
// stages on two) in which frozen tensors keep their initial values while every other tensor trains as it
// would with nothing frozen.
#include "model/freeze.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "anvil/rng.hpp"
#include "anvil/trainer.hpp"
#include "dist/communicator.hpp"
#include "io/safetensors.hpp"
#include "optim/optimizer.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

TEST(FreezeGlob, MatchesWholeNames) {
  EXPECT_TRUE(glob_match("model.layers.*", "model.layers.0.mlp.up_proj.weight"));
  EXPECT_FALSE(glob_match("model.layers.*", "lm_head.weight"));
  EXPECT_TRUE(glob_match("*.bias", "transformer.h.3.attn.c_attn.bias"));
  EXPECT_FALSE(glob_match("*.bias", "transformer.h.3.attn.c_attn.bias2"));
  EXPECT_TRUE(glob_match("model.layers.[0-1].*", "model.layers.1.input_layernorm.weight"));
  EXPECT_FALSE(glob_match("model.layers.[0-1].*", "model.layers.2.input_layernorm.weight"));
  EXPECT_FALSE(glob_match("model.layers.[0-1].*", "model.layers.10.input_layernorm.weight"));
  EXPECT_TRUE(glob_match("model.layers.1?.*", "model.layers.12.x"));
  EXPECT_FALSE(glob_match("model.layers.1?.*", "model.layers.1.x"));
  EXPECT_TRUE(glob_match("model.layers.[!0].*", "model.layers.3.x"));
  EXPECT_FALSE(glob_match("model.layers.[!0].*", "model.layers.0.x"));
  EXPECT_TRUE(glob_match("a*b*c", "a--b--b--c"));
  EXPECT_TRUE(glob_match("exact.name", "exact.name"));
  EXPECT_FALSE(glob_match("exact.name", "exact.name.more"));
  EXPECT_TRUE(glob_match("[x", "[x"));  // an unclosed set is a literal '['
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("?", ""));
}

TEST(FreezeGlob, SplitsTheList) {
  EXPECT_EQ(split_patterns(" a, b ,,c "), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(split_patterns("").empty());
  EXPECT_TRUE(split_patterns(" , ").empty());
}

TransformerConfig tiny_gpt2() {
  TransformerConfig c;
  c.n_layer = 2, c.n_head = 2, c.n_embd = 16, c.vocab_size = 40, c.block_size = 8;
  return c;
}

TEST(FreezeLayout, PatternsAndAliasesMarkTensors) {
  ParamLayout l = ParamLayout::decoder(tiny_gpt2());
  // GPT2Model files drop "transformer.": the alias matches as the name does.
  const FrozenCount n = freeze_parameters(l, {"transformer.wte.weight", "h.0.*"});
  size_t tensors = 0, numel = 0;
  for (const ParamTensor& t : l.tensors()) {
    const bool want = t.name == "transformer.wte.weight" || t.name.starts_with("transformer.h.0.");
    EXPECT_EQ(t.trainable, !want) << t.name;
    if (want) ++tensors, numel += t.numel();
  }
  EXPECT_EQ(n.tensors, tensors);
  EXPECT_EQ(n.numel, numel);
  // wte alone (wpe trains), then block 0 whole: two ranges.
  const std::vector<ParamRange> f = l.frozen_ranges();
  ASSERT_EQ(f.size(), 2u);
  const ParamTensor& wte = l.get("transformer.wte.weight");
  EXPECT_EQ(f[0], (ParamRange{wte.offset, wte.offset + wte.numel()}));
  EXPECT_EQ(f[1], (ParamRange{l.units()[1].offset, l.units()[1].offset + l.units()[1].numel}));
  EXPECT_FALSE(l.any_trainable(f[1]));
  EXPECT_TRUE(l.any_trainable({f[1].begin, f[1].end + 1}));
  EXPECT_TRUE(l.any_trainable(l.all()));
}

TEST(FreezeLayout, ErrorsNameThePattern) {
  test::expect_error(
      [] {
        ParamLayout l = ParamLayout::decoder(tiny_gpt2());
        freeze_parameters(l, {"transformer.h.0.*", "model.layers.0.*"});
      },
      {"freeze_parameters", "'model.layers.0.*'", "matches no parameter", "transformer.wte.weight"});
  test::expect_error(
      [] {
        ParamLayout l = ParamLayout::decoder(tiny_gpt2());
        freeze_parameters(l, {"*"});
      },
      {"freeze_parameters", "every one", "nothing to train"});
  test::expect_error(
      [] {
        TrainConfig::from_json(
            {{"bf16", true}, {"stochastic_rounding", true}, {"freeze_parameters", "*.bias"}}, "cfg");
      },
      {"stochastic_rounding", "freeze_parameters", "frozen weights would move"});
}

TEST(FreezeOptimizer, RangeTableSkipsFrozenTensors) {
  ParamLayout l = ParamLayout::decoder(tiny_gpt2());
  freeze_parameters(l, {"transformer.h.1.attn.*"});
  const ParamRangeTable t = ParamRangeTable::from_layout(l);
  for (const ParamTensor& p : l.tensors()) {
    size_t r = 0;
    while (r + 1 < t.begins.size() && t.begins[r + 1] <= p.offset) ++r;
    if (!p.trainable)
      EXPECT_EQ(t.groups[r], kSkipGroup) << p.name;
    else
      EXPECT_NE(t.groups[r], kSkipGroup) << p.name;
  }
}

// Every optimizer, driven directly with random gradients and weight decay: frozen elements stay bit for bit,
// every trainable tensor moves.
class FreezeEveryOptimizer : public testing::TestWithParam<std::string> {};

// Three steps of one optimizer over the tiny model with the same random weights and gradients; returns the
// weights. `freeze` as freeze_parameters.
std::vector<float> optimizer_steps(const std::string& optim, const std::vector<std::string>& freeze,
                                   size_t* state_numel = nullptr) {
  EngineOptions o;
  o.device = DeviceKind::CPU, o.batch_size = 1, o.seq_len = 8, o.training = true;
  o.optimizer = parse_optimizer(optim);
  o.optim.weight_decay = 0.1f;
  o.optim.momentum = 0.9f;
  o.optim.min_8bit_size = 256;  // 8-bit states for the tiny matrices
  o.optim.adafactor_beta1 = 0.9f;
  o.freeze = freeze;
  Engine e(tiny_gpt2(), o);
  const size_t n = e.model().layout().total_numel();
  Rng rng(3);
  std::vector<float> p(n), g(n);
  for (float& x : p) x = 0.5f * rng.normal();
  e.device().copy_to_device(e.model().params(), p.data(), n * sizeof(float));
  for (int64_t step = 1; step <= 3; ++step) {
    for (float& x : g) x = rng.normal();
    e.device().copy_to_device(e.model().grads(), g.data(), n * sizeof(float));
    e.optimizer().step(e.ops(), e.model().params(), e.model().grads(), 1e-2f, step, 1.0f);
  }
  e.device().copy_to_host(p.data(), e.model().params(), n * sizeof(float));
  if (state_numel) *state_numel = e.optimizer().state_numel();
  return p;
}

// Frozen elements stay bit for bit; trainable ones get exactly the update they get with nothing frozen
// (AdamW's and SGD's states compact, Adafactor's and 8-bit AdamW's per tensor).
TEST_P(FreezeEveryOptimizer, FrozenTensorsDoNotMoveOthersUpdateAsUnfrozen) {
  const std::vector<std::string> freeze = {"transformer.wte.weight", "transformer.h.0.*",
                                           "transformer.h.1.ln_2.bias"};
  size_t states = 0;
  const std::vector<float> frozen = optimizer_steps(GetParam(), freeze, &states);
  const std::vector<float> open = optimizer_steps(GetParam(), {});
  Rng rng(3);
  std::vector<float> p0(frozen.size());
  for (float& x : p0) x = 0.5f * rng.normal();
  ParamLayout layout = ParamLayout::decoder(tiny_gpt2());
  freeze_parameters(layout, freeze);
  size_t trainable = 0;
  for (const ParamTensor& t : layout.tensors()) {
    bool moved = false, as_open = true;
    for (size_t i = t.offset; i < t.offset + t.numel(); ++i) {
      moved = moved || frozen[i] != p0[i];
      as_open = as_open && frozen[i] == open[i];
    }
    EXPECT_EQ(moved, t.trainable) << GetParam() << ": " << t.name;
    if (t.trainable) {
      EXPECT_TRUE(as_open) << GetParam() << ": " << t.name << " updated unlike unfrozen";
      trainable += t.numel();
    }
  }
  // Elementwise states cover the trainable elements only.
  EXPECT_EQ(states, trainable);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, FreezeEveryOptimizer,
                         testing::Values("adamw_torch_fused", "adafactor", "adamw_8bit", "sgd"));

// The backward FLOPs the decoder skips (what MFU leaves out): block 0's weight gradients and, the embedding
// and block 0 being frozen, block 0's whole backward; not block 1's q/k/v (frozen in part) nor the head.
TEST(FreezeTrain, SkippedBackwardFlops) {
  EngineOptions o;
  o.device = DeviceKind::CPU, o.batch_size = 1, o.seq_len = 8, o.training = true;
  o.freeze = {"model.embed_tokens.weight", "model.layers.0.*", "model.layers.1.self_attn.q_proj.weight"};
  Engine e(TransformerConfig::preset("llama-tiny"), o);
  double block0 = 0;
  for (const ParamTensor& t : e.model().layout().tensors())
    if (t.layer == 0 && t.shape.ndim == 2) block0 += double(t.numel());
  const double C = 128, T = 8;
  EXPECT_EQ(e.model().skipped_backward_flops_per_token(8), 4 * block0 + 8 * C * T);
  o.freeze = {"lm_head.weight"};
  Engine head(TransformerConfig::preset("llama-tiny"), o);
  EXPECT_EQ(head.model().skipped_backward_flops_per_token(8), 2.0 * 256 * 128);
  // BERT with its encoder frozen: every block's backward (4 of the 6 FLOPs per weight, attention's 8 C T).
  const TransformerConfig bert = TransformerConfig::preset("bert-tiny");
  o.freeze = {"bert.*"};
  Engine enc(bert, o);
  const double Cb = bert.n_embd, F = bert.ffn_size();
  EXPECT_EQ(enc.model().skipped_backward_flops_per_token(8),
            bert.n_layer * (4 * (4 * Cb * Cb + 4 * Cb + 2 * Cb * F + F + Cb) + 8 * Cb * T));
}

// anvil estimate plans what training plans: AdamW's moments for the trainable elements only (8 bytes each),
// the frozen count in the report and its JSON.
TEST(FreezeEstimate, OptimizerStatesOfTheTrainableTensors) {
  const auto estimate = [](const std::string& freeze) {
    const test::CommandResult r =
        test::run_anvil("estimate --model llama-tiny --device cpu --json" +
                        (freeze.empty() ? std::string() : " --freeze_parameters '" + freeze + "'"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return json::parse(r.output.substr(r.output.find('{')));
  };
  const json open = estimate(""), frozen = estimate("model.layers.0.*");
  ParamLayout l = ParamLayout::decoder(TransformerConfig::preset("llama-tiny"));
  const FrozenCount n = freeze_parameters(l, {"model.layers.0.*"});
  EXPECT_EQ(open["frozen_parameters"].get<size_t>(), 0u);
  EXPECT_EQ(frozen["frozen_parameters"].get<size_t>(), n.numel);
  // (Less the compact states' range table: a few hundred bytes at most.)
  EXPECT_NEAR(
      double(open["optimizer_states"].get<size_t>()) - double(frozen["optimizer_states"].get<size_t>()),
      8.0 * double(n.numel), 512.0);
  EXPECT_EQ(open["gradients"], frozen["gradients"]);  // still planned (the flat layout)
  const test::CommandResult text =
      test::run_anvil("estimate --model llama-tiny --device cpu --freeze_parameters 'model.layers.0.*'");
  EXPECT_NE(text.output.find(fmt::format("frozen (freeze_parameters): {} tensors", n.tensors)),
            std::string::npos)
      << text.output;
}

// A run's initial weights (what the trainer initialises from cfg.seed), flat.
std::vector<float> initial_weights(const TrainConfig& cfg) {
  Engine e(cfg.model, training_engine_options(cfg, DeviceKind::CPU));
  e.model().init_weights(cfg.seed, e.device());
  std::vector<float> p(e.model().layout().total_numel());
  e.model().param_store().download(e.device(), p.data());
  return p;
}

// Tensor `t` of a checkpoint's model.safetensors (fp32) in Anvil's layout order: transposed back where
// Hugging Face stores it [in, out], the real vocabulary rows only.
std::vector<float> checkpoint_tensor(const io::SafeTensorsReader& r, const ParamTensor& t) {
  const io::SafeTensorInfo& info = r.at(t.name);
  EXPECT_EQ(info.dtype, DType::F32) << t.name;
  std::vector<float> hf(size_t(info.numel()));
  std::memcpy(hf.data(), r.data(info), info.nbytes);
  if (!t.hf_transposed) return hf;
  const size_t rows = size_t(t.shape[0]), cols = size_t(t.shape[1]);
  std::vector<float> out(hf.size());
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) out[i * cols + j] = hf[j * rows + i];
  return out;
}

// The layout's tensors of a run's config (frozen as it says).
ParamLayout layout_of(const TrainConfig& cfg) {
  ParamLayout l = ParamLayout::decoder(cfg.model);
  const std::vector<std::string> p = split_patterns(cfg.freeze_parameters);
  if (!p.empty()) freeze_parameters(l, p);
  return l;
}

std::vector<float> initial_part(const std::vector<float>& init, const ParamTensor& t, size_t count) {
  return {init.begin() + long(t.offset), init.begin() + long(t.offset + count)};
}

TrainConfig llama_run(const test::ByteCorpus& c, const std::string& out, int steps,
                      const std::string& freeze) {
  const json j = {{"model", "llama-tiny"},
                  {"train_data", c.dir / "data/train.bin"},
                  {"per_device_train_batch_size", 2},
                  {"max_seq_length", 32},
                  {"max_steps", steps},
                  {"learning_rate", 3e-3},
                  {"weight_decay", 0.1},
                  {"max_grad_norm", 0.0},  // no clipping: each tensor's update depends on its gradient only
                  {"logging_steps", 1},
                  {"device", "cpu"},
                  {"seed", 7},
                  {"freeze_parameters", freeze},
                  {"output_dir", out}};
  return TrainConfig::from_json(j, "test");
}

// A resume keeps the frozen set (the optimizer's compact state depends on it): another set, even one of the
// same size, or none, is an error that says what to do; the same patterns written otherwise resume.
TEST(FreezeTrain, ResumeKeepsTheFrozenSet) {
  test::ByteCorpus c;
  const std::string dir = c.dir / "run";
  test::quietly([&] { return train(llama_run(c, dir, 2, "model.layers.0.*")); });
  for (const std::string other : {"model.layers.1.*", ""}) {
    TrainConfig r = llama_run(c, c.dir / "again", 4, other);
    r.resume_from_checkpoint = dir + "/checkpoint-2";
    test::expect_error([&] { test::quietly([&] { return train(r); }); },
                       {"freeze_parameters is '" + other + "'", "froze 'model.layers.0.*'", "--init_from"});
  }
  TrainConfig same = llama_run(c, c.dir / "same", 4, " model.layers.0.* ,");
  same.resume_from_checkpoint = dir + "/checkpoint-2";
  EXPECT_EQ(test::quietly([&] { return train(same); }).global_step, 4);
}

// Llama with the embedding, block 0 and one part of block 1's fused q/k/v frozen (its gradient is computed
// with k and v and zeroed before the norm and the update).
TEST(FreezeTrain, FrozenTensorsKeepTheirValuesOthersTrainAsUnfrozen) {
  test::ByteCorpus c;
  const std::string freeze =
      "model.embed_tokens.weight, model.layers.0.*, model.layers.1.self_attn.q_proj.weight";
  const TrainConfig frozen1 = llama_run(c, c.dir / "frozen1", 1, freeze);
  const TrainConfig frozen4 = llama_run(c, c.dir / "frozen4", 4, freeze);
  const TrainConfig open1 = llama_run(c, c.dir / "open1", 1, "");
  for (const TrainConfig* cfg : {&frozen1, &frozen4, &open1}) test::quietly([&] { return train(*cfg); });
  const std::vector<float> init = initial_weights(open1);
  const ParamLayout layout = layout_of(frozen1);
  io::SafeTensorsReader f1(c.dir / "frozen1/checkpoint-1/model.safetensors");
  io::SafeTensorsReader f4(c.dir / "frozen4/checkpoint-4/model.safetensors");
  io::SafeTensorsReader o1(c.dir / "open1/checkpoint-1/model.safetensors");
  size_t frozen = 0;
  for (const ParamTensor& t : layout.tensors()) {
    SCOPED_TRACE(t.name);
    const std::vector<float> a = checkpoint_tensor(f1, t), b = checkpoint_tensor(f4, t),
                             open = checkpoint_tensor(o1, t);
    const std::vector<float> start = initial_part(init, t, a.size());
    if (!t.trainable) {
      ++frozen;
      EXPECT_TRUE(a == start) << "a frozen tensor moved in step 1";
      EXPECT_TRUE(b == start) << "a frozen tensor moved by step 4";
      EXPECT_FALSE(open == start) << "the unfrozen run does not move it: the test would not see a move";
    } else {
      // The same gradient as unfrozen (frozen gradients skipped or zeroed leave the others as they are).
      EXPECT_TRUE(a == open) << "a trainable tensor's first update differs from the unfrozen run's";
      EXPECT_FALSE(b == start) << "a trainable tensor did not train";
    }
  }
  EXPECT_EQ(frozen, 1u + 9u + 1u);  // the embedding, block 0's nine tensors, block 1's q_proj
  // The gradient norm counts trainable tensors only.
  const auto norm = [](const std::string& metrics) {
    std::istringstream in(test::read_file(metrics));
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.contains("grad_norm")) return j["grad_norm"].get<double>();
    }
    ADD_FAILURE() << metrics << " has no grad_norm";
    return 0.0;
  };
  EXPECT_LT(norm(c.dir / "frozen1/metrics.jsonl"), norm(c.dir / "open1/metrics.jsonl"));
}

// ZeRO stages 0, 2 and 3 on two processes with frozen tensors: equal loss curves, frozen tensors at their
// initial values in every stage's checkpoint (frozen units are not reduced), and ZeRO-2's checkpoint resumed
// by one process.
TEST(FreezeTrain, ZeroStagesOnTwoProcesses) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  // The embedding unit (wte, wpe) and block 0 frozen: backward stops above block 0 (their hooks still run).
  const std::string freeze = "transformer.wte.weight,transformer.wpe.weight,transformer.h.0.*";
  std::vector<std::vector<double>> curves;
  TrainConfig cfg;
  // Stage 0 also with bf16 communication and tiny buckets (one per unit): frozen units are passed over.
  for (int stage : {0, 2, 3, -1}) {
    const std::string name = stage < 0 ? "comm" : "stage" + std::to_string(stage);
    json j = {
        {"model", {{"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 256}, {"block_size", 32}}},
        {"train_data", c.dir / "data/train.bin"},
        {"per_device_train_batch_size", 2},
        {"max_steps", 6},
        {"learning_rate", 3e-3},
        {"weight_decay", 0.1},
        {"logging_steps", 1},
        {"device", "cpu"},
        {"seed", 5},
        {"dataloader_pin_memory", false},
        {"zero_stage", std::max(stage, 0)},
        {"save_steps", 3},
        {"freeze_parameters", freeze},
        {"output_dir", c.dir / name}};
    if (stage < 0) j.update({{"communication_data_type", "bf16"}, {"ddp_bucket_cap_mb", 0.001}});
    test::write_file(c.dir / (name + ".json"), j.dump());
    const test::CommandResult r = test::run_anvil(
        fmt::format("launch --nproc_per_node 2 --master_port 0 train --config {}", c.dir / (name + ".json")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("frozen (freeze_parameters): 14 tensors"), std::string::npos) << r.output;
    curves.push_back(test::metrics_losses(c.dir / (name + "/metrics.jsonl")));
    cfg = TrainConfig::from_json(j, "test");
  }
  ASSERT_EQ(curves[0].size(), 6u);
  for (size_t s = 1; s < curves.size(); ++s)
    for (size_t i = 0; i < curves[0].size(); ++i)
      EXPECT_NEAR(curves[s][i], curves[0][i], (s == 3 ? 1e-3 : 1e-6) * curves[0][i])
          << "run " << s << " step " << i + 1;
  // ZeRO-2's checkpoint (compact optimizer states in two shards) resumed by one process, stage 0.
  {
    json j = json::parse(test::read_file(c.dir / "stage2.json"));
    j["zero_stage"] = 0;
    j["per_device_train_batch_size"] = 4;  // the same global batch
    j["output_dir"] = c.dir / "resumed";
    j["resume_from_checkpoint"] = c.dir / "stage2/checkpoint-3";
    test::write_file(c.dir / "resumed.json", j.dump());
    const test::CommandResult r = test::run_anvil("train --config " + c.dir / "resumed.json");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::vector<double> got = test::metrics_losses(c.dir / "resumed/metrics.jsonl");
    ASSERT_EQ(got.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(got[i], curves[1][3 + i], 1e-6 * got[i]) << "resumed step " << i + 4;
  }
  const std::vector<float> init = initial_weights(cfg);
  const ParamLayout layout = layout_of(cfg);
  for (const char* run : {"stage0", "stage2", "stage3", "comm"}) {
    io::SafeTensorsReader r(c.dir / fmt::format("{}/checkpoint-6/model.safetensors", run));
    for (const ParamTensor& t : layout.tensors()) {
      if (t.trainable) continue;
      const std::vector<float> got = checkpoint_tensor(r, t);
      EXPECT_TRUE(got == initial_part(init, t, got.size())) << run << ": " << t.name << " moved";
    }
  }
}

}  // namespace
}  // namespace anvil
