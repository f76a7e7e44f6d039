// A Store inside one process (store.hpp): threads acting as ranks in tests, and single-process jobs, which
// need a store for the same start-up code paths but have no peer to reach.
#pragma once
#include <condition_variable>
#include <mutex>
#include <string>
#include <unordered_map>

#include "dist/store.hpp"

namespace anvil::dist {

class MemoryStore final : public Store {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  // Counters are stored as decimal text (as torch's TCPStore does), so get() of a counter reads its value.
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  std::mutex mutex_;
  std::condition_variable changed_;  // notified on every set() and add()
  std::unordered_map<std::string, std::string> values_;
};

}  // namespace anvil::dist
