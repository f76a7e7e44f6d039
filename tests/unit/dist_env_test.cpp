// Where a process stands in a job, read from each launcher family's variables (a fake environment).
#include "dist/dist_env.hpp"

#include <gtest/gtest.h>

#include <map>

#include "test_util.hpp"

namespace anvil::dist {
namespace {

using Vars = std::map<std::string, std::string>;

DistEnv read(const Vars& vars) {
  return read_dist_env([&](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

void expect_env(const DistEnv& d, int rank, int world, int local_rank, int local_world, int node, int nodes,
                const std::string& addr, int port, const std::string& launcher) {
  EXPECT_EQ(d.rank, rank);
  EXPECT_EQ(d.world_size, world);
  EXPECT_EQ(d.local_rank, local_rank);
  EXPECT_EQ(d.local_world_size, local_world);
  EXPECT_EQ(d.node_rank, node);
  EXPECT_EQ(d.num_nodes, nodes);
  EXPECT_EQ(d.master_addr, addr);
  EXPECT_EQ(d.master_port, port);
  EXPECT_EQ(d.launcher, launcher);
}

TEST(DistEnv, NoLauncherIsOneProcess) {
  const DistEnv d = read({{"PATH", "/usr/bin"}, {"SLURM_JOB_ID", "12"}});
  expect_env(d, 0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "none");
  EXPECT_FALSE(d.distributed());
}

TEST(DistEnv, Torchrun) {
  const DistEnv d = read({{"RANK", "5"},
                          {"WORLD_SIZE", "8"},
                          {"LOCAL_RANK", "1"},
                          {"LOCAL_WORLD_SIZE", "4"},
                          {"GROUP_RANK", "1"},
                          {"MASTER_ADDR", "node0"},
                          {"MASTER_PORT", "1234"}});
  expect_env(d, 5, 8, 1, 4, 1, 2, "node0", 1234, "torchrun");
  EXPECT_TRUE(d.distributed());
}

TEST(DistEnv, AnvilLaunchSetsTheNumberOfNodes) {
  const DistEnv d = read({{"RANK", "2"},
                          {"WORLD_SIZE", "3"},
                          {"LOCAL_RANK", "2"},
                          {"LOCAL_WORLD_SIZE", "3"},
                          {"GROUP_RANK", "0"},
                          {"GROUP_WORLD_SIZE", "1"},
                          {"MASTER_ADDR", "127.0.0.1"},
                          {"MASTER_PORT", "41000"}});
  expect_env(d, 2, 3, 2, 3, 0, 1, "127.0.0.1", 41000, "torchrun");
}

// One node: LOCAL_WORLD_SIZE, GROUP_RANK and MASTER_* may be left out.
TEST(DistEnv, TorchrunOneNodeDefaults) {
  const DistEnv d = read({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}});
  expect_env(d, 1, 2, 1, 2, 0, 1, "127.0.0.1", 29500, "torchrun");
}

// The DeepSpeed launcher's names for the local size and the node.
TEST(DistEnv, DeepSpeedLauncher) {
  const DistEnv d = read({{"RANK", "3"},
                          {"WORLD_SIZE", "4"},
                          {"LOCAL_RANK", "1"},
                          {"LOCAL_SIZE", "2"},
                          {"CROSS_RANK", "1"},
                          {"CROSS_SIZE", "2"},
                          {"MASTER_ADDR", "10.0.0.1"},
                          {"MASTER_PORT", "29501"}});
  expect_env(d, 3, 4, 1, 2, 1, 2, "10.0.0.1", 29501, "torchrun");
}

TEST(DistEnv, TorchrunErrorsNameTheVariable) {
  const Vars base = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}};
  auto with = [&](const std::string& k, const std::string& v) {
    Vars vars = base;
    vars[k] = v;
    return vars;
  };
  test::expect_error([&] { read(with("RANK", "2")); }, {"RANK=2 is not a rank of WORLD_SIZE=2 (0 to 1)"});
  test::expect_error([&] { read(with("RANK", "-1")); }, {"RANK=-1"});
  test::expect_error([&] { read(with("RANK", "one")); }, {"RANK=\"one\" is not an integer"});
  test::expect_error([&] { read(with("WORLD_SIZE", "0")); }, {"WORLD_SIZE=0"});
  test::expect_error([&] { read(with("LOCAL_WORLD_SIZE", "3")); },
                     {"LOCAL_WORLD_SIZE=3 does not fit WORLD_SIZE=2"});
  test::expect_error([&] { read(with("LOCAL_RANK", "2")); },
                     {"LOCAL_RANK=2 is not a local rank", "(0 to 1)"});
  test::expect_error([&] { read(with("MASTER_PORT", "70000")); }, {"MASTER_PORT=70000 is not a TCP port"});
  test::expect_error([&] { read(with("MASTER_PORT", "http")); }, {"MASTER_PORT=\"http\" is not an integer"});
  Vars no_local = base;
  no_local.erase("LOCAL_RANK");
  test::expect_error([&] { read(no_local); }, {"LOCAL_RANK is not set", "torchrun"});
  test::expect_error([&] { read({{"WORLD_SIZE", "2"}}); }, {"RANK is not set"});
  // Several nodes: LOCAL_WORLD_SIZE and MASTER_ADDR are needed.
  test::expect_error([&] { read(with("GROUP_RANK", "1")); }, {"LOCAL_WORLD_SIZE is not set", "GROUP_RANK=1"});
  Vars two_nodes = with("LOCAL_WORLD_SIZE", "1");
  test::expect_error([&] { read(two_nodes); }, {"MASTER_ADDR is not set", "2 nodes"});
  two_nodes["GROUP_RANK"] = "2";
  two_nodes["MASTER_ADDR"] = "n0";
  test::expect_error([&] { read(two_nodes); }, {"GROUP_RANK=2 is not a node"});
}

// A variable set to "" counts as unset (shells export empty values).
TEST(DistEnv, EmptyVariablesAreUnset) {
  expect_env(read({{"RANK", ""}, {"WORLD_SIZE", ""}}), 0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "none");
}

TEST(DistEnv, OpenMpi) {
  const DistEnv d = read({{"OMPI_COMM_WORLD_RANK", "6"},
                          {"OMPI_COMM_WORLD_SIZE", "8"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                          {"MASTER_ADDR", "head"},
                          {"MASTER_PORT", "29600"}});
  expect_env(d, 6, 8, 2, 4, 1, 2, "head", 29600, "mpirun");
  // One node: MASTER_ADDR may be left out.
  expect_env(read({{"OMPI_COMM_WORLD_RANK", "1"},
                   {"OMPI_COMM_WORLD_SIZE", "2"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
             1, 2, 1, 2, 0, 1, "127.0.0.1", 29500, "mpirun");
}

TEST(DistEnv, OpenMpiErrors) {
  const Vars two_nodes = {{"OMPI_COMM_WORLD_RANK", "0"},
                          {"OMPI_COMM_WORLD_SIZE", "4"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  test::expect_error([&] { read(two_nodes); }, {"MASTER_ADDR is not set", "mpirun -x MASTER_ADDR"});
  test::expect_error(
      [&] {
        read({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "0"}});
      },
      {"OMPI_COMM_WORLD_LOCAL_RANK is not set", "mpirun"});
  Vars bad = two_nodes;
  bad["MASTER_ADDR"] = "h";
  bad["OMPI_COMM_WORLD_LOCAL_RANK"] = "2";
  test::expect_error([&] { read(bad); },
                     {"OMPI_COMM_WORLD_LOCAL_RANK=2 is not a local rank of OMPI_COMM_WORLD_LOCAL_SIZE=2"});
}

Vars srun_task() {
  return {{"SLURM_JOB_ID", "77"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_PROCID", "5"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"},
          {"SLURM_NTASKS", "8"},
          {"SLURM_TASKS_PER_NODE", "4(x2)"},
          {"SLURM_NNODES", "2"},
          {"SLURM_JOB_NODELIST", "gpu[07-08]"},
          {"SLURM_STEP_NODELIST", "gpu[07-08]"}};
}

TEST(DistEnv, SlurmSrunTask) {
  expect_env(read(srun_task()), 5, 8, 1, 4, 1, 2, "gpu07", 29500, "slurm");
  Vars with_master = srun_task();
  with_master["MASTER_ADDR"] = "login";
  with_master["MASTER_PORT"] = "30000";
  expect_env(read(with_master), 5, 8, 1, 4, 1, 2, "login", 30000, "slurm");
}

// Uneven nodes, and the step's values over the job's (a step may use part of the allocation).
TEST(DistEnv, SlurmStepValuesAndUnevenNodes) {
  Vars v = srun_task();
  v["SLURM_STEP_NUM_TASKS"] = "11";
  v["SLURM_STEP_TASKS_PER_NODE"] = "4(x2),3";
  v["SLURM_STEP_NUM_NODES"] = "3";
  v["SLURM_STEP_NODELIST"] = "n[3-5]";
  v["SLURM_PROCID"] = "9";
  v["SLURM_NODEID"] = "2";
  v["SLURM_LOCALID"] = "1";
  expect_env(read(v), 9, 11, 1, 3, 2, 3, "n3", 29500, "slurm");
}

// A batch script (no srun) sees SLURM_PROCID and SLURM_NTASKS of the allocation but is one process.
TEST(DistEnv, SlurmBatchScriptIsOneProcess) {
  Vars v = srun_task();
  v.erase("SLURM_STEP_ID");
  v["SLURM_PROCID"] = "0";
  expect_env(read(v), 0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "none");
}

TEST(DistEnv, SlurmContradictions) {
  Vars v = srun_task();
  v["SLURM_TASKS_PER_NODE"] = "4,3";
  test::expect_error([&] { read(v); }, {"SLURM_TASKS_PER_NODE=\"4,3\" counts 7 tasks, but SLURM_NTASKS=8"});
  v = srun_task();
  v["SLURM_NNODES"] = "3";
  test::expect_error([&] { read(v); }, {"SLURM_TASKS_PER_NODE=\"4(x2)\" lists 2 nodes, but SLURM_NNODES=3"});
  v = srun_task();
  v["SLURM_TASKS_PER_NODE"] = "4(2)";
  test::expect_error([&] { read(v); }, {"SLURM_TASKS_PER_NODE=\"4(2)\" is not a list of task counts"});
  v = srun_task();
  v["SLURM_LOCALID"] = "4";
  test::expect_error([&] { read(v); }, {"SLURM_LOCALID=4 is not a local rank"});
  v = srun_task();
  v["SLURM_NODEID"] = "2";
  test::expect_error([&] { read(v); }, {"SLURM_NODEID=2 is not a node"});
  v = srun_task();
  v.erase("SLURM_STEP_NODELIST");
  v.erase("SLURM_JOB_NODELIST");
  test::expect_error([&] { read(v); }, {"MASTER_ADDR", "SLURM_STEP_NODELIST"});
}

// The first family found wins: torchrun started by srun sets RANK for its workers.
TEST(DistEnv, TorchrunBeforeMpiBeforeSlurm) {
  Vars v = srun_task();
  v["OMPI_COMM_WORLD_RANK"] = "0";
  v["OMPI_COMM_WORLD_SIZE"] = "1";
  v["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";
  v["OMPI_COMM_WORLD_LOCAL_SIZE"] = "1";
  EXPECT_EQ(read(v).launcher, "mpirun");
  v["RANK"] = "0", v["WORLD_SIZE"] = "1", v["LOCAL_RANK"] = "0";
  EXPECT_EQ(read(v).launcher, "torchrun");
}

TEST(DistEnv, SlurmNodelistExpansion) {
  using L = std::vector<std::string>;
  EXPECT_EQ(expand_slurm_nodelist("node[01-03,07],gpu-a"),
            (L{"node01", "node02", "node03", "node07", "gpu-a"}));
  EXPECT_EQ(expand_slurm_nodelist("a[8-10]"), (L{"a8", "a9", "a10"}));
  EXPECT_EQ(expand_slurm_nodelist("n[098-101]"), (L{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_slurm_nodelist("rack[1-2]-n[1,3]"), (L{"rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"}));
  EXPECT_EQ(expand_slurm_nodelist("single"), (L{"single"}));
  EXPECT_EQ(expand_slurm_nodelist("x[5]"), (L{"x5"}));
  EXPECT_EQ(expand_slurm_nodelist(""), L{});
}

TEST(DistEnv, SlurmNodelistErrors) {
  test::expect_error([] { expand_slurm_nodelist("node[3-1]"); }, {"node[3-1]", "runs backwards"});
  test::expect_error([] { expand_slurm_nodelist("node[01"); }, {"node[01", "'[' without ']'"});
  test::expect_error([] { expand_slurm_nodelist("node]"); }, {"unbalanced"});
  test::expect_error([] { expand_slurm_nodelist("node[a-b]"); }, {"'a' in [a-b] is not a number"});
  test::expect_error([] { expand_slurm_nodelist("a,,b"); }, {"an empty host name"});
  test::expect_error([] { expand_slurm_nodelist("n[[1]]"); }, {"unbalanced"});
}

}  // namespace
}  // namespace anvil::dist
