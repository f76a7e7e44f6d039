#include "optim/optimizer_kind.hpp"

#include "anvil/error.hpp"

namespace anvil {

const char* optimizer_name(OptimizerKind o) {
  switch (o) {
    case OptimizerKind::AdamW:
      return "adamw_torch_fused";
    case OptimizerKind::Adafactor:
      return "adafactor";
    case OptimizerKind::AdamW8bit:
      return "adamw_8bit";
    case OptimizerKind::SGD:
      return "sgd";
  }
  return "?";
}

OptimizerKind parse_optimizer(const std::string& name) {
  if (name == "adamw_torch" || name == "adamw_torch_fused" || name == "adamw_hf" || name == "adamw" ||
      name == "adamw_apex_fused")
    return OptimizerKind::AdamW;
  if (name == "adafactor") return OptimizerKind::Adafactor;
  if (name == "adamw_8bit" || name == "adamw_bnb_8bit") return OptimizerKind::AdamW8bit;
  if (name == "sgd") return OptimizerKind::SGD;
  ANVIL_REQUIRE(name.rfind("paged_", 0) != 0,
                "optim '{}': paged optimizers are not supported (Anvil plans optimizer state up front; use "
                "adamw_8bit, or adafactor for the least state)",
                name);
  ANVIL_THROW(
      "optim must be one of adamw_torch_fused (also adamw_torch, adamw_hf, adamw), adafactor, adamw_8bit "
      "(also adamw_bnb_8bit), sgd; got '{}'",
      name);
}

}  // namespace anvil
