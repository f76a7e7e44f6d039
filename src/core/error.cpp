#include "anvil/error.hpp"

namespace anvil::detail {

void raise_at(const char* file, int line, const std::string& msg) {
  throw Error(fmt::format("{} ({}:{})", msg, file, line));
}

}  // namespace anvil::detail
