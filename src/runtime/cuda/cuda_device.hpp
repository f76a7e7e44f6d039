// Internal to the CUDA backend: access to the CudaDevice's streams for the CUDA ops.
#pragma once
#include <cuda_runtime.h>

#include "runtime/device.hpp"

namespace anvil {

// The compute stream of a device made by make_cuda_device; throws anvil::Error for any other device.
cudaStream_t cuda_compute_stream(Device& dev);
// The GPU ordinal of a device made by make_cuda_device; throws anvil::Error for any other device.
int cuda_device_ordinal(Device& dev);

}  // namespace anvil
