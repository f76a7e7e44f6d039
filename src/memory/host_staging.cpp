#include "memory/host_staging.hpp"

#include <fmt/format.h>

#include "data/prefetch_ring.hpp"

namespace anvil {
namespace {

// Batches each loader assembles ahead (the tasks' LoaderConfig::prefetch: causal_lm_task.cpp,
// classification_task.cpp); the ring holds PrefetchRing::slots of them.
constexpr int kTrainPrefetch = 4;
constexpr int kEvalPrefetch = 2;

// A loader's staging: every slot holds one batch of `ints_per_batch` int32 (DataLoader: inputs and targets;
// ClassificationLoader: ids, lengths and labels).
HostBuffer loader(const std::string& what, int prefetch, size_t ints_per_batch, const std::string& batch,
                  bool pinned) {
  const size_t slots = data::PrefetchRing::slots(prefetch);
  return {fmt::format("{} loader staging ({} slots x {})", what, slots, batch),
          slots * ints_per_batch * sizeof(int32_t), pinned};
}

}  // namespace

size_t HostStaging::pinned_bytes() const {
  size_t s = 0;
  for (const HostBuffer& b : buffers) s += b.pinned ? b.bytes : 0;
  return s;
}

size_t HostStaging::total_bytes() const {
  size_t s = 0;
  for (const HostBuffer& b : buffers) s += b.bytes;
  return s;
}

HostStaging host_staging_per_process(const TrainConfig& cfg, const TransformerConfig& model,
                                     const MemoryPlan& plan, const MemoryPlan* host_optimizer) {
  HostStaging h;
  const bool pin = cfg.dataloader_pin_memory;
  const size_t T = size_t(cfg.seq_len());
  auto add_loader = [&](const char* what, int prefetch, int batch) {
    const size_t B = size_t(batch);
    if (model.is_bert())
      h.buffers.push_back(
          loader(what, prefetch, B * T + 2 * B, fmt::format("{} x {} ids + lengths + labels", B, T), pin));
    else
      h.buffers.push_back(
          loader(what, prefetch, 2 * B * T, fmt::format("{} x {} tokens, inputs + targets", B, T), pin));
  };
  add_loader("train", kTrainPrefetch, cfg.per_device_train_batch_size);
  if (!cfg.val_data.empty()) add_loader("eval", kEvalPrefetch, cfg.eval_batch_size());
  // The engine keeps a pinned host copy of these device buffers and uploads it before each step.
  for (const PlannedBuffer& b : plan.buffers())
    if (b.name == "step values" || b.name == "dropout state")
      h.buffers.push_back({b.name + " (host copy)", b.bytes, true});
  if (host_optimizer)
    for (const PlannedBuffer& b : host_optimizer->buffers())
      h.buffers.push_back(
          {"optimizer offload: " + b.name, b.bytes, b.name.find("pinned") != std::string::npos});
  return h;
}

}  // namespace anvil
