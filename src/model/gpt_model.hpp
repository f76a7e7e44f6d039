// GPT-2 with explicit forward and backward per layer (DESIGN principle 3). The model does not own
// memory: it adds its buffers to a MemoryPlan and binds to the Arena carved from it.
//
// Precision (OpsPrecision): weights, activations and activation gradients are stored in the compute type;
// parameter gradients in the gradient type; LayerNorm statistics and per-position losses in fp32. With a
// 16-bit compute type the model also keeps fp32 master weights (what the optimizer updates, checkpoints
// save and evaluation-free code reads); sync_weights() rounds them into the compute-type copy.
//
// Saved activations per layer (what backward reads): ln1 out, ln1 mean/rstd, qkv, attention output,
// attention probabilities, residual after attention, ln2 out, ln2 mean/rstd, MLP pre-activation,
// MLP activation, and the block output (always stored: it is the next block's checkpoint). Under a
// CheckpointPolicy, a checkpointed block's activations of the recomputed kinds go to shared recompute
// buffers and are rebuilt by re-running the block's forward just before its backward.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "anvil/memory_plan.hpp"
#include "anvil/model_config.hpp"
#include "kernels/ops.hpp"
#include "memory/memory_trace.hpp"
#include "model/checkpointing.hpp"
#include "model/model.hpp"
#include "model/param_layout.hpp"
#include "runtime/arena.hpp"
#include "runtime/step_profiler.hpp"

namespace anvil {

class GptModel final : public Model {
 public:
  // `max_batch` x `max_seq` is the largest input forward() will see. With `training`, gradients and the
  // backward workspace are planned too.
  GptModel(TransformerConfig cfg, int max_batch, int max_seq, bool training,
           CheckpointPolicy checkpointing = {}, OpsPrecision precision = {});

  // Adds the model's buffers; `backend` sizes the attention scratch (no device is needed to plan).
  void plan_memory(MemoryPlan& plan, DeviceKind backend) override;
  void bind(const Arena& arena) override;

  const TransformerConfig& config() const override { return cfg_; }
  const ParamLayout& layout() const override { return layout_; }
  int max_batch() const override { return B_; }
  int max_seq() const override { return T_; }
  OpsPrecision precision() const override { return precision_; }
  // The fp32 (master) weights, in the flat layout: the weights themselves when the compute type is fp32.
  float* params() const override { return master_; }
  // The weights the ops read, in the compute type (== params() for fp32).
  void* weights() const override { return weights_; }
  // Parameter gradients in the gradient type; grads() is for fp32 gradients only.
  void* grad_buffer() const override { return grads_; }
  float* grads() const override;
  size_t grad_bytes() const override { return dtype_bytes(precision_.grad, layout_.total_numel()); }
  // Per-position losses [B*T] (0 at ignore-index targets).
  const float* losses() const override { return losses_; }
  size_t loss_rows(int B, int T) const override { return size_t(B) * size_t(T); }
  // Logits [B, T, padded vocab] in the compute type, after a forward without targets (a forward with
  // targets computes them in chunks of logits_rows() rows and keeps none); copy_logits_to_host widens rows
  // to fp32.
  const void* logits() const { return logits_; }
  // Rows the logits buffer holds: B*T for an inference model; at most kLossChunkRows for a training one.
  size_t logits_rows() const { return logits_rows_; }
  void copy_logits_to_host(Device& dev, float* dst, size_t first_row, size_t rows) const;

  // GPT-2 initialisation, deterministic for a seed: N(0, 0.02) for matrices and embeddings,
  // N(0, 0.02/sqrt(2 n_layer)) for the residual projections, LayerNorm (1, 0), biases 0, padded vocab rows 0.
  void init_weights(uint64_t seed, Device& dev) const override;
  // Sets the weights from fp32 host values (flat layout): the master weights and, for a 16-bit compute
  // type, their round-to-nearest copy.
  void upload_weights(Device& dev, const float* host) const override;
  // Rounds the master weights into the compute-type copy on the device (after an optimizer step); with a
  // nonzero `rounding_seed`, stochastically (bf16). No-op for fp32.
  void sync_weights(Ops& ops, uint64_t rounding_seed = 0,
                    const StepValues* step_values = nullptr) const override;

  // tokens/targets are [B, T] in device memory. With targets, losses() receives the per-position loss; the
  // LM head and loss run in chunks of logits_rows() rows, so the [B*T, vocab] logits never exist at once.
  // With write_grad, each chunk's backward through the head (tied wte gradient, d(ln_f output)) runs right
  // after its loss, scaled by grad_scale; backward() continues from there. Without targets, the logits of
  // all B*T rows are computed (B*T must fit logits_rows()).
  void forward(Ops& ops, const int32_t* tokens, const int32_t* targets, int B, int T, float grad_scale,
               bool write_grad);
  // Rows of one LM-head + loss chunk of a training model (a [rows, vocab] logits buffer: 0.8 GB for
  // GPT-2's vocabulary in bf16).
  static constexpr size_t kLossChunkRows = 8192;
  // Accumulates parameter gradients into grads(); needs the preceding forward with write_grad.
  void backward(Ops& ops, const int32_t* tokens, int B, int T);
  // The Model interface: tokens and targets of `in`.
  void forward(Ops& ops, const ModelInputs& in, float grad_scale, bool write_grad) override {
    forward(ops, in.tokens, in.targets, in.B, in.T, grad_scale, write_grad);
  }
  void backward(Ops& ops, const ModelInputs& in) override { backward(ops, in.tokens, in.B, in.T); }

