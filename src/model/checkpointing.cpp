#include "model/checkpointing.hpp"

#include "anvil/error.hpp"

namespace anvil {

CheckpointMode parse_checkpoint_mode(std::string_view name) {
  if (name == "full") return CheckpointMode::Full;
  if (name == "selective") return CheckpointMode::Selective;
  ANVIL_THROW("gradient_checkpointing_mode '{}' is not supported (full, selective)", name);
}

std::string checkpoint_mode_name(CheckpointMode m) {
  switch (m) {
    case CheckpointMode::None:
      return "none";
    case CheckpointMode::Full:
      return "full";
    case CheckpointMode::Selective:
      return "selective";
  }
  return "?";
}

}  // namespace anvil
