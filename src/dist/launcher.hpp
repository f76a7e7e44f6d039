// `anvil launch`: runs one node's processes of a job, with torchrun's semantics (DESIGN: src/dist/
// "launch"). Each child gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT (what read_dist_env reads), and otherwise the launcher's environment
// unchanged. The launcher waits for them: when one fails (exits non-zero or by a signal) it says which,
// stops the others (SIGTERM, then SIGKILL after the kill timeout) and exits with that child's code; SIGINT
// and SIGTERM sent to the launcher are passed on to the children.
//
// Each child runs in a process group of its own, so that stopping it also stops what it started (a shell's
// commands, say); Ctrl-C reaches the children through the launcher, and they cannot read the terminal. A
// child also gets SIGKILL if the launcher dies without stopping it (PR_SET_PDEATHSIG).
#pragma once
#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace anvil::dist {

struct LaunchOptions {
  // What each child runs: a program (a path, or a name looked up in PATH) and its arguments.
  std::vector<std::string> command;
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";            // must name node 0's host when nnodes > 1
  int master_port = 29500;                          // 0: a free port of this host (one node only)
  std::optional<std::string> cuda_visible_devices;  // CUDA_VISIBLE_DEVICES for the children (--include)
  std::chrono::seconds kill_timeout{30};            // grace after SIGTERM before SIGKILL
};

// Throws anvil::Error naming the option (as `anvil launch` spells it) and the value when an option is out
// of range or contradicts another (--node_rank 2 with --nnodes 2).
void validate_launch_options(const LaunchOptions& options);

// The environment of the child with local rank `local_rank`: `inherited` ("NAME=value" entries) with the
// job's variables set, replacing inherited ones of the same names; OMP_NUM_THREADS=`omp_threads` is added
// when given. master_port must be resolved (not 0).
std::vector<std::string> child_environment(const LaunchOptions& options, int local_rank,
                                           const std::vector<std::string>& inherited,
                                           std::optional<int> omp_threads);

// DeepSpeed's --include / --exclude, for this host only: "localhost:0,2" (those GPUs), "localhost" (all of
// them); the host may also be this host's name. `visible` lists the GPUs this process sees (see
// visible_gpus()); the result is the CUDA_VISIBLE_DEVICES entries of the GPUs selected, in the order given
// (--include) or in `visible`'s order (--exclude). Exactly one of `include` and `exclude` is non-empty.
std::vector<std::string> select_gpus(const std::string& include, const std::string& exclude,
                                     const std::vector<std::string>& visible);

// The GPUs this process sees, as CUDA_VISIBLE_DEVICES entries: that variable's entries when it is set,
// else "0" to "N-1" for the N GPUs CUDA counts (none in a build without CUDA).
std::vector<std::string> visible_gpus();

// A TCP port of this host that is free now: a random one below the kernel's ephemeral range, so that no
// port-0 bind of another process (Gloo's connections, clients) takes it before the job's store binds it;
// an ephemeral one (the kernel's pick) when that range leaves no room.
int free_tcp_port();

// Starts options.nproc_per_node children and waits for all of them. Returns 0 when every child exited 0;
// else the exit code of the first child that failed (128 + N for signal N), after stopping the others; or
// 128 + N when the launcher got signal N (SIGINT, SIGTERM) and stopped them. Throws anvil::Error for bad
// options or a command that cannot run (after stopping the children already started).
int launch(const LaunchOptions& options);

}  // namespace anvil::dist
