// The optimizer a run asks for, by Hugging Face TrainingArguments `optim` name. Apart from the optimizers
// themselves (optimizer.hpp) so that config parsing (TrainConfig, DeepSpeed import) needs no kernels.
#pragma once
#include <string>

namespace anvil {

// HF TrainingArguments `optim` values (and aliases) map to these.
enum class OptimizerKind { AdamW, Adafactor, AdamW8bit, SGD };
// The canonical name: adamw_torch_fused | adafactor | adamw_8bit | sgd.
const char* optimizer_name(OptimizerKind o);
// HF names: adamw_torch, adamw_torch_fused, adamw_hf, adamw (AdamW); adafactor; adamw_8bit, adamw_bnb_8bit,
// paged_adamw_8bit is refused (no paging); sgd. Errors name the value and list the accepted ones.
OptimizerKind parse_optimizer(const std::string& name);

}  // namespace anvil
