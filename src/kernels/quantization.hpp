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
//        leaves the last low nibble 0). 4.5 bits per weight.
//   NF4 with double quantization (bnb_4bit_use_double_quant=True, QLoRA's "double quantization"): the NF4
//        codes as above, computed from the exact block absmax; the block scales themselves then quantized as
//        bitsandbytes does: their mean is subtracted (the offset), and what is left is cut into blocks of
//        kNf4ScaleBlock scales, each stored as 8-bit codes of the signed dynamic map (dynamic_quant_map)
//        times that block's fp32 absmax. scale = map[scale code] * absmax2 + offset (rounded after the
//        product and after the sum: fmaf would differ); about 4.127 bits per weight. The codes' bytes are
//        followed by the scale codes (QuantizedMatrix::scale_codes); the fp32 scales hold the offset, then
//        the absmax of each block of scales.
// A block or row of zeros has scale 0 and decodes to zeros (with double quantization: to kNf4Code[7] = 0
// times whatever scale it decodes to).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace anvil {

// How a tensor of the parameter store is kept (ParamTensor::storage): in the compute type (everything that
// trains), or quantized (a frozen Linear weight).
enum class WeightStorage : uint8_t { Compute, Int8, NF4, NF4DoubleQuant };
// "compute" / "int8" / "nf4" / "nf4-dq".
const char* weight_storage_name(WeightStorage s);
// From the name a user gives ("none" is Compute); throws an anvil::Error naming `what` and the choices.
WeightStorage parse_weight_storage(const std::string& name, const char* what);

constexpr int kNf4BlockSize = 64;
constexpr int kNf4ScaleBlock =
    256;  // scales per absmax under double quantization (bitsandbytes' nested blocks)
constexpr float kInt8Step = 1.0f / 127.0f;
// The 16 NF4 values (ascending; kNf4Code[7] is 0, the ends are -1 and 1).
extern const float kNf4Code[16];

// The codes' bytes and the number of fp32 scales of a quantized [rows, cols] matrix.
size_t quantized_code_bytes(WeightStorage s, int64_t rows, int64_t cols);
size_t quantized_scale_count(WeightStorage s, int64_t rows, int64_t cols);
// Bits per weight, scales included, for reports (4.5 for NF4, about 4.127 with double quantization, 8 + 32 /
// cols for Int8).
double quantized_bits_per_weight(WeightStorage s, int64_t rows, int64_t cols);

// A quantized matrix's memory (device or host, as its user says).
struct QuantizedMatrix {
  WeightStorage storage = WeightStorage::NF4;
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;
  int64_t rows = 0, cols = 0;
  size_t numel() const { return size_t(rows) * size_t(cols); }
  // NF4 with double quantization: the scales' 8-bit codes, after the weights' codes.
  const uint8_t* scale_codes() const { return codes + (numel() + 1) / 2; }
};

// bitsandbytes' dynamic quantization map (create_dynamic_map(signed, max_exponent_bits=7, total_bits=8)): 256
// ascending values. For exponent level k = 0..6 the fraction range [0.1, 1] is cut into 2^k (signed: mirrored
// to the negative side) or 2^(k+1) (unsigned) equal bins, whose midpoints scaled by 10^(k-6) are the values;
// 0 and 1 complete the map. Signed: 127 negative values down to -0.99297, 0, 127 positive values and 1.
// Unsigned: 0, 254 positive values and 1. The 8-bit optimizer states and NF4's double quantization use it.
std::array<float, 256> dynamic_quant_map(bool is_signed);

// Block-wise quantisation with a map (bitsandbytes quantize_blockwise / dequantize_blockwise semantics):
// absmax[b] = max |x| over block b of `block` elements, codes[i] = the map value nearest x[i] / absmax (an
// all-zero block gets absmax 0 and the codes of the value nearest 0). `absmax` has ceil(n / block) entries.
void quantize_blockwise(const float* x, size_t n, const float* map, size_t block, uint8_t* codes,
                        float* absmax);
void dequantize_blockwise(const uint8_t* codes, const float* absmax, size_t n, const float* map, size_t block,
                          float* x);

// The scale of NF4 block `b` of a double-quantized matrix (host memory), as both backends compute it.
float nf4_double_quant_scale(const QuantizedMatrix& m, size_t b);

// Host quantization of w [rows, cols] (fp32) into codes and scales (sized as above): each element to its
// nearest code (ties to the lower code). Runs in parallel over rows or blocks; deterministic.
void quantize_host(WeightStorage s, const float* w, int64_t rows, int64_t cols, uint8_t* codes,
                   float* scales);
// The fp32 values a quantized matrix (host memory) stands for; out [rows, cols].
void dequantize_host(const QuantizedMatrix& m, float* out);
// One element of it (the formula both backends' dequantize kernels compute).
float dequantized_value(const QuantizedMatrix& m, size_t i);

}  // namespace anvil
