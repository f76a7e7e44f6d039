#include "train/engine.hpp"

#include <algorithm>

namespace anvil {

EngineOptions training_engine_options(const TrainConfig& cfg) {
  EngineOptions o;
  o.device = resolve_device(cfg.device);
  o.batch_size = std::max(cfg.per_device_train_batch_size, cfg.val_data.empty() ? 1 : cfg.eval_batch_size());
  o.seq_len = cfg.seq_len();
  o.training = true;
  o.tf32 = cfg.tf32;
  if (cfg.gradient_checkpointing)
    o.checkpointing = {parse_checkpoint_mode(cfg.gradient_checkpointing_mode),
                       cfg.gradient_checkpointing_every};
  o.adamw = {float(cfg.adam_beta1), float(cfg.adam_beta2), float(cfg.adam_epsilon), float(cfg.weight_decay)};
  return o;
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
// Adds every buffer of a run to `plan`, in a fixed order (the estimate and the real arena agree).
void plan_all(MemoryPlan& plan, GptModel& model, std::optional<AdamW>& opt, const Ops& ops,
              const EngineOptions& o, size_t i_tokens[2], size_t i_targets[2], size_t* i_gemm_ws) {
  model.plan_memory(plan, ops);
  if (opt) opt->plan_memory(plan);
  const size_t tok_bytes = size_t(o.batch_size) * o.seq_len * sizeof(int32_t);
  for (int s = 0; s < 2; ++s) {
    i_tokens[s] = plan.add("input tokens " + std::to_string(s), MemoryCategory::Data, tok_bytes);
    i_targets[s] = plan.add("target tokens " + std::to_string(s), MemoryCategory::Data, tok_bytes);
  }
  if (o.device == DeviceKind::CUDA)
    *i_gemm_ws = plan.add("cuBLASLt workspace", MemoryCategory::Workspace, kCudaGemmWorkspaceBytes);
}
}  // namespace

MemoryPlan plan_engine_memory(const TransformerConfig& cfg, const EngineOptions& o) {
  std::unique_ptr<Device> dev = o.device == DeviceKind::CUDA ? make_cuda_device() : make_cpu_device();
  std::unique_ptr<Ops> ops =
      o.device == DeviceKind::CUDA ? make_cuda_ops(*dev, o.tf32, nullptr, 0) : make_cpu_ops(*dev);
  GptModel model(cfg, o.batch_size, o.seq_len, o.training, o.checkpointing);
  std::optional<AdamW> opt;
  if (o.training) opt.emplace(model.layout(), o.adamw);
  MemoryPlan plan;
  size_t tokens[2], targets[2], ws = 0;
  plan_all(plan, model, opt, *ops, o, tokens, targets, &ws);
  return plan;
}

Engine::Engine(const TransformerConfig& cfg, const EngineOptions& o) {
  device_ = o.device == DeviceKind::CUDA ? make_cuda_device() : make_cpu_device();
  // The CUDA ops take their GEMM workspace from the arena, which is sized with their help: a first
  // instance without workspace answers the sizing questions.
  std::unique_ptr<Ops> sizing =
      o.device == DeviceKind::CUDA ? make_cuda_ops(*device_, o.tf32, nullptr, 0) : make_cpu_ops(*device_);
  model_ = std::make_unique<GptModel>(cfg, o.batch_size, o.seq_len, o.training, o.checkpointing);
  if (o.training) optimizer_.emplace(model_->layout(), o.adamw);
  MemoryPlan plan;
  size_t i_ws = 0;
  plan_all(plan, *model_, optimizer_, *sizing, o, i_tokens_, i_targets_, &i_ws);
  arena_ = std::make_unique<Arena>(*device_, std::move(plan));
  if (o.device == DeviceKind::CUDA) {
    ops_ = make_cuda_ops(*device_, o.tf32, arena_->get<void>(i_ws), kCudaGemmWorkspaceBytes);
  } else {
    ops_ = std::move(sizing);
  }
  model_->bind(*arena_);
  if (optimizer_) {
    optimizer_->bind(*arena_);
    optimizer_->zero_state(*device_);
    device_->fill_zero(model_->grads(), model_->layout().total_numel() * sizeof(float));
  }
}

}  // namespace anvil
