// TrainConfig: the single source of truth for a run (DESIGN principle 5). JSON config files and
// command-line overrides (named like Hugging Face TrainingArguments) are importers into it; every
// derived value is computed once and validated with errors that name the key and the value.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "anvil/model_config.hpp"

namespace anvil {

struct LossScalerConfig;  // precision/loss_scaler.hpp

struct TrainConfig {
  // Model: a preset name ("tiny", "d12", ..., "bert-tiny", "bert-base", "bert-large"), a Hugging Face
  // config.json (GPT2Config / BertConfig; shape only), or an explicit shape (an object of TransformerConfig
  // fields, with "family"); or weights to start from.
  TransformerConfig model = TransformerConfig::preset("tiny");
  std::string model_preset = "tiny";  // "" when the shape was given explicitly
  // Hugging Face model directory or Anvil checkpoint to start from (also set by HF's name for it,
  // model_name_or_path).
  std::string init_from;
  // Comma-separated glob patterns of Hugging Face tensor names that do not train (model/freeze.hpp).
  std::string freeze_parameters;
  // LoRA (docs/lora.md; PEFT's LoraConfig fields): rank (0: no LoRA; else only the adapters train), alpha,
  // dropout (0 only), rsLoRA scaling, and the comma-separated target modules ("" : PEFT's default for the
  // family; "all-linear").
  int lora_r = 0;
  double lora_alpha = 8;
  double lora_dropout = 0;
  bool use_rslora = false;
  std::string lora_target_modules;
  // A PEFT adapter directory (adapter_config.json + adapter_model.safetensors) kept apart from init_from, its
  // base: the run's adapters start from its factors (PEFT's PeftModel.from_pretrained(...,
  // is_trainable=True)).
  std::string lora_adapter;
  // QLoRA: the block Linear weights of the frozen base kept quantized ("none", "int8", "nf4":
  // kernels/quantization.hpp), beside LoRA adapters (lora_r > 0) that alone train.
  std::string quantization = "none";
  // "bytes" (vocab 256), or a tokenizer.json / vocab.txt. Used for the end-of-run sample and copied
  // into checkpoints; "" means "bytes" (or the tokenizer a checkpoint being resumed carries).
  std::string tokenizer;
  // Derived: the model's vocab_size follows the tokenizer (a preset, or a shape without vocab_size).
  bool vocab_from_tokenizer = true;
  // Derived (BERT): num_labels and the label names follow the classification data (a preset, a shape
  // without num_labels / label_names, a config.json without id2label / num_labels).
  bool labels_from_data = true;

  // Data (docs/data.md): token shards (language modelling, GPT-2) or classification shards (BERT), told
  // apart by their magic bytes.
  std::string train_data;
  std::string val_data;

  int per_device_train_batch_size = 8;
  int per_device_eval_batch_size = 0;  // 0: same as train
  int gradient_accumulation_steps = 1;
  // HF auto_find_batch_size: at start-up, the largest micro-batch <= per_device_train_batch_size (halving)
  // whose memory plan fits the device, with gradient_accumulation_steps raised to keep the effective batch.
  bool auto_find_batch_size = false;
  // Activation checkpointing (HF gradient_checkpointing): mode full | selective, every N-th block.
  bool gradient_checkpointing = false;
  std::string gradient_checkpointing_mode = "full";
  int gradient_checkpointing_every = 1;
  int max_seq_length = 0;             // 0: the model's block_size
  int dataloader_num_workers = 1;     // threads assembling batches in the background (0 counts as 1)
  bool dataloader_pin_memory = true;  // page-locked staging buffers for truly asynchronous copies
  int64_t max_steps = -1;             // > 0 overrides num_train_epochs
  double num_train_epochs = 1.0;

