// Device timestamps for the NCCL communicator's step timing (Communicator::end_timing): a one-thread kernel
// that writes the GPU's global nanosecond clock. Being a kernel, it is ordered on its stream with the
// collectives and the waits it brackets, and stream capture records it into CUDA graphs like any other, so a
// replayed step stamps its times too.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace anvil::dist::cuda {

// *out = the device's global timer (nanoseconds) when the kernel runs on `stream`.
void stamp_clock(cudaStream_t stream, uint64_t* out);

}  // namespace anvil::dist::cuda
