// Everything one device needs to run a model: the device, its ops, the memory plan and the arena
// carved from it, the model of the config's family and (for training) the optimizer, plus the family's
// double-buffered input buffers.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "anvil/train_config.hpp"
#include "kernels/ops.hpp"
#include "model/bert_model.hpp"
#include "model/decoder.hpp"
#include "model/model.hpp"
#include "offload/host_optimizer.hpp"
#include "optim/adamw.hpp"
#include "optim/optimizer.hpp"
#include "runtime/arena.hpp"

namespace anvil {

// How weights and activations are stored: fp32 (TF32 and 3xTF32 are GEMM modes over fp32 storage, see
// EngineOptions::fp32_matmul), or bf16 / fp16 mixed precision with fp32 master weights.
enum class Precision { FP32, BF16, FP16 };
const char* precision_name(Precision p);
DType precision_dtype(Precision p);

struct EngineOptions;
OpsPrecision ops_precision(const EngineOptions& o);

struct EngineOptions {
  DeviceKind device = DeviceKind::CPU;
  int batch_size = 1;
  int seq_len = 1;
  bool training = false;
  // How fp32 GEMMs run on CUDA (the CPU always computes native fp32); 3xTF32 plans a split scratch buffer.
  Fp32Matmul fp32_matmul = Fp32Matmul::Native;
  GemmTuningOptions gemm_tuning;  // CUDA only
  Precision precision = Precision::FP32;
  // Parameter gradients in the 16-bit compute type instead of fp32 (DeepSpeed's grad_accum_dtype): half
  // the gradient memory, at the cost of accumulation precision.
  bool half_precision_grads = false;
  OptimizerKind optimizer = OptimizerKind::AdamW;
  CheckpointPolicy checkpointing;
  OptimizerHyper optim;
  // Gradients in the memory of activations backward is done with (Model::grads_share_activations): for
  // runs of one micro-batch per step, where no gradient outlives its step; BERT only.
  bool share_grad_memory = false;
  // ZeRO (dist/zero_partition.hpp): with stage >= 1 this process is rank `zero_rank` of `zero_world` and
  // keeps that rank's shard of the fp32 master weights and of the optimizer state, with stage >= 2 also of
  // the gradients kept for the optimizer where the model writes gradients by unit (Model::grads_by_unit;
  // ParamStore::set_grad_shard) (-1: plan the largest shard's memory, the same on every rank).
  int zero_stage = 0;
  int zero_world = 1, zero_rank = 0;
  // Data parallelism (several processes): the type the gradients are reduced in (communication_data_type;
  // ParamStore::set_comm_type). One process: the gradient type (nothing is reduced).
  std::optional<DType> comm_dtype;
  // ZeRO stages 2-3 (several processes): the 16-bit compute type when backward writes the unit gradients in
  // it (backward_grad_dtype; ParamStore::set_grad_shard); nullopt: the gradient type.
  std::optional<DType> unit_grad_dtype;
  // Training: glob patterns of the tensors to freeze (freeze_parameters; ParamStore::freeze). Empty: all
  // train.
  std::vector<std::string> freeze;
  // Inference: the block Linear weights kept quantized (int8 / NF4; quantize_model); Compute: none.
  WeightStorage weight_storage = WeightStorage::Compute;
  // LoRA adapters (lora_r > 0): the model is made with them and only they train (peft/lora_config.hpp).
  LoraConfig lora;
  // LoRA where nothing shards the layout (no ZeRO stage) and every adapter trains: the store keeps master
  // weights and gradients for the adapters alone (ParamStore::keep_trainable_only). False keeps them for
  // every tensor, as ZeRO stages 1-3 do (tests compare the two).
  bool trainable_only_store = true;
  // Optimizer offload (offload_optimizer cpu; full training; under ZeRO each rank its shard): the fp32 master
  // weights and the optimizer state in host memory, the update on the CPU (offload::HostOptimizer); none of
  // them planned on the device. Under ZeRO-2/3 with gradients by unit (decoders) the shard's gradients too
  // (ParamStore::set_grads_on_host); stages 2 and 3 then run with one process as well.
  bool offload_optimizer = false;
  // Parameter offload (offload_param cpu; ZeRO stage 3 with offload_optimizer): the shard of the compute-type
  // weights in pinned host memory (ParamStore::set_weights_on_host), gathered from there.
  bool offload_param = false;
  // NVMe offload (offload_optimizer nvme): with optimizer offload, the optimizer state in a swap file
  // (offload::PagedOptimizerState) instead of host memory.
  std::optional<offload::NvmeOptions> nvme;
  // Parameter offload to NVMe (offload_param nvme; with offload_param): the weight shard in a swap file
  // (offload::PagedWeights) paged through `param_nvme_buffers` pinned buffers, instead of host memory.
  std::optional<offload::NvmeOptions> param_nvme;
  int param_nvme_buffers = offload::PagedWeights::kDefaultBuffers;
};

// The shard of the flat buffer this engine's optimizer and master weights cover under ZeRO (nullopt: the
// whole buffer).
std::optional<ParamRange> zero_shard(const EngineOptions& o, const ParamLayout& layout);
// Whether the store of a model with `layout` (its freezing applied) keeps master weights and gradients for
// the trainable tensors only (EngineOptions::trainable_only_store): LoRA without ZeRO shards, every adapter
// trainable and nothing else (freeze_parameters that froze an adapter keeps the whole layout's).
bool keeps_trainable_only(const EngineOptions& o, const ParamLayout& layout);

// The engine a training run of `cfg` uses (also what `anvil estimate` plans, so the two agree exactly):
// the device, the larger of the train and (with val_data) eval batch, the sequence length (cfg.seq_len():
// for a classification run, resolve_classification_data() has fixed it from the data), TF32,
// checkpointing and optimizer settings. The second form takes the device kind as given (planning for a
// device that is not here).
EngineOptions training_engine_options(const TrainConfig& cfg);
EngineOptions training_engine_options(const TrainConfig& cfg, DeviceKind device);

// The optimizer hyper-parameters of a config (optim and its keys).
OptimizerHyper optimizer_hyper(const TrainConfig& cfg);
// The LoRA settings of a training config (lora_r, lora_alpha, lora_dropout, use_rslora,
// lora_target_modules).
LoraConfig lora_config(const TrainConfig& cfg);

// Resolves "auto" | "cpu" | "cuda" to a device kind ("auto": CUDA when a GPU is visible).
DeviceKind resolve_device(const std::string& name);

// The memory plan of a run, without a device and without allocating anything (what `anvil estimate`
// prints and what Engine allocates).
MemoryPlan plan_engine_memory(const TransformerConfig& cfg, const EngineOptions& o);
// Optimizer offload: the host memory the run holds for it (offload::HostOptimizer::plan_host_memory);
// none without offload.
std::optional<MemoryPlan> host_optimizer_plan(const TransformerConfig& cfg, const EngineOptions& o);
// NVMe offload: the swap file and sub-groups of the largest shard; none without it.
std::optional<offload::PagedOptimizerState::Sizes> nvme_swap_sizes(const TransformerConfig& cfg,
                                                                   const EngineOptions& o);
// Parameter offload to NVMe: the weights' swap file and buffers of the largest shard; none without it.
std::optional<offload::PagedWeights::Sizes> weight_pages_sizes(const TransformerConfig& cfg,
                                                               const EngineOptions& o);

// The scalars of one training step, kept in device memory so that the step needs no host read before its
// end (the trainer reads the whole struct once, after the step's final synchronisation). Filled by the
// device-result reductions of Ops (accumulate_sum, sum_squares_to, grad_clip_scale).
struct StepScalars {
  double loss_sum = 0;          // sum of the per-token losses of all the step's micro-batches
  double grad_sum_squares = 0;  // sum of squares of the stored gradients (their loss scale included)
  double grad_norm = 0;         // the global norm of the true gradient (stored ones x unscale)
  float grad_scale = 0;         // the optimizer's gradient multiplier: clip factor x unscale
};

// Input buffers per slot (two slots, so the next batch's copy overlaps this batch's compute), by family:
//   gpt2: "input tokens s" [B, T] and "target tokens s" [B, T] (int32)
//   bert: "input tokens s" [B, T], "sequence lengths s" [B] (int32) and "labels s" [B] (int32 class ids, or
//         fp32 targets for regression). No token-type buffer: classification shards hold single texts, so
//         every token type is 0, which BertModel reads from a null pointer without memory.
// B and T are the planned maxima (EngineOptions); a batch of B' x T' <= B x T uses the first B' x T' elements
// of each buffer, row-major.
class Engine {
 public:
  // Makes the device of `o.device`, plans, and allocates the arena. Throws anvil::Error, before
  // allocating, when the plan does not fit in the device's available memory (where it is known).
  Engine(const TransformerConfig& cfg, const EngineOptions& o);
  // The same on a device made by the caller (of kind o.device).
  Engine(const TransformerConfig& cfg, const EngineOptions& o, std::unique_ptr<Device> device);

