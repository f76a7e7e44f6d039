#include "model/model.hpp"

#include "model/bert_model.hpp"
#include "model/decoder.hpp"

namespace anvil {

std::unique_ptr<Model> make_model(const TransformerConfig& cfg, int max_batch, int max_seq, bool training,
                                  CheckpointPolicy checkpointing, OpsPrecision precision,
                                  bool share_grad_memory, const LoraConfig& lora) {
  cfg.validate();  // names an unknown family before either constructor sees it
  validate_lora_config(lora);
  if (cfg.is_bert()) {
    ANVIL_REQUIRE(!lora.enabled(),
                  "LoRA (lora_r {}) is for the decoder families (gpt2, llama, qwen2, mistral) for now, not "
                  "bert; fine-tune the BERT classifier whole, or freeze its encoder (freeze_parameters)",
                  lora.r);
    return std::make_unique<BertModel>(cfg, max_batch, max_seq, training, checkpointing, precision,
                                       share_grad_memory);
  }
  return std::make_unique<Decoder>(cfg, max_batch, max_seq, training, checkpointing, precision, lora);
}

void quantize_model(Model& model, WeightStorage s) {
  if (s == WeightStorage::Compute) return;
  const char* name = weight_storage_name(s);
  ANVIL_REQUIRE(!model.config().is_bert(),
                "quantized weights ({}) are for the decoder families (gpt2, llama, qwen2, mistral), not {}",
                name, model.config().family);
  ANVIL_REQUIRE(
      !model.param_store().training() || model.param_store().trainable_only(),
      "quantized weights ({}) are for inference (anvil generate, anvil logits) or the frozen base of "
      "LoRA adapters (QLoRA: lora_r > 0, zero_stage 0-2, every adapter training); train the model "
      "itself in bf16 instead",
      name);
  model.param_store().quantize(s);
}

}  // namespace anvil
