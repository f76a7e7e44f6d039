// Rotary position embedding (Ops::rope_fwd / rope_bwd), in place on the q and k heads of qkv.
//
// Accuracy: the build's --use_fast_math turns sinf/cosf into the sin.approx/cos.approx intrinsics, whose
// error grows with the argument, and the angles reach the position itself (inv_freq[0] = 1): ~1e5 radians
// at long contexts. Each (position, frequency) pair's cos and sin are therefore taken in fp64 (sincos, which
// fast-math leaves alone) and rounded to fp32, once per block, then shared by every sequence and head at
// that position: B * (NH + NKV) uses per fp64 evaluation.
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1 << 16;

// Block b handles positions t = b, b + gridDim.x, ... of every sequence: it fills the (cos, sin) table of
// its position in shared memory, then rotates the (x[i], x[i + HS/2]) pairs of every q and k head of every
// sequence at that position, kN pairs (16 bytes of each half) per thread and step with kVec. `sign` is +1
// (forward) or -1 (backward: rotation by -a, the transpose). The rotation is written with explicitly rounded
// fp32 operations, the CPU reference's arithmetic (no contraction into FMAs).
template <class T, bool kVec>
__global__ void rope_kernel(T* qkv, const float* inv_freq, int B, int T_, int heads, int width, int HS,
                            int pos_offset, float sign) {
  extern __shared__ float2 table[];  // [HS / 2]: (cos a, sign * sin a)
  constexpr int kN = kVec ? Vec16<T>::kN : 1;
  const int half = HS / 2;
  const int groups = half / kN;  // per head
  const int items = B * heads * groups;
  for (int t = blockIdx.x; t < T_; t += gridDim.x) {
    __syncthreads();  // the previous position's table is no longer read
    const float p = static_cast<float>(pos_offset + t);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      double s, c;
      sincos(static_cast<double>(__fmul_rn(p, inv_freq[i])), &s, &c);
      table[i] = make_float2(static_cast<float>(c), sign * static_cast<float>(s));
    }
    __syncthreads();
    for (int j = threadIdx.x; j < items; j += blockDim.x) {
      const int g = j % groups, bh = j / groups;
      const int h = bh % heads, b = bh / heads;
      T* x0 = qkv + (static_cast<size_t>(b) * T_ + t) * width + static_cast<size_t>(h) * HS + g * kN;
      T* x1 = x0 + half;
      float f0[kN], f1[kN];
      if constexpr (kVec) {
        const Vec16<T> v0 = *reinterpret_cast<const Vec16<T>*>(x0),
                       v1 = *reinterpret_cast<const Vec16<T>*>(x1);
#pragma unroll
        for (int k = 0; k < kN; ++k) f0[k] = to_float(v0.v[k]), f1[k] = to_float(v1.v[k]);
      } else {
        f0[0] = to_float(*x0), f1[0] = to_float(*x1);
      }
      float y0[kN], y1[kN];
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        const float2 cs = table[g * kN + k];
        y0[k] = __fsub_rn(__fmul_rn(f0[k], cs.x), __fmul_rn(f1[k], cs.y));
        y1[k] = __fadd_rn(__fmul_rn(f1[k], cs.x), __fmul_rn(f0[k], cs.y));
      }
      if constexpr (kVec) {
        Vec16<T> v0, v1;
#pragma unroll
        for (int k = 0; k < kN; ++k) v0.v[k] = from_float<T>(y0[k]), v1.v[k] = from_float<T>(y1[k]);
        *reinterpret_cast<Vec16<T>*>(x0) = v0;
        *reinterpret_cast<Vec16<T>*>(x1) = v1;
      } else {
        *x0 = from_float<T>(y0[0]), *x1 = from_float<T>(y1[0]);
      }
    }
  }
}

}  // namespace

void rope(cudaStream_t stream, anvil::DType act, void* qkv, const float* inv_freq, int B, int T, int NH,
          int NKV, int HS, int pos_offset, bool inverse) {
  if (B <= 0 || T <= 0) return;
  const int heads = NH + NKV, width = (NH + 2 * NKV) * HS, half = HS / 2;
  const unsigned blocks = static_cast<unsigned>(std::min(T, kMaxBlocks));
  const size_t smem = static_cast<size_t>(half) * sizeof(float2);
  const float sign = inverse ? -1.f : 1.f;
  dispatch_float(act, [&](auto tag) {
    using T_ = decltype(tag);
    auto* x = static_cast<T_*>(qkv);
    // Vectors of 16 bytes need whole vectors in each half head (then rows and heads are aligned too).
    if (half % Vec16<T_>::kN == 0 && reinterpret_cast<uintptr_t>(qkv) % 16 == 0)
      rope_kernel<T_, true>
          <<<blocks, kThreads, smem, stream>>>(x, inv_freq, B, T, heads, width, HS, pos_offset, sign);
    else
      rope_kernel<T_, false>
          <<<blocks, kThreads, smem, stream>>>(x, inv_freq, B, T, heads, width, HS, pos_offset, sign);
  });
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
