// The job this process belongs to (DESIGN: src/dist/): where it stands (DistEnv), the job's store and the
// communicator among its ranks for the device it trains on. With one process there is no store and the
// communicator is the single-process one, so every caller runs the same code whatever the world size.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dist/communicator.hpp"
#include "dist/dist_env.hpp"
#include "dist/store.hpp"

namespace anvil {
class Device;
}

namespace anvil::dist {

class ProcessGroup {
 public:
  // Several processes: global rank 0 serves the job's store at master_addr:master_port (the others wait for
  // it up to `timeout`), then the communicator starts: NCCL for a CUDA device, Gloo for the CPU.
  ProcessGroup(const DistEnv& env, Device& dev, std::chrono::milliseconds timeout);
  ~ProcessGroup();

  const DistEnv& env() const { return env_; }
  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  bool distributed() const { return env_.distributed(); }
  // Rank 0: the one that prints, writes metrics, the summary and checkpoints.
  bool is_main() const { return env_.rank == 0; }
  Communicator& comm() { return *comm_; }
  // The job's store (null with one process).
  Store* store() { return store_.get(); }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Every rank's `text` for `name`, in rank order (through the store; one process: {text}). Each name may
  // be exchanged once.
  std::vector<std::string> exchange(const std::string& name, const std::string& text);
  // Start-up check that every rank has the same `text` for `what` (the run's resolved config): throws, on
  // every rank, an anvil::Error naming the first rank whose text differs from rank 0's and its first
  // differing line.
  void require_same(const std::string& what, const std::string& text);

 private:
  DistEnv env_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace anvil::dist
