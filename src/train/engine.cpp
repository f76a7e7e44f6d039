#include "train/engine.hpp"

#include <algorithm>

#include "dist/dist_env.hpp"
#include "dist/zero_partition.hpp"
#include "model/freeze.hpp"
#include "train/resolved_config.hpp"

namespace anvil {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::FP32:
      return "fp32";
    case Precision::BF16:
      return "bf16";
    case Precision::FP16:
      return "fp16";
  }
  return "?";
}

DType precision_dtype(Precision p) {
  switch (p) {
    case Precision::FP32:
      return DType::F32;
    case Precision::BF16:
      return DType::BF16;
    case Precision::FP16:
      return DType::F16;
  }
  return DType::F32;
}

OpsPrecision ops_precision(const EngineOptions& o) {
  const DType compute = precision_dtype(o.precision);
  return {compute, o.half_precision_grads ? compute : DType::F32};
}

EngineOptions training_engine_options(const TrainConfig& cfg) {
  return training_engine_options(cfg, resolve_device(cfg.device));
}

EngineOptions training_engine_options(const TrainConfig& cfg, DeviceKind device) {
  const ResolvedTrainConfig rc = resolve_train_config(cfg);
  EngineOptions o;
  o.device = device;
  o.batch_size = std::max(cfg.per_device_train_batch_size, cfg.val_data.empty() ? 1 : cfg.eval_batch_size());
  o.seq_len = cfg.seq_len();
  o.training = true;
  o.fp32_matmul = rc.fp32_matmul;
  ANVIL_REQUIRE(
      !cfg.gemm_tuning || device == DeviceKind::CUDA,
      "gemm_tuning tunes the cuBLASLt GEMM algorithms of the CUDA backend; it is not supported on the "
      "CPU (device {})",
      cfg.device);
  o.gemm_tuning = {cfg.gemm_tuning, cfg.gemm_tuning_cache};
  o.precision = rc.precision;
  o.half_precision_grads = rc.half_precision_grads;
  o.checkpointing = rc.checkpointing;
  o.optimizer = rc.optimizer;
  o.optim = optimizer_hyper(cfg);
  o.share_grad_memory = cfg.gradient_accumulation_steps == 1;
  // ZeRO: the launcher's world (anvil estimate --num_gpus plans one). The plan is the largest shard's, so
  // that every rank fits the same configuration; the trainer then binds its own rank's shard.
  const dist::DistEnv env = dist::read_dist_env();
  o.offload_param = cfg.offload_param != "none";
  o.offload_optimizer = cfg.offload_optimizer != "none";
  const offload::NvmeOptions nvme{cfg.offload_nvme_path, size_t(cfg.sub_group_size),
                                  size_t(cfg.aio_block_size), cfg.aio_threads};
  if (cfg.offload_optimizer == "nvme") o.nvme = nvme;
  if (cfg.offload_param == "nvme") o.param_nvme = nvme;
  o.param_nvme_buffers = cfg.offload_param_buffer_count;
  // (Offload runs stages 2 and 3 with one process too, the shard the whole buffer: stage 2 for its
  // gradients in host memory, stage 3 for the weights' gathers from there.)
  if (cfg.zero_stage > 0 &&
      (env.world_size > 1 || o.offload_param || (o.offload_optimizer && cfg.zero_stage >= 2))) {
    o.zero_stage = cfg.zero_stage;
    o.zero_world = env.world_size;
    o.zero_rank = -1;
  }
  if (env.world_size > 1) o.comm_dtype = rc.comm_dtype;
  if (o.zero_stage >= 2 && rc.backward_grad_dtype != rc.grad_dtype())
    o.unit_grad_dtype = rc.backward_grad_dtype;
  o.freeze = split_patterns(cfg.freeze_parameters);
  o.lora = lora_config(cfg);
  o.weight_storage = parse_weight_storage(cfg.quantization, "quantization");
  ANVIL_REQUIRE(!o.offload_optimizer || env.world_size == 1 || cfg.zero_stage > 0,
                "offload_optimizer {} with {} processes and zero_stage 0: every rank would keep and update "
                "the whole model on its CPU; set zero_stage 1, 2 or 3 so that each rank offloads its shard "
                "(DeepSpeed's ZeRO-Offload runs with stage 1-3 too)",
                cfg.offload_optimizer, env.world_size);
  return o;
}

