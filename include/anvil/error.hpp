// Errors: one exception type for everything a user can cause (bad config, bad file, bad value) and
// for failing library calls. Messages name the file, field, value or call that failed.
#pragma once
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace anvil {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void raise_at(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace anvil

// A user-facing error: the message must say what was wrong and where (file, field, value).
#define ANVIL_THROW(...) throw ::anvil::Error(::fmt::format(__VA_ARGS__))

// A user-facing check.
#define ANVIL_REQUIRE(cond, ...)                                   \
  do {                                                             \
    if (!(cond)) throw ::anvil::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

// An internal invariant: failing it is a bug in Anvil, so the message carries the source location.
#define ANVIL_ASSERT(cond, ...)                                                              \
  do {                                                                                       \
    if (!(cond))                                                                             \
      ::anvil::detail::raise_at(__FILE__, __LINE__,                                          \
                                "internal error: " #cond ": " + ::fmt::format(__VA_ARGS__)); \
  } while (0)
