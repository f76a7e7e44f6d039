#include <algorithm>
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

constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

template <DType A>
void gelu_erf_fwd_t(void* out_, const void* inp_, size_t n) {
  using S = Storage<A>;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* inp = static_cast<const storage_t<A>*>(inp_);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    const float x = S::load(inp[i]);
    out[i] = S::store(0.5f * x * (1.0f + std::erf(x * kInvSqrt2)));
  }
}

// d/dx [x Phi(x)] = Phi(x) + x phi(x), with Phi the standard normal CDF and phi its density.
template <DType A>
void gelu_erf_bwd_t(void* dinp_, const void* inp_, const void* dout_, size_t n) {
  using S = Storage<A>;
  auto* dinp = static_cast<storage_t<A>*>(dinp_);
  const auto* inp = static_cast<const storage_t<A>*>(inp_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    const float x = S::load(inp[i]);
    const float cdf = 0.5f * (1.0f + std::erf(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x * x);
    dinp[i] = S::store(S::load(dout[i]) * (cdf + x * pdf));
  }
}

template <DType A>
void tanh_fwd_t(void* out_, const void* inp_, size_t n) {
  using S = Storage<A>;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* inp = static_cast<const storage_t<A>*>(inp_);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) out[i] = S::store(std::tanh(S::load(inp[i])));
}

template <DType A>
void tanh_bwd_t(void* dinp_, const void* out_, const void* dout_, size_t n) {
  using S = Storage<A>;
  auto* dinp = static_cast<storage_t<A>*>(dinp_);
  const auto* out = static_cast<const storage_t<A>*>(out_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) {
    const float y = S::load(out[i]);
    dinp[i] = S::store(S::load(dout[i]) * (1.0f - y * y));
  }
}

// Rows are copied as stored (no rounding: the storage type is the same on both sides).
template <DType A>
void first_token_fwd_t(void* out_, const void* inp_, int B, int T, int C) {
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* inp = static_cast<const storage_t<A>*>(inp_);
  for (int64_t b = 0; b < B; ++b) std::copy_n(inp + b * T * C, C, out + b * C);
}

template <DType A>
void first_token_bwd_t(void* dinp_, const void* dout_, int B, int T, int C) {
  using S = Storage<A>;
  auto* dinp = static_cast<storage_t<A>*>(dinp_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < int64_t(B) * T; ++bt) {
    auto* d = dinp + bt * C;
    if (bt % T == 0)
      std::copy_n(dout + (bt / T) * C, C, d);
    else
      std::fill_n(d, C, S::store(0.0f));
  }
}

}  // namespace

void gelu_erf_fwd(DType act, void* out, const void* inp, size_t n) {
  dispatch_float(act, [&](auto a) { gelu_erf_fwd_t<decltype(a)::value>(out, inp, n); });
}

void gelu_erf_bwd(DType act, void* dinp, const void* inp, const void* dout, size_t n) {
  dispatch_float(act, [&](auto a) { gelu_erf_bwd_t<decltype(a)::value>(dinp, inp, dout, n); });
}

void tanh_fwd(DType act, void* out, const void* inp, size_t n) {
  dispatch_float(act, [&](auto a) { tanh_fwd_t<decltype(a)::value>(out, inp, n); });
}

void tanh_bwd(DType act, void* dinp, const void* out, const void* dout, size_t n) {
  dispatch_float(act, [&](auto a) { tanh_bwd_t<decltype(a)::value>(dinp, out, dout, n); });
}

void first_token_fwd(DType act, void* out, const void* inp, int B, int T, int C) {
  dispatch_float(act, [&](auto a) { first_token_fwd_t<decltype(a)::value>(out, inp, B, T, C); });
}

void first_token_bwd(DType act, void* dinp, const void* dout, int B, int T, int C) {
  dispatch_float(act, [&](auto a) { first_token_bwd_t<decltype(a)::value>(dinp, dout, B, T, C); });
}

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
