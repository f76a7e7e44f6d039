// AdamW, elementwise, with PyTorch's formula (decoupled weight decay applied before the Adam update).
#include "kernels/cuda/cuda_kernels.hpp"
#include "kernels/cuda/kernel_utils.cuh"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::cuda {
namespace {

constexpr int kThreads = 256;

template <class G>
__global__ void adamw_kernel(float* param, const G* grad, float* m, float* v, size_t n, float lr, float beta1,
                             float beta2, float eps, float weight_decay, float step_size, float sqrt_bias2,
                             float grad_scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const float g = to_float(grad[i]) * grad_scale;
    float p = param[i];
    p -= lr * weight_decay * p;
    const float m_new = beta1 * m[i] + (1.f - beta1) * g;
    const float v_new = beta2 * v[i] + (1.f - beta2) * g * g;
    p -= step_size * m_new / (sqrtf(v_new) / sqrt_bias2 + eps);
    m[i] = m_new;
    v[i] = v_new;
    param[i] = p;
  }
}

}  // namespace

void adamw_step(cudaStream_t stream, anvil::DType grad_type, float* param, const void* grad, float* m,
                float* v, size_t n, float lr, float beta1, float beta2, float eps, float weight_decay,
                float step_size, float sqrt_bias2, float grad_scale) {
  if (n == 0) return;
  dispatch_float(grad_type, [&](auto t) {
    using G = decltype(t);
    adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(param, static_cast<const G*>(grad), m, v, n,
                                                                 lr, beta1, beta2, eps, weight_decay,
                                                                 step_size, sqrt_bias2, grad_scale);
  });
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::cuda