bool keeps_trainable_only(const EngineOptions& o, const ParamLayout& layout) {
  if (!o.training || !o.lora.enabled() || !o.trainable_only_store) return false;
  for (const ParamTensor& t : layout.tensors())
    if (t.trainable != t.is_adapter()) return false;
  return true;
}

static void apply_trainable_only(const EngineOptions& o, Model& model) {
  if (keeps_trainable_only(o, model.layout())) model.param_store().keep_trainable_only();
}

// Freezing happens on the store's layout before an optimizer is made from it (the optimizers skip frozen
// tensors from their range tables).
// What the store keeps of each tensor: frozen ones (training), master weights and gradients of the trainable
// ones only (LoRA), quantized ones (inference; QLoRA's frozen base).
static void apply_parameter_options(const EngineOptions& o, Model& model) {
  if (o.training && !o.freeze.empty()) model.param_store().freeze(o.freeze);
  apply_trainable_only(o, model);
  quantize_model(model, o.weight_storage);
}

// Optimizer offload, after the ZeRO shard is set: the store's master weights (the shard's) in host memory.
static void apply_offload(const EngineOptions& o, Model& model) {
  if (!o.training || !o.offload_optimizer) return;
  ANVIL_REQUIRE(!o.lora.enabled(), "optimizer offload: full training (not LoRA, whose state is small)");
  ParamStore& store = model.param_store();
  store.set_master_on_host();
  // ZeRO-2/3 (gradients by unit): the shard's gradients go to the host too, as DeepSpeed's offload does.
  if (store.grads_sharded()) store.set_grads_on_host();
  if (o.offload_param) {
    ANVIL_REQUIRE(model.param_store().weights_sharded(),
                  "offload_param {}: the weights are not sharded (ZeRO stage 3 with a decoder model)",
                  o.param_nvme ? "nvme" : "cpu");
    model.param_store().set_weights_on_host();
  }
}

// Data parallelism's settings of the parameter store: the communication type and the ZeRO shards.
// The shards cut the layout (zero_shard); a store of the trainable tensors only keeps master weights,
// gradients and optimizer state for each shard's trainable part (ParamStore::optimizer_range).
static void apply_data_parallel(const EngineOptions& o, Model& model) {
  ParamStore& store = model.param_store();
  if (o.training && o.comm_dtype) store.set_comm_type(*o.comm_dtype);
  const std::optional<ParamRange> shard = zero_shard(o, model.layout());
  if (!shard) return;
  const ParamRange trainable = store.optimizer_range(*shard);
  store.set_master_range(trainable);
  // Stage 2 keeps the gradients of the shard only, where the model writes its gradients unit by unit;
  // stage 3 the weights too, gathered unit by unit as the model acquires them.
  ANVIL_REQUIRE(o.zero_stage < 3 || model.grads_by_unit(),
                "ZeRO stage 3 partitions the weights of decoder models (GPT-2, Llama, Qwen2, Mistral); this "
                "model family keeps whole weights: use zero_stage 2 or lower");
  ANVIL_REQUIRE(
      !o.unit_grad_dtype || model.grads_by_unit(),
      "backward_grad_dtype: this model family keeps whole gradients (no unit slots to write {} into); "
      "remove backward_grad_dtype",
      dtype_name(*o.unit_grad_dtype));
  ANVIL_REQUIRE(!store.trainable_only() || o.zero_stage < 2 || model.grads_by_unit(),
                "ZeRO stage {} with LoRA: this model family keeps whole gradients; use zero_stage 0 or 1",
                o.zero_stage);
  if (o.zero_stage >= 2 && model.grads_by_unit()) store.set_grad_shard(trainable, o.unit_grad_dtype);
  if (o.zero_stage >= 3) store.set_weight_shard(*shard);
}

// The optimizer's shard after apply_data_parallel: the master range, in the optimizer layout's numbering.
static std::optional<ParamRange> optimizer_shard(const EngineOptions& o, Model& model) {
  if (!zero_shard(o, model.layout())) return std::nullopt;
  return model.param_store().master_range();
}

