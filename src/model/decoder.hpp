// The causal-LM decoder of every decoder family (GPT-2, Llama, Qwen2, Mistral), built from the parts its
// ArchSpec selects (model/arch_spec.hpp): LayerNorm or RMSNorm, learned positions or RoPE, multi-head or
// grouped-query attention with an optional sliding window, GELU or SwiGLU MLP, tied or untied head. Explicit
// forward and backward per layer (DESIGN principle 3). The decoder owns no parameter memory (its ParamStore
// plans the weights, master weights and gradients) and no memory at all: it adds its buffers to a MemoryPlan
// and binds to the Arena carved from it.
//
// Precision (OpsPrecision): weights, activations and activation gradients are stored in the compute type;
// parameter gradients in the gradient type; norm statistics and per-position losses in fp32.
//
// Saved activations per layer (what backward reads): norm-1 output and statistics, qkv (after RoPE),
// attention output and log-sum-exp, residual after attention, norm-2 output and statistics, the MLP's first
// GEMM output (GELU's input; SwiGLU's gate|up) and the MLP activation, and the block output (always stored:
// it is the next block's checkpoint). Under a CheckpointPolicy, a checkpointed block's activations of the
// recomputed kinds go to shared recompute buffers and are rebuilt by re-running the block's forward just
// before its backward.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "anvil/memory_plan.hpp"
#include "anvil/model_config.hpp"
#include "kernels/ops.hpp"
#include "memory/memory_trace.hpp"
#include "model/arch_spec.hpp"
#include "model/checkpointing.hpp"
#include "model/linear.hpp"
#include "model/model.hpp"
#include "model/param_store.hpp"
#include "peft/lora_adapter.hpp"
#include "runtime/arena.hpp"
#include "runtime/step_profiler.hpp"

namespace anvil {

class KvCache;

class Decoder final : public Model {
 public:
  // `max_batch` x `max_seq` is the largest input forward() will see. With `training`, gradients and the
  // backward workspace are planned too.
  // `lora` (enabled: r > 0) adds LoRA adapters to the block Linears it targets and freezes every other tensor
  // (ParamLayout::decoder).
  Decoder(TransformerConfig cfg, int max_batch, int max_seq, bool training,
          CheckpointPolicy checkpointing = {}, OpsPrecision precision = {}, const LoraConfig& lora = {});

  // Adds the model's buffers; `backend` sizes the attention scratch (no device is needed to plan).
  void plan_memory(MemoryPlan& plan, DeviceKind backend) override;
  void bind(const Arena& arena) override;
  // The RoPE frequencies (the only buffer not derived from the weights).
  void upload_constants(Device& dev) const override;

  const TransformerConfig& config() const override { return cfg_; }
  const ArchSpec& spec() const { return spec_; }
  const ParamLayout& layout() const override { return store_.layout(); }
  ParamStore& param_store() override { return store_; }
  int max_batch() const override { return B_; }
  int max_seq() const override { return T_; }
  OpsPrecision precision() const override { return store_.precision(); }
  float* params() const override { return store_.master(); }
  void* weights() const override { return store_.weights(); }
  void* grad_buffer() const override { return store_.grads(); }
  // LoRA with lora_dropout while training: the state its masks are drawn from; else null.
  DropoutState* dropout_state() const override { return lora_dropout_state_; }
  float* grads() const override { return store_.grads_f32(); }
  size_t grad_bytes() const override { return store_.grad_bytes(); }
  bool grads_by_unit() const override { return true; }
  double skipped_backward_flops_per_token(int seq_len) const override;
  // Per-position losses [B*T] (0 at ignore-index targets).
  const float* losses() const override { return losses_; }
  size_t loss_rows(int B, int T) const override { return size_t(B) * size_t(T); }
  // Logits [B, T, padded vocab] in the compute type, after a forward without targets (a forward with
  // targets computes them in chunks of logits_rows() rows and keeps none); copy_logits_to_host widens rows
  // to fp32.
  const void* logits() const { return logits_; }
  // Rows the logits buffer holds: B*T for an inference model; at most kLossChunkRows for a training one.
  size_t logits_rows() const { return logits_rows_; }
  // An inference model used only through forward_cached (a Generator) needs one row per sequence: fewer
  // rows to plan (before plan_memory; at least max_batch). forward() without targets then takes that many.
  void set_logits_rows(size_t rows);
  void copy_logits_to_host(Device& dev, float* dst, size_t first_row, size_t rows) const;

