// LoRA adapters in PEFT's files: adapter_model.safetensors (the factors, named
// "base_model.model.<module>.lora_A.weight" / ".lora_B.weight", A [r, in] and B [out, r]) and
// adapter_config.json (peft/lora_config.hpp). What PeftModel.from_pretrained(base, dir) loads, and what
// PEFT's save_pretrained writes.
//
// A checkpoint of a LoRA run holds these two files and the base model (model.safetensors, unchanged), or a
// reference to the base's directory (io/base_reference.hpp). Read
// into a model with the same adapters, they set its adapters; read into a model without adapters (anvil
// generate, logits, convert, init_from), they are merged into its weights: W += s B A, PEFT's
// merge_and_unload.
#pragma once
#include <functional>
#include <string>

#include "model/param_layout.hpp"

namespace anvil::io {

inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";
inline constexpr const char* kAdapterConfigFile = "adapter_config.json";

// Whether `dir` holds an adapter (adapter_config.json).
bool has_peft_adapter(const std::string& dir);
// Its adapter_config.json's base_model_name_or_path, quoted, or "not named" (for messages).
std::string adapter_base_model(const std::string& dir);

// Writes the adapter tensors of `layout` (read from `host`, fp32 in the flat layout) and the adapter config
// into `dir`; nothing when the layout has no adapters.
void write_peft_adapter(const std::string& dir, const ParamLayout& layout, const float* host);
// The same with each adapter tensor's fp32 values from `values_of` (a checkpoint of the trainable tensors
// alone), and `base_model` as adapter_config.json's base_model_name_or_path ("" for none).
void write_peft_adapter(const std::string& dir, const ParamLayout& layout,
                        const std::function<const float*(const ParamTensor&)>& values_of,
                        const std::string& base_model);

// Reads the adapter of `dir` into `host` (fp32, flat layout of `layout`, which has adapters): the config must
// agree with the layout's (rank, alpha, rsLoRA, the adapted modules), every adapter tensor must be there with
// its shape, and nothing else; errors name the file and what differs.
void read_peft_adapter(const std::string& dir, const ParamLayout& layout, float* host);
// The same, each adapter tensor into `dest_of(t)` (its numel floats).
void read_peft_adapter(const std::string& dir, const ParamLayout& layout,
                       const std::function<float*(const ParamTensor&)>& dest_of);

// Merges the adapter of `dir` into the weights in `host` (fp32, flat layout of `layout`, which has no
// adapters): W += s B A for every adapted module. A module the model lacks, a missing factor, or a shape that
// disagrees is an error naming the file and tensor.
void merge_peft_adapter(const std::string& dir, const ParamLayout& layout, float* host);

}  // namespace anvil::io
