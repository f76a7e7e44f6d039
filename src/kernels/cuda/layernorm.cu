// LayerNorm over the last dimension: one warp per row for the row-wise work, and a tiled column
// reduction for the parameter gradients.
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "kernels/dropout.hpp"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kThreads = kRowsPerBlock * kWarpSize;

// Row access in 16-byte vectors when the row is a whole number of them (and the buffers are aligned), else
// element by element: Row<T, kVec>::for_each calls f(c, values[k]) for the row's elements in lane order.
template <class T, bool kVec>
struct Row {
  static constexpr int kN = kVec ? Vec16<T>::kN : 1;
  // Loads element group i (kN elements starting at i * kN) of row r into f.
  __device__ static void load(const T* row, int i, float (&f)[kN]) {
    if constexpr (kVec) {
      const Vec16<T> v = reinterpret_cast<const Vec16<T>*>(row)[i];
#pragma unroll
      for (int k = 0; k < kN; ++k) f[k] = to_float(v.v[k]);
    } else {
      f[0] = to_float(row[i]);
    }
  }
  __device__ static void store(T* row, int i, const float (&f)[kN]) {
    if constexpr (kVec) {
      Vec16<T> v;
#pragma unroll
      for (int k = 0; k < kN; ++k) v.v[k] = from_float<T>(f[k]);
      reinterpret_cast<Vec16<T>*>(row)[i] = v;
    } else {
      row[i] = from_float<T>(f[0]);
    }
  }
};

// The rest of a row's LayerNorm once its sum is known (this warp's lanes hold partial sums): the centred
// variance (a second pass, for accuracy), then the normalised output, reading the row x back from L1/L2.
template <class T, bool kVec>
__device__ void layernorm_row(T* y, float* mean, float* rstd, const T* x, const T* w, const T* b, int row,
                              int lane, int C, float eps, float partial_sum) {
  using R = Row<T, kVec>;
  constexpr int kN = R::kN;
  const int groups = C / kN;
  const float mu = warp_sum(partial_sum) / C;
  float f[kN];
  float sq = 0.f;
  for (int i = lane; i < groups; i += kWarpSize) {
    R::load(x, i, f);
#pragma unroll
    for (int k = 0; k < kN; ++k) sq += (f[k] - mu) * (f[k] - mu);
  }
  const float rs = rsqrtf(warp_sum(sq) / C + eps);
  float fw[kN], fb[kN];
  for (int i = lane; i < groups; i += kWarpSize) {
    R::load(x, i, f);
    R::load(w, i, fw);
    R::load(b, i, fb);
#pragma unroll
    for (int k = 0; k < kN; ++k) f[k] = (f[k] - mu) * rs * fw[k] + fb[k];
    R::store(y, i, f);
  }
  if (lane == 0) {
    if (mean) mean[row] = mu;
    if (rstd) rstd[row] = rs;
  }
}

// One warp per row: the sum pass, then layernorm_row.
template <class T, bool kVec>
__global__ void layernorm_fwd_kernel(T* out, float* mean, float* rstd, const T* inp, const T* w, const T* b,
                                     int N, int C, float eps) {
  using R = Row<T, kVec>;
  constexpr int kN = R::kN;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // whole warps exit together
  const size_t offset = static_cast<size_t>(row) * C;
  float f[kN];
  float sum = 0.f;
  for (int i = lane; i < C / kN; i += kWarpSize) {
    R::load(inp + offset, i, f);
#pragma unroll
    for (int k = 0; k < kN; ++k) sum += f[k];
  }
  layernorm_row<T, kVec>(out + offset, mean, rstd, inp + offset, w, b, row, lane, C, eps, sum);
}

