// The quantized base of a QLoRA checkpoint, kept as the run held it when its dequantized values do not
// restore it: nf4-dq (double quantization) quantizes the decoded scales into other ones. A checkpoint's
// model.safetensors holds the base dequantized (what transformers and PEFT read); beside it
// quantized_base.safetensors holds the codes ("codes", the bytes as I8) and fp32 scales ("scales") of every
// quantized matrix in the store's order, with the storage and the matrix count in its metadata. A model
// with the same storage and adapters (a resumed run, or one started from the checkpoint) reads them back
// after the dequantized weights, so it continues from exactly the base that was trained against.
#pragma once
#include <string>

#include "model/model.hpp"
#include "runtime/device.hpp"

namespace anvil::io {

inline constexpr const char* kQuantizedBaseFile = "quantized_base.safetensors";

// Writes dir/quantized_base.safetensors when the model's store is quantized in a storage that does not
// requantize exactly; nothing otherwise.
void save_quantized_base(const std::string& dir, const Model& model, Device& dev);

// When dir holds that file, the model keeps its base apart from its adapters (LoRA layout) and is quantized
// in the file's storage: uploads the file's codes and scales (a file of another size is an error naming
// it). Returns whether it did.
bool load_quantized_base(const std::string& dir, const Model& model, Device& dev);

}  // namespace anvil::io
