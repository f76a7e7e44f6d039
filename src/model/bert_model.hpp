// BERT (Hugging Face BertForSequenceClassification) with explicit forward and backward per layer (DESIGN
// principle 3), implementing the Model interface (model.hpp) as Decoder does: the model owns no memory; it
// adds its buffers to a MemoryPlan and binds to the Arena carved from it, and nothing is allocated in
// forward() or backward(). Its weights, master weights and gradients are a ParamStore (model/param_store.hpp)
// of ParamLayout::bert, with the store's per-unit acquire / release / grads_ready hooks around every unit, as
// in Decoder; only the placement of the gradients in dead activation memory (plan_shared_grads) is BERT's.
//
// The network, exactly as transformers computes it in eval mode (docs/bert.md):
//   embedding: e = LayerNorm(word[tokens] + token_type[types] + position[t])
//   block:     qkv = x Wqkv^T + b (query, key and value fused: one GEMM); a = attention(qkv) over the real
//              tokens of each sequence (bidirectional, padding keys masked out);
//              h1 = LayerNorm(x + a Wo^T + bo);  f = gelu(h1 Wi^T + bi);  out = LayerNorm(h1 + f Wout^T +
//              bout)
//   head:      pooled = tanh(out_L[:, 0] Wp^T + bp) (the first token);  logits = pooled Wc^T + bc
//   loss:      cross-entropy over num_labels (labels int32, kIgnoreIndex ignored) or, with one label,
//              squared error (labels fp32): per sequence, in losses()
// "gelu" is the exact erf GELU (matmul_fwd + gelu_erf_fwd: the cuBLASLt epilogue is the tanh approximation,
// which hidden_act "gelu_new" selects and then uses fused).
//
// Dropout (a training forward, write_grad, of a model planned for training), where HF's BertModel applies it:
// e (hidden_dropout_prob), the attention probabilities (attention_probs_dropout_prob), a Wo^T + bo and
// f Wout^T + bout before their residual adds (hidden_dropout_prob), and pooled before the classifier
// (classifier_dropout_prob()). Masks are hashes of the DropoutState's seed and micro-batch counter, the site
// and the element (kernels/dropout.hpp): each training forward advances the counter, backward and checkpoint
// recomputes draw the same masks, and CPU and CUDA drop the same elements. Sites: layer l's attention
// probabilities 4l, attention output 4l + 1, MLP output 4l + 2; the embedding 4L, the classifier input 4L
// + 1.
//
// Padding: `lengths` [B] (int32, device memory; null = every sequence is T tokens) gives each sequence's
// real tokens, 1 <= lengths[b] <= T; the rest is padding, which no query attends to. Padding positions carry
// values that never reach the logits, and get exactly zero gradient.
//
// Precision (OpsPrecision) as in Decoder: weights, activations and activation gradients in the compute
// type, parameter gradients in the gradient type, LayerNorm statistics and losses in fp32, fp32 master
// weights for a 16-bit compute type (the store's sync rounds them into the compute-type copy).
//
// Saved activations per layer (what backward reads): qkv, attention output, attention log-sum-exp, the
// attention residual (LayerNorm 1's input) with LayerNorm 1's mean/rstd and output, the MLP pre-activation,
// the MLP residual (LayerNorm 2's input) with LayerNorm 2's mean/rstd, and the block output (always stored:
// it is the next block's input and checkpoint). The MLP activation (GELU output) is not stored: it lives in a
// one-layer recompute buffer and backward rebuilds it from the pre-activation (a quarter less activation
// memory for one elementwise pass per block). Under a CheckpointPolicy a checkpointed
// block's activations of the recomputed kinds live in shared recompute buffers and are rebuilt by re-running
// the block's forward just before its backward: "full" recomputes all of them (LayerNorm 2's statistics
// excepted: they produced the stored output and are tiny), "selective" keeps the attention tensors.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "anvil/memory_plan.hpp"
#include "anvil/model_config.hpp"
#include "kernels/ops.hpp"
#include "memory/memory_trace.hpp"
#include "model/checkpointing.hpp"
#include "model/linear.hpp"
#include "model/model.hpp"
#include "model/param_layout.hpp"
#include "model/param_store.hpp"
#include "runtime/arena.hpp"
#include "runtime/step_profiler.hpp"

namespace anvil {

class BertModel final : public Model {
 public:
  // `max_batch` x `max_seq` is the largest input forward() will see. With `training`, gradients and the
  // backward workspace are planned too. With `share_grad_memory` (training with one micro-batch per step),
  // the gradients are planned in the memory of saved activations that backward is done with when they are
  // written (grads_share_activations()).
  BertModel(TransformerConfig cfg, int max_batch, int max_seq, bool training,
            CheckpointPolicy checkpointing = {}, OpsPrecision precision = {}, bool share_grad_memory = false);

