#include "train/config_keys.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "anvil/error.hpp"
#include "anvil/train_config.hpp"

namespace anvil {
namespace {

using json = nlohmann::json;

// The table. Meanings are markdown (they are the cells of docs/config.md); raw strings use the delimiter
// md so that a `)"` inside the text cannot end them.
const std::vector<ConfigKeyDoc> kKeys = {
    // ----------------------------------------------------------------------------------------------
    // Model
    {.key = "model",
     .section = "Model",
     .type = "string or object",
     .meaning =
         R"md(A preset: `tiny` (4 layers, 4 heads, 128 dims, byte vocabulary 256, context 128; the CPU default), `d12` (GPT-2 124M), `d24` (350M), `d36` (774M), `d48` (1.5B); the `d*` presets have vocab 50257 and context 1024. BERT sequence classifiers ([bert.md](bert.md)): `bert-tiny`, `bert-base`, `bert-large`. Llama-family decoders ([models.md](models.md)): `llama-tiny` (CPU-sized), `llama-1b` (Llama-3.2-1B's shape), `llama-8b` (Llama-3.1-8B's), `qwen2.5-0.5b`. Or the path of a Hugging Face `config.json` (GPT2Config, BertConfig, LlamaConfig, Qwen2Config or MistralConfig; the file or its directory): the shape only, the weights start fresh. Or an object with `family` (`gpt2`, default, or `bert`), `n_layer`, `n_head`, `n_embd` (a multiple of `n_head`), `vocab_size`, `block_size`, `eos_token_id`, and for `bert` also `intermediate_size`, `layer_norm_eps`, `hidden_act`, `type_vocab_size`, `pad_token_id`, `num_labels`, `label_names`, `problem_type`, `initializer_range`, `hidden_dropout_prob`, `attention_probs_dropout_prob`, `classifier_dropout` (the training dropout probabilities, in [0, 1): 0.1, 0.1 and null = `hidden_dropout_prob` by default, as HF's; 0 turns a site off: [bert.md](bert.md), "Dropout"); missing fields take the `tiny` (`bert-tiny`) values. A BERT model's `num_labels` and label names follow the classification data unless the config gives them (then they must agree with it). The GPT-2 vocabulary is padded to a multiple of 128 internally (Tensor Core friendly shapes); padded rows stay zero and are never exported.)md",
     .summary = "A preset (tiny, d12, d24, d36, d48, bert-*, llama-tiny, llama-1b, llama-8b, "
                "qwen2.5-0.5b), the path of "
                "a Hugging Face "
                "config.json, or a JSON object giving the shape: '{\"n_layer\": 2, ...}'."},
    {.key = "init_from",
     .section = "Model",
     .type = "path",
     .meaning =
         R"md(Start from these weights: a Hugging Face GPT-2, Llama, Qwen2, Mistral or BERT directory (`config.json` + `model.safetensors` or sharded safetensors, F32/F16/BF16) or an Anvil checkpoint. The model shape comes from its `config.json`. A BERT directory without a classifier (a `BertModel`, e.g. `bert-base-uncased`) gets a freshly initialised head.)md",
     .summary = "Start from these weights: a Hugging Face directory (GPT-2, Llama, Qwen2, Mistral, BERT) or "
                "an Anvil checkpoint."},
    {.key = "model_name_or_path",
     .section = "Model",
     .type = "path",
     .meaning =
         R"md(Hugging Face's name for `init_from` (an alias: it sets `init_from`, and both at once must agree).)md",
     .no_default = true},
    {.key = "freeze_parameters",
     .section = "Model",
     .type = "string",
     .meaning =
         R"md(Parameters that do not train (PyTorch's `requires_grad_(False)`): comma-separated glob patterns over the Hugging Face tensor names (`*` any characters, `?` one, `[0-7]` one of a set), e.g. `model.embed_tokens.weight,model.layers.[0-7].*`. Frozen tensors keep their values exactly: the optimizer skips them and keeps no state for them, their gradients count in neither the gradient norm nor the update, and the decoder skips their weight-gradient matmuls. Their gradient and master-weight memory is still planned (the flat layout). A pattern that matches nothing, or patterns that match every tensor, are errors; not with `stochastic_rounding` (it would re-round the frozen bf16 weights every step). See [models.md](models.md#freezing-parameters).)md",
     .summary = "Comma-separated glob patterns of Hugging Face tensor names that do not train (e.g. "
                "`model.layers.[0-7].*`)."},
    {.key = "lora_r",
     .section = "Model",
     .type = "int",
     .meaning =
         R"md(LoRA's rank (PEFT's `r`): with `lora_r` > 0 the targeted Linear weights of every block get a trainable low-rank update `s (x A^T) B^T` (A [r, in], B [out, r], s = `lora_alpha / lora_r`), and every other tensor is frozen: it costs its weights only (no master weights, gradients or optimizer state; under ZeRO stage 3 each rank keeps its shard of them). Checkpoints hold the adapters as PEFT writes them (`adapter_model.safetensors`, `adapter_config.json`) and either a reference to the base model's directory or, for a base drawn at random or with `save_base_model`, the base itself (`model.safetensors`). Decoder families only. 0: no LoRA. See [lora.md](lora.md).)md",
     .summary = "LoRA rank (0: off): train low-rank adapters of the targeted Linears only (docs/lora.md)."},
    {.key = "lora_alpha",
     .section = "Model",
     .type = "float",
     .meaning = R"md(LoRA's `lora_alpha`: the adapters' term is scaled by `lora_alpha / lora_r` (> 0).)md"},
    {.key = "lora_dropout",
     .section = "Model",
     .type = "float",
     .meaning =
         R"md(LoRA's `lora_dropout`, in [0, 1): dropout on each adapter's input in training forwards (a mask of its own per adapted module, as PEFT's `nn.Dropout` per module; the base weight's product sees the input undropped). Evaluation, samples and generation run without it.)md",
     .summary =
         "LoRA's dropout on each adapter's input in [0, 1), training forwards only (a mask per adapted "
         "module, as PEFT's)."},
    {.key = "use_rslora",
     .section = "Model",
     .type = "bool",
     .meaning =
         R"md(Rank-stabilised LoRA: scale by `lora_alpha / sqrt(lora_r)` instead of `lora_alpha / lora_r`.)md"},
    {.key = "lora_adapter",
     .section = "Model",
     .type = "string",
     .meaning =
         R"md(A PEFT LoRA adapter directory (`adapter_config.json`, `adapter_model.safetensors`) kept apart from its base (`model_name_or_path`), as PEFT saves adapters and the Hub serves them: the run's adapters start from its factors instead of their initialisation (PEFT's `PeftModel.from_pretrained(base, dir, is_trainable=True)`). `lora_r`, `lora_alpha`, `use_rslora` and `lora_target_modules` must be the adapter's (a difference is an error naming both). A resumed run takes its adapters from the checkpoint. `anvil generate`, `logits` and `convert` take such a directory as `--adapter`, merged into the base. See [lora.md](lora.md).)md",
     .default_text = "`\"\"` (adapters start from their initialisation)",
     .summary = "A PEFT adapter directory apart from its base: the run's adapters start from it."},
    {.key = "lora_target_modules",
     .section = "Model",
     .type = "string",
     .meaning =
         R"md(The Linear modules that get adapters, comma-separated, matched as PEFT's `target_modules` (a module's name or its last parts: `q_proj` matches `model.layers.3.self_attn.q_proj`), or `all-linear` (every Linear of the blocks). Llama, Qwen2, Mistral: `q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`; GPT-2: `c_attn`, `c_proj` (both the attention's and the MLP's), `c_fc`. A name that matches no module is an error.)md",
     .default_text = "`\"\"` (PEFT's default: `q_proj,v_proj`; GPT-2 `c_attn`)",
     .summary =
         "Comma-separated modules that get adapters, matched as PEFT's target_modules (q_proj, v_proj, "
         "...), or all-linear."},
    {.key = "quantization",
             .section = "Model",
             .type = "string",
             .meaning =
                 R"md(QLoRA: the frozen base's block Linear weights (q/k/v, attention output, MLP) kept quantized while the LoRA adapters train: `nf4` (bitsandbytes' `load_in_4bit` with `bnb_4bit_quant_type="nf4"`: 4-bit codes, an fp32 absmax per block of 64), `nf4-dq` (the same with `bnb_4bit_use_double_quant=True`: the block absmax quantized again, as 8-bit codes of bitsandbytes' dynamic map in blocks of 256 around their mean, about 4.13 bits a weight instead of 4.5), `int8` (`load_in_8bit`'s storage: int8 codes, a row-wise absmax), or `none`. Each matrix is dequantized into the compute type (`bnb_4bit_compute_dtype`: `bf16` / `fp16` / fp32 as the run's precision) before each matmul that reads it, forward and backward; the embeddings, norms, biases and LM head stay in the compute type, as transformers keeps them. Needs `lora_r` > 0, `zero_stage` 0-2 (stages 1-2 shard the adapters' state; stage 3 does not shard a quantized base yet) and no `freeze_parameters`; decoder families only. Checkpoints hold the base dequantized (`model.safetensors`; quantizing it again on resume gives the same codes) and the adapters as PEFT writes them. See [lora.md](lora.md#qlora).)md",
             .default_text = "`none`",
             .summary = "QLoRA: keep the frozen base's block matrices as nf4 or int8 codes beside the LoRA "
                        "adapters."},
            // -----------------------------------------------------------------------------------------------
            // Data
            // -----------------------------------------------------------------------------------------------
    // Data
    {.key = "tokenizer",
     .section = "Data",
     .type = "string",
     .meaning =
         R"md(`bytes`, or a Hugging Face `tokenizer.json` (byte-level BPE, WordPiece) or BERT `vocab.txt`. When given and the model is a preset or a shape without `vocab_size`, the model's vocabulary is the tokenizer's (and its eos token). Used to encode `sample_prompt` and decode the sample; copied into every checkpoint (as `tokenizer.json` / `vocab.txt`, with the `tokenizer_config.json` and `special_tokens_map.json` beside it, which say which special tokens the model's tokenizer adds). `""`: the tokenizer the `init_from` / resumed checkpoint carries, else `bytes`.)md",
     .default_text = "`\"\"` (the checkpoint's, else `bytes`)",
     .summary = "bytes, or a Hugging Face tokenizer.json or BERT vocab.txt."},
    {.key = "train_data",
     .section = "Data",
     .type = "path",
     .meaning =
         R"md(What to train on (`anvil prepare-data`, formats in formats.md): a token shard (GPT-2 language modelling) or a classification shard (`.cls`, labelled examples; a BERT classifier). The kind is read from the file and must be the model's. Its vocabulary must fit the model's.)md",
     .default_text = "(required to train)",
     .summary = "What to train on (anvil prepare-data): a token shard (GPT-2 language modelling) or a "
                "classification shard (a BERT classifier)."},
    {.key = "val_data",
     .section = "Data",
     .type = "path",
     .meaning =
         R"md(Shard of the same kind for evaluation (classification: the same labels); if empty, no evaluation. Classification runs report `eval_accuracy` with `eval_loss`.)md"},
    {.key = "dataloader_num_workers",
     .section = "Data",
     .type = "int",
     .meaning =
         R"md(Threads assembling batches in the background (a batch's rows are split among them; 0 counts as 1). The batches do not depend on it.)md"},
    {.key = "dataloader_pin_memory",
     .section = "Data",
     .type = "bool",
     .meaning =
         R"md(Stage batches in page-locked host memory, so host-to-device copies run asynchronously on the copy stream and overlap compute.)md"},
    {.key = "max_seq_length",
     .section = "Data",
     .type = "int",
     .meaning =
         R"md(Tokens per training sequence (1..block_size). The shard is cut into windows of this length; each epoch visits every window once in a seeded random order. Classification: the longest batch; 0 = the longest example of train and val data rounded up to a multiple of 8 (at most block_size). Batches are padded to their own longest example (a multiple of 8); an example longer than this is an error.)md",
     .default_text = "0 (= block_size)"},
    // ----------------------------------------------------------------------------------- Batch and
    // length
    {.key = "per_device_train_batch_size",
     .section = "Batch and length",
     .type = "int",
     .meaning = R"md(Sequences per micro-batch.)md"},
    {.key = "per_device_eval_batch_size",
     .section = "Batch and length",
     .type = "int",
     .meaning = R"md(Sequences per evaluation batch.)md",
     .default_text = "0 (= train)"},
    {.key = "auto_find_batch_size",
     .section = "Batch and length",
     .type = "bool",
     .meaning =
         R"md(At start-up, use the largest micro-batch of `per_device_train_batch_size`, /2, /4, ..., 1 whose memory plan fits the GPU's free memory, and raise `gradient_accumulation_steps` to keep the effective batch (rounded up to a multiple of the micro-batch when it does not divide). Printed at start and written to `train_config.json`. On the CPU the batch is kept (no reliable free-memory figure). See [memory.md](memory.md).)md",
     .summary = "At start-up, halve the micro-batch until its memory plan fits the GPU, raising "
                "gradient_accumulation_steps to keep the effective batch."},
    {.key = "gradient_accumulation_steps",
     .section = "Batch and length",
     .type = "int",
     .meaning =
         R"md(Micro-batches summed into one optimizer step. Gradients are accumulated as sums and divided by the real number of target tokens (not ignore-index; classification: labelled sequences) of all the step's micro-batches, so N micro-batches of B give the same update as one batch of N*B. The effective batch is printed at start.)md"},
    {.key = "gradient_checkpointing",
     .section = "Batch and length",
     .type = "bool",
     .meaning =
         R"md(Activation checkpointing: checkpointed blocks keep only their input and re-run their forward just before their backward. Results are identical (bit for bit on the CPU); memory falls (GPT-2 124M, batch 8 x 1024: 12.65 GiB -> 4.66 GiB planned with `full`).)md"},
    {.key = "gradient_checkpointing_mode",
     .section = "Batch and length",
     .type = "string",
     .meaning =
         R"md(`full` recomputes everything in a checkpointed block; `selective` keeps the attention tensors (qkv, attention output, probabilities: expensive to recompute) and recomputes the LayerNorm outputs, the residual and the MLP activations.)md",
     .summary = "full recomputes everything in a checkpointed block; selective keeps the attention "
                "tensors and "
                "recomputes the rest."},
    {.key = "gradient_checkpointing_every",
     .section = "Batch and length",
     .type = "int",
     .meaning = R"md(Checkpoint blocks 0, N, 2N, ...; the others store all their activations.)md"},
    {.key = "max_steps",
     .section = "Batch and length",
     .type = "int",
     .meaning = R"md(Optimizer steps; when > 0 it overrides `num_train_epochs`.)md"},
    {.key = "num_train_epochs",
     .section = "Batch and length",
     .type = "number",
     .meaning = R"md(Epochs (fractions allowed) when `max_steps` is -1.)md"},
    // ----------------------------------------------------------------------------- Optimizer and
    // schedule
    {.key = "learning_rate",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning = R"md(Peak learning rate.)md"},
    {.key = "weight_decay",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning =
         R"md(Decoupled weight decay (AdamW) for matrices and embeddings; biases and LayerNorm weights never decay.)md"},
    {.key = "adam_beta1",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning = R"md(AdamW's first-moment decay rate (PyTorch's formula).)md"},
    {.key = "adam_beta2",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning = R"md(AdamW's second-moment decay rate (PyTorch's formula).)md"},
    {.key = "adam_epsilon",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning = R"md(AdamW's epsilon (PyTorch's formula).)md"},
    {.key = "lr_scheduler_type",
     .section = "Optimizer and schedule",
     .type = "string",
     .meaning =
         R"md(`constant`; `constant_with_warmup` (DeepSpeed WarmupLR with linear warmup); `linear` (warmup then linear decay to 0 at the last step; DeepSpeed WarmupDecayLR); `cosine` (warmup then half-cosine to 0). Hugging Face semantics: step s (0-based) uses lr * lambda(s), lambda = s / warmup_steps during warmup.)md",
     .summary = "constant, constant_with_warmup, linear (warmup, then linear decay to 0) or cosine "
                "(warmup, then "
                "half-cosine to 0)."},
    {.key = "warmup_steps",
     .section = "Optimizer and schedule",
     .type = "int",
     .meaning = R"md(Linear warmup length.)md",
     .summary = "Linear warmup length, in optimizer steps."},
    {.key = "max_grad_norm",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning =
         R"md(Clip the global gradient norm to this value (HF semantics: coefficient max_norm / (norm + 1e-6)); 0 disables.)md"},
    {.key = "optim",
     .section = "Optimizer and schedule",
     .type = "string",
     .meaning =
         R"md(`adamw_torch_fused` (also `adamw_torch`, `adamw_hf`, `adamw`), `adafactor`, `adamw_8bit` (also `adamw_bnb_8bit`), `sgd`. See [optimizers.md](optimizers.md).)md"},
    {.key = "no_decay_lr_multiplier",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning = R"md(Learning-rate multiplier of the biases/norm weights group.)md"},
    {.key = "embedding_lr_multiplier",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning = R"md(Learning-rate multiplier of the embeddings group.)md"},
    {.key = "adamw_bf16_moments",
     .section = "Optimizer and schedule",
     .type = "bool",
     .meaning = R"md(AdamW: bf16 moments with stochastic rounding (4 bytes/param instead of 8).)md"},
    {.key = "optim_8bit_min_size",
     .section = "Optimizer and schedule",
     .type = "int",
     .meaning = R"md(adamw_8bit: tensors with fewer elements keep fp32 states.)md"},
    {.key = "optim_8bit_embedding_fp32",
     .section = "Optimizer and schedule",
     .type = "bool",
     .meaning = R"md(adamw_8bit: the embeddings keep fp32 states.)md"},
    {.key = "momentum",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning = R"md(sgd: the momentum factor (PyTorch semantics).)md"},
    {.key = "dampening",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning = R"md(sgd: the dampening of the momentum (PyTorch semantics).)md"},
    {.key = "nesterov",
     .section = "Optimizer and schedule",
     .type = "bool",
     .meaning = R"md(sgd: Nesterov momentum (PyTorch semantics; needs momentum > 0 and dampening 0).)md"},
    {.key = "adafactor_eps1",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning = R"md(adafactor: added to the squared gradient (transformers' `eps[0]`).)md"},
    {.key = "adafactor_eps2",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning = R"md(adafactor: floor of the parameter scale RMS(p) (transformers' `eps[1]`).)md"},
    {.key = "adafactor_clip_threshold",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning = R"md(adafactor: the update's RMS is clipped to this (transformers' `clip_threshold`).)md"},
    {.key = "adafactor_decay_rate",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning = R"md(adafactor: beta2 at step t is 1 - t^decay_rate (transformers' `decay_rate`; < 0).)md"},
    {.key = "adafactor_beta1",
     .section = "Optimizer and schedule",
     .type = "number",
     .meaning =
         R"md(adafactor: the first-moment coefficient; negative: no first moment (transformers' `beta1=None`).)md",
     .default_text = "-1 (none)"},
    {.key = "adafactor_scale_parameter",
     .section = "Optimizer and schedule",
     .type = "bool",
     .meaning =
         R"md(adafactor: multiply the step size by max(eps2, RMS(p)) (transformers' `scale_parameter`; false by default, as HF Trainer's `optim="adafactor"` sets it).)md"},
    {.key = "adafactor_relative_step",
     .section = "Optimizer and schedule",
     .type = "bool",
     .meaning =
         R"md(adafactor: step size min(1e-2, 1/sqrt(t)), ignoring `learning_rate` (transformers' `relative_step`; false by default, as HF Trainer's `optim="adafactor"` sets it).)md"},
    {.key = "adafactor_warmup_init",
     .section = "Optimizer and schedule",
     .type = "bool",
     .meaning =
         R"md(adafactor: relative step min(1e-6 t, 1/sqrt(t)) (transformers' `warmup_init`); needs `adafactor_relative_step`.)md"},
    // ------------------------------------------------------------------------------------------------
    // Run
    {.key = "device",
     .section = "Run",
     .type = "string",
     .meaning = R"md(`auto` (CUDA if a GPU is visible, else CPU), `cpu`, `cuda`.)md"},
    {.key = "seed",
     .section = "Run",
     .type = "int",
     .meaning =
         R"md(Seeds initialisation and the data order. The same seed and config give the same loss curve bit for bit on the CPU.)md"},
    {.key = "output_dir",
     .section = "Run",
     .type = "path",
     .meaning = R"md(Where metrics, summary and checkpoints go.)md"},
    {.key = "overwrite_output_dir",
     .section = "Run",
     .type = "bool",
     .meaning =
         R"md(Hugging Face's name: a fresh run (not a resume) may start in an `output_dir` that already holds another run's checkpoints, which are removed first. Without it such a start is refused.)md",
     .summary = "Let a fresh run (not a resume) start in an output_dir that holds another run's "
                "checkpoints; "
                "they are removed first."},
    {.key = "logging_steps",
     .section = "Run",
     .type = "int",
     .meaning = R"md(Print and record a progress line every N steps (also the first and last).)md"},
    {.key = "save_steps",
     .section = "Run",
     .type = "int",
     .meaning = R"md(Save `checkpoint-<step>` every N steps; a checkpoint is always saved at the end.)md"},
    {.key = "save_total_limit",
     .section = "Run",
     .type = "int",
     .meaning =
         R"md(Keep at most this many `checkpoint-<step>` directories, the newest, deleting older ones after each save (Hugging Face's `save_total_limit`); 0 keeps all.)md",
     .default_text = "0 (keep all)"},
    {.key = "save_base_model",
     .section = "Run",
     .type = "bool",
     .meaning =
         R"md(LoRA and QLoRA runs whose base model came from a directory (`model_name_or_path`, or the base a resumed checkpoint refers to): `false` (default) writes checkpoints that hold the adapter (PEFT's files, `adapter_config.json` naming the base in `base_model_name_or_path`), the optimizer and trainer state, and `base_model.json`, which records the base directory and a fingerprint of its weight files, instead of a copy of the base: a few MB instead of 4 bytes a parameter, as PEFT saves adapters. Resuming, `generate`, `logits` and `convert` read the base from there and refuse one that is missing or changed. `true`: every checkpoint also holds the base (`model.safetensors` in fp32), self-contained. A base drawn at random (no directory) is always saved. See docs/lora.md.)md",
     .default_text = "false",
     .summary = "LoRA: checkpoints refer to the base model's directory (false) or copy it (true)."},
    {.key = "save_strategy",
     .section = "Run",
     .type = "string",
     .meaning =
         R"md(`steps`: checkpoints as `save_steps` says (and at the end); `no`: no checkpoint at all (HF's `save_strategy="no"`: benchmarks, throwaway runs; metrics.jsonl and summary.json are still written).)md",
     .summary = "steps: checkpoints every save_steps and at the end; no: none (metrics and summary "
                "are still "
                "written)."},
    {.key = "eval_steps",
     .section = "Run",
     .type = "int",
     .meaning = R"md(Evaluate on `val_data` every N steps; always at the end when `val_data` is set.)md"},
    {.key = "max_eval_batches", .section = "Run", .type = "int", .meaning = R"md(Batches per evaluation, from the start of `val_data`. 0 (the default): 20 batches for language modelling, every example for classification (in file order, the last batch partial; as HF Trainer evaluates the whole set).)md", .summary = "Batches per evaluation (0: 20 for language modelling, every example for classification)."},
    {.key = "memory_trace",
     .section = "Run",
     .type = "path",
     .meaning =
         R"md(Write the memory history of one step (arena buffers, when each saved activation is live, the peak) as a JSON-lines trace; render it with `anvil memory-report FILE` ([memory.md](memory.md#memory-history)).)md",
     .summary = "Write the memory history of one step as a JSON-lines trace (render it with anvil "
                "memory-report)."},
    {.key = "profile_steps",
     .section = "Run",
     .type = "string",
     .meaning =
         R"md(`A:B`: write a Chrome trace of global steps A..B (phases per block on the device, the step on the host, and on CUDA every kernel, memcpy and memset with its GPU times, one row per stream, recorded with CUPTI; NVTX ranges on CUDA) to `output_dir/profile_steps_A-B.json`, and print the top kernels by GPU time at the end of the run ([performance.md](performance.md#profiling---profile_steps-ab)).)md",
     .summary = "A:B: write a Chrome trace of global steps A..B to output_dir/profile_steps_A-B.json."},
    {.key = "cuda_graphs", .section = "Run", .type = "bool", .meaning = R"md(CUDA: record the step's device work into CUDA graphs and replay them with one launch each. One micro-batch per step without the fp16 loss scaler: the whole step (zeroing, forward, backward, norm, clip, optimizer, weight cast) is one graph per input slot and batch shape; with gradient accumulation, one graph per micro-batch and one for the step's tail; with the fp16 loss scaler, micro-batch, norm and update graphs around its overflow decision. Each graph is recorded the second time its key is used (classification batches vary in padded length: one graph per shape, never replayed for another), and reads the step's learning rate, step count, seeds and unscale factor from device memory, so replays follow the schedule. Profiled (`profile_steps`) and memory-traced steps run without graphs; a changed fp16 loss scale records the micro-batch graphs again. `summary.json` counts them (`cuda_graphs`). `--cuda_graphs false` launches every kernel each time. Ignored on the CPU ([performance.md](performance.md)).)md"},
    {.key = "gemm_tuning",
     .section = "Run",
     .type = "bool",
     .meaning =
         R"md(CUDA: run each distinct GEMM (shape, layout, types, epilogue) with the cuBLASLt algorithm configuration measured fastest on this GPU instead of cuBLASLt's heuristic first choice. The first time a GEMM is met (in an eager step; never inside a CUDA graph capture) its candidates are timed on its own operands: the heuristic's top 8, plus for fp32 operands every algorithm x tile x stages x split-K (1-4) x CTA swizzling that cuBLASLt accepts (up to 256). Each takes ~0.1 s for bert-large sizes; the choice is kept in `gemm_tuning_cache` and reused by every later run on the same GPU model and cuBLASLt version, so tune once (a short run, e.g. `--max_steps 2`) and train afterwards. One line per tuned GEMM is printed (`gemm tuning: ...`: tuned and heuristic time, candidates). A configuration must be at least 1% faster than the heuristic's to replace it. An accumulating GEMM is timed on a scratch copy of its output, so its result is the same as untuned. Not supported on the CPU (an error). See [performance.md](performance.md#gemm-tuning).)md",
     .summary = "CUDA: run each distinct GEMM with the cuBLASLt algorithm measured fastest on this "
                "GPU (timed "
                "once, kept in gemm_tuning_cache)."},
    {.key = "gemm_tuning_cache",
     .section = "Run",
     .type = "string",
     .meaning =
         R"md(The tuning cache file (text; format in `src/kernels/gemm_tuning_cache.hpp`): keyed by GPU name, compute capability and SM count, cuBLASLt version, workspace size and the GEMM. Written atomically (a temporary file renamed over it), merging entries other runs added meanwhile. A malformed file is an error naming the file and line; delete it to start again. An entry cuBLASLt no longer accepts is tuned again.)md",
     .default_text = "`$ANVIL_CACHE_DIR/gemm_tuning.txt`, else `$XDG_CACHE_HOME/anvil/gemm_tuning.txt`, else "
                     "`~/.cache/anvil/gemm_tuning.txt`",
     .summary = "The GEMM tuning cache file (text), shared by later runs on the same GPU model."},
    {.key = "peak_flops",
     .section = "Run",
     .type = "number",
     .meaning =
         R"md(The device's dense peak FLOP/s for MFU; 0: a known GPU's nominal figure for the precision ([performance.md](performance.md)).)md"},
    {.key = "memory_trace_step",
     .section = "Run",
     .type = "int",
     .meaning =
         R"md(The global step `memory_trace` records (after a resume: the first step run if this one is past).)md"},
    {.key = "resume_from_checkpoint",
     .section = "Run",
     .type = "path",
     .meaning =
         R"md(Continue from a checkpoint: weights, AdamW state, step, data position and RNG are restored, so the run continues exactly as if uninterrupted (bit for bit on the CPU). The model shape comes from the checkpoint.)md",
     .summary = "Continue from a checkpoint exactly as if uninterrupted (weights, optimizer state, "
                "step, data "
                "position and RNG are restored)."},
    // ------------------------------------------------------------------------------------------
    // Precision
    {.key = "fp16",
     .section = "Precision",
     .type = "bool",
     .meaning =
         R"md(fp16 mixed precision (HF `fp16`): 16-bit weights and activations, fp32 master weights and optimizer states, dynamic loss scaling (below).)md",
     .summary = "fp16 mixed precision (HF fp16): 16-bit weights and activations, fp32 master weights "
                "and optimizer "
                "states, loss scaling."},
    {.key = "bf16",
     .section = "Precision",
     .type = "bool",
     .meaning =
         R"md(bf16 mixed precision (HF `bf16`): as `fp16` with bfloat16, which has fp32's exponent range, so no loss scaling. Cannot be combined with `fp16`.)md"},
    {.key = "tf32", .section = "Precision", .type = "bool", .meaning = R"md(On CUDA, let fp32 matmuls use TF32 tensor cores (faster, ~1e-3 relative precision). Combines with any of the above (it affects what stays fp32). The same as `fp32_matmul: "tf32"`.)md"},
    {.key = "fp32_matmul",
     .section = "Precision",
     .type = "string",
     .meaning =
         R"md(How fp32 matmuls run on CUDA: `fp32` (native fp32 FMA), `tf32` (single-pass TF32 tensor cores, ~1e-3 relative) or `3xtf32` (three TF32 tensor-core products per fp32 product: about fp32 accuracy at tensor-core speed; see below). Setting `tf32: true` with anything but `tf32` here is an error. Only fp32 GEMMs are affected (none in a `bf16` or `fp16` run). The CPU always computes native fp32.)md",
     .default_text = "`fp32` (`tf32` when `tf32` is true)",
     .summary = "How fp32 matmuls run on CUDA: fp32 (native), tf32 (TF32 tensor cores) or 3xtf32 "
                "(TF32 tensor "
                "cores at about fp32 accuracy)."},
    {.key = "grad_accum_dtype",
     .section = "Precision",
     .type = "string",
     .meaning =
         R"md(Type of the gradient buffer that micro-batches accumulate into (DeepSpeed's `data_types.grad_accum_dtype`): `fp32`, or the 16-bit type in use (`bf16` with `bf16`, `fp16` with `fp16`) to halve gradient memory at some cost in precision. Any other combination is an error.)md",
     .summary = "Type of the gradient buffer micro-batches accumulate into: fp32, or the 16-bit type "
                "in use (bf16 "
                "with bf16, fp16 with fp16)."},
    {.key = "stochastic_rounding",
     .section = "Precision",
     .type = "bool",
     .meaning =
         R"md(bf16 only: when the optimizer writes the bf16 weights from the fp32 master weights, round stochastically (unbiased) instead of to nearest, so updates smaller than half a bf16 ulp still move the weights on average. An error without `bf16`.)md",
     .summary = "bf16 only: round the weights stochastically (unbiased) when writing them from the "
                "fp32 master "
                "weights."},
    {.key = "loss_scale",
     .section = "Precision",
     .type = "number",
     .meaning =
         R"md(fp16 only. 0: dynamic loss scaling; > 0: a static scale that never changes (overflowing steps are still skipped).)md",
     .summary = "fp16 only: 0 for dynamic loss scaling, > 0 for a static scale."},
    {.key = "initial_scale_power",
     .section = "Precision",
     .type = "int",
     .meaning = R"md(Dynamic scaling starts at 2^`initial_scale_power` (0..63; 16 = 65536).)md"},
    {.key = "loss_scale_window",
     .section = "Precision",
     .type = "int",
     .meaning = R"md(Clean steps (without overflow) before the scale doubles (>= 1).)md"},
    {.key = "hysteresis",
     .section = "Precision",
     .type = "int",
     .meaning = R"md(Overflows tolerated before the scale halves (DeepSpeed's `delayed_shift`; >= 1).)md"},
    {.key = "consecutive_hysteresis",
     .section = "Precision",
     .type = "bool",
     .meaning = R"md(Refill the hysteresis on every clean step (instead of only when the scale grows).)md"},
    {.key = "min_loss_scale",
     .section = "Precision",
     .type = "number",
     .meaning = R"md(The dynamic scale never goes below this (> 0; at most the initial scale).)md"},
    {.key = "max_overflows_at_min_scale",
     .section = "Precision",
     .type = "int",
     .meaning =
         R"md(Stop the run after this many consecutive overflowing steps at the minimum scale (>= 1; see below).)md",
     .summary = "Stop the run after this many consecutive overflowing steps at the minimum loss scale."},
    {.key = "debug_inject_overflow_steps",
     .section = "Precision",
     .type = "list of int",
     .meaning =
         R"md(**Testing hook.** At these 1-based global steps the trainer makes the gradients overflow (as if they held inf), so tests can exercise the skip path. JSON: `[3, 4, 5]`; command line: `--debug_inject_overflow_steps 3,4,5`. Needs `fp16`. Not for real runs.)md",
     .hidden = true},
    // ----------------------------------------------------------------------------------- DeepSpeed
    // config
    {.key = "deepspeed",
     .section = "DeepSpeed config",
     .type = "path",
     .meaning =
         R"md(A DeepSpeed config JSON, applied onto this config when it is loaded, as Hugging Face TrainingArguments' `deepspeed` (below).)md",
     .summary = "A DeepSpeed config JSON, applied onto this config when it is loaded (as HF "
                "TrainingArguments' "
                "deepspeed)."},
    // ---------------------------------------------------------------------------------- Sample at
    // the end
    {.key = "sample_prompt",
     .section = "Sample at the end",
     .type = "string",
     .meaning =
         R"md(If set, generate a continuation of this text (byte-level) after training. GPT-2 only (an error with a BERT model: use `anvil predict`).)md"},
    {.key = "sample_max_new_tokens",
     .section = "Sample at the end",
     .type = "int",
     .meaning = R"md(Length of the sample.)md",
     .summary = "Length of the end-of-run sample, in tokens."},
    {.key = "sample_temperature",
     .section = "Sample at the end",
     .type = "number",
     .meaning = R"md(0 is greedy.)md",
     .summary = "Sampling temperature of the end-of-run sample; 0 is greedy."},
    {.key = "sample_top_k",
     .section = "Sample at the end",
     .type = "int",
     .meaning = R"md(Sample among the k most likely tokens (0: all).)md"},
    {.key = "ddp_timeout",
     .section = "Distributed",
     .type = "int",
     .meaning =
         R"md(Seconds a rank waits for the others (the start-up rendezvous, a collective) before it stops with an error naming what it waited for (Hugging Face's `ddp_timeout`; default 1800). See docs/distributed.md.)md"},
    {.key = "ddp_bucket_cap_mb",
     .section = "Distributed",
     .type = "number",
     .meaning =
         R"md(Data parallelism: megabytes of gradients per bucket; each bucket is all-reduced as soon as backward has completed it, overlapping the rest of the backward (Hugging Face's `ddp_bucket_cap_mb`; default 25). 0: no overlap, one reduction after the whole backward (DeepSpeed's `overlap_comm: false`). DeepSpeed's `zero_optimization.reduce_bucket_size` (elements) sets it as fp32 megabytes.)md",
     .summary = "Data parallelism: megabytes of gradients per bucket, each all-reduced as soon as backward "
                "completes it (HF's ddp_bucket_cap_mb; 0: one reduction after backward)."},
    {.key = "communication_data_type",
     .section = "Distributed",
     .type = "string",
     .meaning =
         R"md(The type gradients are reduced in across processes (DeepSpeed's `communication_data_type`): `fp32`, `bf16` or `fp16`; `""` (default) the gradient type, `grad_accum_dtype`. Accumulation over micro-batches stays in `grad_accum_dtype`: with fp32 gradients and `bf16`, each bucket (each unit under ZeRO 2-3) is rounded to bf16 just before its collective, summed in bf16 (NCCL adds in fp32 and rounds at each step of its ring; Gloo sums in fp32) and widened back into the fp32 gradients, so half the bytes cross the network. The staging buffer costs 2 bytes per parameter (the unit slots' size under ZeRO 2-3), planned with the rest (`anvil estimate --num_gpus N`). `fp16` can overflow where gradients exceed 65504 (the step's norm is then not finite and the run stops or, with the loss scaler, skips the step). With one process it changes nothing. See docs/distributed.md.)md",
     .default_text = "`\"\"` (the gradient type)",
     .summary = "Type gradients are reduced in across processes: fp32, bf16 or fp16 "
                "(default: theirs)."},
    {.key = "backward_grad_dtype",
     .section = "Distributed",
     .type = "string",
     .meaning =
         R"md(ZeRO stages 2-3: the type backward writes each micro-batch's parameter gradients in before they are reduced: `""` (default) `grad_accum_dtype`, or the 16-bit compute type (`bf16` with `bf16`, `fp16` with `fp16`) while `grad_accum_dtype` stays `fp32`. The unit slots backward writes into then take half the memory, each unit is reduced in that type (unless `communication_data_type` says otherwise) and added into the shard's fp32 gradients, so accumulation over micro-batches stays in fp32: what DeepSpeed's bf16 mode and FSDP2 with bf16 parameters do. Each micro-batch's gradients are rounded to 16 bits once (a weight used twice in a micro-batch, as a tied embedding, sums in 16 bits). Needs `zero_stage` 2 or 3 and a decoder model; with one process (every stage is stage 0) it has no effect. See docs/distributed.md.)md",
     .default_text = "`\"\"` (grad_accum_dtype)",
     .summary = "ZeRO 2-3: backward writes gradients in the 16-bit compute type, "
                "accumulated in fp32."},
    {.key = "zero_stage",
     .section = "Distributed",
     .type = "int",
     .meaning =
         R"md(ZeRO stage with several processes (DeepSpeed's `zero_optimization.stage`; default 0). 0: every rank keeps the whole fp32 master weights, optimizer state and gradients. 1: each rank keeps only its shard of the fp32 master weights and of the optimizer state, updates that shard and all-gathers the updated weights. 2: also reduce-scatters the gradients and keeps only its shard's sums. 3: also keeps only its shard of the weights, gathering each unit (embedding, block, final) as forward and backward reach it (decoders only). The shards are balanced ranges of the parameter buffer (whole tensors for Adafactor, 8-bit blocks for adamw_8bit). With one process every stage is stage 0, except stage 3 with offload_param cpu. See docs/distributed.md.)md",
     .summary = "ZeRO stage: 0 replicas; 1 shards master weights, optimizer state; 2 gradients; 3 weights."},
    {.key = "offload_optimizer",
             .section = "Distributed",
             .type = "string",
             .meaning =
                 R"md(Optimizer offload (ZeRO-Offload; DeepSpeed's `zero_optimization.offload_optimizer.device`): `cpu` keeps the fp32 master weights and the optimizer state in host memory and runs the update on the CPU (Anvil's CPU optimizer kernels, OpenMP): after backward and the gradient norm on the GPU, the gradients are copied to the host (pinned memory), updated there, and the new weights copied back in the compute type. The GPU then holds the weights, gradients and activations only (AdamW mixed precision: 2 + 4 bytes a parameter instead of 18). Under zero_stage 2 or 3 (decoder models) the gradients of the shard go to host memory too, as DeepSpeed does: each unit's reduced gradients are written there during backward, and the GPU keeps the weights, two unit-sized gradient slots and the activations (with one process too: `--zero_stage 2 --offload_optimizer cpu` on one GPU; stage 0 or 1 keeps the gradients on the GPU, which is faster). With several processes it needs zero_stage 1-3: each rank offloads its shard. Full training (not LoRA, whose state is small anyway), no stochastic rounding; CUDA graphs cover forward and backward but not the update. `nvme` (ZeRO-Infinity's NVMe part): as `cpu`, but the optimizer state (moments, factored statistics, 8-bit codes) lives in a swap file in `offload_nvme_path` instead of host memory; each update reads it in and writes it back sub-group by sub-group (`sub_group_size` elements of the parameters at a time, two sub-groups in host memory: one updated while the next is read and the previous written), with direct I/O where the filesystem allows it. The master weights and the gradients stay in host memory. `none` (default): everything on the device. See docs/memory.md.)md",
             .default_text = "`none`",
             .summary = "cpu: master weights and optimizer state in host memory, updated by the CPU "
                        "(ZeRO-Offload); nvme: the state in a swap file."},
    {.key = "offload_param",
     .section = "Distributed",
     .type = "string",
     .meaning =
         R"md(Parameter offload (DeepSpeed's `zero_optimization.offload_param.device`; ZeRO-Infinity's CPU part): `cpu` keeps each rank's ZeRO stage 3 shard of the compute-type weights in pinned host memory; each unit (embedding, block, final) is copied in from there as it is gathered, in forward and in backward, and the offloaded optimizer writes the updated shard there directly (nothing copied back). Needs zero_stage 3 and offload_optimizer cpu or nvme; with one process it runs stage 3 on that one rank (the gathers are copies). The GPU then holds the gathered units' slots, the gradients of the shard and the activations. `none` (default): the shard on the device. `nvme` (ZeRO-Infinity's NVMe part for the weights): as `cpu`, but the shard lives in a swap file in `offload_nvme_path` (2 bytes a parameter in bf16), paged into `offload_param_buffer_count` pinned host buffers (each the size of the largest unit's piece) as the units are gathered; the units after the one gathered are read ahead in the order the previous step gathered them, and the update is written back to the file after each step. Host memory then holds those buffers instead of the shard; CUDA graphs are off (the host reads the file as the step is queued). Combines with `offload_optimizer cpu` or `nvme`. See docs/memory.md.)md",
     .default_text = "`none`",
     .summary = "cpu: ZeRO-3 weight shard in host memory, copied in unit by unit (ZeRO-Infinity); nvme: in a "
                "swap file."},
    {.key = "offload_param_buffer_count",
     .section = "Distributed",
     .type = "int",
     .meaning =
         R"md(Parameter offload to NVMe (`offload_param nvme`): pinned host buffers the weight shard is paged through (DeepSpeed's `offload_param.buffer_count`; default 5, at least 2). Each holds one unit's piece of the shard (the largest unit's size: the embedding, or a block); one is copied to the GPU while the others are read ahead. More buffers read further ahead at the cost of host memory.)md",
     .default_text = "5",
     .summary = "offload_param nvme: pinned buffers the weight shard is paged through (DeepSpeed buffer_count)."},
            {.key = "offload_nvme_path",
     .section = "Distributed",
     .type = "string",
     .meaning =
         R"md(NVMe offload (`offload_optimizer nvme`, `offload_param nvme`): the directory of the swap files (DeepSpeed's `offload_optimizer.nvme_path` and `offload_param.nvme_path`), on a fast local drive. Each process creates one file there of its shard's optimizer state (AdamW fp32: 8 bytes a parameter) and one of its shard's weights (bf16: 2 bytes a parameter), removes its name at once (nothing is left behind, even after a crash) and reserves its space at start: a drive without room fails then, naming the bytes needed and free. Direct I/O (O_DIRECT) keeps the file out of the page cache; on a filesystem that refuses it (tmpfs) the I/O is buffered and the run header says so. Default: none (required with `offload_optimizer nvme` or `offload_param nvme`).)md",
     .default_text = "none",
     .summary = "NVMe offload: directory of the swap files (DeepSpeed nvme_path)."},
    {.key = "sub_group_size",
     .section = "Distributed",
     .type = "int",
     .meaning =
         R"md(NVMe offload: elements of the parameters per sub-group of the update (DeepSpeed's `zero_optimization.sub_group_size`; default 1000000000). The update reads, updates and writes back one sub-group's optimizer state at a time, with two sub-groups' state in host memory: smaller sub-groups hold less host memory, larger ones make fewer, longer reads and writes. Sub-groups are cut where the optimizer's state allows (whole tensors for Adafactor, 256-element blocks for 8-bit AdamW). Without NVMe offload the update covers the whole shard at once.)md",
     .summary = "NVMe offload: parameters per swapped sub-group (DeepSpeed sub_group_size)."},
    {.key = "aio_block_size",
     .section = "Distributed",
     .type = "int",
     .meaning =
         R"md(NVMe offload: bytes of each read or write request to the swap file (DeepSpeed's `aio.block_size`; default 1048576; a multiple of 4096).)md",
     .summary = "NVMe offload: bytes per I/O request (DeepSpeed aio block_size)."},
    {.key = "aio_threads",
     .section = "Distributed",
     .type = "int",
     .meaning =
         R"md(NVMe offload: I/O threads per process, each keeping one request in flight (DeepSpeed's `aio.thread_count` x `aio.queue_depth`; default 8). NVMe drives reach their bandwidth only with several requests in flight.)md",
     .summary = "NVMe offload: I/O requests in flight per process (DeepSpeed aio threads x depth)."},
            {.key = "zero_allgather_bucket_size",
     .section = "Distributed",
     .type = "int",
     .meaning =
         R"md(ZeRO stages 1-2: elements of the compute-type weights per all-gather after each update (DeepSpeed's `zero_optimization.allgather_bucket_size`; default 500000000). Smaller buckets only split the gather into more collectives; the weights need no extra buffer either way.)md",
     .summary =
         "ZeRO 1-2: elements per all-gather of the updated weights (DeepSpeed allgather_bucket_size)."},
};

const json& default_values() {
  static const json defaults = TrainConfig().to_json();
  return defaults;
}

// The shortest text that reads back as `v`, with a plain exponent (5e-5, not 5e-05).
std::string format_number(double v) {
  std::string s = fmt::format("{}", v);
  const size_t e = s.find('e');
  if (e == std::string::npos) return s;
  std::string mantissa = s.substr(0, e), exponent = s.substr(e + 1);
  const bool negative = !exponent.empty() && exponent[0] == '-';
  if (!exponent.empty() && (exponent[0] == '-' || exponent[0] == '+')) exponent.erase(0, 1);
  exponent.erase(0, std::min(exponent.find_first_not_of('0'), exponent.size() - 1));
  return mantissa + "e" + (negative ? "-" : "") + exponent;
}

// The default of a key as JSON-ish text, without markdown ("" for an empty string: `""`).
std::string plain_default_value(const ConfigKeyDoc& doc) {
  const json& defaults = default_values();
  const auto it = defaults.find(std::string(doc.key));
  ANVIL_ASSERT(it != defaults.end(), "config key '{}' has no default in TrainConfig::to_json", doc.key);
  const json& v = *it;
  if (v.is_string()) return v.get<std::string>().empty() ? "\"\"" : v.get<std::string>();
  if (v.is_number_float()) return format_number(v.get<double>());
  return v.dump();
}

bool starts_sentence(char c) {
  return std::isupper(static_cast<unsigned char>(c)) || c == '`' || c == '*' || c == '[' ||
         std::isdigit(static_cast<unsigned char>(c));
}

// The first sentence of markdown text: up to the first ". " outside parentheses and code spans that is
// followed by the start of a sentence (so "e.g. `x`" and "1..block_size" do not end it).
std::string first_sentence(std::string_view text) {
  int depth = 0;
  bool code = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '`') code = !code;
    if (code) continue;
    if (c == '(') ++depth;
    if (c == ')') depth = std::max(0, depth - 1);
    if (c != '.' || depth > 0) continue;
    if (i + 1 == text.size()) return std::string(text);
    const bool abbreviation = i >= 3 && (text.substr(i - 3, 3) == "e.g" || text.substr(i - 3, 3) == "i.e");
    if (text[i + 1] == ' ' && i + 2 < text.size() && starts_sentence(text[i + 2]) && !abbreviation)
      return std::string(text.substr(0, i + 1));
  }
  return std::string(text);
}