// out = a + b (rounded to T, as residual_fwd stores it) in the sum pass, then layernorm_row over out, which
// this warp has just written (read back from L1/L2, not DRAM). kDrop: a goes through dropout first, rounded
// to T as Ops::dropout stores it (one correctly rounded multiply by `scale`), element (row, c) drawing the
// mask of index row * index_pitch + c.
template <class T, bool kVec, bool kDrop>
__global__ void residual_layernorm_fwd_kernel(T* out, T* ln, float* mean, float* rstd, const T* a, const T* b,
                                              const T* w, const T* bias, int N, int C, float eps,
                                              uint32_t threshold, float scale,
                                              const anvil::DropoutState* state, uint32_t site,
                                              size_t index_pitch) {
  using R = Row<T, kVec>;
  constexpr int kN = R::kN;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;  // whole warps exit together
  const size_t offset = static_cast<size_t>(row) * C;
  uint64_t key = 0;
  if constexpr (kDrop) key = anvil::dropout_key(state->seed, state->micro, site);
  float f[kN], fb[kN];
  float sum = 0.f;
  for (int i = lane; i < C / kN; i += kWarpSize) {
    R::load(a + offset, i, f);
    R::load(b + offset, i, fb);
    if constexpr (kDrop) {
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        const size_t index = row * index_pitch + size_t(i) * kN + k;
        f[k] = anvil::dropout_keep(key, index, threshold) ? to_float(from_float<T>(__fmul_rn(f[k], scale)))
                                                          : 0.f;
      }
    }
#pragma unroll
    for (int k = 0; k < kN; ++k) f[k] = to_float(from_float<T>(f[k] + fb[k]));
    R::store(out + offset, i, f);
#pragma unroll
    for (int k = 0; k < kN; ++k) sum += f[k];
  }
  layernorm_row<T, kVec>(ln + offset, mean, rstd, out + offset, w, bias, row, lane, C, eps, sum);
}

// Output-gradient element group i of a row: dy, plus dy2 with kSum (rounded to T, as residual_fwd stores the
// sum).
template <class T, bool kVec, bool kSum>
__device__ void load_dout(const T* dy, const T* dy2, int i, float (&f)[Row<T, kVec>::kN]) {
  using R = Row<T, kVec>;
  R::load(dy, i, f);
  if constexpr (kSum) {
    float f2[R::kN];
    R::load(dy2, i, f2);
#pragma unroll
    for (int k = 0; k < R::kN; ++k) f[k] = to_float(from_float<T>(f[k] + f2[k]));
  }
}

// dinp += rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)), dnorm = dout * w; with kOverwrite,
// dinp = that; with kSum, dout is dout + dout2. dinp may alias dout2: each lane reads and writes its own
// element groups only, and writes a group (second pass) after it has read it in both passes.
template <class T, bool kVec, bool kSum, bool kOverwrite>
__global__ void layernorm_bwd_input_kernel(T* dinp, const T* dout, const T* dout2, const T* inp, const T* w,
                                           const float* mean, const float* rstd, int N, int C) {
  using R = Row<T, kVec>;
  constexpr int kN = R::kN;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (row >= N) return;
  const size_t offset = static_cast<size_t>(row) * C;
  const T* x = inp + offset;
  const T* dy = dout + offset;
  const T* dy2 = kSum ? dout2 + offset : nullptr;
  const float mu = mean[row], rs = rstd[row];
  const int groups = C / kN;
  float fx[kN], fdy[kN], fw[kN], fdx[kN];
  float sum_dnorm = 0.f, sum_dnorm_xhat = 0.f;
  for (int i = lane; i < groups; i += kWarpSize) {
    R::load(x, i, fx);
    load_dout<T, kVec, kSum>(dy, dy2, i, fdy);
    R::load(w, i, fw);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const float dnorm = fdy[k] * fw[k];
      sum_dnorm += dnorm;
      sum_dnorm_xhat += dnorm * (fx[k] - mu) * rs;
    }
  }
  const float mean_dnorm = warp_sum(sum_dnorm) / C;
  const float mean_dnorm_xhat = warp_sum(sum_dnorm_xhat) / C;
  T* dx = dinp + offset;
  for (int i = lane; i < groups; i += kWarpSize) {
    R::load(x, i, fx);
    load_dout<T, kVec, kSum>(dy, dy2, i, fdy);
    R::load(w, i, fw);
    if constexpr (!kOverwrite) R::load(dx, i, fdx);
#pragma unroll
    for (int k = 0; k < kN; ++k) {
      const float xhat = (fx[k] - mu) * rs;
      const float d = rs * (fdy[k] * fw[k] - mean_dnorm - xhat * mean_dnorm_xhat);
      if constexpr (kOverwrite)
        fdx[k] = d;
      else
        fdx[k] += d;
    }
    R::store(dx, i, fdx);
  }
}

constexpr int kColumnTile = 32;
constexpr int kRowThreads = 8;
constexpr int kMinRowsPerChunk = 256;

