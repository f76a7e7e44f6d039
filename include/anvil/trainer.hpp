// The training loop: one call runs a whole training job described by a TrainConfig.
#pragma once
#include <cstdint>
#include <string>

#include "anvil/train_config.hpp"

namespace anvil {

struct TrainSummary {
  int64_t global_step = 0;
  double train_runtime = 0;             // seconds, this process
  double train_samples_per_second = 0;  // sequences per second
  double train_steps_per_second = 0;
  double train_tokens_per_second = 0;
  double train_loss = 0;         // mean loss over the optimizer steps of this run
  double eval_loss = -1;         // last evaluation (-1: none)
  double eval_accuracy = -1;     // classification: last evaluation's accuracy (-1: none)
  double data_wait_seconds = 0;  // time the step loop waited for the loader
  // Several processes: rank 0's device collectives over the run, and the part compute waited for (-1: one
  // process).
  double comm_seconds = -1, comm_exposed_seconds = -1;
  // Optimizer offload (offload_optimizer cpu): rank 0's seconds over the run copying gradients to the host,
  // updating on the CPU and copying the weights back (-1: no offload).
  double offload_grads_down_seconds = -1, offload_update_seconds = -1, offload_weights_up_seconds = -1;
  // NVMe offload: rank 0's bytes read from and written to the swap file, and the seconds its I/O threads
  // spent doing so (the update's seconds above include them, less what overlapped the CPU's work; -1: none).
  double nvme_read_gib = -1, nvme_read_seconds = -1, nvme_write_gib = -1, nvme_write_seconds = -1;
  // Parameter offload to NVMe: the same for the weights' swap file, and the pieces the gathers were served
  // and how many of them the read-ahead had not read in (-1: none).
  double weights_read_gib = -1, weights_read_seconds = -1, weights_write_gib = -1, weights_write_seconds = -1;
  int64_t weight_pieces_served = -1, weight_pieces_on_demand = -1;
  size_t peak_memory_bytes = 0;     // the arena (planned) plus, on CUDA, what the driver reports in use
  size_t planned_memory_bytes = 0;  // the memory plan's total (the arena)
  size_t allocator_peak_bytes = 0;  // the most device memory the device's allocator held at once
  std::string precision;            // fp32 | tf32 | 3xtf32 | bf16 | fp16
  int64_t skipped_steps = 0;        // fp16: steps skipped on gradient overflow (all runs, after a resume)
  double loss_scale = 0;            // fp16: the loss scale at the end (0 otherwise)
  std::string device;
  // CUDA graphs (cuda_graphs): graphs recorded, graph launches, and steps replayed whole from one graph.
  int64_t cuda_graphs_recorded = 0, cuda_graph_launches = 0, cuda_graph_whole_steps = 0;
  std::string last_checkpoint;
  std::string sample;  // generated text (if sample_prompt was set)
  // Data parallelism: this process's rank and the number of processes; only rank 0 reports (its summary
  // holds the world's figures: samples and tokens per second of every rank together).
  int rank = 0;
  int world_size = 1;
};

// Runs training as configured: prints the plan, one progress line per logging step, evaluation and
// checkpoints; writes metrics.jsonl and summary.json into output_dir. Throws anvil::Error on bad input.
TrainSummary train(const TrainConfig& cfg);

}  // namespace anvil
