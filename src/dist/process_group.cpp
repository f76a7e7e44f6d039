#include "dist/process_group.hpp"

#include <fmt/format.h>

#include <sstream>

#include "anvil/error.hpp"
#include "dist/tcp_store.hpp"
#include "runtime/device.hpp"

namespace anvil::dist {
namespace {

// The first line where `a` and `b` differ, with its number.
std::string first_difference(const std::string& a, const std::string& b) {
  std::istringstream sa(a), sb(b);
  std::string la, lb;
  for (int line = 1;; ++line) {
    const bool ga = bool(std::getline(sa, la)), gb = bool(std::getline(sb, lb));
    if (!ga && !gb) return "(no line differs)";
    if (!ga || !gb || la != lb)
      return fmt::format("line {}: rank 0 has '{}', this one '{}'", line, ga ? la : "(end)",
                         gb ? lb : "(end)");
  }
}

}  // namespace

ProcessGroup::ProcessGroup(const DistEnv& env, Device& dev, std::chrono::milliseconds timeout)
    : env_(env), timeout_(timeout) {
  if (!env_.distributed()) {
    comm_ = make_single_process_communicator(dev);
    return;
  }
  store_ = std::make_unique<TcpStore>(env_.master_addr, env_.master_port, env_.rank == 0, timeout_);
  if (dev.kind() == DeviceKind::CUDA) {
    comm_ = make_nccl_communicator(env_, dev, *store_, timeout_);
  } else {
    comm_ = make_gloo_communicator(env_, *store_, "gloo", timeout_);
  }
}

ProcessGroup::~ProcessGroup() = default;

std::vector<std::string> ProcessGroup::exchange(const std::string& name, const std::string& text) {
  if (!store_) return {text};
  const std::string prefix = "exchange/" + name + "/";
  store_->set(prefix + std::to_string(env_.rank), text);
  std::vector<std::string> all(size_t(env_.world_size));
  for (int r = 0; r < env_.world_size; ++r)
    all[size_t(r)] = store_->get(prefix + std::to_string(r), timeout_);
  return all;
}

void ProcessGroup::require_same(const std::string& what, const std::string& text) {
  const std::vector<std::string> all = exchange(what, text);
  for (int r = 1; r < int(all.size()); ++r)
    ANVIL_REQUIRE(all[size_t(r)] == all[0],
                  "rank {} of {} runs another {} than rank 0 ({}): every rank must be started with the same "
                  "arguments and files",
                  r, all.size(), what, first_difference(all[0], all[size_t(r)]));
}

}  // namespace anvil::dist
