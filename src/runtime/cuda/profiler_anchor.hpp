// The step profiler's anchor kernel (runtime/cuda/kernel_activity.cpp): an empty kernel queued on the
// compute stream right before the device track's first timing mark, so that its CUPTI record's end time
// is that mark's time on CUPTI's clock.
#pragma once
#include <cuda_runtime.h>

namespace anvil {

// The anchor's name as CUPTI reports it (extern "C": not mangled).
inline constexpr const char* kProfilerAnchorKernelName = "anvil_profiler_anchor";

// Queues the anchor (one thread) on `stream`.
void launch_profiler_anchor(cudaStream_t stream);
// Loads the anchor's module now (CUDA loads kernels lazily), so the first profiled step does not.
void load_profiler_anchor();

}  // namespace anvil
