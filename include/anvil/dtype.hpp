// Element types. fp32 is what this version computes in; the others are declared storage types for
// mixed precision (fp16, bf16) and quantisation (int8, nf4) in later versions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace anvil {

enum class DType : uint8_t { F32, F16, BF16, I8, NF4, I32, U16, F64 };

// Size in bits (NF4 packs two values per byte).
constexpr size_t dtype_bits(DType t) {
  switch (t) {
    case DType::F32:
      return 32;
    case DType::F16:
      return 16;
    case DType::BF16:
      return 16;
    case DType::I8:
      return 8;
    case DType::NF4:
      return 4;
    case DType::I32:
      return 32;
    case DType::U16:
      return 16;
    case DType::F64:
      return 64;
  }
  return 0;
}

constexpr size_t dtype_bytes(DType t, size_t count) {
  return (dtype_bits(t) * count + 7) / 8;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::I8:
      return "I8";
    case DType::NF4:
      return "NF4";
    case DType::I32:
      return "I32";
    case DType::U16:
      return "U16";
    case DType::F64:
      return "F64";
  }
  return "?";
}

}  // namespace anvil
