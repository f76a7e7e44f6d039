#include "optim/adamw.hpp"

namespace anvil {

void AdamW::plan_memory(MemoryPlan& plan) {
  i_m_ = plan.add("adamw exp_avg", MemoryCategory::OptimizerState, numel() * sizeof(float));
  i_v_ = plan.add("adamw exp_avg_sq", MemoryCategory::OptimizerState, numel() * sizeof(float));
}

void AdamW::bind(const Arena& arena) {
  m_ = arena.get(i_m_);
  v_ = arena.get(i_v_);
}

void AdamW::zero_state(Device& dev) {
  dev.fill_zero(m_, numel() * sizeof(float));
  dev.fill_zero(v_, numel() * sizeof(float));
}

void AdamW::step(Ops& ops, float* params, const void* grads, float lr, int64_t step, float grad_scale) {
  const size_t ge = dtype_bits(ops.precision().grad) / 8;
  const auto grad_at = [&](size_t o) { return static_cast<const char*>(grads) + o * ge; };
  AdamWArgs a;
  a.lr = lr, a.beta1 = h_.beta1, a.beta2 = h_.beta2, a.eps = h_.eps, a.step = step, a.grad_scale = grad_scale;
  for (const ParamUnit& u : layout_.units()) {
    const size_t o = u.offset;
    if (u.decay_numel) {
      a.weight_decay = h_.weight_decay;
      ops.adamw_step(params + o, grad_at(o), m_ + o, v_ + o, u.decay_numel, a);
    }
    if (u.numel > u.decay_numel) {
      const size_t o2 = o + u.decay_numel;
      a.weight_decay = 0.0f;
      ops.adamw_step(params + o2, grad_at(o2), m_ + o2, v_ + o2, u.numel - u.decay_numel, a);
    }
  }
}

}  // namespace anvil
