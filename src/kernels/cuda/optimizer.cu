// Fused AdamW (PyTorch's formula: decoupled weight decay before the Adam update) and SGD over the whole
// flat parameter buffer.
#include <algorithm>
#include <type_traits>

#include "core/half.hpp"
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

// One launch over the whole flat buffer; each element finds its parameter group by a binary search over
// the range table, staged in shared memory when it fits (GPT-2 models have ~2 ranges per block).

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxSharedRanges = 512;
constexpr uint64_t kSecondMomentStream = 0x5bd1e9955bd1e995ull;  // as the CPU backend

struct GroupHyper {
  float lr[4];
  float wd[4];
};

// The step's values: from device memory when the op was given a pointer (a graph replays them as the host
// last wrote them), else the launch's copy.
__device__ __forceinline__ const anvil::StepValues& step_values(const anvil::StepValues& arg,
                                                                const anvil::StepValues* device) {
  return device ? *device : arg;
}

// The per-group learning rates of the step and the weight decays, in shared memory (dynamic indexing into
// kernel parameters would copy them to local memory). Synchronises the block.
__device__ GroupHyper* stage_group_hyper(GroupHyper* s, const anvil::StepValues& sv, const float (&wd)[4]) {
  if (threadIdx.x < 4) {
    s->lr[threadIdx.x] = sv.lr[threadIdx.x];
    s->wd[threadIdx.x] = wd[threadIdx.x];
  }
  __syncthreads();
  return s;
}

// The table, in shared memory when it fits.
struct RangeView {
  const uint64_t* begins;
  const uint8_t* groups;
  const uint64_t* state_begins;
  int count;

  // The range holding element i: the last r with begins[r] <= i (begins[0] == 0).
  __device__ int find(size_t i) const {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (begins[mid] <= i)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  }
};

__device__ RangeView stage_table(const GroupTable& t, uint64_t* s_begins, uint8_t* s_groups,
                                 uint64_t* s_states) {
  if (t.count > kMaxSharedRanges) return {t.begins, t.groups, t.state_begins, t.count};
  for (int r = threadIdx.x; r < t.count; r += blockDim.x) {
    s_begins[r] = t.begins[r];
    s_groups[r] = t.groups[r];
    if (t.state_begins) s_states[r] = t.state_begins[r];
  }
  __syncthreads();
  return {s_begins, s_groups, t.state_begins ? s_states : nullptr, t.count};
}

// One element's AdamW update (fp32 or bf16 moments at state index s).
template <bool kBf16Moments>
__device__ __forceinline__ float adamw_element(float p, float gr, void* m_, void* v_, size_t s, float lr,
                                               float wd, float beta1, float beta2, float eps, float inv_bias1,
                                               float sqrt_bias2, uint64_t seed, uint64_t base) {
  float mi, vi;
  if constexpr (kBf16Moments) {
    auto* m = static_cast<uint16_t*>(m_);
    auto* v = static_cast<uint16_t*>(v_);
    mi = beta1 * anvil::bf16_to_float(m[s]) + (1.f - beta1) * gr;
    vi = beta2 * anvil::bf16_to_float(v[s]) + (1.f - beta2) * gr * gr;
    m[s] = anvil::float_to_bf16_stochastic(mi, anvil::rounding_bits(seed, base + s));
    v[s] = anvil::float_to_bf16_stochastic(vi, anvil::rounding_bits(seed ^ kSecondMomentStream, base + s));
  } else {
    auto* m = static_cast<float*>(m_);
    auto* v = static_cast<float*>(v_);
    mi = beta1 * m[s] + (1.f - beta1) * gr;
    vi = beta2 * v[s] + (1.f - beta2) * gr * gr;
    m[s] = mi;
    v[s] = vi;
  }
  p -= lr * wd * p;
  return p - lr * inv_bias1 * mi / (sqrtf(vi) / sqrt_bias2 + eps);
}

