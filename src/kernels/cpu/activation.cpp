#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoef = 0.044715f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// The elementwise ops in fp32 over the activation storage type: out[i] = f(a[i]), or f(a[i], b[i]) (out may
// alias an input: each element is read before it is written).
template <class F>
void map1(DType act, void* out_, const void* a_, size_t n, F f) {
  dispatch_float(act, [&](auto tag) {
    using S = Storage<decltype(tag)::value>;
    auto* out = static_cast<typename S::type*>(out_);
    const auto* a = static_cast<const typename S::type*>(a_);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i) out[i] = S::store(f(S::load(a[i])));
  });
}

template <class F>
void map2(DType act, void* out_, const void* a_, const void* b_, size_t n, F f) {
  dispatch_float(act, [&](auto tag) {
    using S = Storage<decltype(tag)::value>;
    auto* out = static_cast<typename S::type*>(out_);
    const auto* a = static_cast<const typename S::type*>(a_);
    const auto* b = static_cast<const typename S::type*>(b_);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i) out[i] = S::store(f(S::load(a[i]), S::load(b[i])));
  });
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
  map1(act, out, inp, n, [](float x) { return 0.5f * x * (1.0f + std::erf(x * kInvSqrt2)); });
}

// d/dx [x Phi(x)] = Phi(x) + x phi(x), with Phi the standard normal CDF and phi its density.
void gelu_erf_bwd(DType act, void* dinp, const void* inp, const void* dout, size_t n) {
  map2(act, dinp, inp, dout, n, [](float x, float d) {
    const float cdf = 0.5f * (1.0f + std::erf(x * kInvSqrt2));
    const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x * x);
    return d * (cdf + x * pdf);
  });
}

void tanh_fwd(DType act, void* out, const void* inp, size_t n) {
  map1(act, out, inp, n, [](float x) { return std::tanh(x); });
}

void tanh_bwd(DType act, void* dinp, const void* out, const void* dout, size_t n) {
  map2(act, dinp, out, dout, n, [](float y, float d) { return d * (1.0f - y * y); });
}

void first_token_fwd(DType act, void* out, const void* inp, int B, int T, int C) {
  dispatch_float(act, [&](auto a) { first_token_fwd_t<decltype(a)::value>(out, inp, B, T, C); });
}

void first_token_bwd(DType act, void* dinp, const void* dout, int B, int T, int C) {
  dispatch_float(act, [&](auto a) { first_token_bwd_t<decltype(a)::value>(dinp, dout, B, T, C); });
}

void gelu_fwd(DType act, void* out, const void* inp, size_t n) {
  map1(act, out, inp, n,
       [](float x) { return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kGeluCoef * x * x * x))); });
}

void gelu_bwd(DType act, void* dinp, const void* inp, const void* dout, size_t n) {
  map2(act, dinp, inp, dout, n, [](float x, float d) {
    const float th = std::tanh(kSqrt2OverPi * (x + kGeluCoef * x * x * x));
    const float dth = (1.0f - th * th) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoef * x * x);
    return d * (0.5f * (1.0f + th) + 0.5f * x * dth);
  });
}

void residual_fwd(DType act, void* out, const void* a, const void* b, size_t n) {
  map2(act, out, a, b, n, [](float x, float y) { return x + y; });
}

// SwiGLU over rows of [gate | up]: silu(g) = g / (1 + exp(-g)), which saturates cleanly (exp overflowing to
// inf gives -0, not NaN).
void swiglu_fwd(DType act, void* out_, const void* inp_, int N, int I) {
  dispatch_float(act, [&](auto tag) {
    using S = Storage<decltype(tag)::value>;
    auto* out = static_cast<typename S::type*>(out_);
    const auto* inp = static_cast<const typename S::type*>(inp_);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      const auto* gate = inp + r * 2 * I;
      const auto* up = gate + I;
      auto* o = out + r * I;
      for (int j = 0; j < I; ++j) {
        const float g = S::load(gate[j]);
        o[j] = S::store(g / (1.0f + std::exp(-g)) * S::load(up[j]));
      }
    }
  });
}

void swiglu_bwd(DType act, void* dinp_, const void* inp_, const void* dout_, int N, int I) {
  dispatch_float(act, [&](auto tag) {
    using S = Storage<decltype(tag)::value>;
    auto* dinp = static_cast<typename S::type*>(dinp_);
    const auto* inp = static_cast<const typename S::type*>(inp_);
    const auto* dout = static_cast<const typename S::type*>(dout_);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      const auto* gate = inp + r * 2 * I;
      const auto* up = gate + I;
      const auto* dy = dout + r * I;
      auto* dgate = dinp + r * 2 * I;
      auto* dup = dgate + I;
      for (int j = 0; j < I; ++j) {
        const float g = S::load(gate[j]), d = S::load(dy[j]);
        const float den = 1.0f + std::exp(-g);
        const float sig = 1.0f / den, silu = g / den;
        dgate[j] = S::store(d * S::load(up[j]) * (sig * (1.0f + g * (1.0f - sig))));
        dup[j] = S::store(d * silu);
      }
    }
  });
}

namespace {
// y[i] = x[i] kept (scaled) or 0 by the mask bit of element index index_of(i).
template <class IndexOf>
void dropout_indexed(DType act, void* y_, const void* x_, size_t n, float p, const DropoutState* state,
                     uint32_t site, IndexOf index_of) {
  const uint64_t key = dropout_key(state->seed, state->micro, site);
  const uint32_t threshold = dropout_threshold(p);
  const float scale = dropout_scale(p);
  dispatch_float(act, [&](auto tag) {
    using S = Storage<decltype(tag)::value>;
    auto* y = static_cast<typename S::type*>(y_);
    const auto* x = static_cast<const typename S::type*>(x_);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i)
      y[i] = S::store(dropout_keep(key, index_of(uint64_t(i)), threshold) ? S::load(x[i]) * scale : 0.0f);
  });
}
}  // namespace

void dropout(DType act, void* y, const void* x, size_t n, float p, const DropoutState* state, uint32_t site) {
  dropout_indexed(act, y, x, n, p, state, site, [](uint64_t i) { return i; });
}

void dropout_rows(DType act, void* y, const void* x, int rows, int cols, size_t index_pitch, float p,
                  const DropoutState* state, uint32_t site) {
  const uint64_t c = uint64_t(cols);
  dropout_indexed(act, y, x, size_t(rows) * cols, p, state, site,
                  [=](uint64_t i) { return (i / c) * index_pitch + i % c; });
}

}  // namespace anvil::cpu
