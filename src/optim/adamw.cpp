#include "optim/adamw.hpp"

#include "anvil/rng.hpp"

namespace anvil {

OptimizerHyper adamw_hyper(const AdamWHyper& a) {
  OptimizerHyper h;
  h.beta1 = a.beta1, h.beta2 = a.beta2, h.eps = a.eps, h.weight_decay = a.weight_decay;
  return h;
}

std::vector<std::pair<std::string, size_t>> AdamW::state_buffers() const {
  const size_t bytes = dtype_bytes(moment_dtype(), state_numel());
  return {{"adamw exp_avg", bytes}, {"adamw exp_avg_sq", bytes}};
}

void AdamW::bind_state(const std::vector<void*>& b) {
  m_ = b[0];
  v_ = b[1];
}

std::vector<OptimizerStateTensor> AdamW::state_tensors() const {
  return {{"exp_avg", moment_dtype(), state_numel(), m_}, {"exp_avg_sq", moment_dtype(), state_numel(), v_}};
}

FusedAdamWArgs AdamW::args(float lr, int64_t step) const {
  FusedAdamWArgs a;
  a.beta1 = h_.beta1, a.beta2 = h_.beta2, a.eps = h_.eps, a.step = step;
  group_args(lr, a.lr, a.weight_decay);
  // bf16 moments: a fresh stochastic-rounding stream per step (nonzero).
  // A shard (ZeRO) draws for its elements what one process draws for them (by state index: compact with
  // frozen tensors).
  if (h_.adamw_bf16_moments) {
    a.rounding_seed = Rng(0xada3u ^ (uint64_t(step) << 20)).next_u64() | 1;
    a.index_base = ranges_.compact_base;
  }
  return a;
}

void AdamW::fill_step_values(float lr, int64_t step, StepValues& out) const {
  anvil::fill_step_values(args(lr, step), out);
}

void AdamW::update(Ops& ops, float* params, const void* grads, float lr, int64_t step, float grad_scale,
                   const float* grad_scale_device, const StepValues* step_values) {
  ops.adamw_fused_step(params, grads, m_, v_, moment_dtype(), numel(), groups(),
                       with_call_fields(args(lr, step), grad_scale, grad_scale_device, step_values));
}

}  // namespace anvil