  // Adds the model's buffers; `backend` sizes the attention scratch (no device is needed to plan).
  void plan_memory(MemoryPlan& plan, DeviceKind backend) override;
  void bind(const Arena& arena) override;

  const TransformerConfig& config() const override { return cfg_; }
  const ParamLayout& layout() const override { return store_.layout(); }
  ParamStore& param_store() override { return store_; }
  int max_batch() const override { return B_; }
  int max_seq() const override { return T_; }
  OpsPrecision precision() const override { return store_.precision(); }
  // The fp32 (master) weights, in the flat layout: the weights themselves when the compute type is fp32.
  float* params() const override { return store_.master(); }
  // The weights the ops read, in the compute type (== params() for fp32).
  void* weights() const override { return store_.weights(); }
  // Parameter gradients in the gradient type; grads() is for fp32 gradients only.
  void* grad_buffer() const override { return store_.grads(); }
  float* grads() const override { return store_.grads_f32(); }
  size_t grad_bytes() const override { return store_.grad_bytes(); }
  // Gradients sharing activation memory: the next forward overwrites them, and backward() zeroes each
  // unit's gradients itself before writing them, so a backward() sets (not accumulates) the gradients.
  bool grads_share_activations() const override { return share_grad_memory_; }
  double skipped_backward_flops_per_token(int seq_len) const override;
  // How the weight-gradient GEMMs write the matrices' gradients: over them when the gradients share
  // activation memory (one write per step, and the buffer holds garbage until then), else added.
  GradWrite dw_write() const { return share_grad_memory_ ? GradWrite::Overwrite : GradWrite::Accumulate; }
  // The dropout state (device memory) the masks are drawn from, when the model trains with dropout; else
  // null. Whoever runs training steps sets its seed before each step (and micro to 0).
  DropoutState* dropout_state() const override { return dropout_state_; }
  // Per-sequence losses [B] (fp32) of the last forward with labels (0 for ignored labels).
  const float* losses() const override { return losses_; }
  size_t loss_rows(int B, int /*T*/) const override { return size_t(B); }
  // Logits [B, num_labels] in the compute type, after any forward; copy_logits_to_host widens them to fp32.
  const void* logits() const { return logits_; }
  void copy_logits_to_host(Device& dev, float* dst, int B) const;
  // Only the pooler reads the encoder output, and only its first ([CLS]) rows: by default the last block
  // computes everything after its attention (output projection, LayerNorms, MLP) for those B rows only, not
  // B x T (the same values and gradients; 1/n_layer of the block work less, about a 24th for bert-large),
  // and its attention and query projection for the [CLS] queries only (attention_first_query_fwd); its keys
  // and values still come from every position. set_full_last_hidden_state(true) makes forward()
  // compute the whole last block, for last_hidden_state().
  void set_full_last_hidden_state(bool on) { full_last_hidden_state_ = on; }
  // The encoder output (transformers' last_hidden_state) [B, T, n_embd] and the pooler output (pooler_output)
  // [B, n_embd] of the last forward, in the compute type; the copy_* functions widen them to fp32. Rows of
  // padding positions hold values that are not transformers' (they never reach the pooler or the logits).
  // last_hidden_state needs set_full_last_hidden_state(true) before that forward.
  const void* last_hidden_state() const;
  const void* pooled_output() const { return pooled_; }
  void copy_last_hidden_state_to_host(Device& dev, float* dst, int B, int T) const;
  void copy_pooled_output_to_host(Device& dev, float* dst, int B) const;
  // The element type forward() expects its labels in: I32 (class ids), or F32 for regression.
  DType label_dtype() const { return cfg_.is_regression() ? DType::F32 : DType::I32; }

  // Hugging Face BERT initialisation, deterministic for a seed: N(0, initializer_range) for matrices and
  // embeddings (the word embedding's pad_token_id row 0), LayerNorm (1, 0), biases 0.
  void init_weights(uint64_t seed, Device& dev) const override;
  // Sets the weights from fp32 host values (flat layout): the master weights and, for a 16-bit compute type,
  // their round-to-nearest copy.
  void upload_weights(Device& dev, const float* host) const override { store_.upload(dev, host); }
  void download_weights(Device& dev, float* host) const override { store_.download(dev, host); }
  // Rounds the master weights into the compute-type copy on the device (after an optimizer step); with a
  // nonzero `rounding_seed`, stochastically (bf16). No-op for fp32.
  void sync_weights(Ops& ops, uint64_t rounding_seed = 0,
                    const StepValues* step_values = nullptr) const override {
    store_.sync(ops, rounding_seed, step_values);
  }

