// GEMMs through OpenBLAS sgemm. fp32 operands go to BLAS directly. 16-bit operands are widened into fp32
// scratch, in chunks of rows so the scratch stays small even for the vocabulary projection; results are
// computed in fp32 and rounded once into storage (gradients: read, accumulate in fp32, round once).
#include <cblas.h>

#include <algorithm>

#include "kernels/cpu/cpu_kernels.hpp"

namespace anvil::cpu {
namespace {

// x[0..n) as fp32: x itself for fp32 storage, else widened into the calling thread's scratch `slot`.
template <DType D>
const float* widened(const storage_t<D>* x, size_t n, ScratchSlot slot) {
  if constexpr (D == DType::F32) {
    return x;
  } else {
    float* f = thread_scratch<float>(slot, n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i) f[i] = Storage<D>::load(x[i]);
    return f;
  }
}

// An fp32 copy of x[0..n) to accumulate into (x itself for fp32 storage).
template <DType D>
float* widened_mut(storage_t<D>* x, size_t n, ScratchSlot slot) {
  return const_cast<float*>(widened<D>(x, n, slot));
}

// Where an fp32 result for x[0..n) is computed: x itself for fp32 storage, else the scratch `slot`.
template <DType D>
float* result_buffer(storage_t<D>* x, size_t n, ScratchSlot slot) {
  if constexpr (D == DType::F32)
    return x;
  else
    return thread_scratch<float>(slot, n);
}

// Rounds acc[0..n) into x (nothing to do when x is fp32: acc is x).
template <DType D>
void narrow_into(storage_t<D>* x, const float* acc, size_t n) {
  if constexpr (D != DType::F32) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < int64_t(n); ++i) x[i] = Storage<D>::store(acc[i]);
  }
}

// Rows per chunk: everything at once for fp32 (no scratch, one BLAS call), else about 4M floats of widened
// rows per buffer.
template <DType D>
int chunk_rows(int N, int width) {
  if constexpr (D == DType::F32) return std::max(N, 1);
  constexpr int64_t kChunkFloats = int64_t(1) << 22;
  return int(std::clamp<int64_t>(kChunkFloats / std::max(width, 1), 1, std::max(N, 1)));
}

template <DType A>
void matmul_fwd_t(void* out_, const void* inp_, const void* w_, const void* bias_, int N, int K, int OC) {
  using S = Storage<A>;
  auto* out = static_cast<storage_t<A>*>(out_);
  const auto* inp = static_cast<const storage_t<A>*>(inp_);
  const auto* bias = static_cast<const storage_t<A>*>(bias_);
  const float* w = widened<A>(static_cast<const storage_t<A>*>(w_), size_t(OC) * K, kScratchA);
  const int R = chunk_rows<A>(N, std::max(K, OC));
  for (int r0 = 0; r0 < N; r0 += R) {
    const int rows = std::min(R, N - r0);
    const float* x = widened<A>(inp + int64_t(r0) * K, size_t(rows) * K, kScratchB);
    float* o = result_buffer<A>(out + int64_t(r0) * OC, size_t(rows) * OC, kScratchC);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, OC, K, 1.0f, x, K, w, K, 0.0f, o, OC);
    // Epilogue: bias added in fp32, one rounding into storage (nothing left to do for fp32 without bias).
    if (A == DType::F32 && !bias) continue;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      auto* dst = out + (r0 + r) * OC;
      for (int c = 0; c < OC; ++c) {
        float v = o[r * OC + c];
        if (bias) v += S::load(bias[c]);
        dst[c] = S::store(v);
      }
    }
  }
}

