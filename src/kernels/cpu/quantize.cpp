// The references of Ops::dequantize (the format's own formula, kernels/quantization.cpp, rounded to the
// compute type) and Ops::quantized_matmul_fwd (dequantize, then the plain matmul).
#include <vector>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {

void dequantize(DType act, void* out, const QuantizedMatrix& m) {
  ANVIL_REQUIRE(m.storage != WeightStorage::Compute, "dequantize: a {} matrix is not quantized",
                weight_storage_name(m.storage));
  dispatch_float(act, [&](auto a) {
    constexpr DType A = decltype(a)::value;
    auto* o = static_cast<storage_t<A>*>(out);
    const int64_t n = int64_t(m.numel());
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = Storage<A>::store(dequantized_value(m, size_t(i)));
  });
}

void quantized_matmul_fwd(DType act, void* y, const void* x, const QuantizedMatrix& m, const void* bias,
                          int N) {
  std::vector<uint8_t> w(dtype_bytes(act, m.numel()));
  dequantize(act, w.data(), m);
  matmul_fwd(act, y, x, w.data(), bias, N, int(m.cols), int(m.rows));
}

}  // namespace anvil::cpu