  // tokens [B, T] and token_types [B, T] (null: all type 0), lengths [B] (null: no padding) and labels [B]
  // (label_dtype(); null: inference, logits only) in device memory. With labels, losses() receives the
  // per-sequence loss; with write_grad the loss gradient (times grad_scale) is kept for backward().
  void forward(Ops& ops, const int32_t* tokens, const int32_t* token_types, const int32_t* lengths,
               const void* labels, int B, int T, float grad_scale, bool write_grad);
  // Accumulates parameter gradients into grad_buffer(); needs the preceding forward with labels and
  // write_grad, and the same inputs.
  void backward(Ops& ops, const int32_t* tokens, const int32_t* token_types, const int32_t* lengths, int B,
                int T);
  // The Model interface: tokens, token types, lengths and labels of `in`.
  void forward(Ops& ops, const ModelInputs& in, float grad_scale, bool write_grad) override {
    forward(ops, in.tokens, in.token_types, in.lengths, in.labels, in.B, in.T, grad_scale, write_grad);
  }
  void backward(Ops& ops, const ModelInputs& in) override {
    backward(ops, in.tokens, in.token_types, in.lengths, in.B, in.T);
  }

  // Memory history (docs/memory.md) and profiling, as Decoder: while set, forward and backward record
  // phases and when each saved activation is live. nullptr stops.
  void set_memory_trace(MemoryTrace* trace) override;
  void set_profiler(StepProfiler* profiler) override { profiler_ = profiler; }

 private:
  // The tensors of one block as offsets into the flat buffer (looked up by name once), or as pointers.
  // qkvw / qkvb are the query weight / bias: key and value follow contiguously.
  template <class T>
  struct LayerTensors {
    T qkvw, qkvb, attow, attob, ln1w, ln1b, fcw, fcb, projw, projb, ln2w, ln2b;
  };
  using LayerParams = LayerTensors<void*>;
  LayerParams layer_params(void* base, size_t elem_bytes, int l) const;
  // The block's linear layers (model/linear.hpp): query/key/value (fused, [3C, C]), attention output, MLP
  // input and output. With `with_grads`, their weight gradients and the QKV and MLP-input bias gradients;
  // the attention-output and MLP-output bias gradients are added by the LayerNorm backward that reads
  // their outputs' gradients (layernorm_bwd_sum), so those two Linears have none.
  struct BlockLinears {
    Linear qkv, attn_out, fc, proj;
  };
  BlockLinears block_linears(int l, bool with_grads) const;
  // The pooler dense [C, C] and the classifier [num_labels, C], with their gradients when `with_grads`.
  Linear pooler_linear(bool with_grads) const;
  Linear classifier_linear(bool with_grads) const;
  std::vector<LayerTensors<size_t>> layer_offsets_;
  // Offsets of the tensors outside the blocks.
  size_t wte_off_, wpe_off_, wtt_off_, lnew_off_, lneb_off_, poolw_off_, poolb_off_, clsw_off_, clsb_off_;

  // The per-layer saved activations, by kind.
  enum Saved { kQkv, kAtty, kLse, kRes1, kLn1Stats, kH1, kFch, kFchGelu, kRes2, kLn2Stats, kSavedKinds };
  bool recomputed(int kind, int layer) const;  // kind's tensor of `layer` lives in the recompute buffer
  void* act(int kind, int layer) const;        // where `layer` keeps (or recomputes) that tensor
  float* stats(int kind, int layer) const { return static_cast<float*>(act(kind, layer)); }
  // The block's forward; with `only_recomputed`, just the steps whose outputs are recomputed for it.
  void block_forward(Ops& ops, int l, int B, int T, const AttentionMask& mask, bool only_recomputed);
  void block_backward(Ops& ops, int l, int B, int T, const AttentionMask& mask);
  struct SavedKind {
    size_t bytes = 0;               // per layer, at the planned batch and sequence length
    size_t i_recompute = SIZE_MAX;  // SIZE_MAX: no layer recomputes the kind
    char* recompute = nullptr;      // the kind's recompute buffer, if any layer recomputes it
  };
  SavedKind saved_[kSavedKinds];
  // Saved activations are planned block by block: the buffer of each block, and where each stored kind
  // (then, at index kSavedKinds, the block output) lies in it; SIZE_MAX for a recomputed kind.
  std::vector<size_t> i_block_acts_;
  std::vector<char*> block_acts_;
  std::vector<std::array<size_t, kSavedKinds + 1>> act_offset_;
  // Places the gradient buffer over activations (share_grad_memory_); after the activations are planned.
  void plan_shared_grads(MemoryPlan& plan);

