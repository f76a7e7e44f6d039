// Where this process stands in a job, read from what its launcher set (DESIGN: src/dist/ "launch"):
//   torchrun, `anvil launch` and the DeepSpeed launcher (found by RANK or WORLD_SIZE): RANK, WORLD_SIZE,
//     LOCAL_RANK; LOCAL_WORLD_SIZE (DeepSpeed: LOCAL_SIZE; may be left out when there is one node: then
//     WORLD_SIZE); GROUP_RANK (DeepSpeed: CROSS_RANK; default RANK / LOCAL_WORLD_SIZE) and GROUP_WORLD_SIZE
//     (DeepSpeed: CROSS_SIZE; default WORLD_SIZE / LOCAL_WORLD_SIZE rounded up); MASTER_ADDR (may be left
//     out on one node), MASTER_PORT;
//   mpirun of Open MPI (found by OMPI_COMM_WORLD_SIZE): OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//     OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE, with MASTER_ADDR / MASTER_PORT from the
//     environment (MASTER_ADDR may be left out when every rank is on one node). Open MPI tells no node
//     index: ranks are taken to fill one node before the next (mpirun's default mapping), which only
//     node_rank and num_nodes depend on;
//   SLURM under srun (found by SLURM_STEP_ID, which srun sets and a batch script or salloc shell lacks):
//     SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID; the step's SLURM_STEP_NUM_TASKS, SLURM_STEP_TASKS_PER_NODE
//     ("4(x2),3") and SLURM_STEP_NUM_NODES, else the job's SLURM_NTASKS, SLURM_TASKS_PER_NODE (else
//     SLURM_NTASKS_PER_NODE) and SLURM_NNODES; the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST
//     as the master address unless MASTER_ADDR is set. A batch script that runs anvil without srun is one
//     process, although it sees SLURM_PROCID and SLURM_NTASKS;
//   none of these: one process.
// The first family found in that order wins (torchrun started by srun sets RANK for its workers). A
// variable set to "" counts as unset. MASTER_PORT defaults to 29500. Values that are not integers, or that
// contradict each other (RANK >= WORLD_SIZE, a local rank past the local world size, tasks per node that do
// not add up to the number of tasks, ...), are errors naming the variable and its value.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace anvil::dist {

struct DistEnv {
  int rank = 0;  // global rank, 0 .. world_size - 1
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