  // Memory history (docs/memory.md): while a trace is set, forward and backward record when each saved
  // activation becomes live (written) and dead (last read), per layer, with phase markers. nullptr stops.
  void set_memory_trace(MemoryTrace* trace) override;
  // Profiling: while set, each phase (forward / recompute / backward per block, head, embedding) starts a
  // range of the profiler. nullptr stops.
  void set_profiler(StepProfiler* profiler) override { profiler_ = profiler; }

 private:
  // The tensors of one block, as offsets into the flat buffer (looked up by name once) or as pointers
  // into the parameters or the gradients.
  template <class T>
  struct LayerTensors {
    T ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
  };
  using LayerParams = LayerTensors<void*>;
  // Pointers into a flat buffer whose elements are `elem_bytes` wide.
  LayerParams layer_params(void* base, size_t elem_bytes, int l) const;
  std::vector<LayerTensors<size_t>> layer_offsets_;

  // The per-layer saved activations, by kind.
  enum Saved { kLn1, kLn1Stats, kQkv, kAtty, kLse, kRes2, kLn2, kLn2Stats, kFch, kFchGelu, kSavedKinds };
  bool recomputed(int kind, int layer) const;  // kind's tensor of `layer` lives in the recompute buffer
  void* act(int kind, int layer) const;        // where `layer` keeps (or recomputes) that tensor
  float* stats(int kind, int layer) const { return static_cast<float*>(act(kind, layer)); }
  // The block's forward; with `only_recomputed`, just the steps whose outputs are recomputed for it.
  void block_forward(Ops& ops, int l, int B, int T, bool only_recomputed);
  struct SavedKind {
    size_t bytes = 0;       // per layer, at the planned batch and sequence length
    std::vector<int> slot;  // per layer: index in the stored buffer, or -1 (recompute buffer)
    size_t i_stored = 0, i_recompute = 0;
    char *stored = nullptr, *recompute = nullptr;
  };
  SavedKind saved_[kSavedKinds];

  // Memory-trace bookkeeping: the live id of each (kind, layer), of each block output, and of the tensors
  // outside the blocks (-1: not live).
  void trace_phase(const char* name, int layer);
  void trace_alloc(int& id, const char* name, MemoryCategory c, size_t bytes, int layer, const char* phase);
  void trace_free(int& id, const char* phase);
  MemoryTrace* trace_ = nullptr;
  StepProfiler* profiler_ = nullptr;
  std::vector<std::array<int, kSavedKinds>> trace_saved_;
  std::vector<int> trace_block_out_;
  int trace_encoded_ = -1, trace_lnf_ = -1, trace_logits_ = -1, trace_losses_ = -1;

  TransformerConfig cfg_;
  ParamLayout layout_;
  size_t wte_off_, wpe_off_, lnfw_off_, lnfb_off_;  // offsets of the tensors outside the blocks
  int B_, T_;
  bool training_;
  size_t logits_rows_;  // rows of the logits buffer (see logits_rows())
  CheckpointPolicy checkpointing_;
  OpsPrecision precision_;
  size_t ae_, ge_;  // bytes per element of the compute and gradient types
  // Element `i` of a compute-type buffer.
  void* at(void* base, size_t i) const { return static_cast<char*>(base) + i * ae_; }

  // Plan indices.
  size_t i_master_ = 0, i_weights_ = 0, i_grads_ = 0, i_encoded_ = 0, i_res3_ = 0, i_lnf_ = 0,
         i_lnf_stats_ = 0, i_logits_ = 0, i_losses_ = 0, i_tmp_c_ = 0, i_dres_ = 0, i_d4c_ = 0, i_dqkv_ = 0,
         i_attn_scratch_ = 0;

  float* master_ = nullptr;
  void *weights_ = nullptr, *grads_ = nullptr;
  void *encoded_ = nullptr, *res3_ = nullptr, *lnf_ = nullptr, *logits_ = nullptr, *tmp_c_ = nullptr,
       *dres_ = nullptr, *d4c_ = nullptr, *dqkv_ = nullptr, *attn_scratch_ = nullptr;
  float *lnf_stats_ = nullptr, *losses_ = nullptr;
  bool head_grad_ready_ = false;  // forward(write_grad) left d(ln_f output) in tmp_c_ for backward()
};

}  // namespace anvil