  Device& device() { return *device_; }
  // The model's ops (forward, backward, evaluation): gradients in the type backward writes.
  Ops& ops() { return *ops_; }
  // The optimizer update's ops: gradients in the type they are kept in for the optimizer. The same as ops()
  // unless backward writes 16-bit unit gradients for fp32 ones (backward_grad_dtype).
  Ops& update_ops() { return update_ops_ ? *update_ops_ : *ops_; }
  // The model, through the family-independent interface.
  Model& model() { return *model_; }
  // The model as its family's class; an anvil::Error naming both families when it is of the other one
  // (e.g. `anvil generate` given a BERT classifier).
  Decoder& decoder();
  BertModel& bert();
  bool is_bert() const { return model_->config().is_bert(); }
  // The optimizer: on the device, or the host optimizer's (offload_optimizer), whose state is host memory.
  Optimizer& optimizer() { return host_ ? host_->optimizer() : *optimizer_; }
  // The device the optimizer's state lives on: device(), or the host optimizer's CPU device (checkpoints
  // copy the state through it).
  Device& optimizer_device() { return host_ ? host_->host_device() : *device_; }
  // The optimizer's state for checkpoints, read and written through optimizer_device(): the optimizer
  // itself, or (NVMe offload) its sub-groups mapped from the swap file while the result lives.
  OptimizerStateParts optimizer_state(bool writable) {
    return host_ ? host_->state_parts(writable) : OptimizerStateParts(*optimizer_);
  }
  // The host optimizer (offload_optimizer), or null.
  offload::HostOptimizer* host_optimizer() { return host_.get(); }
  // The weights paged from NVMe (offload_param nvme), or null.
  const offload::PagedWeights* weight_pages() const { return weight_pages_.get(); }
  bool training() const { return optimizer_ != nullptr || host_ != nullptr; }
  const MemoryPlan& plan() const { return arena_->plan(); }
  // The input buffers of `slot` (see above); targets() is GPT-2's, lengths() and labels() BERT's.
  int32_t* tokens(int slot) const { return arena_->get<int32_t>(i_tokens_[slot]); }
  int32_t* targets(int slot) const;
  int32_t* lengths(int slot) const;
  void* labels(int slot) const;
  // The inputs of a B x T batch held in `slot`, for Model::forward / backward; without `with_loss`, no
  // targets / labels (logits only).
  ModelInputs inputs(int slot, int B, int T, bool with_loss = true) const;
  // The step's scalars in device memory (training engines only; a planned buffer like every other). The
  // host may form pointers to the members (&step_scalars()->loss_sum) but reads them only by copying.
  StepScalars* step_scalars() const;
  // The step's values (kernels/step_values.hpp) in device memory, and their pinned host copy: the trainer
  // writes the host copy before a step and queues upload_step_values() at the step's head, so kernels (and
  // a graph replaying the step) read this step's learning rate, bias terms, seeds and unscale factor. The
  // host copy may only be rewritten once the previous step's upload has run (the trainer synchronises at
  // the end of every step).
  StepValues* step_values() const;
  StepValues& step_values_host();
  void upload_step_values();
  // Training with dropout (Model::dropout_state non-null): the pinned host copy of the dropout state, and its
  // upload on the compute stream (queued; a graph records it), as for the step values.
  bool has_dropout() const { return dropout_host_ != nullptr; }
  DropoutState& dropout_state_host();
  void upload_dropout_state();

 private:
  std::unique_ptr<Device> device_;
  std::unique_ptr<Ops> ops_, update_ops_;
  std::unique_ptr<offload::PagedWeights> weight_pages_;  // offload_param nvme: the store's weights
  std::unique_ptr<Model> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<offload::HostOptimizer> host_;
  std::unique_ptr<Arena> arena_;
  // Plan indices of the input buffers (see above); SIZE_MAX where the family has none.
  size_t i_tokens_[2] = {0, 0}, i_targets_[2] = {SIZE_MAX, SIZE_MAX}, i_lengths_[2] = {SIZE_MAX, SIZE_MAX},
         i_labels_[2] = {SIZE_MAX, SIZE_MAX};
  size_t i_step_scalars_ = 0, i_step_values_ = 0;
  std::unique_ptr<PinnedBuffer> step_values_host_, dropout_host_;
};

}  // namespace anvil