  // The family's initialisation, deterministic for a seed: N(0, 0.02) for matrices and embeddings,
  // N(0, 0.02/sqrt(2 n_layer)) for the residual projections, norms (1, 0), biases 0, padded vocab rows 0.
  void init_weights(uint64_t seed, Device& dev) const override;
  // Sets the weights from fp32 host values (flat layout): the master weights and, for a 16-bit compute
  // type, their round-to-nearest copy.
  void upload_weights(Device& dev, const float* host) const override;
  void download_weights(Device& dev, float* host) const override { store_.download(dev, host); }
  void sync_weights(Ops& ops, uint64_t rounding_seed = 0,
                    const StepValues* step_values = nullptr) const override {
    store_.sync(ops, rounding_seed, step_values);
  }

  // tokens/targets are [B, T] in device memory. With targets, losses() receives the per-position loss; the
  // LM head and loss run in chunks of logits_rows() rows, so the [B*T, vocab] logits never exist at once.
  // With write_grad, each chunk's backward through the head (head gradient, d(final norm output)) runs
  // right after its loss, scaled by grad_scale; backward() continues from there. Without targets, the
  // logits of all B*T rows are computed (B*T must fit logits_rows()).
  void forward(Ops& ops, const int32_t* tokens, const int32_t* targets, int B, int T, float grad_scale,
               bool write_grad);
  // Rows of one LM-head + loss chunk of a training model (a [rows, vocab] logits buffer: 0.8 GB for
  // GPT-2's vocabulary in bf16).
  static constexpr size_t kLossChunkRows = 8192;
  // Accumulates parameter gradients into grad_buffer(); needs the preceding forward with write_grad.
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

  // --- generation with a KV cache (decoder_decode.cpp; model/kv_cache.hpp) ---------------------------------
  // Runs Tn <= max_seq() new tokens of each of B <= max_batch() sequences: tokens [B, Tn] and pos [B] are
  // int32 in device memory, token t of sequence b at position pos[b] + t, its positions before pos[b] already
  // in `cache`. The blocks are forward()'s, with the embedding and RoPE at those positions; their keys and
  // values go into the cache and each token attends to its sequence's cached positions up to its own (causal,
  // the spec's sliding window). `max_end` (host): pos[b] + Tn <= max_end <= cache.max_len() for every b. The
  // final norm output of row last_rows[b] (host, in [0, Tn); empty: Tn - 1) of each sequence goes through the
  // LM head into logits() row b. A prompt is prefilled in calls of up to max_seq() tokens, then each decode
  // step is a call with Tn = 1.
  void forward_cached(Ops& ops, const KvCache& cache, const int32_t* tokens, const int32_t* pos, int B,
                      int Tn, int max_end, const std::vector<int>& last_rows = {});
  void decode_step(Ops& ops, const KvCache& cache, const int32_t* tokens, const int32_t* pos, int B,
                   int max_end) {
    forward_cached(ops, cache, tokens, pos, B, 1, max_end);
  }

 private:
  void block_forward_cached(Ops& ops, const KvCache& cache, int l, const int32_t* pos, int B, int Tn,
                            int max_end);
  // --- end of generation with a KV cache -------------------------------------------------------------

 private:
  // The tensors of one block, as offsets into the flat buffer (found by role in the layout once; SIZE_MAX
  // for a part the spec does not have) or as pointers into the weights or the gradients (null then).
  template <class T>
  struct LayerTensors {
    T ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
  };
  using LayerParams = LayerTensors<void*>;
  LayerParams layer_weights(int l) const;
  LayerParams layer_grads(int l) const;
  std::vector<LayerTensors<size_t>> layer_offsets_;
  void* weight_or_null(size_t offset) const;
  void* grad_or_null(size_t offset) const;
  // The gradient of the `numel` elements at `offset` (a Linear's weight or bias, fused ones included), or
  // null where there is none or every tensor in it is frozen: the op then skips that gradient.
  void* trainable_grad_or_null(size_t offset, size_t numel) const;

  // The block's linear layers (model/linear.hpp): q/k/v (one fused GEMM), the attention output, the MLP's
  // input (GELU: c_fc; SwiGLU: gate and up fused) and output; with their gradients when `with_grads`.
  struct BlockLinears {
    Linear qkv, out, mlp_in, mlp_out;
  };
  // With LoRA, the Linears carry their adapters (adapters_ of block l, valid until the next call).
  BlockLinears block_linears(int l, bool with_grads) const;
  // LoRA (peft/lora_adapter.hpp): per block and Linear (qkv, out, mlp_in, mlp_out), the adapted parts (the
  // offsets of A and B in the flat layout, the output rows they add to); the adapters block_linears hands
  // out, rebuilt from the store's current views on each call (ZeRO may move them between units); the
  // adapters' shared scratch.
  struct LoraSlot {
    size_t a = 0, b = 0;
    int first = 0, rows = 0;
  };
  std::vector<std::array<std::vector<LoraSlot>, 4>> lora_slots_;
  mutable std::array<LoraAdapter, 4> adapters_;
  mutable std::array<std::array<LoraPart, 3>, 4> lora_parts_;  // the adapters' parts (q, k, v at most)
  void* lora_scratch_ = nullptr;
  size_t i_lora_scratch_ = SIZE_MAX;
  // lora_dropout (training): the masks' state (dropout_state()), the dropped inputs' scratch, and whether the
  // last forward was a training one (its backward then drops too).
  DropoutState* lora_dropout_state_ = nullptr;
  void* lora_dropout_scratch_ = nullptr;
  size_t i_lora_dropout_state_ = SIZE_MAX, i_lora_dropout_scratch_ = SIZE_MAX;
  bool lora_dropping_ = false;
  // The LM head [padded vocab, C] (the token embedding when tied), with its gradient when `with_grads`.
  Linear head_linear(bool with_grads) const;

