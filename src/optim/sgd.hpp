// SGD with optional momentum, dampening and Nesterov momentum (PyTorch torch.optim.SGD semantics; weight
// decay is L2, added to the gradient, as PyTorch does), one fused launch per step over the flat buffer.
// State: one fp32 momentum buffer (4 bytes/param) when momentum > 0, none otherwise.
#pragma once
#include "optim/optimizer.hpp"

namespace anvil {

class Sgd final : public Optimizer {
 public:
  Sgd(const ParamLayout& layout, const OptimizerHyper& h, std::optional<ParamRange> shard = {});
  OptimizerKind kind() const override { return OptimizerKind::SGD; }
  std::vector<OptimizerStateTensor> state_tensors() const override;

 protected:
  void update(Ops& ops, float* params, const void* grads, float lr, int64_t step, float grad_scale,
              const float* grad_scale_device, const StepValues* step_values) override;
  void fill_step_values(float lr, int64_t step, StepValues& out) const override;
  std::vector<std::pair<std::string, size_t>> state_buffers() const override;
  void bind_state(const std::vector<void*>& buffers) override;

 private:
  SgdArgs args(float lr, int64_t step) const;  // everything but the gradient scale
  float* momentum_ = nullptr;
};

}  // namespace anvil
