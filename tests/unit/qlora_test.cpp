// QLoRA (docs/lora.md#qlora): LoRA adapters beside a frozen base whose block matrices are kept as nf4 or int8
// codes (quantization). A quantized base computes what a dense base holding its dequantized values computes
// (logits, loss, every adapter gradient); training learns, leaves the codes as they were and resumes
// exactly; two processes equal one; bad settings are refused with messages that name them.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "anvil/rng.hpp"
#include "anvil/trainer.hpp"
#include "dist/communicator.hpp"
#include "io/checkpoint.hpp"
#include "io/peft_adapter.hpp"
#include "io/safetensors.hpp"
#include "lora_test_util.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kB = 2, kT = 24;

EngineOptions qlora_options(WeightStorage storage, Precision p) {
  EngineOptions o;
  o.batch_size = kB, o.seq_len = kT, o.training = true, o.precision = p;
  o.lora.r = 4, o.lora.alpha = 8, o.lora.target_modules = {"all-linear"};
  o.weight_storage = storage;
  return o;
}

struct Pass {
  std::vector<float> logits, grads;  // grads: the adapters' (the store keeps those alone)
  double loss = 0;
};

// One forward and backward of the model from its current weights.
Pass forward_backward(Engine& e, const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
  Model& m = e.model();
  e.device().copy_to_device(e.tokens(0), tokens.data(), tokens.size() * sizeof(int32_t));
  e.device().copy_to_device(e.targets(0), targets.data(), targets.size() * sizeof(int32_t));
  Pass p;
  e.decoder().forward(e.ops(), e.tokens(0), nullptr, kB, kT, 0, false);
  p.logits.resize(tokens.size() * size_t(e.decoder().config().padded_vocab_size()));
  e.decoder().copy_logits_to_host(e.device(), p.logits.data(), 0, tokens.size());
  e.device().fill_zero(m.grad_buffer(), m.grad_bytes());
  m.forward(e.ops(), e.inputs(0, kB, kT), 1.0f / float(tokens.size()), true);
  p.loss = e.ops().sum(m.losses(), tokens.size()) / double(tokens.size());
  m.backward(e.ops(), e.inputs(0, kB, kT));
  p.grads.resize(m.param_store().optimizer_layout().total_numel());
  e.device().copy_to_host(p.grads.data(), m.grads(), p.grads.size() * sizeof(float));
  return p;
}

class QuantizedBase : public ::testing::TestWithParam<std::tuple<WeightStorage, Precision>> {};

TEST_P(QuantizedBase, ComputesWhatTheDequantizedDenseBaseComputes) {
  const auto [storage, precision] = GetParam();
  const TransformerConfig cfg = TransformerConfig::preset("llama-tiny");
  Engine q(cfg, qlora_options(storage, precision));
  Engine dense(cfg, qlora_options(WeightStorage::Compute, precision));
  ASSERT_TRUE(q.model().param_store().trainable_only());
  ASSERT_NE(q.model().param_store().quantized(), nullptr);
  ASSERT_EQ(q.model().param_store().quantized()->matrices(), size_t(4 * cfg.n_layer));
  // Random base and factors (B too, so that every gradient is non-trivial); the quantized model's weights as
  // it keeps them (the matrices dequantized) go into the dense one.
  const ParamLayout& l = q.model().layout();
  Rng rng(17);
  const std::vector<float> w = test::random_weights(l, rng);
  q.model().upload_weights(q.device(), w.data());
  std::vector<float> kept(w.size());
  q.model().download_weights(q.device(), kept.data());
  size_t changed = 0;
  for (const ParamTensor& t : l.tensors())
    for (size_t i = t.offset; i < t.offset + t.numel(); ++i) {
      if (t.storage == WeightStorage::Compute && precision == Precision::FP32) {
        ASSERT_EQ(kept[i], w[i]) << t.name;  // stored as given
      }
      changed += kept[i] != w[i];
    }
  EXPECT_GT(changed, 0u) << "the matrices were not quantized";
  dense.model().upload_weights(dense.device(), kept.data());

  std::vector<int32_t> tokens, targets;
  for (int i = 0; i < kB * kT; ++i) {
    tokens.push_back(int32_t(rng.next_u64() % uint64_t(cfg.vocab_size)));
    targets.push_back(int32_t(rng.next_u64() % uint64_t(cfg.vocab_size)));
  }
  const Pass a = forward_backward(q, tokens, targets), b = forward_backward(dense, tokens, targets);
  // Dequantizing into the compute type and rounding the dequantized values into it are the same rounding.
  EXPECT_EQ(a.logits, b.logits);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.grads, b.grads);
  EXPECT_TRUE(std::any_of(a.grads.begin(), a.grads.end(), [](float g) { return g != 0; }));
}

