#include "kernels/quantization.hpp"

#include <algorithm>
#include <cmath>

#include "anvil/error.hpp"

namespace anvil {

// The NF4 data type of QLoRA (Dettmers et al., 2023, appendix E), as bitsandbytes tabulates it.
const float kNf4Code[16] = {-1.0f,
                            -0.6961928009986877f,
                            -0.5250730514526367f,
                            -0.39491748809814453f,
                            -0.28444138169288635f,
                            -0.18477343022823334f,
                            -0.09105003625154495f,
                            0.0f,
                            0.07958029955625534f,
                            0.16093020141124725f,
                            0.24611230194568634f,
                            0.33791524171829224f,
                            0.44070982933044434f,
                            0.5626170039176941f,
                            0.7229568362236023f,
                            1.0f};

const char* weight_storage_name(WeightStorage s) {
  switch (s) {
    case WeightStorage::Compute:
      return "compute";
    case WeightStorage::Int8:
      return "int8";
    case WeightStorage::NF4:
      return "nf4";
  }
  return "?";
}

WeightStorage parse_weight_storage(const std::string& name, const char* what) {
  if (name == "none" || name.empty()) return WeightStorage::Compute;
  if (name == "int8") return WeightStorage::Int8;
  if (name == "nf4") return WeightStorage::NF4;
  ANVIL_THROW(
      "{} '{}': give none, int8 (bitsandbytes' load_in_8bit storage: row-wise absmax) or nf4 (load_in_4bit "
      "with bnb_4bit_quant_type nf4: blocks of {})",
      what, name, kNf4BlockSize);
}

size_t quantized_code_bytes(WeightStorage s, int64_t rows, int64_t cols) {
  const size_t n = size_t(rows) * size_t(cols);
  switch (s) {
    case WeightStorage::Int8:
      return n;
    case WeightStorage::NF4:
      return (n + 1) / 2;
    case WeightStorage::Compute:
      break;
  }
  ANVIL_ASSERT(false, "quantized_code_bytes of a tensor kept in the compute type");
  return 0;
}

size_t quantized_scale_count(WeightStorage s, int64_t rows, int64_t cols) {
  const size_t n = size_t(rows) * size_t(cols);
  switch (s) {
    case WeightStorage::Int8:
      return size_t(rows);
    case WeightStorage::NF4:
      return (n + kNf4BlockSize - 1) / kNf4BlockSize;
    case WeightStorage::Compute:
      break;
  }
  ANVIL_ASSERT(false, "quantized_scale_count of a tensor kept in the compute type");
  return 0;
}

double quantized_bits_per_weight(WeightStorage s, int64_t rows, int64_t cols) {
  const double n = double(rows) * double(cols);
  return n == 0 ? 0.0
                : (8.0 * double(quantized_code_bytes(s, rows, cols)) +
                   32.0 * double(quantized_scale_count(s, rows, cols))) /
                      n;
}

namespace {

// The nearest NF4 code of x in [-1, 1] (ties: the lower code).
uint8_t nf4_code(float x) {
  int lo = 0;
  // The codes ascend: the first code whose midpoint with the next lies above x.
  while (lo < 15 && x > 0.5f * (kNf4Code[lo] + kNf4Code[lo + 1])) ++lo;
  return uint8_t(lo);
}

float absmax(const float* w, size_t n) {
  float m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(w[i]));
  return m;
}

}  // namespace

void quantize_host(WeightStorage s, const float* w, int64_t rows, int64_t cols, uint8_t* codes,
                   float* scales) {
  ANVIL_ASSERT(rows >= 0 && cols >= 0, "quantize_host: shape [{}, {}]", rows, cols);
  const size_t n = size_t(rows) * size_t(cols);
  if (s == WeightStorage::Int8) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = w + size_t(r) * size_t(cols);
      const float m = absmax(row, size_t(cols));
      scales[r] = m;
      auto* out = reinterpret_cast<int8_t*>(codes) + size_t(r) * size_t(cols);
      for (int64_t c = 0; c < cols; ++c)
        out[c] =
            m == 0 ? int8_t(0) : int8_t(std::clamp(std::nearbyint(row[c] * 127.0f / m), -127.0f, 127.0f));
    }
    return;
  }
  ANVIL_ASSERT(s == WeightStorage::NF4, "quantize_host: storage {}", weight_storage_name(s));
  const int64_t blocks = int64_t(quantized_scale_count(s, rows, cols));
  std::fill_n(codes, quantized_code_bytes(s, rows, cols), uint8_t(0));
  // A block is 64 elements, 32 whole bytes: blocks write disjoint bytes.
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const size_t first = size_t(b) * kNf4BlockSize, count = std::min<size_t>(kNf4BlockSize, n - first);
    const float m = absmax(w + first, count);
    scales[b] = m;
    for (size_t i = first; i < first + count; ++i) {
      const uint8_t q = m == 0 ? uint8_t(7) : nf4_code(w[i] / m);
      codes[i / 2] |= uint8_t(i % 2 == 0 ? q << 4 : q);
    }
  }
}

float dequantized_value(const QuantizedMatrix& m, size_t i) {
  if (m.storage == WeightStorage::Int8) {
    const size_t row = i / size_t(m.cols);
    return float(reinterpret_cast<const int8_t*>(m.codes)[i]) * (m.scales[row] * kInt8Step);
  }
  const uint8_t byte = m.codes[i / 2];
  return kNf4Code[i % 2 == 0 ? byte >> 4 : byte & 0xF] * m.scales[i / kNf4BlockSize];
}

void dequantize_host(const QuantizedMatrix& m, float* out) {
  ANVIL_ASSERT(m.storage == WeightStorage::Int8 || m.storage == WeightStorage::NF4,
               "dequantize_host: storage {}", weight_storage_name(m.storage));
  const int64_t n = int64_t(m.numel());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = dequantized_value(m, size_t(i));
}

}  // namespace anvil
