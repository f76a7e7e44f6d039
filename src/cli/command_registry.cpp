#include <algorithm>
#include <utility>

#include "cli/command.hpp"

namespace anvil::cli {
namespace {
std::vector<std::pair<int, CommandFactory>>& registry() {
  static std::vector<std::pair<int, CommandFactory>> r;  // function-local: safe during static initialisation
  return r;
}
}  // namespace

int register_command(int order, CommandFactory factory) {
  registry().emplace_back(order, factory);
  return 0;
}

std::vector<CommandFactory> registered_commands() {
  auto r = registry();
  std::stable_sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CommandFactory> out;
  for (const auto& [order, f] : r) out.push_back(f);
  return out;
}

}  // namespace anvil::cli
