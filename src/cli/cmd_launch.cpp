// anvil launch: runs an anvil command (or, after --, any program) as the processes of a distributed job on
// this host, with torchrun's environment and failure semantics (src/dist/launcher.hpp):
//   anvil launch --nproc_per_node 8 train --config run.json
//   anvil launch --nnodes 2 --node_rank 0 --master_addr node0 --nproc_per_node gpu train ...
//   anvil launch --include localhost:0,2 train ...     (DeepSpeed's syntax, this host only)
//   anvil launch --nproc_per_node 3 --master_port 0 -- sh -c 'echo $RANK'
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <memory>
#include <system_error>

#include "anvil/error.hpp"
#include "anvil/train_config.hpp"
#include "cli/command.hpp"
#include "cli/help.hpp"
#include "dist/launcher.hpp"

namespace anvil::cli {
namespace {

struct LaunchFlags {
  std::string nproc_per_node = "1";
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string include, exclude;
  int kill_timeout = 30;
  std::string command;  // only documents the positional: the command line is read from remaining()
  CLI::Option* nproc_option = nullptr;
};

// This executable, for the children of `anvil launch SUBCOMMAND`.
std::string self_executable() {
  std::string path(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
  if (n < 0)
    ANVIL_THROW("anvil launch: cannot find this executable: readlink /proc/self/exe failed: {}",
                std::generic_category().message(errno));
  ANVIL_REQUIRE(static_cast<size_t>(n) < path.size(),
                "anvil launch: the path of this executable is too long");
  path.resize(static_cast<size_t>(n));
  return path;
}

int parse_nproc(const std::string& value) {
  if (value == "gpu") {
    const size_t gpus = dist::visible_gpus().size();
    ANVIL_REQUIRE(gpus > 0, "--nproc_per_node gpu: no GPU is visible here; give a number of processes");
    return static_cast<int>(gpus);
  }
  int n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  ANVIL_REQUIRE(!value.empty() && ec == std::errc() && end == value.data() + value.size() && n >= 1,
                "--nproc_per_node must be a positive integer or gpu, got {}", value);
  return n;
}

// The command each child runs, from what follows the options: "-- PROGRAM ARGS..." or "COMMAND ARGS...".
std::vector<std::string> child_command(const std::vector<std::string>& rest, CLI::App& launch,
                                       CLI::App& root) {
  ANVIL_REQUIRE(
      !rest.empty(),
      "anvil launch: give the command to run: anvil launch [options] COMMAND ARGS... (an anvil command) "
      "or anvil launch [options] -- PROGRAM ARGS...");
  if (rest.front() == "--") {
    ANVIL_REQUIRE(rest.size() > 1, "anvil launch: give the program to run after --");
    return {rest.begin() + 1, rest.end()};
  }
  const std::string& first = rest.front();
  // Parsing stops at the first argument that is not one of launch's options: a misspelt option ends here.
  if (first.size() > 1 && first.front() == '-') {
    std::vector<std::string> names;
    for (const CLI::Option* opt : launch.get_options())
      for (const std::string& name : opt->get_lnames())
        if (name != "help") names.push_back(name);
    const std::string flag = first.substr(0, first.find('='));
    const std::string near = nearest_key(flag.substr(flag.find_first_not_of('-')), names);
    if (!near.empty()) ANVIL_THROW("unknown flag {} (did you mean --{}?)", flag, near);
    ANVIL_THROW("unknown flag {}; run 'anvil launch --help' for the flags", flag);
  }
  std::vector<std::string> commands;
  for (const CLI::App* sub : root.get_subcommands([](CLI::App*) { return true; }))
    if (sub->get_name() != "launch") commands.push_back(sub->get_name());
  ANVIL_REQUIRE(first != "launch", "anvil launch launch: launch runs other commands, not itself");
  if (std::find(commands.begin(), commands.end(), first) == commands.end()) {
    const std::string near = nearest_key(first, commands);
    ANVIL_THROW(
        "anvil launch: '{}' is not an anvil command{}; to run another program put -- before it: anvil "
        "launch [options] -- PROGRAM ARGS...",
        first, near.empty() ? "" : " (did you mean '" + near + "'?)");
  }
  std::vector<std::string> command = {self_executable()};
  command.insert(command.end(), rest.begin(), rest.end());
  return command;
}

Command make_launch(CLI::App& parent) {
  auto f = std::make_shared<LaunchFlags>();
  CLI::App* app = parent.add_subcommand(
      "launch", "run an anvil command as the processes of a multi-GPU / multi-process job, like torchrun");
  // Everything from the first argument that is not a launch option on is the children's command line.
  app->prefix_command();
  // The positional only documents that command line: it refuses every value, so that CLI11 leaves the
  // arguments to remaining() (and keeps a leading "--" there, which marks a program).
  app->validate_positionals();
  app->add_option(
         "command", f->command,
         "the anvil command to run and its arguments (anvil launch train --config c.json), or -- and a "
         "program with its arguments (anvil launch -- python script.py)")
      ->type_name("COMMAND ARGS... | -- PROGRAM ARGS...")
      ->check(CLI::Validator([](std::string&) { return std::string("not an option"); }, ""));
  f->nproc_option =
      app->add_option(
             "--nproc_per_node,--num_gpus", f->nproc_per_node,
             "processes on this node: a number, or gpu for one per visible GPU (--num_gpus: DeepSpeed's "
             "name)")
          ->type_name("N|gpu");
  app->add_option("--nnodes", f->nnodes, "nodes of the job; run anvil launch once on each")
      ->check(positive_integer(INT_MAX));
  app->add_option("--node_rank", f->node_rank, "this node's index, 0 to nnodes - 1")
      ->check(non_negative_integer(INT_MAX));
  app->add_option("--master_addr", f->master_addr,
                  "host of node 0, where rank 0 serves the job's store; every node must reach it")
      ->type_name("HOST");
  app->add_option("--master_port", f->master_port,
                  "port of the job's store on the master host; 0 picks a free one (one node only)")
      ->check(integer_between(0, 65535));
  app->add_option(
         "--include", f->include,
         "run on these GPUs of this host, in DeepSpeed's syntax: localhost:0,2 (sets CUDA_VISIBLE_DEVICES "
         "and one process per GPU)")
      ->type_name("HOST:IDS");
  app->add_option("--exclude", f->exclude,
                  "run on every visible GPU but these, in DeepSpeed's syntax: localhost:1 (sets "
                  "CUDA_VISIBLE_DEVICES and one process per GPU)")
      ->type_name("HOST:IDS");
  app->add_option("--kill_timeout", f->kill_timeout,
                  "seconds a rank gets to exit after SIGTERM (when another rank failed) before SIGKILL")
      ->check(non_negative_integer(INT_MAX));
  return {
      app, [f, app, &parent] {
        dist::LaunchOptions o;
        o.command = child_command(app->remaining(), *app, parent);
        o.nnodes = f->nnodes;
        o.node_rank = f->node_rank;
        o.master_addr = f->master_addr;
        o.master_port = f->master_port;
        o.kill_timeout = std::chrono::seconds(f->kill_timeout);
        if (!f->include.empty() || !f->exclude.empty()) {
          const std::vector<std::string> gpus =
              dist::select_gpus(f->include, f->exclude, dist::visible_gpus());
          const std::string flag = f->include.empty() ? "--exclude " + f->exclude : "--include " + f->include;
          ANVIL_REQUIRE(f->nproc_option->count() == 0 ||
                            parse_nproc(f->nproc_per_node) == static_cast<int>(gpus.size()),
                        "--nproc_per_node {} and {} ({} GPU(s)) disagree: {} runs one process per GPU, drop "
                        "--nproc_per_node",
                        f->nproc_per_node, flag, gpus.size(), flag.substr(0, flag.find(' ')));
          o.nproc_per_node = static_cast<int>(gpus.size());
          std::string list;
          for (const std::string& g : gpus) list += (list.empty() ? "" : ",") + g;
          o.cuda_visible_devices = list;
        } else {
          o.nproc_per_node = parse_nproc(f->nproc_per_node);
        }
        return dist::launch(o);
      }};
}

}  // namespace

ANVIL_REGISTER_COMMAND(12, make_launch);

}  // namespace anvil::cli