std::optional<ParamRange> zero_shard(const EngineOptions& o, const ParamLayout& layout) {
  if (o.zero_stage == 0 || !o.training) return std::nullopt;
  const dist::ZeroPartition p(layout, o.zero_world, dist::shard_cuts(o.optimizer));
  if (o.zero_rank >= 0) return p.shard(o.zero_rank);
  const std::vector<size_t> counts = p.counts();
  return p.shard(int(std::max_element(counts.begin(), counts.end()) - counts.begin()));
}

LoraConfig lora_config(const TrainConfig& c) {
  LoraConfig l;
  l.r = c.lora_r;
  l.alpha = c.lora_alpha;
  l.dropout = c.lora_dropout;
  l.rslora = c.use_rslora;
  l.target_modules = split_patterns(c.lora_target_modules);
  return l;
}

OptimizerHyper optimizer_hyper(const TrainConfig& c) {
  OptimizerHyper h;
  h.weight_decay = float(c.weight_decay);
  h.lr_multiplier[int(ParamGroup::Decay)] = 1.0f;
  h.lr_multiplier[int(ParamGroup::NoDecay)] = float(c.no_decay_lr_multiplier);
  h.lr_multiplier[int(ParamGroup::Embedding)] = float(c.embedding_lr_multiplier);
  h.beta1 = float(c.adam_beta1), h.beta2 = float(c.adam_beta2), h.eps = float(c.adam_epsilon);
  h.adamw_bf16_moments = c.adamw_bf16_moments;
  h.min_8bit_size = size_t(c.optim_8bit_min_size);
  h.embedding_fp32_states = c.optim_8bit_embedding_fp32;
  h.momentum = float(c.momentum), h.dampening = float(c.dampening), h.nesterov = c.nesterov;
  h.adafactor_eps1 = float(c.adafactor_eps1), h.adafactor_eps2 = float(c.adafactor_eps2);
  h.clip_threshold = float(c.adafactor_clip_threshold), h.decay_rate = float(c.adafactor_decay_rate);
  if (c.adafactor_beta1 >= 0) h.adafactor_beta1 = float(c.adafactor_beta1);
  h.scale_parameter = c.adafactor_scale_parameter;
  h.relative_step = c.adafactor_relative_step;
  h.warmup_init = c.adafactor_warmup_init;
  return h;
}

DeviceKind resolve_device(const std::string& name) {
  if (name == "cpu") return DeviceKind::CPU;
  if (name == "cuda") {
    ANVIL_REQUIRE(cuda_available(), "--device cuda: no usable CUDA GPU (or Anvil was built without CUDA)");
    return DeviceKind::CUDA;
  }
  ANVIL_REQUIRE(name == "auto", "device must be auto, cpu or cuda, got '{}'", name);
  return cuda_available() ? DeviceKind::CUDA : DeviceKind::CPU;
}

