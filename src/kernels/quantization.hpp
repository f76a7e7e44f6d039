// Quantized weight storage (bitsandbytes' formats, so that what its users know of load_in_8bit and
// load_in_4bit holds): a matrix [rows, cols] (one Linear's weight; a fused q/k/v or gate/up matrix is one)
// kept as codes and fp32 scales, dequantized into the compute type before the GEMM that reads it.
//
//   Int8 (load_in_8bit's storage, LLM.int8's row-wise absmax): codes [rows, cols] int8, scales [rows] the
//        absmax of each row; w = code * (scale * kInt8Step), code = round(w * 127 / scale).
//   NF4  (load_in_4bit with bnb_4bit_quant_type "nf4", QLoRA's 4-bit NormalFloat): the matrix in row-major
//        order cut into blocks of kNf4BlockSize elements (the last may be shorter), scales [blocks] the
//        absmax of each block; w = kNf4Code[code] * scale, code the nearest of the 16 values to w / scale;
//        two codes a byte, element 2i in the high nibble of byte i (bitsandbytes' packing; an odd count
//        leaves the last low nibble 0). Double quantization of the scales is not used: 4.5 bits per weight.
// A block or row of zeros has scale 0 and decodes to zeros.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace anvil {

// How a tensor of the parameter store is kept (ParamTensor::storage): in the compute type (everything that
// trains), or quantized (a frozen Linear weight).
enum class WeightStorage : uint8_t { Compute, Int8, NF4 };
// "compute" / "int8" / "nf4".
const char* weight_storage_name(WeightStorage s);
// From the name a user gives ("none" is Compute); throws an anvil::Error naming `what` and the choices.
WeightStorage parse_weight_storage(const std::string& name, const char* what);

constexpr int kNf4BlockSize = 64;
constexpr float kInt8Step = 1.0f / 127.0f;
// The 16 NF4 values (ascending; kNf4Code[7] is 0, the ends are -1 and 1).
extern const float kNf4Code[16];

// The codes' bytes and the number of fp32 scales of a quantized [rows, cols] matrix.
size_t quantized_code_bytes(WeightStorage s, int64_t rows, int64_t cols);
size_t quantized_scale_count(WeightStorage s, int64_t rows, int64_t cols);
// Bits per weight, scales included, for reports (4.5 for NF4, 8 + 32 / cols for Int8).
double quantized_bits_per_weight(WeightStorage s, int64_t rows, int64_t cols);

// A quantized matrix's memory (device or host, as its user says).
struct QuantizedMatrix {
  WeightStorage storage = WeightStorage::NF4;
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  int64_t rows = 0, cols = 0;
  size_t numel() const { return size_t(rows) * size_t(cols); }
};

// Host quantization of w [rows, cols] (fp32) into codes and scales (sized as above): each element to its
// nearest code (ties to the lower code). Runs in parallel over rows or blocks; deterministic.
void quantize_host(WeightStorage s, const float* w, int64_t rows, int64_t cols, uint8_t* codes,
                   float* scales);
// The fp32 values a quantized matrix (host memory) stands for; out [rows, cols].
void dequantize_host(const QuantizedMatrix& m, float* out);
// One element of it (the formula both backends' dequantize kernels compute).
float dequantized_value(const QuantizedMatrix& m, size_t i);

}  // namespace anvil
