// Entry points of the CUDA backend for builds without CUDA: they say so clearly instead of failing to link.
#ifndef ANVIL_WITH_CUDA
#include "kernels/ops.hpp"
#include "runtime/device.hpp"

namespace anvil {

bool cuda_available() {
  return false;
}

bool cuda_compiled() {
  return false;
}

std::unique_ptr<Device> make_cuda_device(int) {
  ANVIL_THROW(
      "--device cuda: this Anvil was built without CUDA (configure with a CUDA toolkit and ANVIL_CUDA=ON)");
}

size_t cuda_attention_scratch_bytes(DType, const AttentionShape&, bool) {
  ANVIL_THROW(
      "--device cuda: this Anvil was built without CUDA, so it cannot plan for the CUDA backend (configure "
      "with a CUDA toolkit and ANVIL_CUDA=ON)");
}

const char* cuda_attention_path(DType, int, bool) {
  return "none (built without CUDA)";
}

std::unique_ptr<Ops> make_cuda_ops(Device&, bool, void*, size_t, OpsPrecision) {
  ANVIL_THROW("the CUDA backend is not available: this Anvil was built without CUDA");
}

std::unique_ptr<Ops> make_cuda_ops(Device&, Fp32Matmul, const CudaGemmBuffers&, OpsPrecision,
                                   const GemmTuningOptions&) {
  ANVIL_THROW("the CUDA backend is not available: this Anvil was built without CUDA");
}

}  // namespace anvil
#endif
