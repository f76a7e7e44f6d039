// The common interface of the model families (Decoder: the causal LMs; BertModel: encoder + sequence
// classification head): what the Engine, the trainer, checkpoints and the optimizers need, independent of
// the family. A model owns no memory: it adds its buffers to a MemoryPlan and binds to the Arena carved from
// it; its parameters are one flat buffer in the family's ParamLayout.
//
// Calls through this interface are a handful per micro-batch (forward, backward, the loss rows) and per
// step (weights, gradients, sync): a virtual call each, against a step of hundreds of kernel launches.
// Code that knows the family (the models' own layers, the tests of one family) uses the concrete classes,
// which are `final`, so their calls are direct.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "anvil/memory_plan.hpp"
#include "anvil/model_config.hpp"
#include "kernels/ops.hpp"
#include "memory/memory_trace.hpp"
#include "model/checkpointing.hpp"
#include "model/param_layout.hpp"
#include "model/param_store.hpp"
#include "runtime/arena.hpp"
#include "runtime/step_profiler.hpp"

namespace anvil {

// One batch of inputs in device memory, for any family; each family reads its own fields (the others stay
// null). B x T must fit the shape the model was planned for.
struct ModelInputs {
  const int32_t* tokens = nullptr;       // [B, T] token ids
  const int32_t* targets = nullptr;      // GPT-2: [B, T] next-token targets (null: logits only)
  const int32_t* token_types = nullptr;  // BERT: [B, T] segment ids, or null (all 0)
  const int32_t* lengths = nullptr;  // BERT: [B] real tokens per sequence (a prefix), or null (none padded)
  const void* labels = nullptr;      // BERT: [B] labels (BertModel::label_dtype()), or null (logits only)
  int B = 0, T = 0;
  // Whether the batch carries what the loss needs (targets or labels).
  bool has_loss_inputs() const { return targets != nullptr || labels != nullptr; }
};

class Model {
 public:
  virtual ~Model() = default;

  // Adds the model's buffers; `backend` sizes the attention scratch (no device is needed to plan).
  virtual void plan_memory(MemoryPlan& plan, DeviceKind backend) = 0;
  virtual void bind(const Arena& arena) = 0;

  virtual const TransformerConfig& config() const = 0;
  virtual const ParamLayout& layout() const = 0;
  // The store of the model's parameters (its per-unit hooks are where data parallelism and ZeRO attach).
  virtual ParamStore& param_store() = 0;
  // Read-only (through a Model; a derived class's own param_store() hides it).
  const ParamStore& param_store() const { return const_cast<Model*>(this)->param_store(); }
  virtual OpsPrecision precision() const = 0;
  virtual int max_batch() const = 0;
  virtual int max_seq() const = 0;
  // The fp32 (master) weights the optimizer updates, in the flat layout of param_store().optimizer_layout()
  // (the whole layout, or its trainable tensors: ParamStore::keep_trainable_only; the weights themselves for
  // an fp32 compute type over the whole layout); null for a model planned without training in a 16-bit
  // type, which keeps its compute-type weights only (download_weights reads either).
  virtual float* params() const = 0;
  // The weights the ops read, in the compute type.
  virtual void* weights() const = 0;
  // Parameter gradients in the gradient type, in the same layout as params(); grads() is for fp32 gradients
  // only.
  virtual void* grad_buffer() const = 0;
  virtual float* grads() const = 0;
  virtual size_t grad_bytes() const = 0;
  // True when the gradients share memory with saved activations (one micro-batch per step, BERT): they are
  // valid from backward() to the next forward(), and backward() zeroes them itself, so the caller must not
  // zero them before the forward (that memory then holds activations).
  virtual bool grads_share_activations() const { return false; }
  // True when every gradient write of a unit follows ParamStore::begin_grads(unit) and every gradient view
  // is taken through ParamStore::grad_at after it: the store may then keep gradients by unit (ZeRO stage 2,
  // ParamStore::set_grad_shard). grad_buffer() is then the reduced shard.
  virtual bool grads_by_unit() const { return false; }
  // The training FLOPs per token (at sequence length `seq_len`) that backward skips because tensors are
  // frozen (freeze_parameters): MFU must not count them.
  virtual double skipped_backward_flops_per_token(int seq_len) const { return 0; }
  // Training with dropout: the device state its masks are drawn from (kernels/dropout.hpp), whose seed the
  // trainer sets before each step; null for a model without dropout.
  virtual DropoutState* dropout_state() const { return nullptr; }

  // The per-row fp32 losses of the last forward with targets / labels: loss_rows(B, T) of them (GPT-2: one
  // per position; BERT: one per sequence). Rows without a target (ignore index) hold 0.
  virtual const float* losses() const = 0;
  virtual size_t loss_rows(int B, int T) const = 0;

  // The family's deterministic initialisation for a seed; upload_weights sets the weights from fp32 host
  // values in the flat layout; sync_weights rounds the master weights into the compute-type copy after an
  // optimizer step (stochastically with a nonzero seed, bf16), a no-op for fp32; with `step_values` (device
  // memory) the seed of a stochastic cast is read there when the cast runs (Ops::cast_weights).
  virtual void init_weights(uint64_t seed, Device& dev) const = 0;
  // Uploads the model's constant buffers that are not weights (the decoder's RoPE frequencies); the Engine
  // calls it once, right after bind.
  virtual void upload_constants(Device& dev) const {}
  virtual void upload_weights(Device& dev, const float* host) const = 0;
  // The weights as fp32 host values in the flat layout: the master weights, or the compute-type weights
  // widened where there are none.
  virtual void download_weights(Device& dev, float* host) const = 0;
  virtual void sync_weights(Ops& ops, uint64_t rounding_seed = 0,
                            const StepValues* step_values = nullptr) const = 0;

  // The family's forward (losses() receives the loss rows when the inputs carry targets / labels; with
  // write_grad the loss gradient times grad_scale is kept for backward) and backward (accumulates parameter
  // gradients into grad_buffer(); same inputs as the preceding forward with write_grad).
  virtual void forward(Ops& ops, const ModelInputs& in, float grad_scale, bool write_grad) = 0;
  virtual void backward(Ops& ops, const ModelInputs& in) = 0;

  // Memory history and profiling (docs/memory.md, docs/performance.md): while set, forward and backward
  // record phases and when each saved activation is live. nullptr stops.
  virtual void set_memory_trace(MemoryTrace* trace) = 0;
  virtual void set_profiler(StepProfiler* profiler) = 0;
};

// Keeps the model's block Linear weights quantized (`s`: Int8 or NF4; Compute: nothing changes), before
// the model plans its memory: bitsandbytes' load_in_8bit / load_in_4bit, for inference, or as the frozen
// base of LoRA adapters (QLoRA: a store of the trainable tensors only, ParamStore::keep_trainable_only).
// Throws an anvil::Error for a model that trains otherwise or is not a decoder.
void quantize_model(Model& model, WeightStorage s);

// The model of cfg.family (the decoder families: Decoder; "bert": BertModel), planned for inputs up to
// max_batch x max_seq; with `training`, gradients and the backward workspace too. `share_grad_memory` asks
// for gradients in dead activation memory (grads_share_activations); only the BERT family does it, decoders
// ignore it. `lora` (enabled: r > 0; decoders only) adds LoRA adapters and freezes the rest
// (ParamLayout::decoder).
std::unique_ptr<Model> make_model(const TransformerConfig& cfg, int max_batch, int max_seq, bool training,
                                  CheckpointPolicy checkpointing = {}, OpsPrecision precision = {},
                                  bool share_grad_memory = false, const LoraConfig& lora = {});

}  // namespace anvil
