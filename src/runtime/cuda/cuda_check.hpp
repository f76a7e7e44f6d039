// Error checks for CUDA runtime and cuBLAS(Lt) calls. Deliberately free of fmt (nvcc cannot compile
// fmt's consteval format strings), so .cu files can include it; failures throw anvil::Error through
// detail::raise_at, which appends file:line.
#pragma once
#include <cublas_api.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>

namespace anvil::detail {

[[noreturn]] void raise_at(const char* file, int line, const std::string& msg);  // core/error.cpp

[[noreturn]] inline void raise_cuda_error(const char* call, const char* file, int line, cudaError_t err) {
  raise_at(file, line,
           std::string("CUDA call failed: ") + call + ": " + cudaGetErrorString(err) + " (" +
               cudaGetErrorName(err) + ")");
}

[[noreturn]] inline void raise_cublas_error(const char* call, const char* file, int line,
                                            cublasStatus_t status) {
  raise_at(file, line,
           std::string("cuBLAS call failed: ") + call + ": " + cublasGetStatusString(status) + " (" +
               cublasGetStatusName(status) + ")");
}

// For destructors and free paths, where throwing would terminate the process: report and carry on.
inline void warn_cuda_error(const char* call, const char* file, int line, cudaError_t err) {
  std::fprintf(stderr, "anvil: warning: CUDA call failed: %s: %s (%s:%d)\n", call, cudaGetErrorString(err),
               file, line);
}

}  // namespace anvil::detail

#define ANVIL_CUDA_CHECK(call)                                                       \
  do {                                                                               \
    const cudaError_t anvil_cuda_err_ = (call);                                      \
    if (anvil_cuda_err_ != cudaSuccess)                                              \
      ::anvil::detail::raise_cuda_error(#call, __FILE__, __LINE__, anvil_cuda_err_); \
  } while (0)

// After a kernel launch: reports launch-configuration errors (and earlier asynchronous faults).
#define ANVIL_CUDA_CHECK_LAST()                                                                \
  do {                                                                                         \
    const cudaError_t anvil_cuda_err_ = cudaGetLastError();                                    \
    if (anvil_cuda_err_ != cudaSuccess)                                                        \
      ::anvil::detail::raise_cuda_error("kernel launch", __FILE__, __LINE__, anvil_cuda_err_); \
  } while (0)

#define ANVIL_CUBLAS_CHECK(call)                                                            \
  do {                                                                                      \
    const cublasStatus_t anvil_cublas_status_ = (call);                                     \
    if (anvil_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                      \
      ::anvil::detail::raise_cublas_error(#call, __FILE__, __LINE__, anvil_cublas_status_); \
  } while (0)

// Checks without throwing, for destructors.
#define ANVIL_CUDA_WARN(call)                                                       \
  do {                                                                              \
    const cudaError_t anvil_cuda_err_ = (call);                                     \
    if (anvil_cuda_err_ != cudaSuccess)                                             \
      ::anvil::detail::warn_cuda_error(#call, __FILE__, __LINE__, anvil_cuda_err_); \
  } while (0)
