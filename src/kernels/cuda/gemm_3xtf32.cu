// 3xTF32: fp32 GEMMs on the TF32 tensor cores at about fp32 accuracy (split_gemm_plan.hpp).
//
// Every operand x is written to the split scratch as big = tf32(x) and small = tf32(x - big), both rounded to
// nearest (so the tensor cores read them exactly, whatever their own conversion does), laid out along K:
//   2 pieces: A = [A_b | A_s], B = [B_s ; B_b]. One GEMM over 2K gives A_b B_s + A_s B_b (with beta C and the
//             bias), a second over K, reading A_b and B_b in place through row strides, adds A_b B_b.
//   3 pieces: A = [A_b | A_b | A_s], B = [B_b ; B_s ; B_b]: one GEMM over 3K, for epilogues (GELU) that
//             must see the whole sum.
// "Along K" is along the stored columns of a row-major operand whose rows run over M (or N), and along its
// stored rows when it is stored transposed.
#include <cstdint>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

// Round to nearest even at TF32's 10 mantissa bits; a value that would round up to infinity is truncated.
__device__ __forceinline__ float round_to_tf32(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf, nan
  uint32_t r = (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
  if ((r & 0x7f800000u) == 0x7f800000u) r = u & 0xffffe000u;
  return __uint_as_float(r);
}

// dst (per batch: pieces x rows x cols, contiguous) from src [rows, cols] with row stride `ld`. Piece p is
// the small part where bit p of small_mask is set, the big part otherwise. V floats per thread (V = 4 when
// every row start is 16-byte aligned and cols % 4 == 0): the kernel is bound by memory bandwidth.
template <int V>
__global__ void split_tf32_kernel(float* __restrict__ dst, const float* __restrict__ src, int rows, int cols,
                                  int64_t ld, int64_t src_batch_stride, int batches, bool along_cols,
                                  int pieces, unsigned small_mask) {
  using Vec = std::conditional_t<V == 4, float4, float>;
  const int vcols = cols / V;
  const int64_t row_count = int64_t(rows) * batches;
  const int64_t dst_batch = int64_t(pieces) * rows * cols;
  for (int64_t rb = blockIdx.y; rb < row_count; rb += gridDim.y) {
    const int64_t b = rb / rows;
    const int r = int(rb - b * rows);
    const Vec* s = reinterpret_cast<const Vec*>(src + b * src_batch_stride + int64_t(r) * ld);
    float* d = dst + b * dst_batch;
    // Piece p of this row starts at row_at + p * piece_step (in floats).
    const int64_t row_at = along_cols ? int64_t(r) * pieces * cols : int64_t(r) * cols;
    const int64_t piece_step = along_cols ? int64_t(cols) : int64_t(rows) * cols;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < vcols; c += gridDim.x * blockDim.x) {
      Vec x = s[c], big, small;
      const float* xs = reinterpret_cast<const float*>(&x);
      float* bs = reinterpret_cast<float*>(&big);
      float* ss = reinterpret_cast<float*>(&small);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        bs[i] = round_to_tf32(xs[i]);
        ss[i] = isfinite(xs[i]) ? round_to_tf32(xs[i] - bs[i]) : 0.f;
      }
      for (int p = 0; p < pieces; ++p)
        reinterpret_cast<Vec*>(d + row_at + p * piece_step)[c] = (small_mask >> p) & 1u ? small : big;
    }
  }
}

void split_tf32(cudaStream_t stream, float* dst, const float* src, int rows, int cols, int64_t ld,
                int64_t src_batch_stride, int batches, bool along_cols, int pieces, unsigned small_mask) {
  // float4 when every source row and every destination piece row starts 16-byte aligned.
  const bool vec4 = cols % 4 == 0 && ld % 4 == 0 && (batches == 1 || src_batch_stride % 4 == 0) &&
                    reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
  const int vcols = vec4 ? cols / 4 : cols;
  const int threads = vcols >= 256 ? 256 : ((vcols + 31) / 32) * 32;
  const int64_t row_count = int64_t(rows) * batches;
  const dim3 grid((vcols + threads - 1) / threads, unsigned(row_count < 65535 ? row_count : 65535));
  if (vec4)
    split_tf32_kernel<4><<<grid, threads, 0, stream>>>(dst, src, rows, cols, ld, src_batch_stride, batches,
                                                       along_cols, pieces, small_mask);
  else
    split_tf32_kernel<1><<<grid, threads, 0, stream>>>(dst, src, rows, cols, ld, src_batch_stride, batches,
                                                       along_cols, pieces, small_mask);
  ANVIL_CUDA_CHECK_LAST();
}

// Splits the block [outer0, outer0 + outer_n) x [k0, k0 + kc) of an operand whose rows (op(A)'s M, op(B)'s
// N) and inner dimension K are stored as [outer, K] (`k_along_cols`) or [K, outer], row stride `ld` (0:
// contiguous), into its pieces laid out along K.
void split_operand_block(cudaStream_t stream, float* dst, const float* src, bool k_along_cols, int outer,
                         int outer0, int outer_n, int k, int k0, int kc, int64_t ld, int64_t batch_stride,
                         int batches, int pieces, unsigned small_mask) {
  if (k_along_cols) {
    const int64_t row = ld ? ld : k;
    split_tf32(stream, dst, src + int64_t(outer0) * row + k0, outer_n, kc, row, batch_stride, batches, true,
               pieces, small_mask);
  } else {
    const int64_t row = ld ? ld : outer;
    split_tf32(stream, dst, src + int64_t(k0) * row + outer0, kc, outer_n, row, batch_stride, batches, false,
               pieces, small_mask);
  }
}