namespace {
OptimizerHyper with_vocab(OptimizerHyper h, const TransformerConfig& cfg) {
  h.vocab_size = cfg.vocab_size;
  return h;
}

// Plan indices of the input buffers of both slots (see engine.hpp).
struct InputIndices {
  size_t tokens[2] = {0, 0};
  size_t targets[2] = {SIZE_MAX, SIZE_MAX}, lengths[2] = {SIZE_MAX, SIZE_MAX},
         labels[2] = {SIZE_MAX, SIZE_MAX};
};

// 3xTF32 applies to fp32 GEMMs on CUDA only.
bool uses_split_scratch(const EngineOptions& o) {
  return o.device == DeviceKind::CUDA && o.fp32_matmul == Fp32Matmul::TF32x3 &&
         o.precision == Precision::FP32;
}

// Adds every buffer of a run to `plan`, in a fixed order (the estimate and the real arena agree).
void plan_all(MemoryPlan& plan, Model& model, Optimizer* opt, const EngineOptions& o, InputIndices& in,
              size_t* i_gemm_ws, size_t* i_split_scratch, size_t* i_step_scalars, size_t* i_step_values) {
  model.plan_memory(plan, o.device);
  if (opt) opt->plan_memory(plan);
  const size_t tok_bytes = size_t(o.batch_size) * o.seq_len * sizeof(int32_t);
  // Labels are int32 class ids or fp32 regression targets: 4 bytes either way.
  const size_t row_bytes = size_t(o.batch_size) * sizeof(int32_t);
  static_assert(sizeof(float) == sizeof(int32_t));
  for (int s = 0; s < 2; ++s) {
    const std::string n = std::to_string(s);
    in.tokens[s] = plan.add("input tokens " + n, MemoryCategory::Data, tok_bytes);
    if (model.config().is_bert()) {
      in.lengths[s] = plan.add("sequence lengths " + n, MemoryCategory::Data, row_bytes);
      in.labels[s] = plan.add("labels " + n, MemoryCategory::Data, row_bytes);
    } else {
      in.targets[s] = plan.add("target tokens " + n, MemoryCategory::Data, tok_bytes);
    }
  }
  if (o.device == DeviceKind::CUDA)
    *i_gemm_ws = plan.add("cuBLASLt workspace", MemoryCategory::Workspace, kCudaGemmWorkspaceBytes);
  if (uses_split_scratch(o))
    *i_split_scratch = plan.add("3xTF32 split scratch", MemoryCategory::Workspace,
                                split_gemm_scratch_bytes(model.config(), o.batch_size, o.seq_len));
  // The step's loss, gradient norm and clip factor live on the device (no host read inside a step).
  if (o.training) *i_step_scalars = plan.add("step scalars", MemoryCategory::Workspace, sizeof(StepScalars));
  // The step's learning rates, seeds and unscale factor, read by the kernels (a graph-replayed step).
  if (o.training) *i_step_values = plan.add("step values", MemoryCategory::Workspace, sizeof(StepValues));
}

// The last line of defence (the trainer checks first, and suggests configurations that fit): a plan
// larger than the device's available memory fails here, before anything is allocated.
void ensure_plan_fits(const MemoryPlan& plan, const Device& dev) {
  const std::optional<size_t> available = dev.available_memory_bytes();
  if (!available || plan.total_bytes() <= *available) return;
  ANVIL_THROW(
      "out of memory at start-up: the memory plan needs {} ({} bytes) but {} has {} ({} bytes) "
      "available:\n{}",
      format_bytes(plan.total_bytes()), plan.total_bytes(), dev.name(), format_bytes(*available), *available,
      plan.report());
}
}  // namespace

MemoryPlan plan_engine_memory(const TransformerConfig& cfg, const EngineOptions& o) {
  const std::unique_ptr<Model> model = make_model(cfg, o.batch_size, o.seq_len, o.training, o.checkpointing,
                                                  ops_precision(o), o.share_grad_memory, o.lora);
  std::unique_ptr<Optimizer> opt;
  apply_parameter_options(o, *model);
  apply_data_parallel(o, *model);
  apply_offload(o, *model);
  if (o.training && !o.offload_optimizer)  // (offloaded: in host memory, offload::HostOptimizer)
    opt = make_optimizer(o.optimizer, model->param_store().optimizer_layout(), with_vocab(o.optim, cfg),
                         optimizer_shard(o, *model));
  MemoryPlan plan;
  InputIndices inputs;
  size_t ws = 0, split = 0, scalars = 0, values = 0;
  plan_all(plan, *model, opt.get(), o, inputs, &ws, &split, &scalars, &values);
  return plan;
}

// The model a run with `o` builds, its store set up as the engine sets it (not bound to memory): what the
// host-side plans read.
static std::unique_ptr<Model> planned_model(const TransformerConfig& cfg, const EngineOptions& o) {
  std::unique_ptr<Model> model = make_model(cfg, o.batch_size, o.seq_len, o.training, o.checkpointing,
                                            ops_precision(o), o.share_grad_memory, o.lora);
  apply_parameter_options(o, *model);
  apply_data_parallel(o, *model);
  return model;
}

// Parameter offload to NVMe: the pages of a planned model's weight shard.
static std::optional<offload::PagedWeights::Sizes> weight_pages_of(const Model& model,
                                                                   const EngineOptions& o) {
  if (!o.training || !o.offload_param || !o.param_nvme) return std::nullopt;
  const ParamStore& store = model.param_store();
  return offload::PagedWeights::sizes(store.layout(), store.weight_range(), store.precision().compute,
                                      o.param_nvme_buffers);
}

