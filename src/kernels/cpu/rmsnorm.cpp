// RMSNorm (Llama, Qwen2, Mistral), the reference of Ops::rmsnorm_fwd / rmsnorm_bwd. Row sums of squares
// run in fp64 in column order, and dw walks rows in order per channel block: results do not depend on the
// thread count.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

template <DType A>
void rmsnorm_fwd_t(void* out_, float* rstd, const void* inp_, const void* w_, int N, int C, float eps) {
  using S = Storage<A>;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* inp = static_cast<const storage_t<A>*>(inp_);
  const auto* w = static_cast<const storage_t<A>*>(w_);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const auto* x = inp + r * C;
    double ss = 0;
    for (int c = 0; c < C; ++c) {
      const double xc = S::load(x[c]);
      ss += xc * xc;
    }
    const float rs = float(1.0 / std::sqrt(ss / C + double(eps)));
    auto* o = out + r * C;
    // Hugging Face's LlamaRMSNorm: the normalised row goes back to the input dtype before the weight.
    for (int c = 0; c < C; ++c) o[c] = S::store(S::load(S::store(S::load(x[c]) * rs)) * S::load(w[c]));
    if (rstd) rstd[r] = rs;
  }
}

// dw[c] += sum_r dout[r,c] * n[r,c] with n the normalised input as the forward stored it (in the compute
// type: the factor the weight multiplied); dinp[r,c] += rs * (dn - xhat * mean_c(dn * xhat)), dn = dout * w,
// xhat = x * rs (fp32, unrounded: the derivative of the fp32 math).
template <DType A, DType G>
void rmsnorm_bwd_t(void* dinp_, void* dw_, const void* dout_, const void* inp_, const void* w_,
                   const float* rstd, int N, int C) {
  using S = Storage<A>;
  using SG = Storage<G>;
  auto* dinp = static_cast<storage_t<A>*>(dinp_);
  auto* dw = static_cast<storage_t<G>*>(dw_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
  const auto* inp = static_cast<const storage_t<A>*>(inp_);
  const auto* w = static_cast<const storage_t<A>*>(w_);
  // Weight gradient: threads split channels and walk rows in order (deterministic sums), rounded once.
  constexpr int kBlock = 16;
  const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    float acc[kBlock] = {};
    for (int64_t r = 0; r < N; ++r) {
      const auto* x = inp + r * C;
      const auto* dy = dout + r * C;
      for (int c = c0; c < c1; ++c)
        acc[c - c0] += S::load(dy[c]) * S::load(S::store(S::load(x[c]) * rstd[r]));
    }
    for (int c = c0; c < c1; ++c) dw[c] = SG::store(SG::load(dw[c]) + acc[c - c0]);
  }
  // Input gradient: rows are independent.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const auto* x = inp + r * C;
    const auto* dy = dout + r * C;
    const float rs = rstd[r];
    double dot = 0;
    for (int c = 0; c < C; ++c) dot += double(S::load(dy[c]) * S::load(w[c])) * (S::load(x[c]) * rs);
    const float m = float(dot / C);
    auto* di = dinp + r * C;
    for (int c = 0; c < C; ++c) {
      const float d = rs * (S::load(dy[c]) * S::load(w[c]) - S::load(x[c]) * rs * m);
      di[c] = S::store(S::load(di[c]) + d);
    }
  }
}

}  // namespace

void rmsnorm_fwd(DType act, void* out, float* rstd, const void* inp, const void* w, int N, int C, float eps) {
  dispatch_float(act, [&](auto a) { rmsnorm_fwd_t<decltype(a)::value>(out, rstd, inp, w, N, C, eps); });
}

void rmsnorm_bwd(DType act, DType grad, void* dinp, void* dw, const void* dout, const void* inp,
                 const void* w, const float* rstd, int N, int C) {
  dispatch_act_grad(act, grad, [&](auto a, auto g) {
    rmsnorm_bwd_t<decltype(a)::value, decltype(g)::value>(dinp, dw, dout, inp, w, rstd, N, C);
  });
}

}  // namespace anvil::cpu