size_t elem_bytes(anvil::DType t) {
  return anvil::dtype_bits(t) / 8;
}

int64_t round_up(int64_t v, int64_t to) {
  return (v + to - 1) / to * to;
}

}  // namespace

void Gemm::run_3xtf32(cudaStream_t stream, const GemmArgs& g) {
  if (g.k <= 0) detail::raise_at(__FILE__, __LINE__, "3xTF32 GEMM with an empty inner dimension");
  if (!split_scratch_)
    detail::raise_at(__FILE__, __LINE__,
                     "3xTF32 GEMM without a split scratch buffer (the Gemm was built without one)");
  const bool whole_sum = g.gelu != GemmArgs::kNoGelu;
  const SplitGemmChunks c = plan_split_gemm(g.m, g.n, g.k, g.batch, whole_sum, split_scratch_floats_);
  if (!c.fits())
    detail::raise_at(__FILE__, __LINE__,
                     "3xTF32 GEMM M=" + std::to_string(g.m) + " N=" + std::to_string(g.n) +
                         " K=" + std::to_string(g.k) + " does not fit its split scratch of " +
                         std::to_string(split_scratch_floats_ * sizeof(float)) + " bytes in any chunking");
  if (c.mc == g.m && c.nc == g.n && c.kc == g.k) {
    for (int b0 = 0; b0 < g.batch; b0 += c.nb)
      run_3xtf32_chunk(stream, g, c, b0, std::min(c.nb, g.batch - b0), 0, g.m, 0, g.n, 0, g.k);
    return;
  }
  for (int b = 0; b < g.batch; ++b)
    for (int n0 = 0; n0 < g.n; n0 += c.nc)
      for (int m0 = 0; m0 < g.m; m0 += c.mc)
        for (int k0 = 0; k0 < g.k; k0 += c.kc)
          run_3xtf32_chunk(stream, g, c, b, 1, m0, std::min(c.mc, g.m - m0), n0, std::min(c.nc, g.n - n0), k0,
                           std::min(c.kc, g.k - k0));
}

void Gemm::run_3xtf32_chunk(cudaStream_t stream, const GemmArgs& g, const SplitGemmChunks& c, int b0, int nb,
                            int m0, int mc, int n0, int nc, int k0, int kc) {
  const int P = c.pieces;
  const unsigned a_small = P == 2 ? 0b10u : 0b100u;  // [A_b | A_s] or [A_b | A_b | A_s]
  const unsigned b_small = P == 2 ? 0b01u : 0b010u;  // [B_s ; B_b] or [B_b ; B_s ; B_b]
  const int64_t a_piece_batch = int64_t(P) * mc * kc, b_piece_batch = int64_t(P) * kc * nc;
  float* As = split_scratch_;
  float* Bs = As + round_up(a_piece_batch * nb, 64);

  split_operand_block(stream, As, static_cast<const float*>(g.a) + int64_t(b0) * g.stride_a, !g.trans_a, g.m,
                      m0, mc, g.k, k0, kc, g.lda, g.stride_a, nb, P, a_small);
  split_operand_block(stream, Bs, static_cast<const float*>(g.b) + int64_t(b0) * g.stride_b, g.trans_b, g.n,
                      n0, nc, g.k, k0, kc, g.ldb, g.stride_b, nb, P, b_small);

  const size_t cb = elem_bytes(g.c_type);
  const int64_t ldc = g.ldc ? g.ldc : g.n;
  GemmArgs s;
  s.ab_type = anvil::DType::F32;
  s.c_type = g.c_type;
  s.trans_a = g.trans_a;
  s.trans_b = g.trans_b;
  s.m = mc;
  s.n = nc;
  s.c = static_cast<char*>(g.c) + cb * size_t(int64_t(b0) * g.stride_c + int64_t(m0) * ldc + n0);
  s.ldc = ldc == nc ? 0 : ldc;
  s.batch = nb;
  s.stride_a = a_piece_batch;
  s.stride_b = b_piece_batch;
  s.stride_c = g.stride_c;
  s.alpha = g.alpha;
  // Only the first K chunk scales C and adds the bias; the later ones accumulate.
  s.beta = k0 == 0 ? g.beta : 1.f;
  s.bias = k0 == 0 && g.bias ? static_cast<const char*>(g.bias) + cb * size_t(n0) : nullptr;
  // The pieces are contiguous: every stored row is P*kc (along K) or the block's width wide.
  s.a = As;
  s.b = Bs;
  s.k = P * kc;
  if (P == 3) {  // the whole sum in one GEMM, with the epilogue
    s.gelu = g.gelu;
    s.aux = g.aux ? static_cast<char*>(g.aux) + cb * size_t(int64_t(m0) * g.n + n0) : nullptr;
  }
  run_plain(stream, s, true);  // 2 pieces: the small terms (with beta C and the bias)
  if (P == 3) return;
  // A_b B_b: A_b is piece 0 of A, B_b piece 1 of B, read in place.
  s.k = kc;
  s.beta = 1.f;
  s.bias = nullptr;
  s.lda = g.trans_a ? 0 : 2 * int64_t(kc);
  if (g.trans_b) {
    s.b = Bs + kc;
    s.ldb = 2 * int64_t(kc);
  } else {
    s.b = Bs + int64_t(kc) * nc;
    s.ldb = 0;
  }
  run_plain(stream, s, true);
}

}  // namespace anvil::cuda
