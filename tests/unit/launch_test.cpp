// anvil launch: the built binary starting shell commands as ranks (CPU only), and its pieces in process.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <regex>
#include <set>
#include <sstream>

#include "dist/launcher.hpp"
#include "test_util.hpp"

namespace anvil::dist {
namespace {

using Clock = std::chrono::steady_clock;

using test::run_shell;

// `anvil launch ARGS`, with `env` (NAME=value ...) set for the launcher and OMP_NUM_THREADS unset.
test::CommandResult launch_cmd(const std::string& args, const std::string& env = "") {
  return run_shell("env -u OMP_NUM_THREADS -u CUDA_VISIBLE_DEVICES " + env + " " + ANVIL_BINARY + " launch " +
                   args);
}

std::vector<std::string> lines_starting(const std::string& output, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(prefix)) out.push_back(line);
  std::sort(out.begin(), out.end());
  return out;
}

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(Launch, EachRankGetsItsEnvironment) {
  const test::CommandResult r = launch_cmd(
      "--nproc_per_node 3 --master_port 0 -- sh -c 'echo \"env rank=$RANK world=$WORLD_SIZE "
      "local=$LOCAL_RANK "
      "lws=$LOCAL_WORLD_SIZE group=$GROUP_RANK addr=$MASTER_ADDR port=$MASTER_PORT omp=$OMP_NUM_THREADS "
      "inherited=$FROM_PARENT nvls=$NCCL_NVLS_ENABLE\"'",
      "FROM_PARENT=kept NCCL_NVLS_ENABLE=0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> lines = lines_starting(r.output, "env ");
  ASSERT_EQ(lines.size(), 3u) << r.output;
  const std::regex pattern(
      "env rank=(\\d) world=3 local=(\\d) lws=3 group=0 addr=127.0.0.1 port=(\\d+) omp=(\\d+) inherited=kept "
      "nvls=0");
  std::set<std::string> ports;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(lines[i], m, pattern)) << lines[i];
    EXPECT_EQ(m[1], std::to_string(i));
    EXPECT_EQ(m[2], std::to_string(i));  // one node: local rank = rank
    EXPECT_GE(std::stoi(m[4]), 1);
    ports.insert(m[3]);
  }
  ASSERT_EQ(ports.size(), 1u) << "every rank gets the same port";
  EXPECT_GT(std::stoi(*ports.begin()), 0);  // --master_port 0 picked a real port
  // OMP_NUM_THREADS was unset: the launcher says so once.
  EXPECT_EQ(count(r.output, "OMP_NUM_THREADS is not set"), 1u) << r.output;
}

TEST(Launch, SecondNodeRanksAndAnExplicitOmpNumThreads) {
  const test::CommandResult r = launch_cmd(
      "--nnodes 2 --node_rank 1 --master_addr 10.1.2.3 --master_port 29999 --nproc_per_node 2 -- sh -c 'echo "
      "\"env $RANK/$WORLD_SIZE $LOCAL_RANK/$LOCAL_WORLD_SIZE $GROUP_RANK/$GROUP_WORLD_SIZE "
      "$MASTER_ADDR:$MASTER_PORT "
      "$OMP_NUM_THREADS\"'",
      "OMP_NUM_THREADS=5");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_starting(r.output, "env "), (std::vector<std::string>{"env 2/4 0/2 1/2 10.1.2.3:29999 5",
                                                                        "env 3/4 1/2 1/2 10.1.2.3:29999 5"}));
  EXPECT_EQ(r.output.find("OMP_NUM_THREADS is not set"), std::string::npos) << r.output;
}

TEST(Launch, FailingRankStopsTheOthers) {
  const auto start = Clock::now();
  const test::CommandResult r = launch_cmd(
      "--nproc_per_node 3 --master_port 0 -- sh -c 'if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 3; fi; sleep "
      "60'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(seconds_since(start), 8.0) << "the sleeping ranks were not stopped";
  const std::regex line("anvil launch: rank 1 \\(pid \\d+\\) exited with code 3; stopping the other ranks\n");
  EXPECT_TRUE(std::regex_search(r.output, line)) << r.output;
  EXPECT_EQ(count(r.output, "anvil launch: rank"), 1u) << "only the first failure is reported\n" << r.output;
}

TEST(Launch, RankKilledByASignal) {
  const test::CommandResult r = launch_cmd(
      "--nproc_per_node 2 --master_port 0 -- sh -c 'if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; sleep 60'");
  EXPECT_EQ(r.exit_code, 128 + 9) << r.output;
  EXPECT_TRUE(
      std::regex_search(r.output, std::regex("rank 0 \\(pid \\d+\\) was killed by signal 9 \\(SIGKILL\\)")))
      << r.output;
}

// A rank that ignores SIGTERM gets SIGKILL after --kill_timeout.
TEST(Launch, KillTimeoutEscalatesToSigkill) {
  const auto start = Clock::now();
  const test::CommandResult r = launch_cmd(
      "--nproc_per_node 2 --master_port 0 --kill_timeout 1 -- sh -c 'trap \"\" TERM; if [ \"$RANK\" = 1 ]; "
      "then "
      "sleep 0.2; exit 2; fi; sleep 60'");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_GE(seconds_since(start), 1.0);
  EXPECT_LT(seconds_since(start), 8.0);
  EXPECT_TRUE(
      std::regex_search(r.output, std::regex("rank 0 \\(pid \\d+\\) still runs 1 s after SIGTERM; sending "
                                             "SIGKILL")))
      << r.output;
}

TEST(Launch, AllRanksSucceed) {
  const test::CommandResult r = launch_cmd("--nproc_per_node 4 --master_port 0 -- true");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("anvil launch: rank"), std::string::npos) << r.output;
}

