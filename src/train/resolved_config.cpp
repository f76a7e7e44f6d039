#include "train/resolved_config.hpp"

#include "anvil/error.hpp"

namespace anvil {

std::string ResolvedTrainConfig::precision_label() const {
  return precision == Precision::FP32 ? fp32_matmul_name(fp32_matmul) : precision_name(precision);
}

ResolvedTrainConfig resolve_train_config(const TrainConfig& cfg) {
  ResolvedTrainConfig r;
  r.precision = cfg.bf16 ? Precision::BF16 : cfg.fp16 ? Precision::FP16 : Precision::FP32;
  r.half_precision_grads = cfg.grad_accum_dtype != "fp32";
  r.fp32_matmul = parse_fp32_matmul(cfg.fp32_matmul_mode());
  if (cfg.gradient_checkpointing)
    r.checkpointing = {parse_checkpoint_mode(cfg.gradient_checkpointing_mode),
                       cfg.gradient_checkpointing_every};
  r.optimizer = parse_optimizer(cfg.optim);
  r.lr_schedule = parse_lr_schedule(cfg.lr_scheduler_type);
  r.save_checkpoints = cfg.save_strategy != "no";
  std::tie(r.profile_first, r.profile_last) = cfg.profile_range();
  // The gradient type keys, by name ("" is their default, the caller's).
  auto dtype = [](const char* key, const std::string& name) {
    ANVIL_REQUIRE(name == "fp32" || name == "bf16" || name == "fp16",
                  "{} must be fp32, bf16 or fp16, got '{}'", key, name);
    return name == "fp32" ? DType::F32 : name == "bf16" ? DType::BF16 : DType::F16;
  };
  if (!cfg.communication_data_type.empty())
    r.comm_dtype = dtype("communication_data_type", cfg.communication_data_type);
  r.backward_grad_dtype = cfg.backward_grad_dtype.empty()
                              ? r.grad_dtype()
                              : dtype("backward_grad_dtype", cfg.backward_grad_dtype);
  return r;
}

}  // namespace anvil