std::string escape_cell(std::string_view text) {
  std::string out;
  for (const char c : text) {
    ANVIL_ASSERT(c != '\n', "a config key's documentation must be one line: {}", text);
    out += c;
  }
  return out;
}

}  // namespace

const std::vector<ConfigKeyDoc>& config_key_docs() {
  return kKeys;
}

const std::vector<std::string>& config_key_sections() {
  static const std::vector<std::string> sections = [] {
    std::vector<std::string> s;
    for (const ConfigKeyDoc& d : kKeys)
      if (std::find(s.begin(), s.end(), d.section) == s.end()) s.emplace_back(d.section);
    return s;
  }();
  return sections;
}

const ConfigKeyDoc* find_config_key_doc(std::string_view key) {
  for (const ConfigKeyDoc& d : kKeys)
    if (d.key == key) return &d;
  return nullptr;
}

std::string config_key_default_markdown(const ConfigKeyDoc& doc) {
  if (doc.no_default) return "";
  if (!doc.default_text.empty()) return std::string(doc.default_text);
  const std::string plain = plain_default_value(doc);
  const json& v = default_values().at(std::string(doc.key));
  // Strings and lists in code spans, numbers and booleans as they are.
  return v.is_string() || v.is_array() ? "`" + plain + "`" : plain;
}