INSTANTIATE_TEST_SUITE_P(Storage, QuantizedBase,
                         ::testing::Combine(::testing::Values(WeightStorage::NF4,
                                                              WeightStorage::NF4DoubleQuant,
                                                              WeightStorage::Int8),
                                            ::testing::Values(Precision::FP32, Precision::BF16)),
                         [](const auto& info) {
                           std::string storage = weight_storage_name(std::get<0>(info.param));
                           std::replace(storage.begin(), storage.end(), '-', '_');  // (gtest names)
                           return storage + (std::get<1>(info.param) == Precision::FP32 ? "_fp32" : "_bf16");
                         });

// The plan: codes and scales instead of the matrices' weights, master weights and gradients of the adapters.
TEST(QLoraPlan, HoldsCodesAndTheAdapters) {
  const TransformerConfig cfg = TransformerConfig::preset("llama-tiny");
  Engine q(cfg, qlora_options(WeightStorage::NF4, Precision::BF16));
  Engine dense(cfg, qlora_options(WeightStorage::Compute, Precision::BF16));
  const QuantizedWeights& qw = *q.model().param_store().quantized();
  const auto bytes = [](const Engine& e, MemoryCategory c) { return e.plan().requested_bytes(c); };
  // bf16 matrices (2 bytes an element) become half a byte an element plus a scale per 64.
  EXPECT_EQ(bytes(dense, MemoryCategory::Weights) - qw.quantized_numel() * 2 + qw.quantized_bytes(),
            bytes(q, MemoryCategory::Weights));
  EXPECT_LT(qw.quantized_bytes(), qw.quantized_numel() * 2 / 3);
  EXPECT_EQ(bytes(q, MemoryCategory::MasterWeights), bytes(dense, MemoryCategory::MasterWeights));
  EXPECT_EQ(bytes(q, MemoryCategory::Gradients), bytes(dense, MemoryCategory::Gradients));
}

// lora_run with every block Linear adapted beside an nf4 base.
TrainConfig qlora_run(const test::ByteCorpus& c, const std::string& out, int steps,
                      const std::string& extra = "{}") {
  json j = {{"lora_target_modules", "all-linear"}, {"quantization", "nf4"}, {"dataloader_pin_memory", false}};
  j.update(json::parse(extra));
  return test::lora_run(c, out, steps, j.dump());
}

class QLoraStorage : public ::testing::TestWithParam<std::string> {};

