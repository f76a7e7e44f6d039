#include "train/run_summary.hpp"

#include <algorithm>

namespace anvil {

using json = nlohmann::json;

TrainSummary summarize_run(const RunRecord& r, const TrainConfig& cfg, const Task& task, Engine& e) {
  TrainSummary s;
  const int64_t steps_run = r.total_steps - r.start_step;
  s.global_step = r.total_steps;
  s.train_runtime = r.runtime;
  s.train_steps_per_second = steps_run / r.runtime;
  s.train_samples_per_second = double(steps_run) * cfg.per_device_train_batch_size *
                               cfg.gradient_accumulation_steps * r.world_size / r.runtime;
  s.train_tokens_per_second = task.tokens_per_second(steps_run, r.totals.tokens, r.runtime);
  const int64_t skipped_total = r.scaler ? r.scaler->skipped_steps() : 0;
  s.train_loss = (r.totals.loss_sum + r.loss_sum_before) /
                 double(std::max<int64_t>(1, steps_run + r.steps_before - skipped_total));
  s.precision = r.precision;
  s.skipped_steps = skipped_total;
  s.loss_scale = r.scaler ? r.scaler->scale() : 0.0;
  s.eval_loss = r.eval.loss;
  s.eval_accuracy = r.eval.accuracy;
  s.peak_memory_bytes = std::max(e.plan().total_bytes(), r.totals.peak_driver);
  s.allocator_peak_bytes = e.device().memory_stats().peak_allocated_bytes;
  s.planned_memory_bytes = e.plan().total_bytes();
  s.data_wait_seconds = task.data_wait_seconds();
  if (r.world_size > 1) {
    s.comm_seconds = r.totals.comm_seconds;
    s.comm_exposed_seconds = r.totals.comm_exposed_seconds;
  }
  if (const offload::HostOptimizer* host = e.host_optimizer()) {
    s.offload_grads_down_seconds = host->seconds().grads_down;
    s.offload_update_seconds = host->seconds().update;
    s.offload_weights_up_seconds = host->seconds().weights_up;
    if (const offload::PagedOptimizerState* paged = host->paged()) {
      const offload::SwapFile::Totals t = paged->file().totals();
      constexpr double kGiB = double(size_t(1) << 30);
      s.nvme_read_gib = double(t.read_bytes) / kGiB, s.nvme_read_seconds = t.read_seconds;
      s.nvme_write_gib = double(t.write_bytes) / kGiB, s.nvme_write_seconds = t.write_seconds;
    }
  }
  if (const offload::PagedWeights* pages = e.weight_pages()) {
    const offload::SwapFile::Totals t = pages->file().totals();
    constexpr double kGiB = double(size_t(1) << 30);
    s.weights_read_gib = double(t.read_bytes) / kGiB, s.weights_read_seconds = t.read_seconds;
    s.weights_write_gib = double(t.write_bytes) / kGiB, s.weights_write_seconds = t.write_seconds;
    s.weight_pieces_served = int64_t(pages->counts().served);
    s.weight_pieces_on_demand = int64_t(pages->counts().read_on_demand);
  }
  s.device = e.device().name();
  s.last_checkpoint = r.last_checkpoint;
  s.cuda_graphs_recorded = r.graphs_recorded;
  s.cuda_graph_launches = r.graph_launches;
  s.cuda_graph_whole_steps = r.whole_step_replays;
  return s;
}

json summary_json(const TrainSummary& s, const RunRecord& r, const Task& task, Engine& e) {
  const double flops_per_token = task.flops_per_token(r.totals.tokens, r.totals.flops);
  const PeakFlops& peak = r.peak;
  json by_category = json::object();
  for (int c = 0; c < kMemoryCategories; ++c)
    by_category[memory_category_name(MemoryCategory(c))] = e.plan().bytes(MemoryCategory(c));
  json summary = {
      {"train_runtime", s.train_runtime},
      {"train_samples_per_second", s.train_samples_per_second},
      {"train_steps_per_second", s.train_steps_per_second},
      {"train_tokens_per_second", s.train_tokens_per_second},
      {"train_loss", s.train_loss},
      {"eval_loss", s.eval_loss >= 0 ? json(s.eval_loss) : json(nullptr)},
      {"peak_memory_bytes", s.peak_memory_bytes},
      {"data_wait_seconds", s.data_wait_seconds},
      {"data_wait_fraction", s.data_wait_seconds / r.runtime},
      {"comm_seconds", s.comm_seconds >= 0 ? json(s.comm_seconds) : json(nullptr)},
      {"comm_exposed_seconds", s.comm_exposed_seconds >= 0 ? json(s.comm_exposed_seconds) : json(nullptr)},
      {"offload_seconds", s.offload_update_seconds >= 0 ? json{{"grads_down", s.offload_grads_down_seconds},
                                                               {"update", s.offload_update_seconds},
                                                               {"weights_up", s.offload_weights_up_seconds}}
                                                        : json(nullptr)},
      {"offload_nvme", s.nvme_read_gib >= 0 ? json{{"read_gib", s.nvme_read_gib},
                                                   {"read_seconds", s.nvme_read_seconds},
                                                   {"write_gib", s.nvme_write_gib},
                                                   {"write_seconds", s.nvme_write_seconds}}
                                            : json(nullptr)},
      {"offload_param_nvme", s.weights_read_gib >= 0
                                 ? json{{"read_gib", s.weights_read_gib},
                                        {"read_seconds", s.weights_read_seconds},
                                        {"write_gib", s.weights_write_gib},
                                        {"write_seconds", s.weights_write_seconds},
                                        {"pieces_served", s.weight_pieces_served},
                                        {"pieces_read_on_demand", s.weight_pieces_on_demand}}
                                 : json(nullptr)},
      {"planned_memory_bytes", e.plan().total_bytes()},
      {"planned_memory_by_category", by_category},
      // Memory accounting (docs/memory.md): the allocator's peak vs the plan, the runtime's
      // overhead measured when the device was made, the driver's peak in use (CUDA).
      {"allocator_peak_bytes", s.allocator_peak_bytes},
      {"context_overhead_bytes", e.device().context_overhead_bytes()},
      {"driver_peak_bytes", r.totals.peak_driver},
      {"precision", s.precision},
      {"flops_per_token", flops_per_token},
      {"peak_flops", peak.flops > 0 ? json(peak.flops) : json(nullptr)},
      {"peak_flops_source", peak.source},
      {"mfu", peak.flops > 0 ? json(s.train_tokens_per_second * flops_per_token / (peak.flops * r.world_size))
                             : json(nullptr)},
      {"world_size", r.world_size},
      {"skipped_steps", s.skipped_steps},
      {"loss_scale", r.scaler ? json(s.loss_scale) : json(nullptr)},
      {"global_step", s.global_step},
      {"cuda_graphs",
       {{"recorded", s.cuda_graphs_recorded},
        {"launches", s.cuda_graph_launches},
        {"whole_step_replays", s.cuda_graph_whole_steps}}},
      {"device", s.device},
      {"last_checkpoint", s.last_checkpoint}};
  task.add_summary(summary, s);
  return summary;
}

}  // namespace anvil
