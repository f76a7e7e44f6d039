#include "dist/cuda/comm_clock.hpp"
#include "runtime/cuda/cuda_check.hpp"

namespace anvil::dist::cuda {
namespace {

__global__ void stamp_kernel(unsigned long long* out) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  *out = t;
}

}  // namespace

void stamp_clock(cudaStream_t stream, uint64_t* out) {
  stamp_kernel<<<1, 1, 0, stream>>>(reinterpret_cast<unsigned long long*>(out));
  ANVIL_CUDA_CHECK_LAST();
}

}  // namespace anvil::dist::cuda
