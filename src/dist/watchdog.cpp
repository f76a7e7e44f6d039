#include "dist/watchdog.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <optional>

namespace anvil::dist {
namespace {

const char* const kFailureKey = "job/failure";

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Watchdog::Watchdog(ProcessGroup& group, std::chrono::milliseconds timeout)
    : group_(group), timeout_(timeout) {
  if (group_.distributed() && group_.store()) thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quit_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::step_begins(int64_t step) {
  step_began_ns_.store(now_ns());
  step_.store(step);
}

void Watchdog::step_ends() {
  step_.store(0);
}

void Watchdog::post_failure(const std::string& message) noexcept {
  if (!group_.distributed() || !group_.store() || posted_) return;
  posted_ = true;
  try {
    group_.store()->set(kFailureKey, fmt::format("rank {}: {}", group_.rank(), message));
  } catch (...) {
    // The store is gone too (rank 0 exited): the others find that out themselves.
  }
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, std::chrono::seconds(1), [this] { return quit_; })) {
    std::optional<std::string> failure;
    try {
      failure = group_.store()->try_get(kFailureKey);
    } catch (const std::exception& e) {
      if (group_.rank() != 0)
        stop(fmt::format("the job's store stopped answering, so rank 0 has exited ({})", e.what()));
    }
    if (failure && !posted_) stop(fmt::format("another rank failed: {}", *failure));
    const int64_t step = step_.load();
    if (step > 0) {
      const double waited = double(now_ns() - step_began_ns_.load()) * 1e-9;
      if (waited > double(timeout_.count()) / 1000.0)
        stop(
            fmt::format("step {} has not ended {:.0f} s after it began (ddp_timeout {} s): another rank has "
                        "exited, hangs, or issued other collectives (see its output)",
                        step, waited, timeout_.count() / 1000));
    }
  }
}

void Watchdog::stop(const std::string& why) {
  std::fprintf(stderr, "error: rank %d of %d stops: %s\n", group_.rank(), group_.world_size(), why.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

}  // namespace anvil::dist
