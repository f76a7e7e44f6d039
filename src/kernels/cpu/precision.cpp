// Master weights (fp32) to the compute type: a copy for F32, round to nearest even for F16 and for BF16
// without a seed, stochastic rounding for BF16 with one. The random bits depend only on (seed, index), so
// the result does not depend on the thread count and matches the CUDA backend bit for bit.
#include <cstring>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {

void cast_weights(DType out_type, void* out, const float* master, size_t n, uint64_t rounding_seed) {
  if (out_type == DType::F32) {
    if (n && out != master) std::memcpy(out, master, n * sizeof(float));
    return;
  }
  auto* dst = static_cast<uint16_t*>(out);
  if (out_type == DType::BF16 && rounding_seed != 0) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i)
      dst[i] = float_to_bf16_stochastic(master[i], rounding_bits(rounding_seed, uint64_t(i)));
    return;
  }
  dispatch_float(out_type, [&](auto d) {
    using S = Storage<decltype(d)::value>;
    if constexpr (!std::is_same_v<typename S::type, float>) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < int64_t(n); ++i) dst[i] = S::store(master[i]);
    }
  });
}

}  // namespace anvil::cpu