  double learning_rate = 5e-5;
  double weight_decay = 0.0;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;
  int64_t warmup_steps = 0;
  std::string lr_scheduler_type = "linear";
  double max_grad_norm = 1.0;  // 0 disables clipping
  // Several processes (anvil launch, torchrun, srun, mpirun): HF's ddp_timeout, the seconds a rank waits for
  // the others (start-up, a collective) before it stops with an error naming what it waited for; and
  // ddp_bucket_cap_mb, the size of the gradient buckets reduced while backward runs.
  int ddp_timeout = 1800;
  double ddp_bucket_cap_mb = 25;
  // The type gradients are reduced in across processes (DeepSpeed's communication_data_type): "" the
  // gradient type (grad_accum_dtype), or fp32 / bf16 / fp16; accumulation stays in grad_accum_dtype.
  std::string communication_data_type;
  // ZeRO stages 2-3: the type backward writes each micro-batch's parameter gradients in before they are
  // reduced: "" grad_accum_dtype, or the 16-bit compute type (bf16 / fp16) with fp32 accumulation.
  std::string backward_grad_dtype;
  // ZeRO stage (docs/distributed.md): 0 every rank keeps everything; 1 each rank keeps its shard of the
  // fp32 master weights and optimizer state; 2 also of the reduced gradients; 3 also of the weights
  // (gathered unit by unit). DeepSpeed's zero_optimization.stage.
  int zero_stage = 0;
  // Where the fp32 master weights and the optimizer state live and the update runs: "none" (the device),
  // "cpu" (host memory, updated by the CPU: DeepSpeed's offload_optimizer; src/offload/) or "nvme" (as cpu,
  // with the optimizer state in a swap file in offload_nvme_path, read and written sub-group by sub-group).
  // Under zero_stage 2 or 3 (one process too) the shard's gradients live in host memory as well.
  std::string offload_optimizer = "none";
  // NVMe offload: the directory of the swap file (DeepSpeed's offload_optimizer.nvme_path), the elements
  // of a sub-group (sub_group_size), the bytes of each I/O request (aio block_size) and the I/O threads per
  // process (aio thread_count x queue_depth).
  std::string offload_nvme_path;
  int64_t sub_group_size = 1000000000;
  int64_t aio_block_size = 1048576;
  int aio_threads = 8;
  // Where each rank's shard of the compute-type weights lives under ZeRO stage 3: "none" (the device),
  // "cpu" (pinned host memory, copied in as each unit is gathered: DeepSpeed's offload_param) or "nvme" (a
  // swap file in offload_nvme_path, paged through offload_param_buffer_count pinned buffers). Needs
  // offload_optimizer cpu or nvme; with one process it runs stage 3 on that one rank.
  std::string offload_param = "none";
  int offload_param_buffer_count = 5;
  // ZeRO stages 1-2: elements per all-gather of the updated weights (DeepSpeed's allgather_bucket_size).
  int64_t zero_allgather_bucket_size = 500000000;
  // The optimizer (docs/optimizers.md): HF `optim` names adamw_torch_fused (default; also adamw_torch,
  // adamw_hf, adamw), adafactor, adamw_8bit (also adamw_bnb_8bit), sgd.
  std::string optim = "adamw_torch_fused";
  // Learning-rate multipliers of the parameter groups (the matrices' group is 1): biases and norm weights,
  // and the token/position embeddings.
  double no_decay_lr_multiplier = 1.0, embedding_lr_multiplier = 1.0;
  bool adamw_bf16_moments = false;        // AdamW: bf16 moments with stochastic rounding (4 bytes/param)
  int64_t optim_8bit_min_size = 4096;     // adamw_8bit: smaller tensors keep fp32 states
  bool optim_8bit_embedding_fp32 = true;  // adamw_8bit: embeddings keep fp32 states
  double momentum = 0, dampening = 0;     // sgd
  bool nesterov = false;                  // sgd
  // adafactor (HF Trainer's optim="adafactor" turns scale_parameter and relative_step off and uses
  // learning_rate; these keys turn them back on). adafactor_beta1 < 0: no first moment.
  double adafactor_eps1 = 1e-30, adafactor_eps2 = 1e-3, adafactor_clip_threshold = 1.0;
  double adafactor_decay_rate = -0.8, adafactor_beta1 = -1;
  bool adafactor_scale_parameter = false, adafactor_relative_step = false, adafactor_warmup_init = false;

