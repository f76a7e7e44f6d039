// Error checks for CUPTI calls, like cuda_check.hpp's for the CUDA runtime: ANVIL_CUPTI_CHECK throws
// anvil::Error naming the call, CUPTI's message and file:line; ANVIL_CUPTI_WARN reports and carries on (for
// destructors and CUPTI's callbacks, which must not throw).
#pragma once
#include <cupti.h>

#include <cstdio>
#include <string>

namespace anvil::detail {

[[noreturn]] void raise_at(const char* file, int line, const std::string& msg);  // core/error.cpp

inline const char* cupti_result_text(CUptiResult result) {
  const char* text = nullptr;
  if (cuptiGetResultString(result, &text) != CUPTI_SUCCESS || !text) return "unknown CUPTI error";
  return text;
}

[[noreturn]] inline void raise_cupti_error(const char* call, const char* file, int line, CUptiResult result) {
  raise_at(file, line,
           std::string("CUPTI call failed: ") + call + ": " + cupti_result_text(result) + " (CUptiResult " +
               std::to_string(int(result)) + ")");
}

inline void warn_cupti_error(const char* call, const char* file, int line, CUptiResult result) noexcept {
  std::fprintf(stderr, "anvil: warning: CUPTI call failed: %s: %s (%s:%d)\n", call, cupti_result_text(result),
               file, line);
}

}  // namespace anvil::detail

#define ANVIL_CUPTI_CHECK(call)                                                           \
  do {                                                                                    \
    const CUptiResult anvil_cupti_result_ = (call);                                       \
    if (anvil_cupti_result_ != CUPTI_SUCCESS)                                             \
      ::anvil::detail::raise_cupti_error(#call, __FILE__, __LINE__, anvil_cupti_result_); \
  } while (0)

// Checks without throwing, for destructors and callbacks.
#define ANVIL_CUPTI_WARN(call)                                                           \
  do {                                                                                   \
    const CUptiResult anvil_cupti_result_ = (call);                                      \
    if (anvil_cupti_result_ != CUPTI_SUCCESS)                                            \
      ::anvil::detail::warn_cupti_error(#call, __FILE__, __LINE__, anvil_cupti_result_); \
  } while (0)