std::optional<MemoryPlan> host_optimizer_plan(const TransformerConfig& cfg, const EngineOptions& o) {
  if (!o.training || !o.offload_optimizer) return std::nullopt;
  const std::unique_ptr<Model> model = planned_model(cfg, o);
  return offload::HostOptimizer::plan_host_memory(
      model->param_store().optimizer_layout(), o.optimizer, with_vocab(o.optim, cfg), ops_precision(o),
      optimizer_shard(o, *model), o.offload_param, model->param_store().grads_sharded(),
      o.nvme ? std::optional(o.nvme->sub_group_size) : std::nullopt, weight_pages_of(*model, o));
}

std::optional<offload::PagedWeights::Sizes> weight_pages_sizes(const TransformerConfig& cfg,
                                                               const EngineOptions& o) {
  if (!o.training || !o.offload_param || !o.param_nvme) return std::nullopt;
  return weight_pages_of(*planned_model(cfg, o), o);
}

std::optional<offload::PagedOptimizerState::Sizes> nvme_swap_sizes(const TransformerConfig& cfg,
                                                                   const EngineOptions& o) {
  if (!o.training || !o.offload_optimizer || !o.nvme) return std::nullopt;
  const std::unique_ptr<Model> model = planned_model(cfg, o);
  const ParamLayout& layout = model->param_store().optimizer_layout();
  return offload::PagedOptimizerState::sizes(o.optimizer, layout, with_vocab(o.optim, cfg),
                                             optimizer_shard(o, *model).value_or(layout.all()),
                                             o.nvme->sub_group_size);
}

Engine::Engine(const TransformerConfig& cfg, const EngineOptions& o)
    : Engine(cfg, o, make_device(o.device)) {}

Engine::Engine(const TransformerConfig& cfg, const EngineOptions& o, std::unique_ptr<Device> device)
    : device_(std::move(device)) {
  ANVIL_ASSERT(device_ && device_->kind() == o.device, "Engine: the device is not of the planned kind");
  model_ = make_model(cfg, o.batch_size, o.seq_len, o.training, o.checkpointing, ops_precision(o),
                      o.share_grad_memory, o.lora);
  apply_parameter_options(o, *model_);
  apply_data_parallel(o, *model_);
  const std::optional<ParamRange> shard = optimizer_shard(o, *model_);
  apply_offload(o, *model_);
  if (o.training && o.offload_param && o.param_nvme) {
    ParamStore& store = model_->param_store();
    weight_pages_ = std::make_unique<offload::PagedWeights>(*device_, store.layout(), store.weight_range(),
                                                            store.precision().compute, *o.param_nvme,
                                                            o.param_nvme_buffers);
    store.bind_weight_pages(weight_pages_.get());
  }
  if (o.training && o.offload_optimizer)
    host_ = std::make_unique<offload::HostOptimizer>(*device_, model_->param_store(), o.optimizer,
                                                     with_vocab(o.optim, cfg), ops_precision(o), o.nvme);
  else if (o.training)
    optimizer_ = make_optimizer(o.optimizer, model_->param_store().optimizer_layout(),
                                with_vocab(o.optim, cfg), shard);
  MemoryPlan plan;
  size_t i_ws = 0, i_split = 0;
  InputIndices in;
  plan_all(plan, *model_, optimizer_.get(), o, in, &i_ws, &i_split, &i_step_scalars_, &i_step_values_);
  for (int s = 0; s < 2; ++s) {
    i_tokens_[s] = in.tokens[s], i_targets_[s] = in.targets[s];
    i_lengths_[s] = in.lengths[s], i_labels_[s] = in.labels[s];
  }
  ensure_plan_fits(plan, *device_);
  arena_ = std::make_unique<Arena>(*device_, std::move(plan));
  // The CUDA ops take their GEMM workspace (and 3xTF32's split scratch) from the arena. The model's ops
  // write gradients in the type backward writes (unit slots in the compute type under backward_grad_dtype);
  // the update's ops then read the gradients kept for the optimizer, in the gradient type.
  const OpsPrecision kept = ops_precision(o);
  const OpsPrecision written{kept.compute, model_->param_store().written_grad_type()};
  if (o.device == DeviceKind::CUDA) {
    CudaGemmBuffers buffers{arena_->get<void>(i_ws), kCudaGemmWorkspaceBytes};
    if (uses_split_scratch(o))
      buffers.split_scratch = arena_->get<float>(i_split),
      buffers.split_scratch_bytes = arena_->plan().buffers()[i_split].bytes;
    ops_ = make_cuda_ops(*device_, o.fp32_matmul, buffers, written, o.gemm_tuning);
    if (written.grad != kept.grad) update_ops_ = make_cuda_ops(*device_, o.fp32_matmul, buffers, kept, {});
  } else {
    ops_ = make_cpu_ops(*device_, written);
    if (written.grad != kept.grad) update_ops_ = make_cpu_ops(*device_, kept);
  }
  model_->bind(*arena_);
  model_->upload_constants(*device_);
  if (host_) host_->reset();
  if (optimizer_) {
    optimizer_->bind(*arena_);
    optimizer_->reset(*device_);
  }
  if (training()) {
    // (Offloaded gradients: zeroed by the host optimizer's reset.)
    if (!model_->param_store().grads_on_host())
      device_->fill_zero(model_->grad_buffer(), model_->grad_bytes());
    model_->param_store().clear_grad_sink(*device_);
    device_->fill_zero(step_scalars(), sizeof(StepScalars));
    step_values_host_ = std::make_unique<PinnedBuffer>(*device_, sizeof(StepValues));
    new (step_values_host_->get()) StepValues{};
    upload_step_values();
    if (model_->dropout_state()) {
      dropout_host_ = std::make_unique<PinnedBuffer>(*device_, sizeof(DropoutState));
      new (dropout_host_->get()) DropoutState{};
      upload_dropout_state();
    }
  }
}