// dw[c] += sum_r dout[r,c] * xhat[r,c]; db[c] += sum_r dout[r,c]. Block (32, 8) covers 32 columns of one
// chunk of rows, coalesced along the row, then adds its partial with one atomic per column.
// kSum: dout is dout + dout2 (rounded to T, as residual_fwd stores it).
template <class T, class G, bool kSum>
__global__ void layernorm_bwd_params_kernel(G* dw, G* db, const T* dout, const T* dout2, const T* inp,
                                            const float* mean, const float* rstd, int N, int C,
                                            int rows_per_chunk) {
  __shared__ float partial_dw[kRowThreads][kColumnTile + 1];
  __shared__ float partial_db[kRowThreads][kColumnTile + 1];
  const int col = blockIdx.x * kColumnTile + threadIdx.x;
  const int row_begin = blockIdx.y * rows_per_chunk;
  const int row_end = min(N, row_begin + rows_per_chunk);
  float acc_dw = 0.f, acc_db = 0.f;
  if (col < C) {
    for (int r = row_begin + threadIdx.y; r < row_end; r += kRowThreads) {
      const size_t i = static_cast<size_t>(r) * C + col;
      float dy = to_float(dout[i]);
      if constexpr (kSum) dy = to_float(from_float<T>(dy + to_float(dout2[i])));
      acc_dw += dy * (to_float(inp[i]) - mean[r]) * rstd[r];
      acc_db += dy;
    }
  }
  partial_dw[threadIdx.y][threadIdx.x] = acc_dw;
  partial_db[threadIdx.y][threadIdx.x] = acc_db;
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    float sum_dw = 0.f, sum_db = 0.f;
    for (int i = 0; i < kRowThreads; ++i) {
      sum_dw += partial_dw[i][threadIdx.x];
      sum_db += partial_db[i][threadIdx.x];
    }
    atomic_add(&dw[col], sum_dw);
    atomic_add(&db[col], sum_db);
  }
}

// Both fp32 LayerNorm backwards in one pass over the rows (C % 4 == 0, C <= kFusedMaxC, 16-byte aligned
// rows): each warp computes the input gradient of one row as layernorm_bwd_input_kernel does and writes its
// row's terms of dw and db (and of the branch's bias gradient) into its own rows of shared memory; the block
// then sums its warps' rows and adds them with one 16-byte atomic per four columns. The separate kernels read
// dout, dout2 and the input once each more, and launch twice: bert-large's 47 LayerNorm backwards a step
// take 986 us fused against 1082 us (662 + 420) on an H100. Keeping the partial sums in shared memory rather
// than registers (96 of them, for two rows a warp) leaves room for two blocks an SM: a kernel of this
// size has few warps, and with one block an SM they waited on memory most of the time (Nsight Compute: 37%
// of the DRAM bandwidth). The row itself stays in registers between the two passes (about 95 of them,
// still two blocks an SM): 1020 -> 902 us a bert-large step against reloading it.
constexpr int kFusedMaxGroups = 8;  // 16-byte groups per lane: C <= 32 * 4 * 8
constexpr int kFusedMaxC = kWarpSize * 4 * kFusedMaxGroups;
size_t fused_bwd_smem_bytes(int C, bool branch_bias) {
  return size_t(branch_bias ? 3 : 2) * kRowsPerBlock * C * sizeof(float);
}

// The residual branch's gradient (Ops::layernorm_bwd_sum's BranchGrad) for the fused kernel: kBranch adds
// the column sums of dinp (kDrop: of dinp through the dropout, also written to dbranch) to dbias.
template <class G>
struct FusedBranch {
  float* dbranch;
  G* dbias;
  const anvil::DropoutState* state;
  uint32_t site, threshold;
  float scale;
  size_t index_pitch;
};

