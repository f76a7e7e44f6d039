// Loss ops: the fused softmax + cross-entropy over the (padded) vocabulary, writing the logits' gradient in
// place, and sequence classification's losses (cross-entropy or regression) with their gradient.
//
// Part of the Ops contract (kernels/ops.hpp: memory, storage types, the `[grad]` pointer marks, and the
// gradient convention: parameter gradients accumulate, activation gradients are overwritten unless a
// comment says otherwise). Ops inherits this interface; CpuOps and CudaOps implement it.
#pragma once
#include <cstdint>

namespace anvil {

constexpr int32_t kIgnoreIndex = -100;

class LossOps {
 public:
  virtual ~LossOps() = default;

  // --- loss: fused softmax + cross-entropy over the vocabulary --------------------------------------
  // logits [N,Vp] with only the first V columns real (Vp >= V is the padded vocabulary). For each row
  // with targets[i] != kIgnoreIndex: losses[i] = logsumexp(logits[i,:V]) - logits[i,targets[i]] (fp32);
  // ignored rows get losses[i] = 0. If write_grad, logits is overwritten by its gradient:
  // grad_scale * (softmax - onehot) on real columns of valid rows, 0 on padded columns and ignored rows.
  virtual void softmax_xent_fwd_bwd(float* losses, void* logits, const int32_t* targets, int N, int V, int Vp,
                                    float grad_scale, bool write_grad) = 0;
  // Sequence classification (Hugging Face BertForSequenceClassification's losses, per row), logits [N, NL] in
  // the compute type, losses [N] fp32:
  //   NL >= 2 (`labels` int32 [N]): cross-entropy, losses[i] = logsumexp(logits[i,:]) - logits[i,labels[i]];
  //     a row with labels[i] == kIgnoreIndex gets loss 0 and gradient 0. A label outside [0, NL) is a data
  //     error: the CPU throws naming it, CUDA writes a NaN loss (the step's non-finite check catches it).
  //   NL == 1 (`labels` fp32 [N]): regression, losses[i] = (logits[i] - labels[i])^2.
  // With `dlogits` (not null) it receives grad_scale * d(losses[i]) / d(logits[i,:]): softmax - onehot, or
  // 2 (logit - label). logits and dlogits must not alias.
  virtual void classification_loss(float* losses, void* dlogits, const void* logits, const void* labels,
                                   int N, int NL, float grad_scale) = 0;
};

}  // namespace anvil
