// Internal to the CUDA backend: access to the CudaDevice's streams for the CUDA ops.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <type_traits>

#include "runtime/device.hpp"

namespace anvil {

// The compute stream of a device made by make_cuda_device; throws anvil::Error for any other device.
cudaStream_t cuda_compute_stream(Device& dev);

// Owning handles of a stream (non-blocking) and an event (no timing) of the current device.
struct CudaStreamDestroyer {
  void operator()(cudaStream_t s) const noexcept;
};
using CudaStreamHandle = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, CudaStreamDestroyer>;
struct CudaEventDestroyer {
  void operator()(cudaEvent_t e) const noexcept;
};
using CudaEventHandle = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, CudaEventDestroyer>;
CudaStreamHandle make_cuda_stream();
CudaEventHandle make_cuda_event();

}  // namespace anvil