  uint64_t seed = 42;
  std::string output_dir = "runs/default";
  // HF overwrite_output_dir: a fresh run (not a resume) may start in an output_dir that already holds
  // another run's checkpoints; they are removed first. Without it such a start is refused.
  bool overwrite_output_dir = false;
  // HF save_total_limit: keep at most this many checkpoint-N directories (the newest), deleting older
  // ones after each save; 0 keeps all.
  int64_t save_total_limit = 0;
  // LoRA whose base came from a model directory: false (default) writes checkpoints that refer to that base
  // (the adapter, base_model.json) as PEFT saves adapters; true copies the base into every checkpoint.
  bool save_base_model = false;
  int64_t logging_steps = 1;
  int64_t save_steps = 0;  // 0: save only at the end
  // "steps": checkpoints every save_steps and at the end; "no": none (HF's save_strategy="no").
  std::string save_strategy = "steps";
  int64_t eval_steps = 0;  // 0: evaluate only at the end (if val_data is set)
  // Batches per evaluation; 0 (the default): 20 for language modelling, every example of val_data for
  // classification (as HF Trainer evaluates the whole set).
  int64_t max_eval_batches = 0;
  std::string device = "auto";  // auto | cpu | cuda
  std::string resume_from_checkpoint;

  // Precision (docs/config.md, "Precision"). HF names: fp16 / bf16 mixed precision (16-bit weights and
  // activations, fp32 master weights and optimizer states), tf32 for fp32 matmuls on CUDA.
  bool fp16 = false;
  bool bf16 = false;
  bool tf32 = false;
  // How fp32 matmuls run on CUDA: "fp32" (native), "tf32" (TF32 tensor cores, ~1e-3 relative) or "3xtf32"
  // (TF32 tensor cores at about fp32 accuracy: docs/config.md, "Precision"). Empty: "tf32" when tf32 is
  // true, else "fp32". The CPU always computes native fp32.
  std::string fp32_matmul;
  // The fp16 loss scaler, with DeepSpeed's names and semantics (used only when fp16 is on).
  double loss_scale = 0;  // > 0: static scale; 0: dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
  int max_overflows_at_min_scale = 20;  // consecutive overflows at the minimum scale before the run stops
  // bf16 only: weights are rounded stochastically when written from the fp32 master weights.
  bool stochastic_rounding = false;
  // Gradient accumulation type (DeepSpeed data_types.grad_accum_dtype): "fp32", or the 16-bit type in use
  // ("bf16" with bf16, "fp16" with fp16) to save memory.
  std::string grad_accum_dtype = "fp32";
  // Testing hook: at these 1-based global steps the trainer makes the gradients overflow (fp16), so tests
  // can exercise the skip path. Sorted, without duplicates.
  std::vector<int64_t> debug_inject_overflow_steps;
  // A DeepSpeed config JSON (as HF TrainingArguments' deepspeed), applied onto this config when it is
  // loaded (src/train/deepspeed_config.hpp); "" for none.
  std::string deepspeed;
  // Memory history (docs/memory.md): a JSON-lines trace of the arena's buffers and of when each saved
  // activation is live during global step memory_trace_step, for `anvil memory-report`; "" for none.
  std::string memory_trace;
  int64_t memory_trace_step = 1;
  // Profiling: "A:B" profiles global steps A..B (1-based) into output_dir/profile_steps_A-B.json, a Chrome
  // trace (docs/performance.md); "" for none.
  std::string profile_steps;
  // CUDA: replay each micro-batch's forward + backward from a CUDA graph recorded at its second use (one
  // launch instead of hundreds). Steps that are profiled or memory-traced run without graphs. Ignored on
  // the CPU.
  bool cuda_graphs = true;
  // CUDA: run each distinct GEMM with the cuBLASLt algorithm measured fastest on this device instead of the
  // heuristic's first choice; timed once at first use (eager steps) and kept in gemm_tuning_cache for later
  // runs (docs/performance.md, "GEMM tuning"). Not supported on the CPU.
  bool gemm_tuning = false;
  std::string gemm_tuning_cache;  // empty: $ANVIL_CACHE_DIR, $XDG_CACHE_HOME/anvil or ~/.cache/anvil
  // The device's dense peak FLOP/s for MFU (0: a known GPU's nominal figure, docs/performance.md).
  double peak_flops = 0;
  // Parsed profile_steps (0, 0 when unset).
  std::pair<int64_t, int64_t> profile_range() const;