std::string config_key_default_plain(const ConfigKeyDoc& doc) {
  if (doc.no_default) return "";
  if (!doc.default_text.empty()) return strip_markdown(doc.default_text);
  return plain_default_value(doc);
}

std::string config_key_summary(const ConfigKeyDoc& doc) {
  return strip_markdown(doc.summary.empty() ? first_sentence(doc.meaning) : doc.summary);
}

bool config_key_is_boolean(const ConfigKeyDoc& doc) {
  return doc.type == "bool";
}

std::string config_key_value_name(const ConfigKeyDoc& doc) {
  if (doc.key == "model") return "NAME|PATH|JSON";
  if (doc.type == "bool") return "[BOOL]";
  if (doc.type == "list of int") return "STEPS";
  std::string name(doc.type);
  for (char& c : name) c = char(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

std::string config_key_table_markdown(std::string_view section) {
  const auto& sections = config_key_sections();
  ANVIL_REQUIRE(std::find(sections.begin(), sections.end(), section) != sections.end(),
                "unknown config section '{}' (sections: {})", section, fmt::join(sections, ", "));
  std::string out = "| key | type | default | meaning |\n| --- | --- | --- | --- |\n";
  for (const ConfigKeyDoc& d : kKeys)
    if (d.section == section)
      out += fmt::format(
          "| `{}` | {} |{}| {} |\n", d.key, d.type,
          d.no_default ? std::string(" ") : fmt::format(" {} ", escape_cell(config_key_default_markdown(d))),
          escape_cell(d.meaning));
  return out;
}

std::string regenerate_config_reference(const std::string& document) {
  static const std::string kBegin = "<!-- BEGIN generated: anvil config-reference --section '";
  static const std::string kBeginEnd = "' -->\n";
  static const std::string kEnd = "<!-- END generated -->";
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t begin = document.find(kBegin, pos);
    if (begin == std::string::npos) break;
    const size_t name_start = begin + kBegin.size();
    const size_t name_end = document.find(kBeginEnd, name_start);
    ANVIL_REQUIRE(name_end != std::string::npos && document.find('\n', name_start) > name_end,
                  "a generated-block marker is malformed: {}",
                  document.substr(begin, document.find('\n', begin) - begin));
    const std::string section = document.substr(name_start, name_end - name_start);
    const size_t body = name_end + kBeginEnd.size();
    const size_t end = document.find(kEnd, body);
    ANVIL_REQUIRE(end != std::string::npos, "the generated block of section '{}' has no '{}'", section, kEnd);
    out += document.substr(pos, body - pos);
    out += config_key_table_markdown(section);
    pos = end;
  }
  out += document.substr(pos);
  return out;
}

std::string strip_markdown(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '`') continue;
    if (c == '*' && i + 1 < text.size() && text[i + 1] == '*') {
      ++i;
      continue;
    }
    if (c == '[') {  // [label](target) -> label
      const size_t close = text.find("](", i);
      const size_t paren = close == std::string_view::npos ? close : text.find(')', close);
      if (close != std::string_view::npos && paren != std::string_view::npos &&
          text.substr(i, close - i).find('[', 1) == std::string_view::npos) {
        out += text.substr(i + 1, close - i - 1);
        i = paren;
        continue;
      }
    }
    out += c;
  }
  return out;
}

}  // namespace anvil