template <class G, bool kSum, bool kOverwrite, bool kBranch, bool kDrop>
__global__ void layernorm_bwd_fused_vec4_kernel(float* dinp, G* dw, G* db, const float* dout,
                                                const float* dout2, const float* inp, const float* w,
                                                const float* mean, const float* rstd, int N, int C,
                                                FusedBranch<G> branch) {
  // [pass][kRowsPerBlock][C]: each warp's row of terms of dw (pass 0), db (1) and, with kBranch and dbias,
  // the branch bias (2)
  extern __shared__ float partial[];
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int groups = C / 4;
  const int passes = kBranch && branch.dbias ? 3 : 2;
  float4* part_dw = reinterpret_cast<float4*>(partial + warp * C);
  float4* part_db = reinterpret_cast<float4*>(partial + (kRowsPerBlock + warp) * C);
  float4* part_dbias = reinterpret_cast<float4*>(partial + (2 * kRowsPerBlock + warp) * C);
  uint64_t key = 0;
  if constexpr (kDrop) key = anvil::dropout_key(branch.state->seed, branch.state->micro, branch.site);
  const auto load_dy = [&](size_t offset, int i) {
    float4 d = reinterpret_cast<const float4*>(dout + offset)[i];
    if constexpr (kSum) {
      const float4 d2 = reinterpret_cast<const float4*>(dout2 + offset)[i];
      d.x += d2.x, d.y += d2.y, d.z += d2.z, d.w += d2.w;
    }
    return d;
  };
  const int row = blockIdx.x * kRowsPerBlock + warp;
  if (row >= N) {  // no row: zero terms
    for (int i = lane; i < groups; i += kWarpSize) {
      part_dw[i] = part_db[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (passes == 3) part_dbias[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  } else {
    const size_t offset = static_cast<size_t>(row) * C;
    const float4* x4 = reinterpret_cast<const float4*>(inp + offset);
    const float4* w4 = reinterpret_cast<const float4*>(w);
    const float mu = mean[row], rs = rstd[row];
    float sum_dnorm = 0.f, sum_dnorm_xhat = 0.f;
    // The row's input and output gradient stay in registers for the second pass: reloading them (from L2
    // at best) was a second round trip per row; the weights are the same for every row and stay cached.
    float4 xs[kFusedMaxGroups], dys[kFusedMaxGroups];
#pragma unroll
    for (int k = 0; k < kFusedMaxGroups; ++k) {
      const int i = lane + k * kWarpSize;
      if (i < groups) {
        xs[k] = x4[i], dys[k] = load_dy(offset, i);
        const float4 x = xs[k], dy = dys[k], wv = w4[i];
        const float4 dn = make_float4(dy.x * wv.x, dy.y * wv.y, dy.z * wv.z, dy.w * wv.w);
        sum_dnorm += dn.x + dn.y + dn.z + dn.w;
        sum_dnorm_xhat +=
            dn.x * (x.x - mu) * rs + dn.y * (x.y - mu) * rs + dn.z * (x.z - mu) * rs + dn.w * (x.w - mu) * rs;
      }
    }
    const float mean_dnorm = warp_sum(sum_dnorm) / C;
    const float mean_dnorm_xhat = warp_sum(sum_dnorm_xhat) / C;
    float4* dx4 = reinterpret_cast<float4*>(dinp + offset);
#pragma unroll
    for (int k = 0; k < kFusedMaxGroups; ++k) {
      const int i = lane + k * kWarpSize;
      if (i < groups) {
        // dinp may alias dout2: the first pass read the whole row before anything is written.
        const float4 x = xs[k], dy = dys[k], wv = w4[i];
        const float4 xh = make_float4((x.x - mu) * rs, (x.y - mu) * rs, (x.z - mu) * rs, (x.w - mu) * rs);
        float4 d = make_float4(rs * (dy.x * wv.x - mean_dnorm - xh.x * mean_dnorm_xhat),
                               rs * (dy.y * wv.y - mean_dnorm - xh.y * mean_dnorm_xhat),
                               rs * (dy.z * wv.z - mean_dnorm - xh.z * mean_dnorm_xhat),
                               rs * (dy.w * wv.w - mean_dnorm - xh.w * mean_dnorm_xhat));
        if constexpr (!kOverwrite) {
          const float4 old = dx4[i];
          d.x += old.x, d.y += old.y, d.z += old.z, d.w += old.w;
        }
        dx4[i] = d;
        part_dw[i] = make_float4(dy.x * xh.x, dy.y * xh.y, dy.z * xh.z, dy.w * xh.w);
        part_db[i] = dy;
        if constexpr (kBranch) {
          if constexpr (kDrop) {
            // Exactly Ops::dropout_rows: x * scale rounded once, element (row, c) drawing index row * pitch +
            // c.
            const size_t index = size_t(row) * branch.index_pitch + 4 * size_t(i);
            const auto drop = [&](float v, int c) {
              return anvil::dropout_keep(key, index + c, branch.threshold) ? __fmul_rn(v, branch.scale) : 0.f;
            };
            d = make_float4(drop(d.x, 0), drop(d.y, 1), drop(d.z, 2), drop(d.w, 3));
            reinterpret_cast<float4*>(branch.dbranch + offset)[i] = d;
          }
          if (passes == 3) part_dbias[i] = d;
        }
      }
    }
  }
  __syncthreads();
  // The block's sums: every pass's rows, one 16-byte group of columns per thread at a time.
  for (int j = threadIdx.x; j < passes * groups; j += kThreads) {
    const int pass = j / groups, c4 = j % groups;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int wi = 0; wi < kRowsPerBlock; ++wi) {
      const float4 p = reinterpret_cast<const float4*>(partial + (pass * kRowsPerBlock + wi) * C)[c4];
      sum.x += p.x, sum.y += p.y, sum.z += p.z, sum.w += p.w;
    }
    atomic_add4((pass == 0 ? dw : pass == 1 ? db : branch.dbias) + 4 * c4, sum);
  }
}

}  // namespace

void layernorm_fwd(cudaStream_t stream, anvil::DType act, void* out, float* mean, float* rstd,
                   const void* inp, const void* w, const void* b, int N, int C, float eps) {
  if (N <= 0 || C <= 0) return;
  const unsigned blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    auto launch = [&](auto kernel) {
      kernel<<<blocks, kThreads, 0, stream>>>(static_cast<T*>(out), mean, rstd, static_cast<const T*>(inp),
                                              static_cast<const T*>(w), static_cast<const T*>(b), N, C, eps);
    };
    if (rows_vectorizable<T>(C, {out, inp, w, b}))
      launch(layernorm_fwd_kernel<T, true>);
    else
      launch(layernorm_fwd_kernel<T, false>);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void residual_layernorm_fwd(cudaStream_t stream, anvil::DType act, void* out, void* ln, float* mean,
                            float* rstd, const void* a, const void* b, const void* w, const void* bias, int N,
                            int C, float eps, const anvil::RowDropout& drop) {
  if (N <= 0 || C <= 0) return;
  const unsigned blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  const bool dropping = drop.p > 0;
  const uint32_t threshold = anvil::dropout_threshold(drop.p);
  const float scale = anvil::dropout_scale(drop.p);  // on the host: --use_fast_math divides approximately
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    auto launch = [&](auto kernel) {
      kernel<<<blocks, kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<T*>(ln), mean, rstd,
                                              static_cast<const T*>(a), static_cast<const T*>(b),
                                              static_cast<const T*>(w), static_cast<const T*>(bias), N, C,
                                              eps, threshold, scale, drop.state, drop.site, drop.index_pitch);
    };
    const bool vec = rows_vectorizable<T>(C, {out, ln, a, b, w, bias});
    if (vec && dropping)
      launch(residual_layernorm_fwd_kernel<T, true, true>);
    else if (vec)
      launch(residual_layernorm_fwd_kernel<T, true, false>);
    else if (dropping)
      launch(residual_layernorm_fwd_kernel<T, false, true>);
    else
      launch(residual_layernorm_fwd_kernel<T, false, false>);
  });
  ANVIL_CUDA_CHECK_LAST();
}

