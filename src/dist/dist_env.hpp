// Where this process stands in a job, read from what its launcher set (DESIGN: src/dist/ "launch"):
//   torchrun, `anvil launch` and the DeepSpeed launcher: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//     (optional: defaults to WORLD_SIZE when there is one node), GROUP_RANK (optional), MASTER_ADDR,
//     MASTER_PORT;
//   mpirun (Open MPI): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK,
//     OMPI_COMM_WORLD_LOCAL_SIZE, with MASTER_ADDR / MASTER_PORT from the environment (MASTER_ADDR may be
//     left out when every rank is on one node);
//   SLURM under srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE or
//     SLURM_TASKS_PER_NODE, SLURM_NODEID, and the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST
//     as the master address unless MASTER_ADDR is set (a batch script that runs anvil without srun is one
//     process);
//   none of these: one process.
// The first family found in that order wins. Values that are not integers, or that contradict each other
// (RANK >= WORLD_SIZE, a local rank past the local world size, ...), are errors naming the variable.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>
#include <string>

namespace anvil::dist {

struct DistEnv {
  int rank = 0;              // global rank, 0 .. world_size - 1
  int world_size = 1;
  int local_rank = 0;        // rank among this node's processes (the GPU ordinal it uses)
  int local_world_size = 1;  // processes on this node
  int node_rank = 0;         // this node, 0 .. num_nodes - 1
  int num_nodes = 1;
  std::string master_addr = "127.0.0.1";  // where global rank 0 serves the job's store
  int master_port = 29500;
  std::string launcher = "none";  // "torchrun" (also anvil launch / deepspeed), "mpirun", "slurm", "none"

  bool distributed() const { return world_size > 1; }
};

// Reads the environment through `getenv` (the process's by default; tests pass their own).
DistEnv read_dist_env(const std::function<const char*(const char*)>& getenv);
DistEnv read_dist_env();

// The hosts of a SLURM node list ("node[01-03,07],gpu-a"), in order: what SLURM_JOB_NODELIST holds.
std::vector<std::string> expand_slurm_nodelist(const std::string& list);

}  // namespace anvil::dist
