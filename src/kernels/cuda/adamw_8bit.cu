// 8-bit AdamW with block-wise quantised moments (semantics: AdamW8bitArgs in kernels/ops.hpp), fused: one
// 256-thread block per quantisation block of 256 state elements (a grid-stride loop over the blocks), one
// element per thread. Each block dequantises its m and v, updates them and the parameters in fp32, takes the
// new absmax of each moment with a block-wide max reduction and requantises by binary search in the sorted
// maps (held in shared memory). The arithmetic follows the CPU kernel (cpu/adamw_8bit.cpp) step for step.
#include <cstdint>

#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kBlock = 256;  // kAdamW8bitBlockSize: threads per block = state elements per block
constexpr int kMapSize = 256;
// Enough resident blocks for any GPU; each loops over several quantisation blocks (and loads the maps once).
constexpr unsigned kMaxGrid = 8192;
constexpr uint8_t kSkip = 255;  // kSkipGroup

struct Group4 {
  float v[4];
};

// Max over the block (blockDim.x == kBlock); every thread gets the result.
__device__ float block_max(float x, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  x = warp_max(x);
  __syncthreads();  // scratch may still be read from the previous call
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < kBlock / kWarpSize ? scratch[lane] : 0.0f;
  return warp_max(x);
}

// The code of the map value nearest x (ties to the lower code); NaN gives code 0.
__device__ int quantize_to_map(const float* map, float x) {
  int lo = 0, hi = kMapSize;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (map[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0) return 0;
  if (lo == kMapSize) return kMapSize - 1;
  return x - map[lo - 1] <= map[lo] - x ? lo - 1 : lo;
}

template <class G>
__global__ void __launch_bounds__(kBlock)
    adamw8bit_kernel(float* __restrict__ param, const G* __restrict__ grad, uint8_t* __restrict__ m_codes,
                     float* __restrict__ m_absmax, uint8_t* __restrict__ v_codes,
                     float* __restrict__ v_absmax, const float* __restrict__ m_map_g,
                     const float* __restrict__ v_map_g, size_t n, size_t num_blocks, GroupTable g,
                     float beta1, float beta2, float eps, float grad_scale,
                     const float* __restrict__ grad_scale_device, Group4 wd4, anvil::StepValues sv_arg,
                     const anvil::StepValues* __restrict__ sv_device) {
  __shared__ float m_map[kMapSize], v_map[kMapSize];
  __shared__ float scratch[kBlock / kWarpSize];
  __shared__ Group4 lr4;  // the step's per-group learning rates (dynamic indexing stays out of local memory)
  m_map[threadIdx.x] = m_map_g[threadIdx.x];
  v_map[threadIdx.x] = v_map_g[threadIdx.x];
  const anvil::StepValues& sv = sv_device ? *sv_device : sv_arg;
  if (threadIdx.x < 4) lr4.v[threadIdx.x] = sv.lr[threadIdx.x];
  __syncthreads();
  // The host's fp64 factors (division and square root are correctly rounded, also under --use_fast_math).
  const double sqrt_bias2 = sqrt(sv.bias2);
  const float step_factor = float(sqrt_bias2 / sv.bias1), eps_hat = float(double(eps) * sqrt_bias2);
  grad_scale = effective_grad_scale(grad_scale, grad_scale_device);

  for (size_t b = blockIdx.x; b < num_blocks; b += gridDim.x) {
    const uint64_t s0 = uint64_t(b) * kBlock;
    // The range holding state element s0: the last whose state starts at or before it (uniform per block).
    int lo = 0, hi = g.count;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (g.state_begins[mid] <= s0)
        lo = mid + 1;
      else
        hi = mid;
    }
    const int r = lo - 1;
    if (r < 0 || g.groups[r] == kSkip) continue;
    const uint64_t p_begin = g.begins[r];
    const uint64_t p_end = r + 1 < g.count ? g.begins[r + 1] : n;
    const uint64_t off = s0 - g.state_begins[r];
    if (off >= p_end - p_begin) continue;
    const uint64_t count = min(uint64_t(kBlock), p_end - p_begin - off);
    const float lr = lr4.v[g.groups[r]], wd = wd4.v[g.groups[r]];

    const bool valid = threadIdx.x < count;
    const size_t s = s0 + threadIdx.x, i = p_begin + off + threadIdx.x;
    float m = 0.0f, v = 0.0f;
    if (valid) {
      // Rounded operations throughout (no FMA contraction), so the result is the CPU kernel's bit for bit.
      const float gj = __fmul_rn(to_float(grad[i]), grad_scale);
      if (isfinite(gj)) {
        m = __fadd_rn(__fmul_rn(beta1, __fmul_rn(m_map[m_codes[s]], m_absmax[b])),
                      __fmul_rn(1.0f - beta1, gj));
        v = __fadd_rn(__fmul_rn(beta2, __fmul_rn(v_map[v_codes[s]], v_absmax[b])),
                      __fmul_rn(1.0f - beta2, __fmul_rn(gj, gj)));
        const float p = __fmul_rn(param[i], __fsub_rn(1.0f, __fmul_rn(lr, wd)));
        param[i] = __fsub_rn(
            p, __fmul_rn(__fmul_rn(lr, step_factor), __fdiv_rn(m, __fadd_rn(__fsqrt_rn(v), eps_hat))));
      }
    }
    // Every thread has read absmax[b] above before thread 0 overwrites it (block_max synchronises).
    const float m_max = block_max(fabsf(m), scratch);
    const float v_max = block_max(v, scratch);
    if (threadIdx.x == 0) {
      m_absmax[b] = m_max;
      v_absmax[b] = v_max;
    }
    if (valid) {
      const float m_inv = m_max > 0.0f ? __frcp_rn(m_max) : 0.0f;
      const float v_inv = v_max > 0.0f ? __frcp_rn(v_max) : 0.0f;
      int c = quantize_to_map(m_map, __fmul_rn(m, m_inv));
      if (m < 0.0f && m_map[c] >= 0.0f && c > 0) --c;
      if (m > 0.0f && m_map[c] < 0.0f && c < kMapSize - 1) ++c;
      m_codes[s] = uint8_t(c);
      v_codes[s] = uint8_t(quantize_to_map(v_map, __fmul_rn(v, v_inv)));
    }
  }
}

}  // namespace

void adamw8bit_step(cudaStream_t stream, anvil::DType grad_type, float* param, const void* grad,
                    uint8_t* m_codes, float* m_absmax, uint8_t* v_codes, float* v_absmax, const float* m_map,
                    const float* v_map, size_t n, size_t num_blocks, const GroupTable& g, float beta1,
                    float beta2, float eps, float grad_scale, const float* grad_scale_device,
                    const float* wd4, const anvil::StepValues& sv, const anvil::StepValues* sv_device) {
  if (num_blocks == 0 || g.count == 0) return;
  if (!g.state_begins)
    anvil::detail::raise_at(__FILE__, __LINE__, "adamw8bit_step needs a table with state_begins");
  const Group4 wd{{wd4[0], wd4[1], wd4[2], wd4[3]}};
  const unsigned grid = static_cast<unsigned>(num_blocks < kMaxGrid ? num_blocks : kMaxGrid);
  dispatch_float(grad_type, [&](auto t) {
    using G = decltype(t);
    adamw8bit_kernel<G><<<grid, kBlock, 0, stream>>>(
        param, static_cast<const G*>(grad), m_codes, m_absmax, v_codes, v_absmax, m_map, v_map, n, num_blocks,
        g, beta1, beta2, eps, grad_scale, grad_scale_device, wd, sv, sv_device);
  });
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
