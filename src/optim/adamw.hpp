// AdamW (PyTorch semantics, decoupled weight decay) over the whole flat buffer in one fused launch per step
// (HF `adamw_torch_fused`): per-group learning rates and weight decay from the parameter-group table. The
// two moments are fp32 (8 bytes/param), or bf16 with stochastic rounding (4 bytes/param) with
// OptimizerHyper::adamw_bf16_moments.
#pragma once
#include "optim/optimizer.hpp"

namespace anvil {

// The AdamW hyper-parameters of the original single-group interface (tests and the golden fixture).
struct AdamWHyper {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};
OptimizerHyper adamw_hyper(const AdamWHyper& h);

class AdamW final : public Optimizer {
 public:
  AdamW(const ParamLayout& layout, const OptimizerHyper& h, std::optional<ParamRange> shard = {})
      : Optimizer(layout, h, shard.value_or(layout.all())) {}
  OptimizerKind kind() const override { return OptimizerKind::AdamW; }
  std::vector<OptimizerStateTensor> state_tensors() const override;

  DType moment_dtype() const { return h_.adamw_bf16_moments ? DType::BF16 : DType::F32; }
  void* m() const { return m_; }
  void* v() const { return v_; }

 protected:
  void update(Ops& ops, float* params, const void* grads, float lr, int64_t step, float grad_scale,
              const float* grad_scale_device, const StepValues* step_values) override;
  void fill_step_values(float lr, int64_t step, StepValues& out) const override;
  std::vector<std::pair<std::string, size_t>> state_buffers() const override;
  void bind_state(const std::vector<void*>& buffers) override;

 private:
  FusedAdamWArgs args(float lr, int64_t step) const;  // everything but the gradient scale
  void *m_ = nullptr, *v_ = nullptr;
};

}  // namespace anvil
