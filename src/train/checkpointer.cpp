#include "train/checkpointer.hpp"

#include <filesystem>

#include "io/checkpoint.hpp"
#include "train/zero_checkpoint.hpp"

namespace anvil {

Checkpointer::Checkpointer(const TrainConfig& cfg, const ResolvedTrainConfig& rc, Engine& e,
                           RunDirectory* dir, std::string tokenizer_file, dist::ProcessGroup* group,
                           const dist::ZeroSync* zero)
    : cfg_(cfg),
      enabled_(rc.save_checkpoints && (dir != nullptr || zero != nullptr)),
      world_size_(rc.world_size),
      e_(e),
      dir_(dir),
      group_(group),
      zero_(zero),
      tokenizer_file_(std::move(tokenizer_file)),
      base_(enabled_ ? checkpoint_base(cfg, e) : std::nullopt) {
  ANVIL_ASSERT(!zero || group, "a ZeRO checkpointer needs the process group");
  if (zero) slices_ = zero_state_slices(e.optimizer(), zero->partition(), group->comm().rank());
}

bool Checkpointer::due(int64_t step, int64_t total_steps) const {
  return enabled_ && ((cfg_.save_steps > 0 && step % cfg_.save_steps == 0) || step == total_steps);
}

void Checkpointer::save(const TrainingState& s) {
  nlohmann::json state = {{"global_step", s.step},
                          {"total_steps", s.total_steps},
                          {"loader", {{"epoch", s.loader.epoch}, {"batch", s.loader.batch}}},
                          {"rng_state", s.rng_state},
                          {"train_loss_sum", s.loss_sum},
                          {"train_loss_steps", s.loss_steps},
                          {"lr_scheduler_type", cfg_.lr_scheduler_type},
                          {"learning_rate", cfg_.learning_rate},
                          {"warmup_steps", cfg_.warmup_steps},
                          {"world_size", world_size_},
                          {"zero_stage", zero_ ? zero_->stage() : 0},
                          {"config", cfg_.to_json()}};
  if (s.scaler) state["loss_scaler"] = s.scaler->state();
  const std::string dir =
      (std::filesystem::path(cfg_.output_dir) / ("checkpoint-" + std::to_string(s.step))).string();
  if (zero_) {
    save_zero_checkpoint(dir, e_, *group_, slices_, state, tokenizer_file_, base_ ? &*base_ : nullptr);
    if (!dir_) {  // rank 0 reports and rotates
      last_ = dir;
      return;
    }
  } else {
    io::save_checkpoint(dir, e_.model(), e_.optimizer_state(false), state, tokenizer_file_, e_.device(),
                        &e_.optimizer_device(), base_ ? &*base_ : nullptr);
  }
  if (base_)
    fmt::print("saved checkpoint {} (the adapter; its base: {})\n", dir, base_->dir);
  else
    fmt::print("saved checkpoint {}\n", dir);
  for (const std::string& old : dir_->rotate_checkpoints(dir))
    fmt::print("deleted checkpoint {} (save_total_limit {})\n", old, cfg_.save_total_limit);
  last_ = dir;
}

std::optional<io::BaseReference> checkpoint_base(const TrainConfig& cfg, Engine& e) {
  const Model& m = e.model();
  if (cfg.save_base_model || !m.layout().lora().enabled() || !m.param_store().trainable_only())
    return std::nullopt;
  const std::string& from = !cfg.resume_from_checkpoint.empty() ? cfg.resume_from_checkpoint : cfg.init_from;
  if (from.empty()) return std::nullopt;  // a random base
  if (const std::optional<std::string> base = io::referenced_base(from)) return io::describe_base(*base);
  if (std::filesystem::exists(std::filesystem::path(from) / "trainer_state.json")) return std::nullopt;
  return io::describe_base(from);
}

}  // namespace anvil