DropoutState& Engine::dropout_state_host() {
  ANVIL_ASSERT(dropout_host_, "dropout_state_host: the model trains without dropout");
  return *static_cast<DropoutState*>(dropout_host_->get());
}

void Engine::upload_dropout_state() {
  device_->upload_on_compute(model_->dropout_state(), dropout_host_->get(), sizeof(DropoutState));
}

StepValues* Engine::step_values() const {
  ANVIL_ASSERT(training(), "step_values: the engine was not built for training");
  return arena_->get<StepValues>(i_step_values_);
}

StepValues& Engine::step_values_host() {
  ANVIL_ASSERT(training(), "step_values_host: the engine was not built for training");
  return *static_cast<StepValues*>(step_values_host_->get());
}

void Engine::upload_step_values() {
  device_->upload_on_compute(step_values(), step_values_host_->get(), sizeof(StepValues));
}

Decoder& Engine::decoder() {
  ANVIL_REQUIRE(
      !is_bert(),
      "this needs a causal language model (a decoder), but the model is of family 'bert' (a sequence "
      "classifier: train it with classification data, run it with `anvil predict`)");
  return static_cast<Decoder&>(*model_);
}

BertModel& Engine::bert() {
  ANVIL_REQUIRE(is_bert(),
                "this needs a BERT sequence classifier, but the model is of family '{}' (a causal language "
                "model)",
                model_->config().family);
  return static_cast<BertModel&>(*model_);
}

int32_t* Engine::targets(int slot) const {
  ANVIL_ASSERT(i_targets_[slot] != SIZE_MAX, "targets(): a {} engine has no target buffers",
               model_->config().family);
  return arena_->get<int32_t>(i_targets_[slot]);
}

int32_t* Engine::lengths(int slot) const {
  ANVIL_ASSERT(i_lengths_[slot] != SIZE_MAX, "lengths(): a {} engine has no length buffers",
               model_->config().family);
  return arena_->get<int32_t>(i_lengths_[slot]);
}

void* Engine::labels(int slot) const {
  ANVIL_ASSERT(i_labels_[slot] != SIZE_MAX, "labels(): a {} engine has no label buffers",
               model_->config().family);
  return arena_->get<void>(i_labels_[slot]);
}

ModelInputs Engine::inputs(int slot, int B, int T, bool with_loss) const {
  ModelInputs in;
  in.tokens = tokens(slot);
  in.B = B, in.T = T;
  if (is_bert()) {
    in.lengths = lengths(slot);
    if (with_loss) in.labels = labels(slot);
  } else if (with_loss) {
    in.targets = targets(slot);
  }
  return in;
}

StepScalars* Engine::step_scalars() const {
  ANVIL_ASSERT(training(), "step_scalars: the engine was not built for training");
  return arena_->get<StepScalars>(i_step_scalars_);
}

}  // namespace anvil
