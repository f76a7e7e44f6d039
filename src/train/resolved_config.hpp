// A TrainConfig resolved into the typed values a run works with (DESIGN principle 5): the one place where
// the strings and flags of precision, fp32 matmuls, gradient accumulation type, activation checkpointing,
// optimizer, learning-rate schedule, save strategy and profiled steps are parsed. The engine options, the
// memory search (memory_fit) and the trainer take them from here; a training run resolves its config once,
// after the memory fit has settled it, and hands the typed values to every part of the loop.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "anvil/train_config.hpp"
#include "kernels/split_gemm_plan.hpp"
#include "model/checkpointing.hpp"
#include "optim/lr_schedule.hpp"
#include "optim/optimizer_kind.hpp"
#include "train/engine.hpp"

namespace anvil {

struct ResolvedTrainConfig {
  Precision precision = Precision::FP32;        // fp16 / bf16
  bool half_precision_grads = false;            // grad_accum_dtype: the 16-bit type instead of fp32
  Fp32Matmul fp32_matmul = Fp32Matmul::Native;  // fp32_matmul, else tf32
  CheckpointPolicy checkpointing;               // gradient_checkpointing (_mode, _every); None when off
  OptimizerKind optimizer = OptimizerKind::AdamW;
  LrSchedule lr_schedule = LrSchedule::Linear;
  bool save_checkpoints = true;                 // save_strategy "steps" (false: "no")
  int64_t profile_first = 0, profile_last = 0;  // profile_steps A:B (0, 0: none)
  int world_size = 1;  // processes training together (data parallel); set by the run from its launcher
  // communication_data_type (nullopt: the type backward writes gradients in).
  std::optional<DType> comm_dtype;
  DType backward_grad_dtype = DType::F32;  // backward_grad_dtype, else the gradient type

  // fp16 keeps a loss scaler.
  bool loss_scaling() const { return precision == Precision::FP16; }
  // The type parameter gradients accumulate in.
  DType grad_dtype() const { return half_precision_grads ? precision_dtype(precision) : DType::F32; }
  // fp32 | tf32 | 3xtf32 | bf16 | fp16: the precision as the summary and the MFU figures name it.
  std::string precision_label() const;
};

// Throws anvil::Error naming the value (the parse functions' errors) for settings that TrainConfig::validate
// would refuse.
ResolvedTrainConfig resolve_train_config(const TrainConfig& cfg);

}  // namespace anvil