  // The norms of the spec: statistics are mean then rstd (LayerNorm, 2 rows of N) or rstd (RMSNorm).
  void norm_fwd(Ops& ops, void* out, float* stats, const void* inp, const void* w, const void* b, int N);
  void residual_norm_fwd(Ops& ops, void* out, void* ln, float* stats, const void* a, const void* b,
                         const void* w, const void* bias, int N);
  void norm_bwd(Ops& ops, void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                const float* stats, int N);
  AttentionShape attention_shape(int B, int T) const { return {B, T, spec_.NH, spec_.NKV, spec_.HS}; }
  AttentionMask attention_mask() const;

  // The per-layer saved activations, by kind.
  enum Saved { kLn1, kLn1Stats, kQkv, kAtty, kLse, kRes2, kLn2, kLn2Stats, kFch, kFchGelu, kSavedKinds };
  bool recomputed(int kind, int layer) const;  // kind's tensor of `layer` lives in the recompute buffer
  void* act(int kind, int layer) const;        // where `layer` keeps (or recomputes) that tensor
  float* stats(int kind, int layer) const { return static_cast<float*>(act(kind, layer)); }
  // The block's forward; with `only_recomputed`, just the steps whose outputs are recomputed for it.
  void block_forward(Ops& ops, int l, int B, int T, bool only_recomputed);
  void block_backward(Ops& ops, int l, int B, int T);
  // Block l's output res2 + tmp_c_ (the MLP projection) into res3_, fused with the norm that reads it next.
  void block_output_fwd(Ops& ops, int l, const void* res2, int N);
  void mlp_forward(Ops& ops, const BlockLinears& lin, void* out, void* pre, const void* inp, int N,
                   bool pre_too);
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
  ArchSpec spec_;
  ParamStore store_;
  // Offsets of the tensors outside the blocks (SIZE_MAX: the spec has none); the head is the token
  // embedding when tied.
  size_t wte_off_, wpe_off_, head_off_, lnfw_off_, lnfb_off_;
  int unit_final_;  // the final unit's index (units: embedding, blocks, final)
  int head_unit_;   // the unit holding the LM head weight (the embedding when tied, else the final unit)
  int B_, T_;
  bool training_;
  size_t logits_rows_;  // rows of the logits buffer (see logits_rows())
  CheckpointPolicy checkpointing_;
  size_t ae_;          // bytes per element of the compute type
  size_t stats_rows_;  // fp32 rows of N per norm's statistics: 2 (LayerNorm) or 1 (RMSNorm)
  size_t proj_width_;  // columns of the projection scratch: max(C, NH * HS)
  // Element `i` of a compute-type buffer.
  void* at(void* base, size_t i) const { return static_cast<char*>(base) + i * ae_; }

  // Plan indices.
  size_t i_encoded_ = 0, i_res3_ = 0, i_lnf_ = 0, i_lnf_stats_ = 0, i_logits_ = 0, i_losses_ = 0,
         i_tmp_c_ = 0, i_dres_ = 0, i_d4c_ = 0, i_dact_ = SIZE_MAX, i_dqkv_ = 0, i_attn_scratch_ = 0,
         i_inv_freq_ = SIZE_MAX;

  void *encoded_ = nullptr, *res3_ = nullptr, *lnf_ = nullptr, *logits_ = nullptr, *tmp_c_ = nullptr,
       *dres_ = nullptr, *d4c_ = nullptr, *dact_ = nullptr, *dqkv_ = nullptr, *attn_scratch_ = nullptr;
  float *lnf_stats_ = nullptr, *losses_ = nullptr, *inv_freq_ = nullptr;
  bool head_grad_ready_ = false;  // forward(write_grad) left d(final norm output) in tmp_c_ for backward()
};

}  // namespace anvil
