// The start-up header of a training run: what is trained on what device, the task's model, data and batch
// lines, then activation checkpointing, precision, dropout, the CUDA attention path and graph mode, the
// optimizer and the memory plan (DESIGN principle 5: every derived value printed at start).
#pragma once
#include <cstdint>
#include <string>

#include "anvil/train_config.hpp"
#include "precision/loss_scaler.hpp"
#include "train/engine.hpp"
#include "train/resolved_config.hpp"
#include "train/task.hpp"

namespace anvil {

struct RunHeader {
  const TrainConfig& cfg;
  const ResolvedTrainConfig& rc;
  const TransformerConfig& model;
  const std::string& weights_from;  // "" for a fresh initialisation
  int64_t start_step = 0, total_steps = 0;
  const LossScaler* scaler = nullptr;  // fp16
};

void print_run_header(const RunHeader& h, const Task& task, Engine& e);

}  // namespace anvil