// Each thread takes 4 consecutive elements at a time (the range found once per thread, then advanced), and
// 16-byte loads and stores of fp32 parameters, gradients and moments when the four share a range and their
// state index is a multiple of 4 too (the arena's buffers are 256-byte aligned, so a multiple-of-4 index is
// 16-byte aligned); otherwise the elements go one by one.
template <class G, bool kBf16Moments>
__global__ void adamw_fused_kernel(float* param, const G* grad, void* m_, void* v_, size_t n, GroupTable t,
                                   GroupHyper wd4, float beta1, float beta2, float eps, float grad_scale,
                                   const float* grad_scale_device, anvil::StepValues sv_arg,
                                   const anvil::StepValues* sv_device) {
  __shared__ uint64_t s_begins[kMaxSharedRanges], s_states[kMaxSharedRanges];
  __shared__ uint8_t s_groups[kMaxSharedRanges];
  __shared__ GroupHyper s_hyper;
  const anvil::StepValues& sv = step_values(sv_arg, sv_device);
  const GroupHyper& h = *stage_group_hyper(&s_hyper, sv, wd4.wd);
  const RangeView rv = stage_table(t, s_begins, s_groups, s_states);
  grad_scale = effective_grad_scale(grad_scale, grad_scale_device);
  // fp64 division and square root are correctly rounded (also under --use_fast_math): the host's factors.
  const float inv_bias1 = float(1.0 / sv.bias1), sqrt_bias2 = float(sqrt(sv.bias2));
  const uint64_t seed = sv.moment_seed;
  // Each block takes a contiguous chunk of quads (its threads striding through it), so a thread's elements
  // only move forward and its range is found once, then advanced: a lookup per quad cost a binary search
  // over the table in shared memory for every 4 elements.
  const size_t quads = (n + 3) / 4;
  const size_t per_block = ((quads + gridDim.x - 1) / gridDim.x + blockDim.x - 1) / blockDim.x * blockDim.x;
  const size_t q_end = min(quads, (blockIdx.x + 1) * per_block);
  size_t q = blockIdx.x * per_block + threadIdx.x;
  int r = q < q_end ? rv.find(q * 4) : 0;
  size_t range_end = r + 1 < rv.count ? size_t(rv.begins[r + 1]) : n;
  for (; q < q_end; q += blockDim.x) {
    const size_t i0 = q * 4;
    while (i0 >= range_end) {
      ++r;
      range_end = r + 1 < rv.count ? size_t(rv.begins[r + 1]) : n;
    }
    if constexpr (std::is_same_v<G, float> && !kBf16Moments) {
      // Compact states (frozen tensors) keep the wide path where the state index is a multiple of 4 too
      // (tensor sizes that are multiples of 4 keep it so).
      const size_t s0 = rv.state_begins ? size_t(rv.state_begins[r]) + (i0 - size_t(rv.begins[r])) : i0;
      if (i0 + 4 <= range_end && s0 % 4 == 0) {
        const int g = rv.groups[r];
        if (g == 255) continue;
        // Each byte is read and written once: streaming (evict-first) loads and stores keep L2 for the
        // lines still in flight (-3% step time on an H100 against plain accesses; wider per-thread work was
        // slower).
        float4 p = __ldcs(reinterpret_cast<const float4*>(param) + q);
        const float4 gr = __ldcs(reinterpret_cast<const float4*>(grad) + q);
        const size_t sq = s0 / 4;
        float4 m = __ldcs(static_cast<const float4*>(m_) + sq),
               v = __ldcs(static_cast<const float4*>(v_) + sq);
        const float lr = h.lr[g], wd = h.wd[g];
        auto one = [&](float& pp, float gg, float& mm, float& vv) {
          gg *= grad_scale;
          mm = beta1 * mm + (1.f - beta1) * gg;
          vv = beta2 * vv + (1.f - beta2) * gg * gg;
          pp -= lr * wd * pp;
          pp -= lr * inv_bias1 * mm / (sqrtf(vv) / sqrt_bias2 + eps);
        };
        one(p.x, gr.x, m.x, v.x);
        one(p.y, gr.y, m.y, v.y);
        one(p.z, gr.z, m.z, v.z);
        one(p.w, gr.w, m.w, v.w);
        __stcs(reinterpret_cast<float4*>(param) + q, p);
        __stcs(static_cast<float4*>(m_) + sq, m);
        __stcs(static_cast<float4*>(v_) + sq, v);
        continue;
      }
    }
    for (size_t i = i0; i < i0 + 4 && i < n; ++i) {
      while (i >= range_end) {
        ++r;
        range_end = r + 1 < rv.count ? size_t(rv.begins[r + 1]) : n;
      }
      const int g = rv.groups[r];
      if (g == 255) continue;  // kSkipGroup
      const size_t s = rv.state_begins ? size_t(rv.state_begins[r]) + (i - rv.begins[r]) : i;
      param[i] =
          adamw_element<kBf16Moments>(param[i], to_float(grad[i]) * grad_scale, m_, v_, s, h.lr[g], h.wd[g],
                                      beta1, beta2, eps, inv_bias1, sqrt_bias2, seed, sv.moment_index_base);
    }
  }
}

