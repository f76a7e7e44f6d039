// Checkpoints and Hugging Face model directories, for either model family (GPT-2 here; BERT's weights in
// bert_checkpoint.hpp, which the Model overloads below dispatch to).
//
// A checkpoint directory (written atomically through AtomicDirectory) holds:
//   model.safetensors     weights with Hugging Face names and shapes (GPT2LMHeadModel or
//                         BertForSequenceClassification: loads in transformers)
//   config.json           Hugging Face GPT2Config / BertConfig fields (a classifier's id2label = its labels)
//   optimizer.safetensors the optimizer's state buffers, each a 1-D tensor named as the optimizer names it
//                         (AdamW: exp_avg, exp_avg_sq over the flat layout), metadata "optimizer" = its name
//   trainer_state.json    global step, data position, RNG state, schedule, the full training config
// A Hugging Face model directory needs only config.json and model.safetensors.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/base_reference.hpp"
#include "io/bert_checkpoint.hpp"
#include "io/trainer_state.hpp"
#include "model/decoder.hpp"
#include "model/model.hpp"
#include "optim/optimizer.hpp"

namespace anvil::io {

// Reads <dir>/config.json: a GPT2Config or a BertConfig (TransformerConfig::from_hf_json). Like every
// reader of model and checkpoint directories here, refuses the leftover of an interrupted save
// ("checkpoint-N.tmp-<pid>", "checkpoint-N.old-<pid>": require_not_interrupted_save in atomic_dir.hpp).
TransformerConfig read_model_config(const std::string& dir);

// Writes model.safetensors (Hugging Face names and shapes) and config.json into `dir` (an existing
// directory): a directory transformers loads as GPT2LMHeadModel / LlamaForCausalLM / Qwen2ForCausalLM /
// MistralForCausalLM with no missing or unexpected keys. The weights are written as `dtype`: F32 (default),
// BF16 or F16, rounded to nearest (ties to even); config.json's "dtype" names it ("float32", "bfloat16",
// "float16", as transformers 5 writes it). A finite weight that overflows the 16-bit type (fp16: beyond
// 65504) is an error naming the tensor; any other dtype is an error.
void save_model(const std::string& dir, const Decoder& model, Device& dev, DType dtype = DType::F32);
// Loads <dir>/model.safetensors (or its shards) into the model's parameters, by the layout table's names
// and aliases (GPT-2 with or without the "transformer." prefix), F32/F16/BF16 tensors; tensors the table
// marks as ignorable (a tied head, attention-mask and rotary buffers) are skipped. A missing, duplicated
// or unexpected tensor, or a shape that disagrees with the config, is an error naming both.
// A PEFT adapter (adapter_config.json + adapter_model.safetensors) in `dir`, or in `adapter_dir` when one is
// given (an adapter kept apart from its base, as PEFT saves and the Hub serves them; `dir` must then hold
// none), is read into the model's adapters when it has LoRA, else merged into the weights it adapts.
void load_model_weights(const std::string& dir, Decoder& model, Device& dev,
                        const std::string& adapter_dir = "");

// Either family: the Decoder's functions above, or (BERT) save_bert_model's output in `dtype` /
// load_bert_weights. The BERT loader's report (head tensors the directory lacks, which keep their values;
// tensors skipped) is returned; it is empty for decoders.
void save_model(const std::string& dir, const Model& model, Device& dev, DType dtype = DType::F32);
BertLoadReport load_model_weights(const std::string& dir, Model& model, Device& dev,
                                  const std::string& adapter_dir = "");
// Writes the optimizer's state (its parts concatenated: io/optimizer_state.hpp) as optimizer.safetensors.
void save_optimizer(const std::string& path, const OptimizerStateParts& state, Device& dev);
// Restores every state buffer; a checkpoint of another optimizer, or a buffer whose name, type or size
// differs, is an error naming the file and what differs.
void load_optimizer(const std::string& path, Optimizer& opt, Device& dev);

// Writes a whole checkpoint directory atomically. `tokenizer_file` (a tokenizer.json or vocab.txt, or
// "" for none) is copied in under its Hugging Face name with the files beside it that belong to it
// (tokenizer_side_files), so the checkpoint is self-contained. The optimizer's state is read through
// `optimizer_dev` (its host device under optimizer offload), else through `dev`.
// `base` (a LoRA run whose base is unchanged and came from that directory; io/base_reference.hpp): the
// checkpoint refers to the base instead of holding it (save_checkpoint_model).
void save_checkpoint(const std::string& dir, const Model& model, const OptimizerStateParts& opt,
                     const nlohmann::json& state, const std::string& tokenizer_file, Device& dev,
                     Device* optimizer_dev = nullptr, const BaseReference* base = nullptr);
// A checkpoint's model files: the model (save_model, fp32) and a QLoRA base that does not re-quantize exactly
// (save_quantized_base); or, with `base`, config.json, the adapter (from the trainable tensors alone:
// ParamStore::download_trainable, whose adapter_config.json names the base) and base_model.json. Under ZeRO
// a collective: the other ranks call join_checkpoint_model at the same time.
void save_checkpoint_model(const std::string& dir, const Model& model, Device& dev,
                           const BaseReference* base);
void join_checkpoint_model(const Model& model, Device& dev, const BaseReference* base);

// The tokenizer file a model directory carries (tokenizer.json, else vocab.txt), or "".
std::string find_tokenizer_file(const std::string& dir);
// The Hugging Face file name for a tokenizer file: vocab.txt for *.txt, else tokenizer.json.
std::string tokenizer_file_name(const std::string& path);
// What a checkpoint takes of a tokenizer: (source path, file name in the checkpoint) for the tokenizer
// file itself (a directory stands for its find_tokenizer_file) and the tokenizer_config.json and
// special_tokens_map.json beside it, if there. load_tokenizer reads the BOS/EOS template from these
// (add_bos_token, add_eos_token, the tokens), so a checkpoint encodes text as the model it came from did;
// transformers reads them too. Empty for "" (the byte tokenizer).
std::vector<std::pair<std::string, std::string>> tokenizer_side_files(const std::string& tokenizer_file);

}  // namespace anvil::io
