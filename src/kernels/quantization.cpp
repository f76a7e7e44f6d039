#include "kernels/quantization.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "anvil/error.hpp"
#include "kernels/cpu/cpu_kernels.hpp"

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

size_t quantized_code_bytes(WeightStorage s, int64_t rows, int64_t cols) {
  const size_t n = size_t(rows) * size_t(cols);
  switch (s) {
    case WeightStorage::Int8:
      return n;
    case WeightStorage::NF4:
      return (n + 1) / 2;
    case WeightStorage::NF4DoubleQuant:  // the codes, then one code per block scale
      return (n + 1) / 2 + (n + kNf4BlockSize - 1) / kNf4BlockSize;
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
    case WeightStorage::NF4DoubleQuant: {  // the offset, then the absmax of each block of scales
      const size_t blocks = (n + kNf4BlockSize - 1) / kNf4BlockSize;
      return 1 + (blocks + kNf4ScaleBlock - 1) / kNf4ScaleBlock;
    }
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

std::array<float, 256> dynamic_quant_map(bool is_signed) {
  // bitsandbytes create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): 7 exponent levels.
  constexpr int kLevels = 7;
  std::vector<double> values;
  for (int k = 0; k < kLevels; ++k) {
    const int bins = is_signed ? 1 << k : 1 << (k + 1);
    const double scale = std::pow(10.0, double(k - (kLevels - 1)));
    for (int j = 0; j < bins; ++j) {
      // The midpoint of bin j of [0.1, 1] cut into `bins` equal parts.
      const double lo = 0.1 + 0.9 * double(j) / bins, hi = 0.1 + 0.9 * double(j + 1) / bins;
      const double mid = 0.5 * (lo + hi);
      values.push_back(scale * mid);
      if (is_signed) values.push_back(-scale * mid);
    }
  }
  values.push_back(0.0);
  values.push_back(1.0);
  ANVIL_ASSERT(values.size() == 256, "dynamic map of {} values", values.size());
  std::sort(values.begin(), values.end());
  std::array<float, 256> map{};
  for (size_t i = 0; i < 256; ++i) map[i] = float(values[i]);
  return map;
}

void quantize_blockwise(const float* x, size_t n, const float* map, size_t block, uint8_t* codes,
                        float* absmax) {
  ANVIL_ASSERT(block > 0, "quantize_blockwise: block size 0");
  for (size_t b0 = 0, b = 0; b0 < n; b0 += block, ++b) {
    const size_t end = std::min(n, b0 + block);
    float mx = 0.0f;
    for (size_t i = b0; i < end; ++i) mx = std::max(mx, std::abs(x[i]));
    absmax[b] = mx;
    const float inv = mx > 0.0f ? 1.0f / mx : 0.0f;
    for (size_t i = b0; i < end; ++i) codes[i] = cpu::quantize_to_map(map, x[i] * inv);
  }
}

void dequantize_blockwise(const uint8_t* codes, const float* absmax, size_t n, const float* map, size_t block,
                          float* x) {
  ANVIL_ASSERT(block > 0, "dequantize_blockwise: block size 0");
  for (size_t i = 0; i < n; ++i) x[i] = map[codes[i]] * absmax[i / block];
}

namespace {

// The signed dynamic map, made once.
const std::array<float, 256>& signed_map() {
  static const std::array<float, 256> map = dynamic_quant_map(true);
  return map;
}

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

// Int8 and NF4 codes with their exact scales.
static void quantize_codes(WeightStorage s, const float* w, int64_t rows, int64_t cols, uint8_t* codes,
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

void quantize_host(WeightStorage s, const float* w, int64_t rows, int64_t cols, uint8_t* codes,
                   float* scales) {
  if (s != WeightStorage::NF4DoubleQuant) {
    quantize_codes(s, w, rows, cols, codes, scales);
    return;
  }
  // bitsandbytes' compress_statistics: the exact block absmax make the codes; the scales are then stored as
  // their mean (the offset) and 8-bit codes of what is left around it, blockwise.
  const size_t n = size_t(rows) * size_t(cols), blocks = (n + kNf4BlockSize - 1) / kNf4BlockSize;
  std::vector<float> exact(blocks);
  quantize_codes(WeightStorage::NF4, w, rows, cols, codes, exact.data());
  const float offset =
      blocks ? float(std::accumulate(exact.begin(), exact.end(), 0.0) / double(blocks)) : 0.0f;
  for (float& v : exact) v -= offset;
  scales[0] = offset;
  QuantizedMatrix m{s, codes, scales, rows, cols};
  quantize_blockwise(exact.data(), blocks, signed_map().data(), kNf4ScaleBlock,
                     const_cast<uint8_t*>(m.scale_codes()), scales + 1);
}

float nf4_double_quant_scale(const QuantizedMatrix& m, size_t b) {
  // Rounded after the product and after the sum, as the CUDA kernels do (__fmul_rn, __fadd_rn).
  const volatile float p = signed_map()[m.scale_codes()[b]] * m.scales[1 + b / kNf4ScaleBlock];
  return p + m.scales[0];
}

float dequantized_value(const QuantizedMatrix& m, size_t i) {
  if (m.storage == WeightStorage::Int8) {
    const size_t row = i / size_t(m.cols);
    return float(reinterpret_cast<const int8_t*>(m.codes)[i]) * (m.scales[row] * kInt8Step);
  }
  const uint8_t byte = m.codes[i / 2];
  const size_t b = i / kNf4BlockSize;
  const float scale = m.storage == WeightStorage::NF4DoubleQuant ? nf4_double_quant_scale(m, b) : m.scales[b];
  return kNf4Code[i % 2 == 0 ? byte >> 4 : byte & 0xF] * scale;
}

void dequantize_host(const QuantizedMatrix& m, float* out) {
  ANVIL_ASSERT(m.storage != WeightStorage::Compute, "dequantize_host: storage {}",
               weight_storage_name(m.storage));
  const int64_t n = int64_t(m.numel());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = dequantized_value(m, size_t(i));
}

}  // namespace anvil
