// LoRA on the CPU backend against PEFT: a LoRA made and saved by PEFT (tests/golden/make_lora_golden.py: its
// B factors random, so the adapter matters) on a base fixture of transformers is loaded as PEFT saved it, and
// Anvil's logits, loss, every factor's gradient and the factors after one AdamW step must match PEFT's to a
// relative error < 1e-4.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "golden_util.hpp"
#include "io/atomic_dir.hpp"
#include "io/checkpoint.hpp"
#include "io/peft_adapter.hpp"
#include "io/safetensors.hpp"
#include "safetensors_util.hpp"
#include "test_util.hpp"
#include "train/engine.hpp"

namespace anvil {
namespace {

namespace fs = std::filesystem;
using test::read_f32;

using test::rel_error;

std::vector<float> part(const std::vector<float>& flat, const ParamTensor& t) {
  return {flat.begin() + long(t.offset), flat.begin() + long(t.offset + t.numel())};
}

class GoldenLora : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenLora, MatchesPeft) {
  const std::string golden_dir = std::string(ANVIL_SOURCE_DIR) + "/tests/golden/";
  const std::string lora_dir = golden_dir + GetParam();
  ASSERT_TRUE(fs::exists(lora_dir + "/golden.safetensors")) << "fixture missing: " << lora_dir;
  const io::SafeTensorsReader golden(lora_dir + "/golden.safetensors");
  const auto& meta = golden.metadata();
  // The base model and PEFT's adapter in one directory, as an Anvil LoRA checkpoint holds them.
  test::TempDir dir;
  for (const char* f : {"config.json", "model.safetensors"})
    fs::copy_file(golden_dir + meta.at("base") + "/" + f, dir / f);
  for (const char* f : {io::kAdapterConfigFile, io::kAdapterWeightsFile})
    fs::copy_file(lora_dir + "/" + f, dir / f);

  const TransformerConfig cfg = io::read_model_config(dir.str());
  const test::GoldenBatch batch = test::golden_batch(golden);
  const int B = batch.B, T = batch.T, valid = batch.valid;
  const std::vector<int32_t>&ids = batch.ids, &targets = batch.targets;

  EngineOptions o;
  o.batch_size = B, o.seq_len = T, o.training = true;
  o.optim = adamw_hyper({std::stof(meta.at("beta1")), std::stof(meta.at("beta2")), std::stof(meta.at("eps")),
                         std::stof(meta.at("weight_decay"))});
  o.lora = lora_config_from_peft(nlohmann::json::parse(io::read_text_file(dir / io::kAdapterConfigFile)),
                                 "adapter_config.json");
  Engine e(cfg, o);
  Decoder& m = e.decoder();
  m.init_weights(0, e.device());
  io::load_model_weights(dir.str(), m, e.device());
  e.device().copy_to_device(e.tokens(0), ids.data(), ids.size() * sizeof(int32_t));
  e.device().copy_to_device(e.targets(0), targets.data(), targets.size() * sizeof(int32_t));

  m.forward(e.ops(), e.tokens(0), nullptr, B, T, 0, false);
  EXPECT_LT(rel_error(test::real_vocab_logits(e.device(), m, size_t(B) * T), read_f32(golden, "logits")),
            1e-4);

  e.device().fill_zero(m.grad_buffer(), m.grad_bytes());
  m.forward(e.ops(), e.tokens(0), e.targets(0), B, T, 1.0f / valid, true);
  const double loss = e.ops().sum(m.losses(), size_t(B) * T) / valid;
  const float want_loss = read_f32(golden, "loss")[0];
  EXPECT_LT(std::fabs(loss - want_loss) / want_loss, 1e-5) << loss << " vs " << want_loss;
  m.backward(e.ops(), e.tokens(0), B, T);
  m.param_store().zero_frozen_grads(e.device());

  // The store keeps gradients and master weights for the adapters alone, packed in layout order.
  ASSERT_TRUE(m.param_store().trainable_only());
  const ParamLayout& packed = m.param_store().optimizer_layout();
  const size_t n = m.layout().total_numel();
  std::vector<float> grads(packed.total_numel()), before(n), after(n);
  e.device().copy_to_host(grads.data(), m.grads(), grads.size() * sizeof(float));
  m.download_weights(e.device(), before.data());
  const float lr = std::stof(meta.at("lr"));
  e.optimizer().step(e.ops(), m.params(), m.grads(), lr, 1, 1.0f);
  m.download_weights(e.device(), after.data());
  size_t factors = 0;
  for (const ParamTensor& t : m.layout().tensors()) {
    if (!t.is_adapter()) {
      EXPECT_EQ(part(after, t), part(before, t)) << "the frozen base moved: " << t.name;
      continue;
    }
    ++factors;
    EXPECT_LT(rel_error(part(grads, packed.get(t.name)), read_f32(golden, "grad." + t.name)), 1e-4)
        << "gradient of " << t.name;
    EXPECT_LT(rel_error(part(after, t), read_f32(golden, "updated." + t.name)), 1e-4) << "updated " << t.name;
  }
  EXPECT_EQ(factors,
            golden.tensors().size() / 2 - 1);  // grad.* and updated.* per factor; input_ids, logits, loss
}

INSTANTIATE_TEST_SUITE_P(Bases, GoldenLora, ::testing::Values("lora_llama_tiny", "lora_gpt2_tiny"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace anvil