template <class G>
__global__ void sgd_kernel(float* param, const G* grad, float* buf, size_t n, GroupTable t, GroupHyper wd4,
                           float momentum, float dampening, bool nesterov, float grad_scale,
                           const float* grad_scale_device, anvil::StepValues sv_arg,
                           const anvil::StepValues* sv_device) {
  __shared__ uint64_t s_begins[kMaxSharedRanges], s_states[kMaxSharedRanges];
  __shared__ uint8_t s_groups[kMaxSharedRanges];
  __shared__ GroupHyper s_hyper;
  const anvil::StepValues& sv = step_values(sv_arg, sv_device);
  const GroupHyper& h = *stage_group_hyper(&s_hyper, sv, wd4.wd);
  const bool first_step = sv.step == 1;
  const RangeView rv = stage_table(t, s_begins, s_groups, s_states);
  grad_scale = effective_grad_scale(grad_scale, grad_scale_device);
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const int r = rv.find(i);
    const int g = rv.groups[r];
    if (g == 255) continue;
    float d = to_float(grad[i]) * grad_scale;
    if (h.wd[g] != 0.f) d += h.wd[g] * param[i];
    if (momentum != 0.f) {
      const size_t s = rv.state_begins ? size_t(rv.state_begins[r]) + (i - rv.begins[r]) : i;
      const float b = first_step ? d : momentum * buf[s] + (1.f - dampening) * d;
      buf[s] = b;
      d = nesterov ? d + momentum * b : b;
    }
    param[i] -= h.lr[g] * d;
  }
}

GroupHyper weight_decays(const float* wd4) {
  GroupHyper h{};
  for (int g = 0; g < 4; ++g) h.wd[g] = wd4[g];
  return h;
}

}  // namespace

void adamw_fused_step(cudaStream_t stream, anvil::DType grad_type, anvil::DType moment_type, float* param,
                      const void* grad, void* m, void* v, size_t n, const GroupTable& g, float beta1,
                      float beta2, float eps, float grad_scale, const float* grad_scale_device,
                      const float* wd4, const anvil::StepValues& sv, const anvil::StepValues* sv_device) {
  if (n == 0 || g.count == 0) return;
  const GroupHyper h = weight_decays(wd4);
  // At most two blocks an SM, each walking one contiguous chunk: every block stages the group table and
  // finds its range once. bert-large's step (335M parameters) took 3.76 ms as 65536 blocks of about 16
  // quads a thread, 3.33 ms as 264 blocks on an H100's 132 SMs, and 3.37-3.51 ms with 4 to 64 blocks an SM
  // (bench/probes/results/adamw_grid_h100_2026-11-23.txt).
  const unsigned grid = std::min(grid_for(((n + 3) / 4 + 3) / 4, kThreads), 2u * unsigned(sm_count()));
  dispatch_float(grad_type, [&](auto t) {
    using G = decltype(t);
    if (moment_type == anvil::DType::BF16)
      adamw_fused_kernel<G, true><<<grid, kThreads, 0, stream>>>(param, static_cast<const G*>(grad), m, v, n,
                                                                 g, h, beta1, beta2, eps, grad_scale,
                                                                 grad_scale_device, sv, sv_device);
    else
      adamw_fused_kernel<G, false><<<grid, kThreads, 0, stream>>>(param, static_cast<const G*>(grad), m, v, n,
                                                                  g, h, beta1, beta2, eps, grad_scale,
                                                                  grad_scale_device, sv, sv_device);
  });
  ANVIL_CUDA_CHECK_LAST();
}

void sgd_step(cudaStream_t stream, anvil::DType grad_type, float* param, const void* grad,
              float* momentum_buf, size_t n, const GroupTable& g, float momentum, float dampening,
              bool nesterov, float grad_scale, const float* grad_scale_device, const float* wd4,
              const anvil::StepValues& sv, const anvil::StepValues* sv_device) {
  if (n == 0 || g.count == 0) return;
  const GroupHyper h = weight_decays(wd4);
  dispatch_float(grad_type, [&](auto t) {
    using G = decltype(t);
    sgd_kernel<G><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        param, static_cast<const G*>(grad), momentum_buf, n, g, h, momentum, dampening, nesterov, grad_scale,
        grad_scale_device, sv, sv_device);
  });
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