namespace {

// Both LayerNorm backwards: the parameter gradients first, as dinp may alias dout2 (layernorm_bwd_sum), which
// the parameter kernel reads and the input kernel overwrites.
template <bool kSum, bool kOverwrite>
void layernorm_bwd_launch(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dinp, void* dw,
                          void* db, const void* dout, const void* dout2, const void* inp, const void* w,
                          const float* mean, const float* rstd, int N, int C,
                          const anvil::BranchGrad& branch = {}) {
  if (N <= 0 || C <= 0) return;
  const unsigned blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  const int rows_per_chunk = std::max(kMinRowsPerChunk, (N + 65534) / 65535);  // gridDim.y <= 65535
  const dim3 grid((C + kColumnTile - 1) / kColumnTile, (N + rows_per_chunk - 1) / rows_per_chunk);
  const bool dropping = branch.drop.p > 0;
  if (act == anvil::DType::F32 && C <= kFusedMaxC &&
      rows_vectorizable<float>(C, {dinp, dout, dout2, inp, w, branch.dbranch})) {
    dispatch_float(grad, [&](auto g) {
      using G = decltype(g);
      const unsigned fused_blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
      const size_t smem = fused_bwd_smem_bytes(C, branch.dbias != nullptr);
      const FusedBranch<G> fb{static_cast<float*>(branch.dbranch),
                              static_cast<G*>(branch.dbias),
                              branch.drop.state,
                              branch.drop.site,
                              anvil::dropout_threshold(branch.drop.p),
                              anvil::dropout_scale(branch.drop.p),  // on the host: fast-math divides roughly
                              branch.drop.index_pitch};
      auto launch = [&](auto kernel) {
        // Opted into the most any row width needs: the attribute is set once per kernel and device.
        configure_for_current_device(reinterpret_cast<const void*>(kernel),
                                     fused_bwd_smem_bytes(kFusedMaxC, true));
        kernel<<<fused_blocks, kThreads, smem, stream>>>(
            static_cast<float*>(dinp), static_cast<G*>(dw), static_cast<G*>(db),
            static_cast<const float*>(dout), static_cast<const float*>(dout2), static_cast<const float*>(inp),
            static_cast<const float*>(w), mean, rstd, N, C, fb);
      };
      if (dropping)
        launch(layernorm_bwd_fused_vec4_kernel<G, kSum, kOverwrite, true, true>);
      else if (branch.dbias)
        launch(layernorm_bwd_fused_vec4_kernel<G, kSum, kOverwrite, true, false>);
      else
        launch(layernorm_bwd_fused_vec4_kernel<G, kSum, kOverwrite, false, false>);
      ANVIL_CUDA_CHECK_LAST();
    });
    return;
  }
  dispatch_float(act, [&](auto t) {
    using T = decltype(t);
    dispatch_float(grad, [&](auto g) {
      using G = decltype(g);
      layernorm_bwd_params_kernel<T, G, kSum><<<grid, dim3(kColumnTile, kRowThreads), 0, stream>>>(
          static_cast<G*>(dw), static_cast<G*>(db), static_cast<const T*>(dout), static_cast<const T*>(dout2),
          static_cast<const T*>(inp), mean, rstd, N, C, rows_per_chunk);
      ANVIL_CUDA_CHECK_LAST();
    });
    auto launch = [&](auto kernel) {
      kernel<<<blocks, kThreads, 0, stream>>>(static_cast<T*>(dinp), static_cast<const T*>(dout),
                                              static_cast<const T*>(dout2), static_cast<const T*>(inp),
                                              static_cast<const T*>(w), mean, rstd, N, C);
    };
    if (rows_vectorizable<T>(C, {dinp, dout, dout2, inp, w}))  // a null dout2 is aligned
      launch(layernorm_bwd_input_kernel<T, true, kSum, kOverwrite>);
    else
      launch(layernorm_bwd_input_kernel<T, false, kSum, kOverwrite>);
    ANVIL_CUDA_CHECK_LAST();
  });
  // The branch's gradient by the ops in sequence.
  const anvil::RowDropout& d = branch.drop;
  if (dropping) dropout_rows(stream, act, branch.dbranch, dinp, N, C, d.index_pitch, d.p, d.state, d.site);
  if (branch.dbias)
    column_sums_accumulate(stream, grad, branch.dbias, act, dropping ? branch.dbranch : dinp, N, C);
}

}  // namespace

void layernorm_bwd(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dinp, void* dw, void* db,
                   const void* dout, const void* inp, const void* w, const float* mean, const float* rstd,
                   int N, int C) {
  layernorm_bwd_launch<false, false>(stream, act, grad, dinp, dw, db, dout, nullptr, inp, w, mean, rstd, N,
                                     C);
}

void layernorm_bwd_sum(cudaStream_t stream, anvil::DType act, anvil::DType grad, void* dinp, void* dw,
                       void* db, const void* dout, const void* dout2, const void* inp, const void* w,
                       const float* mean, const float* rstd, int N, int C, const anvil::BranchGrad& branch) {
  if (dout2)
    layernorm_bwd_launch<true, true>(stream, act, grad, dinp, dw, db, dout, dout2, inp, w, mean, rstd, N, C,
                                     branch);
  else
    layernorm_bwd_launch<false, true>(stream, act, grad, dinp, dw, db, dout, nullptr, inp, w, mean, rstd, N,
                                      C, branch);
}

}  // namespace anvil::cuda