// nf4 and nf4-dq. nf4's codes come back from the checkpoint's dequantized base; nf4-dq's decoded scales
// would quantize into other ones, so its checkpoint holds the codes and scales too
// (quantized_base.safetensors).
TEST_P(QLoraStorage, LearnsKeepsTheCodesResumesExactly) {
  test::ByteCorpus c;
  const std::string dir = c.dir / "run";
  const std::string storage = GetParam();
  const std::string q = fmt::format(R"({{"quantization": "{}"}})", storage);
  const TrainConfig cfg =
      qlora_run(c, dir, 30, fmt::format(R"({{"save_steps": 20, "quantization": "{}"}})", storage));
  test::quietly([&] { return train(cfg); });
  const std::vector<double> losses = test::metrics_losses(dir + "/metrics.jsonl");
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_LT(losses.back(), losses.front() - 0.3) << "the adapters do not learn";

  // The checkpoint's base is the initial base as the codes hold it, bit for bit; the adapters are PEFT's.
  Engine init(cfg.model, training_engine_options(cfg, DeviceKind::CPU));
  init.model().init_weights(cfg.seed, init.device());
  std::vector<float> w0(init.model().layout().total_numel());
  init.model().download_weights(init.device(), w0.data());
  const std::string ckpt = dir + "/checkpoint-20";
  const io::SafeTensorsReader base(ckpt + "/model.safetensors");
  for (const ParamTensor& t : init.model().layout().tensors()) {
    if (t.is_adapter()) continue;
    const io::SafeTensorInfo& info = base.at(t.name);
    std::vector<float> v(size_t(info.numel()));
    std::memcpy(v.data(), base.data(info), info.nbytes);
    EXPECT_TRUE(std::equal(v.begin(), v.end(), w0.begin() + long(t.offset))) << t.name << " moved";
  }
  EXPECT_TRUE(io::has_peft_adapter(ckpt));
  EXPECT_EQ(fs::exists(ckpt + "/quantized_base.safetensors"), storage == "nf4-dq");

  // Resume quantizes the saved (dequantized) base again into the same codes (nf4-dq: reads them): 20 + 10
  // steps equal 30.
  TrainConfig resumed = qlora_run(c, c.dir / "resumed", 30, q);
  resumed.resume_from_checkpoint = ckpt;
  test::quietly([&] { return train(resumed); });
  const std::vector<double> r = test::metrics_losses(c.dir / "resumed/metrics.jsonl");
  ASSERT_EQ(r.size(), 10u);
  for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(r[i], losses[20 + i]) << "step " << 21 + i;
  if (storage != "nf4-dq") return;

  // Without the file the base is quantized again from its dequantized values: the scales move, and so the
  // run (what the file is for). A file of another shape is refused, naming it and what to do.
  const std::string bare = c.dir / "bare";
  fs::copy(ckpt, bare, fs::copy_options::recursive);
  fs::remove(bare + "/quantized_base.safetensors");
  TrainConfig requantized = qlora_run(c, c.dir / "requantized", 30, q);
  requantized.resume_from_checkpoint = bare;
  test::quietly([&] { return train(requantized); });
  EXPECT_NE(test::metrics_losses(c.dir / "requantized/metrics.jsonl"), r);
  io::SafeTensorsWriter w;
  w.set_metadata("storage", "nf4-dq");
  const std::vector<int8_t> codes(10);
  const std::vector<float> scales(3);
  w.add("codes", DType::I8, {10}, codes.data());
  w.add("scales", DType::F32, {3}, scales.data());
  w.write(bare + "/quantized_base.safetensors");
  TrainConfig bad = qlora_run(c, c.dir / "bad", 30, q);
  bad.resume_from_checkpoint = bare;
  try {
    test::quietly([&] { return train(bad); });
    FAIL() << "a quantized base of another shape was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("quantized_base.safetensors: 10 code bytes"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("delete the file"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Storage, QLoraStorage, ::testing::Values("nf4", "nf4-dq"),
                         [](const auto& info) { return info.param == "nf4" ? "nf4" : "nf4_dq"; });

// Data parallelism over two Gloo processes: every process keeps the quantized base, only the adapters'
// gradients are reduced; the loss curve is one process's with the same global batch, and so is ZeRO-1's and
// ZeRO-2's (the adapters' state sharded). An nf4-dq ZeRO-2 checkpoint holds the quantized base and resumes
// exactly.
TEST(QLoraTrain, TwoProcessesEqualOne) {
  if (!dist::gloo_compiled()) GTEST_SKIP() << "built without Gloo";
  test::ByteCorpus c;
  std::vector<std::vector<double>> curves;
  for (const std::string name : {"one", "two", "stage1", "stage2"}) {
    json j = json::parse(qlora_run(c, c.dir / name, 6).to_json().dump());
    j["per_device_train_batch_size"] = name == "one" ? 4 : 2;
    j["zero_stage"] = name == "stage1" ? 1 : name == "stage2" ? 2 : 0;
    test::write_file(c.dir / (name + ".json"), j.dump());
    const std::string cmd = name == "one" ? "train --config " + c.dir / (name + ".json")
                                          : "launch --nproc_per_node 2 --master_port 0 train --config " +
                                                c.dir / (name + ".json");
    const test::CommandResult r = test::run_anvil(cmd);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    curves.push_back(test::metrics_losses(c.dir / (name + "/metrics.jsonl")));
  }
  ASSERT_EQ(curves[0].size(), 6u);
  for (size_t run = 1; run < curves.size(); ++run) {
    ASSERT_EQ(curves[run].size(), 6u) << run;
    for (size_t i = 0; i < 6; ++i)
      EXPECT_NEAR(curves[run][i], curves[0][i], 1e-5 * curves[0][i]) << "run " << run << ", step " << i + 1;
  }
  json j = json::parse(
      qlora_run(c, c.dir / "dq", 6, R"({"quantization": "nf4-dq", "save_steps": 3})").to_json().dump());
  j.update({{"per_device_train_batch_size", 2}, {"zero_stage", 2}});
  test::write_file(c.dir / "dq.json", j.dump());
  const std::string launch = "launch --nproc_per_node 2 --master_port 0 train --config " + c.dir / "dq.json";
  test::CommandResult r = test::run_anvil(launch);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(c.dir / "dq/checkpoint-3/quantized_base.safetensors"));
  r = test::run_anvil(launch + " --output_dir " + (c.dir / "dq_resumed") + " --resume_from_checkpoint " +
                      (c.dir / "dq/checkpoint-3"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<double> full = test::metrics_losses(c.dir / "dq/metrics.jsonl");
  ASSERT_EQ(full.size(), 6u);
  EXPECT_EQ(test::metrics_losses(c.dir / "dq_resumed/metrics.jsonl"),
            std::vector<double>(full.begin() + 3, full.end()));
}

TEST(QLoraTrain, Errors) {
  test::ByteCorpus c;
  const std::string dir = c.dir / "e";
  test::expect_error([&] { qlora_run(c, dir, 1, R"({"lora_r": 0})"); }, {"quantization", "lora_r", "QLoRA"});
  test::expect_error([&] { qlora_run(c, dir, 1, R"({"zero_stage": 3})"); }, {"set zero_stage 2", "QLoRA"});
  test::expect_error([&] { qlora_run(c, dir, 1, R"({"freeze_parameters": "model.norm.weight"})"); },
                     {"freeze_parameters"});
  test::expect_error([&] { qlora_run(c, dir, 1, R"({"quantization": "fp4"})"); },
                     {"quantization", "'fp4'", "nf4"});
  test::expect_error([&] { qlora_run(c, dir, 1, R"({"model": "bert-tiny"})"); }, {"LoRA", "bert"});
}

TEST(QLoraEstimate, PlansTheCodes) {
  const test::CommandResult r =
      test::run_anvil("estimate --model llama-tiny --device cpu --lora_r 8 --quantization nf4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const test::CommandResult plain =
      test::run_anvil("estimate --model llama-tiny --device cpu --lora_r 8 --json");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const json q = json::parse(r.output), p = json::parse(plain.output);
  EXPECT_LT(q["weights"].get<size_t>(), p["weights"].get<size_t>());
  EXPECT_EQ(q["master_weights"], p["master_weights"]);
  EXPECT_EQ(q["optimizer_states"], p["optimizer_states"]);
}

}  // namespace
}  // namespace anvil