  // A sample generated from the trained model at the end of training ("" disables).
  std::string sample_prompt;
  int sample_max_new_tokens = 200;
  double sample_temperature = 0.8;
  int sample_top_k = 40;

  // Parses a config object; `source` names it in errors (e.g. the file path). Unknown keys are errors
  // that suggest the nearest valid key. When the object sets `deepspeed`, that DeepSpeed config is
  // applied (its "auto" values take this config's; its other values must agree with the keys this
  // object sets) before validation. `key_sources` names where single keys came from instead (key ->
  // "--flag" for command-line flags): their errors blame that flag ("--learning_rate must be a number,
  // got \"abc\""), and it is their `origin`.
  static TrainConfig from_json(const nlohmann::json& j, const std::string& source,
                               const std::map<std::string, std::string>& key_sources = {});
  static TrainConfig from_file(const std::string& path);
  nlohmann::json to_json() const;
  static std::vector<std::string> keys();
  // Other names accepted for a key (as config keys and flags), never written: alias -> key.
  static const std::map<std::string, std::string>& key_aliases();

  // Where each key the user set explicitly came from (key -> a config file path, "--flag", ...), for
  // errors that blame the right source and for checks against a resumed checkpoint. Keys left at their
  // defaults are absent. Not written by to_json.
  std::map<std::string, std::string> origin;

  // Derived values. The typed values of the string and flag settings (precision, fp32 matmuls, gradient type,
  // checkpointing policy, optimizer, schedule, save strategy, profiled steps) are resolved in one place,
  // resolve_train_config (src/train/resolved_config.hpp), once a run's config is final.
  int seq_len() const { return max_seq_length > 0 ? max_seq_length : model.block_size; }
  int eval_batch_size() const {
    return per_device_eval_batch_size > 0 ? per_device_eval_batch_size : per_device_train_batch_size;
  }
  int64_t tokens_per_step() const {
    return int64_t(per_device_train_batch_size) * gradient_accumulation_steps * seq_len();
  }
  // "fp32", "tf32" or "3xtf32": how fp32 matmuls run on CUDA (fp32_matmul, else tf32).
  std::string fp32_matmul_mode() const { return !fp32_matmul.empty() ? fp32_matmul : tf32 ? "tf32" : "fp32"; }
  // "fp32", "bf16" or "fp16": the type of the model's weights and activations.
  std::string precision() const { return fp16 ? "fp16" : bf16 ? "bf16" : "fp32"; }
  // The loss scaler's settings (include "precision/loss_scaler.hpp" to use it).
  LossScalerConfig loss_scaler() const;

  void validate(const std::string& source) const;
};

// Sets `key` (a TrainConfig key) in `j` from a command-line string: the value of a key whose default is a
// string stays a string; otherwise numbers and true/false are typed, and anything else is a string.
void set_config_override(nlohmann::json& j, const std::string& key, const std::string& value);

// The valid key nearest to `key` by edit distance ("" if nothing is close).
std::string nearest_key(const std::string& key, const std::vector<std::string>& valid);

}  // namespace anvil