  // Memory-trace bookkeeping (see Decoder): live ids per (layer, kind), per block output, and outside.
  void trace_phase(const char* name, int layer);
  void trace_alloc(int& id, const char* name, MemoryCategory c, size_t bytes, int layer, const char* phase);
  void trace_free(int& id, const char* phase);
  MemoryTrace* trace_ = nullptr;
  StepProfiler* profiler_ = nullptr;
  std::vector<std::array<int, kSavedKinds>> trace_saved_;
  std::vector<int> trace_block_out_;
  int trace_embedding_ = -1, trace_head_ = -1;

  TransformerConfig cfg_;
  ParamStore store_;  // weights, master weights and gradients
  int B_, T_;
  bool training_;
  CheckpointPolicy checkpointing_;
  bool share_grad_memory_;
  // Dropout probabilities in training (0 without training): hidden, attention probabilities, classifier.
  float p_hidden_ = 0, p_attn_ = 0, p_cls_ = 0;
  bool has_dropout() const { return p_hidden_ > 0 || p_attn_ > 0 || p_cls_ > 0; }
  bool fwd_dropout_ = false;  // the last forward applied dropout (a training forward)
  bool full_last_hidden_state_ = false;
  bool first_rows_last_ = false;  // the last forward computed the last block's [CLS] rows only
  // That forward's layer l runs only the [CLS] rows after its attention.
  bool first_rows_only(int l) const { return first_rows_last_ && l == cfg_.n_layer - 1; }
  // Dropout of a block's [rows, C] hidden-state tensor at `site`: all B x T rows, or the [CLS] rows of the
  // last block with the masks those rows draw in the whole tensor.
  void hidden_dropout(Ops& ops, void* y, const void* x, int l, int B, int T, uint32_t site) const;
  // That dropout as a fused op's RowDropout.
  RowDropout hidden_row_dropout(int l, int T, uint32_t site) const;
  uint32_t site(int layer, int k) const { return uint32_t(4 * layer + k); }
  // The attention mask of layer l: `base` with that layer's dropout site, and dropout only when `on`.
  AttentionMask layer_mask(const AttentionMask& base, int l) const;
  size_t ae_, ge_;  // bytes per element of the compute and gradient types
  // Element `i` of a compute-type buffer.
  void* at(void* base, size_t i) const { return static_cast<char*>(base) + i * ae_; }
  // The [CLS]-rows block's QKV buffer (and its gradient): the keys and values of every token [B*T, 2C],
  // then the queries of the B [CLS] rows [B, C] (attention_first_query_fwd's operands).
  struct FirstQueryQkv {
    void* kv;
    void* q;
  };
  FirstQueryQkv first_query_qkv(void* buffer, int B, int T) const {
    return {buffer, at(buffer, size_t(B) * T * 2 * cfg_.n_embd)};
  }
  void* block_out(int l) const { return block_acts_[l] + act_offset_[l][kSavedKinds]; }

  // Plan indices.
  size_t i_shared_grads_ = SIZE_MAX, i_emb_sum_ = 0, i_emb_stats_ = 0, i_encoded_ = 0, i_cls_ = 0,
         i_pooled_ = 0, i_logits_ = 0, i_losses_ = 0, i_attn_scratch_ = 0, i_dlogits_ = 0, i_dhead_ = 0,
         i_d0_ = 0, i_d1_ = 0, i_dfc_ = 0, i_dqkv_ = 0, i_dropout_state_ = 0, i_cls_in_ = 0,
         i_first_rows_ = 0;

  void *emb_sum_ = nullptr, *encoded_ = nullptr, *cls_ = nullptr, *pooled_ = nullptr, *logits_ = nullptr,
       *attn_scratch_ = nullptr, *dlogits_ = nullptr, *dhead_ = nullptr, *d0_ = nullptr, *d1_ = nullptr,
       *dfc_ = nullptr, *dqkv_ = nullptr;
  float *emb_stats_ = nullptr, *losses_ = nullptr;
  DropoutState* dropout_state_ = nullptr;
  void* cls_in_ = nullptr;  // the classifier's input after dropout
  // The last block's input and attention output at the [CLS] rows [B, C] each (first_rows_only).
  void *x_first_ = nullptr, *atty_first_ = nullptr;
  bool head_grad_ready_ = false;  // forward(write_grad) left the loss gradient in dlogits_ for backward()
  int fwd_B_ = 0, fwd_T_ = 0;     // the shape of that forward
};

}  // namespace anvil
