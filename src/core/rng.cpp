#include "anvil/rng.hpp"

#include <cmath>

namespace anvil {

float Rng::normal() {
  // 53-bit uniforms, u1 in (0, 1] so the log is finite.
  double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

}  // namespace anvil
