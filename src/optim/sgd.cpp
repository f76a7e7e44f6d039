#include "optim/sgd.hpp"

namespace anvil {

Sgd::Sgd(const ParamLayout& layout, const OptimizerHyper& h, std::optional<ParamRange> shard)
    : Optimizer(layout, h, shard.value_or(layout.all())) {
  ANVIL_REQUIRE(h.momentum >= 0, "sgd: momentum must be >= 0, got {}", h.momentum);
  ANVIL_REQUIRE(
      !h.nesterov || (h.momentum > 0 && h.dampening == 0),
      "sgd: Nesterov momentum needs momentum > 0 and dampening 0 (as in PyTorch), got momentum {} and "
      "dampening {}",
      h.momentum, h.dampening);
}

std::vector<std::pair<std::string, size_t>> Sgd::state_buffers() const {
  if (h_.momentum == 0) return {};
  return {{"sgd momentum_buffer", state_numel() * sizeof(float)}};
}

void Sgd::bind_state(const std::vector<void*>& b) {
  momentum_ = b.empty() ? nullptr : static_cast<float*>(b[0]);
}

std::vector<OptimizerStateTensor> Sgd::state_tensors() const {
  if (!momentum_) return {};
  return {{"momentum_buffer", DType::F32, state_numel(), momentum_}};
}

SgdArgs Sgd::args(float lr, int64_t step) const {
  SgdArgs a;
  a.momentum = h_.momentum, a.dampening = h_.dampening, a.nesterov = h_.nesterov;
  a.first_step = step == 1;
  group_args(lr, a.lr, a.weight_decay);
  return a;
}

void Sgd::fill_step_values(float lr, int64_t step, StepValues& out) const {
  anvil::fill_step_values(args(lr, step), out);
  out.step = step;
}

void Sgd::update(Ops& ops, float* params, const void* grads, float lr, int64_t step, float grad_scale,
                 const float* grad_scale_device, const StepValues* step_values) {
  ops.sgd_step(params, grads, momentum_, numel(), groups(),
               with_call_fields(args(lr, step), grad_scale, grad_scale_device, step_values));
}

}  // namespace anvil
