// Backend-neutral parts of kernel activity recording (runtime/kernel_activity.hpp); the CUPTI recorder
// itself is runtime/cuda/kernel_activity.cpp.
#include "runtime/kernel_activity.hpp"

namespace anvil {

std::string short_kernel_name(std::string_view name, size_t max_chars) {
  std::string_view s = name;
  if (s.starts_with("void ")) s.remove_prefix(5);
  // The parameter list: the last balanced "(...)" that ends the name (templates may hold parentheses of
  // their own, e.g. "(anonymous namespace)", so match from the end).
  if (s.ends_with(')')) {
    int depth = 0;
    for (size_t i = s.size(); i-- > 0;) {
      if (s[i] == ')') ++depth;
      if (s[i] == '(' && --depth == 0) {
        if (i > 0) s = s.substr(0, i);
        break;
      }
    }
  }
  std::string out;
  out.reserve(s.size());
  constexpr std::string_view kAnonymous = "(anonymous namespace)::";
  for (size_t i = 0; i < s.size();) {
    if (s.substr(i).starts_with(kAnonymous)) {
      i += kAnonymous.size();
    } else {
      out += s[i++];
    }
  }
  if (out.size() > max_chars && max_chars >= 3) out = out.substr(0, max_chars - 3) + "...";
  return out;
}

#ifndef ANVIL_WITH_CUPTI
bool kernel_activity_compiled() {
  return false;
}

std::unique_ptr<KernelActivity> make_kernel_activity(Device& dev, std::string& why_not) {
  if (dev.kind() == DeviceKind::CPU) {
    why_not = "the CPU backend runs no GPU kernels";
  } else {
    why_not =
        "this Anvil was built without CUPTI (libcupti and cupti.h were not found when CMake configured the "
        "CUDA build), so there are no kernel timings";
  }
  return nullptr;
}
#endif

}  // namespace anvil
