// A BertModel with everything a test step needs around it: a device, a
// MemoryPlan holding the model's buffers plus the inputs (tokens, token types, lengths, labels), one arena,
// and the ops. Used by the unit tests (CPU) and the parity tests (CPU and CUDA).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "anvil/memory_plan.hpp"
#include "core/half.hpp"
#include "kernels/ops.hpp"
#include "model/bert_model.hpp"
#include "runtime/arena.hpp"
#include "runtime/device.hpp"

namespace anvil::test {

// The inputs of one batch on the host. `labels_f` is used instead of `labels` by regression models.
struct BertBatch {
  int B = 0, T = 0;
  std::vector<int32_t> tokens, types, lengths, labels;
  std::vector<float> labels_f;
};

class BertHarness {
 public:
  BertHarness(const TransformerConfig& cfg, int B, int T, bool training, DeviceKind kind = DeviceKind::CPU,
              CheckpointPolicy checkpointing = {}, OpsPrecision precision = {}, bool tf32 = false,
              bool share_grad_memory = false)
      : dev_(make_device(kind)) {
    model_ = std::make_unique<BertModel>(cfg, B, T, training, checkpointing, precision, share_grad_memory);
    MemoryPlan plan;
    model_->plan_memory(plan, kind);
    const size_t bt = size_t(B) * T * sizeof(int32_t), b = size_t(B) * sizeof(int32_t);
    i_tokens_ = plan.add("input tokens", MemoryCategory::Data, bt);
    i_types_ = plan.add("token types", MemoryCategory::Data, bt);
    i_lengths_ = plan.add("lengths", MemoryCategory::Data, b);
    i_labels_ = plan.add("labels", MemoryCategory::Data, b);
    if (kind == DeviceKind::CUDA)
      i_workspace_ = plan.add("cuBLASLt workspace", MemoryCategory::Workspace, kCudaGemmWorkspaceBytes);
    plan_ = plan;
    arena_ = std::make_unique<Arena>(*dev_, std::move(plan));
    ops_ = kind == DeviceKind::CUDA ? make_cuda_ops(*dev_, tf32, arena_->get<void>(i_workspace_),
                                                    kCudaGemmWorkspaceBytes, precision)
                                    : make_cpu_ops(*dev_, precision);
    model_->bind(*arena_);
    if (training) zero_grads();
    if (model_->dropout_state()) set_dropout(0, 0);
  }

  BertModel& model() { return *model_; }
  Ops& ops() { return *ops_; }
  Device& device() { return *dev_; }
  const MemoryPlan& plan() const { return plan_; }
  int32_t* tokens() const { return arena_->get<int32_t>(i_tokens_); }
  int32_t* types() const { return arena_->get<int32_t>(i_types_); }
  int32_t* lengths() const { return arena_->get<int32_t>(i_lengths_); }
  void* labels() const { return arena_->get<void>(i_labels_); }

  void zero_grads() { dev_->fill_zero(model_->grad_buffer(), model_->grad_bytes()); }
  // The dropout state (training with dropout): the next training forward draws micro-batch `micro` + 1.
  void set_dropout(uint64_t seed, uint32_t micro) {
    const DropoutState s{seed, micro, 0};
    dev_->copy_to_device(model_->dropout_state(), &s, sizeof(s));
  }

  // Copies the batch's inputs to the device (types and lengths only when given).
  void upload(const BertBatch& b) {
    has_types_ = !b.types.empty(), has_lengths_ = !b.lengths.empty();
    dev_->copy_to_device(tokens(), b.tokens.data(), b.tokens.size() * sizeof(int32_t));
    if (has_types_) dev_->copy_to_device(types(), b.types.data(), b.types.size() * sizeof(int32_t));
    if (has_lengths_) dev_->copy_to_device(lengths(), b.lengths.data(), b.lengths.size() * sizeof(int32_t));
    if (model_->label_dtype() == DType::F32)
      dev_->copy_to_device(labels(), b.labels_f.data(), b.labels_f.size() * sizeof(float));
    else
      dev_->copy_to_device(labels(), b.labels.data(), b.labels.size() * sizeof(int32_t));
  }

  // The per-sequence losses of the last forward as they are now (the trainer sums them after backward).
  std::vector<float> losses(int B) {
    std::vector<float> l(static_cast<size_t>(B));
    dev_->copy_to_host(l.data(), model_->losses(), l.size() * sizeof(float));
    return l;
  }
  // Forward (with labels) of the uploaded batch; the per-sequence losses on the host.
  std::vector<float> forward(int B, int T, float grad_scale, bool write_grad) {
    model_->forward(*ops_, tokens(), has_types_ ? types() : nullptr, has_lengths_ ? lengths() : nullptr,
                    labels(), B, T, grad_scale, write_grad);
    std::vector<float> losses(static_cast<size_t>(B));
    dev_->copy_to_host(losses.data(), model_->losses(), losses.size() * sizeof(float));
    return losses;
  }
  void backward(int B, int T) {
    model_->backward(*ops_, tokens(), has_types_ ? types() : nullptr, has_lengths_ ? lengths() : nullptr, B,
                     T);
  }
  std::vector<float> logits(int B) {
    std::vector<float> out(size_t(B) * model_->config().num_labels);
    model_->copy_logits_to_host(*dev_, out.data(), B);
    return out;
  }
  // The fp32 gradients (widened from a 16-bit gradient type) or master weights, on the host.
  std::vector<float> grads() {
    std::vector<float> g(model_->layout().total_numel());
    const DType t = model_->precision().grad;
    if (t == DType::F32) {
      dev_->copy_to_host(g.data(), model_->grad_buffer(), g.size() * sizeof(float));
      return g;
    }
    std::vector<uint16_t> h(g.size());
    dev_->copy_to_host(h.data(), model_->grad_buffer(), h.size() * sizeof(uint16_t));
    for (size_t i = 0; i < g.size(); ++i) g[i] = t == DType::BF16 ? bf16_to_float(h[i]) : fp16_to_float(h[i]);
    return g;
  }
  std::vector<float> params() {
    std::vector<float> p(model_->layout().total_numel());
    dev_->copy_to_host(p.data(), model_->params(), p.size() * sizeof(float));
    return p;
  }

 private:
  // Declaration order: the device outlives the arena and ops that use it.
  std::unique_ptr<Device> dev_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<BertModel> model_;
  MemoryPlan plan_;
  size_t i_tokens_ = 0, i_types_ = 0, i_lengths_ = 0, i_labels_ = 0, i_workspace_ = 0;
  bool has_types_ = false, has_lengths_ = false;
};

}  // namespace anvil::test
