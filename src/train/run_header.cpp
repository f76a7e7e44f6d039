#include "train/run_header.hpp"

#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "io/atomic_dir.hpp"
#include "model/freeze.hpp"
#include "train/deepspeed_config.hpp"

namespace anvil {

namespace {
// A compute type as the config spells it (--bf16, --fp16, fp32).
const char* type_name(DType t) {
  return t == DType::BF16 ? "bf16" : t == DType::F16 ? "fp16" : "fp32";
}

std::string precision_description(const RunHeader& h, DeviceKind device) {
  const ResolvedTrainConfig& rc = h.rc;
  if (rc.precision == Precision::FP32) {
    const bool cuda = device == DeviceKind::CUDA;
    if (rc.fp32_matmul == Fp32Matmul::TF32)
      return cuda ? "fp32 storage, TF32 matmuls" : "fp32 (TF32 applies on CUDA only)";
    if (rc.fp32_matmul == Fp32Matmul::TF32x3)
      return cuda ? "fp32 storage, 3xTF32 matmuls (fp32-accurate on the TF32 tensor cores)"
                  : "fp32 (3xTF32 applies on CUDA only)";
    return "fp32";
  }
  std::string d = fmt::format(
      "{} weights and activations, fp32 master weights and optimizer states, {} gradients",
      precision_name(rc.precision), rc.half_precision_grads ? precision_name(rc.precision) : "fp32");
  if (h.cfg.stochastic_rounding) d += ", stochastic rounding of the weights";
  if (const LossScaler* s = h.scaler)
    d += s->dynamic() ? fmt::format("; dynamic loss scale from {} (window {}, hysteresis {}, min {})",
                                    format_loss_scale(s->scale()), h.cfg.loss_scale_window, h.cfg.hysteresis,
                                    format_loss_scale(h.cfg.min_loss_scale))
                      : fmt::format("; static loss scale {}", format_loss_scale(s->scale()));
  return d;
}

// Which attention path the shapes and build take, and how CUDA graphs replay the step (performance.md).
void print_cuda_paths(const RunHeader& h, Engine& e) {
  const TransformerConfig& m = h.model;
  const bool attention_dropout = e.has_dropout() && m.attention_probs_dropout_prob > 0;
  fmt::print("  attention: {}\n",
             cuda_attention_path(e.ops().precision().compute, m.head_size(), attention_dropout));
  fmt::print("  cuda graphs: {}\n",
             !h.cfg.cuda_graphs ? "off (--cuda_graphs false)"
             : e.weight_pages()
                 ? "off (offload_param nvme: the host reads the weights from their swap file as the step is "
                   "queued)"
             : e.host_optimizer()
                 ? "on (micro-batches and the gradient norm replayed as graphs; the offloaded update runs on "
                   "the host)"
             : h.cfg.gradient_accumulation_steps == 1 && !h.scaler
                 ? "on (each step replayed whole from one graph)"
             : h.scaler ? "on (micro-batches, gradient norm and update replayed as graphs; the fp16 loss "
                          "scaler decides between the last two)"
                        : "on (each micro-batch replayed from a graph, then the step's tail from one)");
}

}  // namespace

void print_run_header(const RunHeader& h, const Task& task, Engine& e) {
  const TrainConfig& cfg = h.cfg;
  const TransformerConfig& m = h.model;
  Device& dev = e.device();
  // A preset with fresh weights by its name, with the family first unless the name says it ("gpt2 d12",
  // "llama-tiny", "bert-base").
  const std::string& preset = cfg.model_preset;
  const std::string model_name =
      !preset.empty() && h.weights_from.empty()
          ? (preset.starts_with(m.family) ? preset : m.family + " " + preset)
          : m.family + (h.weights_from.empty() ? " (custom shape)" : " from " + h.weights_from);
  fmt::print("anvil train: {} on {}\n", model_name, dev.name());
  task.print_header(h.total_steps,
                    h.start_step ? fmt::format("resuming at {}", h.start_step) : std::string("from scratch"));
  if (h.rc.checkpointing.mode != CheckpointMode::None)
    fmt::print("  activation checkpointing: {} every {} block(s)\n",
               checkpoint_mode_name(h.rc.checkpointing.mode), h.rc.checkpointing.every);
  fmt::print("  precision: {}\n", precision_description(h, dev.kind()));
  if (e.has_dropout())
    fmt::print("  dropout: hidden {}, attention probabilities {}, classifier {}\n", m.hidden_dropout_prob,
               m.attention_probs_dropout_prob, m.classifier_dropout_prob());
  if (dev.kind() == DeviceKind::CUDA) print_cuda_paths(h, e);
  const ParamLayout& layout = e.model().layout();
  if (layout.lora().enabled()) {
    const LoraConfig& l = layout.lora();
    const FrozenCount f = count_frozen(layout);
    const size_t all = layout.total_numel();
    // PEFT's print_trainable_parameters: the adapters against every parameter, adapters included.
    fmt::print(
        "  LoRA: r {}, lora_alpha {} (scale {:.4g}), {} modules ({}); trainable {} of {} parameters "
        "({:.4f}%)\n",
        l.r, l.alpha, l.scale(), layout.lora_modules().size(), fmt::join(lora_targets(l, m.family), ", "),
        all - f.numel, all, 100.0 * double(all - f.numel) / double(all));
    const ParamStore& store = e.model().param_store();
    if (const QuantizedWeights* q = store.quantized())
      fmt::print(
          "  frozen base (QLoRA): {} block matrices as {} ({}), the rest in the {} weights; master "
          "weights, gradients and optimizer state for the adapters\n",
          q->matrices(), weight_storage_name(q->storage()), format_bytes(q->quantized_bytes()),
          type_name(store.precision().compute));
    else if (store.trainable_only())
      fmt::print(
          "  frozen base: in the {} weights only{} (master weights, gradients and optimizer state for the "
          "adapters)\n",
          type_name(store.precision().compute), store.weights_sharded() ? ", this rank's shard" : "");
    else
      fmt::print(
          "  frozen base: master weights and gradients planned for every tensor (freeze_parameters "
          "freezes adapters too)\n");
  } else if (e.model().param_store().has_frozen()) {
    const FrozenCount f = count_frozen(layout);
    const size_t all = layout.total_numel();
    fmt::print("  frozen (freeze_parameters): {} tensors, {} of {} parameters; {} train\n", f.tensors,
               f.numel, all, all - f.numel);
  }
  offload::HostOptimizer* host = e.host_optimizer();
  if (const offload::PagedOptimizerState* paged = host ? host->paged() : nullptr)
    fmt::print(
        "  optimizer: {} ({} of state), offloaded (offload_optimizer nvme): the state in a {} swap file in "
        "{} "
        "({}), {} sub-group(s) of at most {} parameters, {} of them in {} of host swap buffers; master "
        "weights in "
        "host memory ({} in all), {} of pinned staging, updated by the CPU\n",
        optimizer_name(e.optimizer().kind()), format_bytes(e.optimizer().state_bytes()),
        format_bytes(paged->size().file_bytes), paged->file().dir(),
        paged->file().direct() ? "direct I/O" : "buffered I/O: the filesystem refuses O_DIRECT",
        paged->size().groups, cfg.sub_group_size, paged->size().buffers,
        format_bytes(paged->size().buffers * paged->size().buffer_bytes),
        format_bytes(host->host_plan().total_bytes()), format_bytes(host->staging_bytes()));
  else if (host)
    fmt::print(
        "  optimizer: {} ({} of state), offloaded (offload_optimizer cpu): master weights and state in {} of "
        "host memory, {} of pinned staging, updated by the CPU\n",
        optimizer_name(e.optimizer().kind()), format_bytes(e.optimizer().state_bytes()),
        format_bytes(host->host_plan().total_bytes()), format_bytes(host->staging_bytes()));
  else
    fmt::print("  optimizer: {} ({} of state)\n", optimizer_name(e.optimizer().kind()),
               format_bytes(e.optimizer().state_bytes()));
  if (const offload::PagedWeights* pages = e.weight_pages())
    fmt::print(
        "  weights: offloaded (offload_param nvme): this rank's shard in a {} swap file in {} ({}), paged "
        "through {} pinned buffers of {}, read ahead in the order of the gathers\n",
        format_bytes(pages->size().file_bytes), pages->file().dir(),
        pages->file().direct() ? "direct I/O" : "buffered I/O: the filesystem refuses O_DIRECT",
        pages->size().buffers, format_bytes(pages->size().buffer_bytes));
  if (e.optimizer().kind() == OptimizerKind::Adafactor && cfg.adafactor_relative_step)
    fmt::print(
        "  adafactor_relative_step: Adafactor sets its own step size (HF semantics); the lr column shows the "
        "schedule, which it ignores\n");
  if (!cfg.deepspeed.empty()) {
    // Every key of the DeepSpeed config, with the value it resolved to ("auto" included).
    fmt::print("  deepspeed {}:\n", cfg.deepspeed);
    const nlohmann::json ds = nlohmann::json::parse(io::read_text_file(cfg.deepspeed));
    for (const std::string& line : deepspeed_resolution(ds, cfg)) fmt::print("    {}\n", line);
  }
  fmt::print("  memory plan ({}):\n{}", device_name(dev.kind()), e.plan().report());
}

}  // namespace anvil
