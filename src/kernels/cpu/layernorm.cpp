#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

template <DType A>
void layernorm_fwd_t(void* out_, float* mean, float* rstd, const void* inp_, const void* w_, const void* b_,
                     int N, int C, float eps) {
  using S = Storage<A>;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* inp = static_cast<const storage_t<A>*>(inp_);
  const auto* w = static_cast<const storage_t<A>*>(w_);
  const auto* b = static_cast<const storage_t<A>*>(b_);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const auto* x = inp + r * C;
    double s = 0;
    for (int c = 0; c < C; ++c) s += S::load(x[c]);
    const float m = float(s / C);
    double v = 0;
    for (int c = 0; c < C; ++c) {
      const float xc = S::load(x[c]);
      v += double(xc - m) * (xc - m);
    }
    const float rs = float(1.0 / std::sqrt(v / C + double(eps)));
    auto* o = out + r * C;
    for (int c = 0; c < C; ++c) o[c] = S::store((S::load(x[c]) - m) * rs * S::load(w[c]) + S::load(b[c]));
    mean[r] = m;
    rstd[r] = rs;
  }
}

// kSum: the output gradient is dout + dout2, each element rounded to the storage type as residual_fwd
// stores it. kOverwrite: dinp = the input gradient instead of dinp += it. The parameter gradients come
// first: with dinp aliasing dout2, the input pass overwrites dout2 (row by row, each element after it is
// read), so nothing may read dout2 after it.
template <DType A, DType G, bool kSum, bool kOverwrite>
void layernorm_bwd_t(void* dinp_, void* dw_, void* db_, const void* dout_, const void* dout2_,
                     const void* inp_, const void* w_, const float* mean, const float* rstd, int N, int C) {
  using S = Storage<A>;
  using SG = Storage<G>;
  auto* dinp = static_cast<storage_t<A>*>(dinp_);
  auto* dw = static_cast<storage_t<G>*>(dw_);
  auto* db = static_cast<storage_t<G>*>(db_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
  const auto* dout2 = static_cast<const storage_t<A>*>(dout2_);
  const auto* inp = static_cast<const storage_t<A>*>(inp_);
  const auto* w = static_cast<const storage_t<A>*>(w_);
  // Element i of the output gradient (fp32).
  const auto dy = [&](size_t i) {
    if constexpr (kSum)
      return S::load(S::store(S::load(dout[i]) + S::load(dout2[i])));
    else
      return S::load(dout[i]);
  };
  // Parameter gradients: threads split channels and walk rows in order (deterministic sums).
  constexpr int kBlock = 16;
  const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kBlock, c1 = std::min(C, c0 + kBlock);
    float acc_w[kBlock] = {}, acc_b[kBlock] = {};
    for (int64_t r = 0; r < N; ++r) {
      const auto* x = inp + r * C;
      for (int c = c0; c < c1; ++c) {
        const float dc = dy(size_t(r) * C + c);
        acc_w[c - c0] += dc * (S::load(x[c]) - mean[r]) * rstd[r];
        acc_b[c - c0] += dc;
      }
    }
    for (int c = c0; c < c1; ++c) {
      dw[c] = SG::store(SG::load(dw[c]) + acc_w[c - c0]);
      db[c] = SG::store(SG::load(db[c]) + acc_b[c - c0]);
    }
  }
  // Input gradient: rows are independent.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < N; ++r) {
    const auto* x = inp + r * C;
    const size_t row = size_t(r) * C;
    const float m = mean[r], rs = rstd[r];
    double sum_dn = 0, sum_dn_xhat = 0;
    for (int c = 0; c < C; ++c) {
      const float xhat = (S::load(x[c]) - m) * rs;
      const float dn = dy(row + c) * S::load(w[c]);
      sum_dn += dn;
      sum_dn_xhat += double(dn) * xhat;
    }
    const float mean_dn = float(sum_dn / C), mean_dn_xhat = float(sum_dn_xhat / C);
    auto* di = dinp + row;
    for (int c = 0; c < C; ++c) {
      const float xhat = (S::load(x[c]) - m) * rs;
      const float d = (dy(row + c) * S::load(w[c]) - mean_dn - xhat * mean_dn_xhat) * rs;
      if constexpr (kOverwrite)
        di[c] = S::store(d);
      else
        di[c] = S::store(S::load(di[c]) + d);
    }
  }
}

}  // namespace

void layernorm_fwd(DType act, void* out, float* mean, float* rstd, const void* inp, const void* w,
                   const void* b, int N, int C, float eps) {
  dispatch_float(act,
                 [&](auto a) { layernorm_fwd_t<decltype(a)::value>(out, mean, rstd, inp, w, b, N, C, eps); });
}

void layernorm_bwd(DType act, DType grad, void* dinp, void* dw, void* db, const void* dout, const void* inp,
                   const void* w, const float* mean, const float* rstd, int N, int C) {
  dispatch_act_grad(act, grad, [&](auto a, auto g) {
    layernorm_bwd_t<decltype(a)::value, decltype(g)::value, false, false>(dinp, dw, db, dout, nullptr, inp, w,
                                                                          mean, rstd, N, C);
  });
}

void layernorm_bwd_sum(DType act, DType grad, void* dinp, void* dw, void* db, const void* dout,
                       const void* dout2, const void* inp, const void* w, const float* mean,
                       const float* rstd, int N, int C) {
  dispatch_act_grad(act, grad, [&](auto a, auto g) {
    constexpr DType A = decltype(a)::value, G = decltype(g)::value;
    if (dout2)
      layernorm_bwd_t<A, G, true, true>(dinp, dw, db, dout, dout2, inp, w, mean, rstd, N, C);
    else
      layernorm_bwd_t<A, G, false, true>(dinp, dw, db, dout, nullptr, inp, w, mean, rstd, N, C);
  });
}

}  // namespace anvil::cpu