// SIGTERM to the launcher reaches every rank; the launcher exits 128 + 15.
TEST(Launch, SignalsToTheLauncherAreForwarded) {
  test::TempDir dir;
  test::write_file(dir / "rank.sh",
                   "trap 'echo \"rank $RANK got TERM\"; exit 0' TERM\n"
                   "touch \"$READY_DIR/ready.$RANK\"\n"
                   "sleep 60 &\n"
                   "wait\n");
  test::write_file(dir / "driver.sh", "env -u OMP_NUM_THREADS READY_DIR=" + dir.str() + " " + ANVIL_BINARY +
                                          " launch --nproc_per_node 2 --master_port 0 -- sh " +
                                          (dir / "rank.sh") +
                                          " &\n"
                                          "pid=$!\n"
                                          "for i in $(seq 100); do\n"
                                          "  [ -e " +
                                          (dir / "ready.0") + " ] && [ -e " + (dir / "ready.1") +
                                          " ] && break\n"
                                          "  sleep 0.1\n"
                                          "done\n"
                                          "kill -TERM $pid\n"
                                          "wait $pid\n"
                                          "echo \"launcher exit $?\"\n");
  const auto start = Clock::now();
  const test::CommandResult r = run_shell("sh " + (dir / "driver.sh"));
  EXPECT_LT(seconds_since(start), 15.0);
  EXPECT_NE(r.output.find("anvil launch: got SIGTERM; passing it on to the ranks"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank 0 got TERM"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank 1 got TERM"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launcher exit 143"), std::string::npos) << r.output;
}

// Without --, the children run this anvil with the given command.
TEST(Launch, RunsAnAnvilCommand) {
  const test::CommandResult r = launch_cmd("--nproc_per_node 2 --master_port 0 estimate --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "--gpu_memory"), 2u) << r.output;
}

TEST(Launch, IncludeAndExcludeSelectGpus) {
  const std::string show = "--master_port 0 -- sh -c 'echo \"env $RANK/$WORLD_SIZE $CUDA_VISIBLE_DEVICES\"'";
  test::CommandResult r = launch_cmd("--include localhost:0,2 " + show, "CUDA_VISIBLE_DEVICES=4,5,6,7");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_starting(r.output, "env "), (std::vector<std::string>{"env 0/2 4,6", "env 1/2 4,6"}));
  r = launch_cmd("--exclude localhost:1 " + show, "CUDA_VISIBLE_DEVICES=4,5,6,7");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_starting(r.output, "env "),
            (std::vector<std::string>{"env 0/3 4,6,7", "env 1/3 4,6,7", "env 2/3 4,6,7"}));
  r = launch_cmd("--nproc_per_node gpu " + show, "CUDA_VISIBLE_DEVICES=0,1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(lines_starting(r.output, "env "), (std::vector<std::string>{"env 0/2 0,1", "env 1/2 0,1"}));
}

// Bad options: one line naming the option and the value, exit status 1, nothing started.
void expect_launch_error(const std::string& args, const std::string& message, const std::string& env = "") {
  const test::CommandResult r = launch_cmd(args, env);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
  EXPECT_TRUE(r.output.starts_with("error: ")) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << "expected '" << message << "' in:\n" << r.output;
  EXPECT_EQ(r.output.find("started"), std::string::npos) << r.output;
}

TEST(Launch, BadOptionsAreNamed) {
  const std::string child = " -- sh -c 'echo started'";
  expect_launch_error("--nnodes 2 --node_rank 2 --master_addr h" + child, "--node_rank 2 with --nnodes 2");
  expect_launch_error("--nproc_per_node 0" + child,
                      "--nproc_per_node must be a positive integer or gpu, got 0");
  expect_launch_error("--nproc_per_node many" + child,
                      "--nproc_per_node must be a positive integer or gpu, got many");
  expect_launch_error("--nnodes 0" + child, "--nnodes must be a positive integer, got 0");
  expect_launch_error("--master_port 70000" + child, "--master_port must be at most 65535, got 70000");
  expect_launch_error("--master_port 0 --nnodes 2 --master_addr h" + child,
                      "--master_port 0 with --nnodes 2");
  expect_launch_error("--kill_timeout -1" + child, "--kill_timeout must be a non-negative integer, got -1");
  expect_launch_error("--nproc_per_nod 2" + child,
                      "unknown flag --nproc_per_nod (did you mean --nproc_per_node?)");
  expect_launch_error("", "give the command to run");
  expect_launch_error("--nproc_per_node 2 --", "give the program to run after --");
  expect_launch_error("trian --max_steps 1", "'trian' is not an anvil command (did you mean 'train'?)");
  expect_launch_error("-- no-such-program-anvil-test", "no-such-program-anvil-test: no such program in PATH");
  expect_launch_error("--include otherhost:0" + child, "otherhost is not this host");
  expect_launch_error("--include localhost:0,5" + child,
                      "--include localhost:0,5: there is no GPU 5: 2 GPU(s)", "CUDA_VISIBLE_DEVICES=0,1");
  expect_launch_error("--include localhost:0 --exclude localhost:1" + child, "give one of them",
                      "CUDA_VISIBLE_DEVICES=0,1");
  expect_launch_error("--exclude localhost:0,1" + child, "no GPU is left to run on",
                      "CUDA_VISIBLE_DEVICES=0,1");
  expect_launch_error("--nproc_per_node 3 --include localhost:0,1" + child, "disagree",
                      "CUDA_VISIBLE_DEVICES=0,1");
  expect_launch_error("--nproc_per_node gpu" + child, "no GPU is visible here", "CUDA_VISIBLE_DEVICES=");
}

TEST(Launch, ChildEnvironmentReplacesTheJobVariables) {
  LaunchOptions o;
  o.command = {"true"};
  o.nproc_per_node = 2;
  o.nnodes = 3;
  o.node_rank = 2;
  o.master_addr = "head";
  o.master_port = 1234;
  o.cuda_visible_devices = "3,1";
  const std::vector<std::string> env =
      child_environment(o, 1, {"PATH=/bin", "RANK=99", "NCCL_NVLS_ENABLE=0", "EMPTY="}, 4);
  const std::set<std::string> got(env.begin(), env.end());
  EXPECT_EQ(got, (std::set<std::string>{"PATH=/bin", "NCCL_NVLS_ENABLE=0", "EMPTY=", "RANK=5", "LOCAL_RANK=1",
                                        "WORLD_SIZE=6", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=2",
                                        "GROUP_WORLD_SIZE=3", "MASTER_ADDR=head", "MASTER_PORT=1234",
                                        "CUDA_VISIBLE_DEVICES=3,1", "OMP_NUM_THREADS=4"}));
  EXPECT_EQ(env.size(), got.size());  // each variable once
}

TEST(Launch, SelectGpus) {
  const std::vector<std::string> four = {"0", "1", "2", "3"};
  using L = std::vector<std::string>;
  EXPECT_EQ(select_gpus("localhost:2,0", "", four), (L{"2", "0"}));
  EXPECT_EQ(select_gpus("localhost", "", four), four);
  EXPECT_EQ(select_gpus("127.0.0.1:3", "", four), (L{"3"}));
  EXPECT_EQ(select_gpus("", "localhost:0,3", four), (L{"1", "2"}));
  EXPECT_EQ(select_gpus("", "localhost:1", {"GPU-a", "GPU-b"}), (L{"GPU-a"}));
  test::expect_error([&] { select_gpus("localhost:1,1", "", four); }, {"GPU 1 is named twice"});
  test::expect_error([&] { select_gpus("localhost:x", "", four); }, {"'x' is not a GPU index"});
  test::expect_error([&] { select_gpus("localhost:0@worker-1:0", "", four); }, {"worker-1 is not this host"});
  test::expect_error([&] { select_gpus("", "localhost", four); }, {"no GPU is left"});
  test::expect_error([&] { select_gpus("localhost:0", "", {}); }, {"no GPU"});
}

TEST(Launch, ValidateOptions) {
  LaunchOptions o;
  o.command = {"true"};
  validate_launch_options(o);
  o.node_rank = 1;
  test::expect_error([&] { validate_launch_options(o); }, {"--node_rank 1 with --nnodes 1"});
  o.node_rank = 0, o.command.clear();
  test::expect_error([&] { validate_launch_options(o); }, {"give the command to run"});
}

}  // namespace
}  // namespace anvil::dist
