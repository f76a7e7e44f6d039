// AdamW over the flat parameter buffer with two parameter groups: tensors that take weight decay
// (matrices, embeddings) and those that do not (biases, norm weights), as the seeds recommend.
// The flat layout puts each unit's decayed tensors first, so one unit is two contiguous updates.
#pragma once
#include "anvil/memory_plan.hpp"
#include "kernels/ops.hpp"
#include "model/param_layout.hpp"
#include "runtime/arena.hpp"

namespace anvil {

struct AdamWHyper {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
};

class AdamW {
 public:
  AdamW(const ParamLayout& layout, AdamWHyper h) : layout_(layout), h_(h) {}
  void plan_memory(MemoryPlan& plan);
  void bind(const Arena& arena);
  void zero_state(Device& dev);  // m = v = 0

  // One update of every (fp32 master) parameter from gradients in the ops' gradient type; `step` is
  // 1-based; `grad_scale` multiplies gradients (token-count normalisation, clipping, 1/loss scale).
  void step(Ops& ops, float* params, const void* grads, float lr, int64_t step, float grad_scale);

  float* m() const { return m_; }
  float* v() const { return v_; }
  size_t numel() const { return layout_.total_numel(); }

 private:
  const ParamLayout& layout_;
  AdamWHyper h_;
  size_t i_m_ = 0, i_v_ = 0;
  float *m_ = nullptr, *v_ = nullptr;
};

}  // namespace anvil
