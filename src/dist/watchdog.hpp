// Stops a rank that can no longer make progress, so that a job never hangs silently (issue 29, "Failures").
// A background thread, once a second:
//   - reads the job's failure notice: a rank that fails posts its message in the job's store before it
//     exits (post_failure), and every other rank stops at once with that message;
//   - checks that the job's store answers: it lives in rank 0's process, so a store that stopped answering
//     means rank 0 is gone;
//   - checks progress: a step that has not ended `timeout` after it began (a rank died, hangs, or issued
//     other collectives) stops the rank with the step and what it was doing.
// Stopping prints the reason on stderr and ends the process at once (std::_Exit(1)): a collective stuck on
// the GPU cannot be unwound. What a rank writes is safe at any moment: checkpoints appear whole or not at
// all, metrics are whole lines.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "dist/process_group.hpp"

namespace anvil::dist {

class Watchdog {
 public:
  // Starts watching (several processes only; with one it does nothing).
  Watchdog(ProcessGroup& group, std::chrono::milliseconds timeout);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The step loop's marks: a step (1-based) began / ended.
  void step_begins(int64_t step);
  void step_ends();
  // Tells the other ranks that this one failed, with why (no-op with one process; never throws).
  void post_failure(const std::string& message) noexcept;

 private:
  void watch();
  [[noreturn]] void stop(const std::string& why);

  ProcessGroup& group_;
  const std::chrono::milliseconds timeout_;
  std::atomic<int64_t> step_{0};           // the step in progress, 0: none
  std::atomic<int64_t> step_began_ns_{0};  // steady clock
  bool posted_ = false;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool quit_ = false;
  std::thread thread_;
};

}  // namespace anvil::dist
