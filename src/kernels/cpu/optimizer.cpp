// Fused AdamW and SGD over the ranges of a parameter-group table (the CPU reference: a fixed order).
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

// Calls f(begin, end, group, state_begin) for every range of the table that is not skipped.
template <class F>
void for_each_range(const ParamGroupTable& t, size_t n, F&& f) {
  for (int r = 0; r < t.count; ++r) {
    const size_t begin = t.begins[r], end = r + 1 < t.count ? size_t(t.begins[r + 1]) : n;
    if (t.groups[r] == kSkipGroup || end <= begin) continue;
    f(begin, end, int(t.groups[r]), t.state_begins ? size_t(t.state_begins[r]) : begin);
  }
}

// The stream of rounding bits for the second moment (the first uses the seed itself).
constexpr uint64_t kSecondMomentStream = 0x5bd1e9955bd1e995ull;

template <DType G, bool kBf16Moments>
void adamw_fused_t(float* param, const void* grad_, void* m_, void* v_, size_t n, const ParamGroupTable& t,
                   const FusedAdamWArgs& a) {
  const auto* grad = static_cast<const storage_t<G>*>(grad_);
  const StepValues sv = step_values_for(a);
  const double bc1 = sv.bias1;
  const float bc2_sqrt = float(std::sqrt(sv.bias2));
  const uint64_t seed = sv.moment_seed;
  const float grad_scale = effective_grad_scale(a);
  const float beta1 = a.beta1, beta2 = a.beta2, eps = a.eps;
  for_each_range(t, n, [&](size_t begin, size_t end, int g, size_t state_begin) {
    // PyTorch's arithmetic, with the group's lr and weight decay.
    const float step_size = float(sv.lr[g] / bc1);
    const float decay = 1.0f - sv.lr[g] * a.weight_decay[g];
    if constexpr (!kBf16Moments) {
      // fp32 moments: the same arithmetic over restrict pointers and local constants, so that the compiler
      // vectorises it (the offloaded optimizer's update of a whole model runs here).
      float* __restrict p = param + begin;
      const storage_t<G>* __restrict gp = grad + begin;
      float* __restrict m = static_cast<float*>(m_) + state_begin;
      float* __restrict v = static_cast<float*>(v_) + state_begin;
      const int64_t count = int64_t(end - begin);
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < count; ++i) {
        const float gr = Storage<G>::load(gp[i]) * grad_scale;
        const float mi = beta1 * m[i] + (1.0f - beta1) * gr;
        const float vi = beta2 * v[i] + (1.0f - beta2) * gr * gr;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
      }
      return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = int64_t(begin); i < int64_t(end); ++i) {
      const size_t s = state_begin + size_t(i) - begin;
      const float gr = Storage<G>::load(grad[i]) * grad_scale;
      float mi, vi;
      if constexpr (kBf16Moments) {
        auto* m = static_cast<uint16_t*>(m_);
        auto* v = static_cast<uint16_t*>(v_);
        mi = a.beta1 * bf16_to_float(m[s]) + (1.0f - a.beta1) * gr;
        vi = a.beta2 * bf16_to_float(v[s]) + (1.0f - a.beta2) * gr * gr;
        m[s] = float_to_bf16_stochastic(mi, rounding_bits(seed, sv.moment_index_base + s));
        v[s] =
            float_to_bf16_stochastic(vi, rounding_bits(seed ^ kSecondMomentStream, sv.moment_index_base + s));
      } else {
        auto* m = static_cast<float*>(m_);
        auto* v = static_cast<float*>(v_);
        mi = a.beta1 * m[s] + (1.0f - a.beta1) * gr;
        vi = a.beta2 * v[s] + (1.0f - a.beta2) * gr * gr;
        m[s] = mi;
        v[s] = vi;
      }
      param[i] = param[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + a.eps);
    }
  });
}

template <DType G>
void sgd_t(float* param, const void* grad_, float* buf, size_t n, const ParamGroupTable& t,
           const SgdArgs& a) {
  const auto* grad = static_cast<const storage_t<G>*>(grad_);
  const float grad_scale = effective_grad_scale(a);
  const StepValues sv = step_values_for(a);
  const bool first_step = sv.step == 1;
  for_each_range(t, n, [&](size_t begin, size_t end, int g, size_t state_begin) {
    const float lr = sv.lr[g], wd = a.weight_decay[g];
#pragma omp parallel for schedule(static)
    for (int64_t i = int64_t(begin); i < int64_t(end); ++i) {
      float d = Storage<G>::load(grad[i]) * grad_scale;
      if (wd != 0.0f) d += wd * param[i];
      if (a.momentum != 0.0f) {
        const size_t s = state_begin + size_t(i) - begin;
        const float b = first_step ? d : a.momentum * buf[s] + (1.0f - a.dampening) * d;
        buf[s] = b;
        d = a.nesterov ? d + a.momentum * b : b;
      }
      param[i] -= lr * d;
    }
  });
}

}  // namespace

void adamw_fused_step(DType grad_type, float* param, const void* grad, void* m, void* v, DType moment_dtype,
                      size_t n, const ParamGroupTable& t, const FusedAdamWArgs& a) {
  ANVIL_REQUIRE(moment_dtype == DType::F32 || moment_dtype == DType::BF16,
                "AdamW moments must be F32 or BF16, got {}", dtype_name(moment_dtype));
  ANVIL_REQUIRE(moment_dtype == DType::F32 || a.rounding_seed != 0 || a.step_values,
                "AdamW with bf16 moments needs a nonzero rounding seed");
  dispatch_float(grad_type, [&](auto g) {
    if (moment_dtype == DType::BF16)
      adamw_fused_t<decltype(g)::value, true>(param, grad, m, v, n, t, a);
    else
      adamw_fused_t<decltype(g)::value, false>(param, grad, m, v, n, t, a);
  });
}

void sgd_step(DType grad_type, float* param, const void* grad, float* momentum_buf, size_t n,
              const ParamGroupTable& t, const SgdArgs& a) {
  ANVIL_REQUIRE(a.momentum == 0.0f || momentum_buf, "sgd with momentum needs a momentum buffer");
  dispatch_float(grad_type, [&](auto g) { sgd_t<decltype(g)::value>(param, grad, momentum_buf, n, t, a); });
}

}  // namespace anvil::cpu
