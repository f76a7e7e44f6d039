// A key-value store every process of a job reaches (DESIGN: src/dist/): what the processes exchange
// before any collective exists (the NCCL unique id, the Gloo transport addresses), the start-up check
// that every rank runs the same config, and failure notices (a rank that fails posts why, so that the
// others stop with its message instead of waiting for a collective that never completes).
//
// The job's store is a TcpStore (tcp_store.hpp): global rank 0 serves it at MASTER_ADDR:MASTER_PORT, as
// torchrun's workers do, and every rank (rank 0 included) is its client.
#pragma once
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace anvil::dist {

class Store {
 public:
  virtual ~Store() = default;
  // Sets `key` to `value` (replacing an earlier value). Values are bytes (may hold zeros).
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The value of `key`, waiting until some process has set it; throws anvil::Error naming the key and the
  // wait when `timeout` passes first.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // The value of `key` if it is set now (never waits).
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  // Adds `delta` to the integer counter `key` (a missing key counts as 0) and returns the new value,
  // atomically across processes.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key of `keys` is set; throws anvil::Error naming the missing keys on timeout.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
};

}  // namespace anvil::dist
