#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoef = 0.044715f;

template <DType A>
void gelu_fwd_t(void* out_, const void* inp_, size_t n) {
  using S = Storage<A>;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* inp = static_cast<const storage_t<A>*>(inp_);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    const float x = S::load(inp[i]);
    out[i] = S::store(0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kGeluCoef * x * x * x))));
  }
}

template <DType A>
void gelu_bwd_t(void* dinp_, const void* inp_, const void* dout_, size_t n) {
  using S = Storage<A>;
  auto* dinp = static_cast<storage_t<A>*>(dinp_);
  const auto* inp = static_cast<const storage_t<A>*>(inp_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    const float x = S::load(inp[i]);
    const float th = std::tanh(kSqrt2OverPi * (x + kGeluCoef * x * x * x));
    const float dth = (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoef * x * x);
    dinp[i] = S::store(S::load(dout[i]) * (0.5f * (1.0f + th) + 0.5f * x * dth));
  }
}

template <DType A>
void residual_fwd_t(void* out_, const void* a_, const void* b_, size_t n) {
  using S = Storage<A>;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* a = static_cast<const storage_t<A>*>(a_);
  const auto* b = static_cast<const storage_t<A>*>(b_);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) out[i] = S::store(S::load(a[i]) + S::load(b[i]));
}

}  // namespace

void gelu_fwd(DType act, void* out, const void* inp, size_t n) {
  dispatch_float(act, [&](auto a) { gelu_fwd_t<decltype(a)::value>(out, inp, n); });
}

void gelu_bwd(DType act, void* dinp, const void* inp, const void* dout, size_t n) {
  dispatch_float(act, [&](auto a) { gelu_bwd_t<decltype(a)::value>(dinp, inp, dout, n); });
}

void residual_fwd(DType act, void* out, const void* a, const void* b, size_t n) {
  dispatch_float(act, [&](auto t) { residual_fwd_t<decltype(t)::value>(out, a, b, n); });
}

}  // namespace anvil::cpu