template <DType A, DType G>
void matmul_bwd_t(void* dinp_, void* dw_, void* dbias_, const void* dout_, const void* inp_, const void* w_,
                  int N, int K, int OC, bool dw_overwrite) {
  auto* dinp = static_cast<storage_t<A>*>(dinp_);
  auto* dw = static_cast<storage_t<G>*>(dw_);
  auto* dbias = static_cast<storage_t<G>*>(dbias_);
  const auto* dout = static_cast<const storage_t<A>*>(dout_);
  const auto* inp = static_cast<const storage_t<A>*>(inp_);
  const float* w =
      dinp ? widened<A>(static_cast<const storage_t<A>*>(w_), size_t(OC) * K, kScratchA) : nullptr;
  float* dw_acc = dw ? widened_mut<G>(dw, size_t(OC) * K, kScratchB) : nullptr;
  const int R = chunk_rows<A>(N, std::max(K, OC));
  for (int r0 = 0; r0 < N; r0 += R) {
    const int rows = std::min(R, N - r0);
    const float* d = widened<A>(dout + int64_t(r0) * OC, size_t(rows) * OC, kScratchC);
    if (dinp) {
      float* di = result_buffer<A>(dinp + int64_t(r0) * K, size_t(rows) * K, kScratchD);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, K, OC, 1.0f, d, OC, w, K, 0.0f, di, K);
      narrow_into<A>(dinp + int64_t(r0) * K, di, size_t(rows) * K);
    }
    if (!dw) continue;
    const float* x = widened<A>(inp + int64_t(r0) * K, size_t(rows) * K, kScratchE);
    // beta 0: BLAS does not read C, so whatever dw held (garbage when it was not zeroed) is not used.
    const float beta = dw_overwrite && r0 == 0 ? 0.0f : 1.0f;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, K, rows, 1.0f, d, OC, x, K, beta, dw_acc, K);
  }
  if (dw) narrow_into<G>(dw, dw_acc, size_t(OC) * K);
  if (!dbias) return;
  constexpr int kBlock = 32;
  const int nblocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int o0 = blk * kBlock, o1 = std::min(OC, o0 + kBlock);
    float acc[kBlock] = {};
    for (int64_t r = 0; r < N; ++r)
      for (int o = o0; o < o1; ++o) acc[o - o0] += Storage<A>::load(dout[r * OC + o]);
    for (int o = o0; o < o1; ++o) dbias[o] = Storage<G>::store(Storage<G>::load(dbias[o]) + acc[o - o0]);
  }
}

// The [rows, cols] matrix at x with row stride ld (elements) as contiguous fp32 (x itself when it is fp32
// and contiguous), in the calling thread's scratch `slot`.
template <DType D>
const float* widened_strided(const storage_t<D>* x, int rows, int cols, int64_t ld, ScratchSlot slot) {
  if constexpr (D == DType::F32)
    if (ld == cols) return x;
  float* f = thread_scratch<float>(slot, size_t(rows) * cols);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) f[r * cols + c] = Storage<D>::load(x[r * ld + c]);
  return f;
}

template <DType A, DType CT>
void gemm_t(const GemmSpec& g) {
  const int a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  const float* a = widened_strided<A>(static_cast<const storage_t<A>*>(g.a), a_rows, a_cols,
                                      g.lda ? g.lda : a_cols, kScratchA);
  const float* b = widened_strided<A>(static_cast<const storage_t<A>*>(g.b), b_rows, b_cols,
                                      g.ldb ? g.ldb : b_cols, kScratchB);
  auto* c = static_cast<storage_t<CT>*>(g.c);
  const int64_t ldc = g.ldc ? g.ldc : g.n;
  const auto ta = g.trans_a ? CblasTrans : CblasNoTrans, tb = g.trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (CT == DType::F32) {
    cblas_sgemm(CblasRowMajor, ta, tb, g.m, g.n, g.k, g.alpha, a, a_cols, b, b_cols, g.beta, c, int(ldc));
  } else {
    // C widened (when beta reads it), computed in fp32, rounded once into storage.
    float* acc = thread_scratch<float>(kScratchC, size_t(g.m) * g.n);
    if (g.beta != 0.0f) {
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < g.m; ++r)
        for (int col = 0; col < g.n; ++col) acc[r * g.n + col] = Storage<CT>::load(c[r * ldc + col]);
    }
    cblas_sgemm(CblasRowMajor, ta, tb, g.m, g.n, g.k, g.alpha, a, a_cols, b, b_cols, g.beta, acc, g.n);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < g.m; ++r)
      for (int col = 0; col < g.n; ++col) c[r * ldc + col] = Storage<CT>::store(acc[r * g.n + col]);
  }
}

}  // namespace

void gemm(DType act, DType grad, const GemmSpec& g) {
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0 && g.beta == 1.0f) return;
  dispatch_float(act, [&](auto a) {
    constexpr DType A = decltype(a)::value;
    if (!g.c_grad || grad == A)
      gemm_t<A, A>(g);
    else
      gemm_t<A, DType::F32>(g);
  });
}

void matmul_fwd(DType act, void* out, const void* inp, const void* w, const void* bias, int N, int K,
                int OC) {
  dispatch_float(act, [&](auto a) { matmul_fwd_t<decltype(a)::value>(out, inp, w, bias, N, K, OC); });
}

void matmul_bwd(DType act, DType grad, void* dinp, void* dw, void* dbias, const void* dout, const void* inp,
                const void* w, int N, int K, int OC, bool dw_overwrite) {
  dispatch_act_grad(act, grad, [&](auto a, auto g) {
    matmul_bwd_t<decltype(a)::value, decltype(g)::value>(dinp, dw, dbias, dout, inp, w, N, K, OC,
                                                         dw_overwrite);
  });
}

}  // namespace anvil::cpu
