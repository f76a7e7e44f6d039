// Adafactor, the CPU reference (transformers.optimization.Adafactor semantics; see AdafactorArgs in
// kernels/ops.hpp). Tensors are updated one after the other in Hugging Face's order of operations: the
// elementwise math is fp32 like PyTorch's, every mean and root mean square is accumulated in fp64 over a
// fixed decomposition (rows, column blocks, or a fixed number of chunks), so the result does not depend
// on the number of threads.
#include <algorithm>
#include <array>
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

float rsqrt(float x) {
  return 1.0f / std::sqrt(x);
}

template <DType G>
void tensor_step(float* param, const void* grad_, float* sq, float* exp_avg, const AdafactorTensor& t,
                 const AdafactorArgs& a) {
  const size_t rows = t.rows, cols = t.cols, n = rows * cols;
  if (n == 0) return;
  float* p = param + t.offset;
  const auto* g = static_cast<const storage_t<G>*>(grad_) + t.offset;
  float* m = a.first_moment ? exp_avg + t.offset : nullptr;
  const float scale = effective_grad_scale(a);
  const auto grad_at = [&](size_t i) { return Storage<G>::load(g[i]) * scale; };

  // HF's _get_lr, with RMS(p) of the parameter before this step.
  const StepValues sv = step_values_for(a);
  float lr = sv.lr[t.group];
  if (a.scale_parameter) {
    const double ss = fixed_order_sum<64>(n, [&](size_t i) { return double(p[i]) * double(p[i]); });
    lr = std::max(a.eps2, float(std::sqrt(ss / double(n)))) * lr;
  }
  const float beta2t = sv.beta2t, one_minus = 1.0f - sv.beta2t, eps1 = a.eps1;

  // The second moment, then u = approx(1 / sqrt(E[g^2])) * g per element (recomputed where needed: no
  // temporary the size of the tensor).
  double sum_u2 = 0;
  float row_mean = 0;  // factored: mean(exp_avg_sq_row), after this step's update
  if (t.factored) {
    float* row = sq + t.row_state;
    float* col = sq + t.col_state;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < int64_t(rows); ++r) {
      double s = 0;
      for (size_t c = 0; c < cols; ++c) {
        const float gv = grad_at(r * cols + c);
        s += double(gv * gv + eps1);
      }
      row[r] = row[r] * beta2t + one_minus * float(s / double(cols));
    }
    constexpr size_t kColBlock = 64;
    const int64_t col_blocks = int64_t((cols + kColBlock - 1) / kColBlock);
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < col_blocks; ++b) {
      const size_t c0 = size_t(b) * kColBlock, c1 = std::min(cols, c0 + kColBlock);
      std::array<double, kColBlock> s{};
      for (size_t r = 0; r < rows; ++r)
        for (size_t c = c0; c < c1; ++c) {
          const float gv = grad_at(r * cols + c);
          s[c - c0] += double(gv * gv + eps1);
        }
      for (size_t c = c0; c < c1; ++c) col[c] = col[c] * beta2t + one_minus * float(s[c - c0] / double(rows));
    }
    row_mean = float(fixed_order_sum<64>(rows, [&](size_t r) { return double(row[r]); }) / double(rows));
    sum_u2 = fixed_order_sum<64>(rows, [&](size_t r) {
      const float rf = rsqrt(row[r] / row_mean);
      double s = 0;
      for (size_t c = 0; c < cols; ++c) {
        const float u = rf * rsqrt(col[c]) * grad_at(r * cols + c);
        s += double(u) * double(u);
      }
      return s;
    });
  } else {
    float* v = sq + t.row_state;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i) {
      const float gv = grad_at(i);
      v[i] = v[i] * beta2t + one_minus * (gv * gv + eps1);
    }
    sum_u2 = fixed_order_sum<64>(n, [&](size_t i) {
      const float u = rsqrt(v[i]) * grad_at(i);
      return double(u) * double(u);
    });
  }

  const float clip = std::max(1.0f, float(std::sqrt(sum_u2 / double(n))) / a.clip_threshold);
  const float decay = -a.weight_decay[t.group] * lr;
  const float beta1 = a.beta1, one_minus_beta1 = 1.0f - a.beta1;
  const auto apply = [&](size_t i, float u) {
    u = u / clip;
    u = u * lr;
    if (m) {
      m[i] = m[i] * beta1 + one_minus_beta1 * u;
      u = m[i];
    }
    float pv = p[i];
    if (decay != 0.0f) pv = pv + pv * decay;
    p[i] = pv - u;
  };
  if (t.factored) {
    const float* row = sq + t.row_state;
    const float* col = sq + t.col_state;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < int64_t(rows); ++r) {
      const float rf = rsqrt(row[r] / row_mean);
      for (size_t c = 0; c < cols; ++c) {
        const size_t i = r * cols + c;
        apply(i, rf * rsqrt(col[c]) * grad_at(i));
      }
    }
  } else {
    const float* v = sq + t.row_state;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i) apply(i, rsqrt(v[i]) * grad_at(i));
  }
}

}  // namespace

void adafactor_step(DType grad_type, float* param, const void* grad, float* sq, float* exp_avg,
                    const AdafactorTensor* tensors, int num_tensors, const AdafactorArgs& a) {
  ANVIL_ASSERT(!a.first_moment || exp_avg, "adafactor: a first moment needs its state");
  dispatch_float(grad_type, [&](auto d) {
    for (int i = 0; i < num_tensors; ++i) {
      ANVIL_ASSERT(tensors[i].group < uint32_t(kMaxParamGroups), "adafactor: tensor {} has group {}", i,
                   tensors[i].group);
      tensor_step<decltype(d)::value>(param, grad, sq, exp_avg, tensors[i], a);
    }
  });
}

}  // namespace anvil::cpu
