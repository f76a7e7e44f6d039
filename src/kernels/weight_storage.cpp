// The names of the weight storage types (kernels/quantization.hpp), apart from the formats' code: what config
// parsing needs (and the config fuzzer links alone).
#include "anvil/error.hpp"
#include "kernels/quantization.hpp"

namespace anvil {

const char* weight_storage_name(WeightStorage s) {
  switch (s) {
    case WeightStorage::Compute:
      return "compute";
    case WeightStorage::Int8:
      return "int8";
    case WeightStorage::NF4:
      return "nf4";
    case WeightStorage::NF4DoubleQuant:
      return "nf4-dq";
  }
  return "?";
}

WeightStorage parse_weight_storage(const std::string& name, const char* what) {
  if (name == "none" || name.empty()) return WeightStorage::Compute;
  if (name == "int8") return WeightStorage::Int8;
  if (name == "nf4") return WeightStorage::NF4;
  if (name == "nf4-dq") return WeightStorage::NF4DoubleQuant;
  ANVIL_THROW(
      "{} '{}': give none, int8 (bitsandbytes' load_in_8bit storage: row-wise absmax), nf4 (load_in_4bit "
      "with bnb_4bit_quant_type nf4: blocks of {}) or nf4-dq (nf4 with bnb_4bit_use_double_quant: the "
      "scales quantized too)",
      what, name, kNf4BlockSize);
}

}  // namespace anvil
