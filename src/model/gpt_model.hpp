// GPT-2 with explicit forward and backward per layer (DESIGN principle 3). The model does not own
// memory: it adds its buffers to a MemoryPlan and binds to the Arena carved from it.
//
// Saved activations per layer (what backward reads): ln1 out, ln1 mean/rstd, qkv, attention output,
// attention probabilities, residual after attention, ln2 out, ln2 mean/rstd, MLP pre-activation,
// MLP activation, and the block output (always stored: it is the next block's checkpoint). Under a
// CheckpointPolicy, a checkpointed block's activations of the recomputed kinds go to shared recompute
// buffers and are rebuilt by re-running the block's forward just before its backward.
#pragma once
#include <cstdint>
#include <vector>

#include "anvil/memory_plan.hpp"
#include "anvil/model_config.hpp"
#include "kernels/ops.hpp"
#include "model/checkpointing.hpp"
#include "model/param_layout.hpp"
#include "runtime/arena.hpp"

namespace anvil {

class GptModel {
 public:
  // `max_batch` x `max_seq` is the largest input forward() will see. With `training`, gradients and the
  // backward workspace are planned too.
  GptModel(TransformerConfig cfg, int max_batch, int max_seq, bool training,
           CheckpointPolicy checkpointing = {});

  // Adds the model's buffers; `backend` sizes the attention scratch (no device is needed to plan).
  void plan_memory(MemoryPlan& plan, DeviceKind backend);
  void bind(const Arena& arena);

  const TransformerConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  int max_batch() const { return B_; }
  int max_seq() const { return T_; }
  float* params() const { return params_; }
  float* grads() const { return grads_; }
  const float* losses() const { return losses_; }
  const float* logits() const { return logits_; }

  // GPT-2 initialisation, deterministic for a seed: N(0, 0.02) for matrices and embeddings,
  // N(0, 0.02/sqrt(2 n_layer)) for the residual projections, LayerNorm (1, 0), biases 0, padded vocab rows 0.
  void init_weights(uint64_t seed, Device& dev) const;

  // tokens/targets are [B, T] in device memory. With targets, losses() receives the per-position loss.
  // With write_grad, the logits buffer is overwritten by dloss/dlogits * grad_scale for backward().
  void forward(Ops& ops, const int32_t* tokens, const int32_t* targets, int B, int T, float grad_scale,
               bool write_grad);
  // Accumulates parameter gradients into grads(); needs the preceding forward with write_grad.
  void backward(Ops& ops, const int32_t* tokens, int B, int T);

 private:
  // The tensors of one block, as offsets into the flat buffer (looked up by name once) or as pointers
  // into the parameters or the gradients.
  template <class T>
  struct LayerTensors {
    T ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
  };
  using LayerParams = LayerTensors<float*>;
  LayerParams layer_params(float* base, int l) const;
  std::vector<LayerTensors<size_t>> layer_offsets_;

  // The per-layer saved activations, by kind.
  enum Saved { kLn1, kLn1Stats, kQkv, kAtty, kProbs, kRes2, kLn2, kLn2Stats, kFch, kFchGelu, kSavedKinds };
  bool recomputed(int kind, int layer) const;  // kind's tensor of `layer` lives in the recompute buffer
  float* act(int kind, int layer) const;       // where `layer` keeps (or recomputes) that tensor
  // The block's forward; with `only_recomputed`, just the steps whose outputs are recomputed for it.
  void block_forward(Ops& ops, int l, int B, int T, bool only_recomputed);
  struct SavedKind {
    size_t floats = 0;      // per layer, at the planned batch and sequence length
    std::vector<int> slot;  // per layer: index in the stored buffer, or -1 (recompute buffer)
    size_t i_stored = 0, i_recompute = 0;
    float *stored = nullptr, *recompute = nullptr;
  };
  SavedKind saved_[kSavedKinds];

  TransformerConfig cfg_;
  ParamLayout layout_;
  size_t wte_off_, wpe_off_, lnfw_off_, lnfb_off_;  // offsets of the tensors outside the blocks
  int B_, T_;
  bool training_;
  CheckpointPolicy checkpointing_;

  // Plan indices.
  size_t i_params_ = 0, i_grads_ = 0, i_encoded_ = 0, i_res3_ = 0, i_lnf_ = 0, i_lnf_stats_ = 0,
         i_logits_ = 0, i_losses_ = 0, i_tmp_c_ = 0, i_dres_ = 0, i_d4c_ = 0, i_dqkv_ = 0,
         i_attn_scratch_ = 0;

  float *params_ = nullptr, *grads_ = nullptr;
  float *encoded_ = nullptr, *res3_ = nullptr, *lnf_ = nullptr, *lnf_stats_ = nullptr, *logits_ = nullptr,
        *losses_ = nullptr, *tmp_c_ = nullptr, *dres_ = nullptr, *d4c_ = nullptr, *dqkv_ = nullptr,
        *attn_scratch_ = nullptr;
};

}  // namespace anvil
