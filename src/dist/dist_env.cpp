#include "dist/dist_env.hpp"

#include <charconv>
#include <cstdlib>
#include <optional>
#include <string_view>

#include "anvil/error.hpp"

namespace anvil::dist {
namespace {

// The environment as the launchers leave it; a variable set to "" counts as not set.
class Env {
 public:
  explicit Env(const std::function<const char*(const char*)>& getenv) : getenv_(getenv) {}

  std::optional<std::string> text(const char* name) const {
    const char* v = getenv_(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  }
  bool has(const char* name) const { return text(name).has_value(); }

  std::optional<int> integer(const char* name) const {
    const std::optional<std::string> v = text(name);
    if (!v) return std::nullopt;
    int out = 0;
    const char* end = v->data() + v->size();
    const auto [stop, ec] = std::from_chars(v->data(), end, out);
    ANVIL_REQUIRE(ec == std::errc() && stop == end, "environment variable {}=\"{}\" is not an integer", name,
                  *v);
    return out;
  }

  // `name`, which the launcher family (`family`: why we think it launched us) always sets.
  int required(const char* name, const char* family) const {
    const std::optional<int> v = integer(name);
    ANVIL_REQUIRE(
        v, "environment variable {} is not set, but {}; set {} too, or unset them all to run one process",
        name, family, name);
    return *v;
  }

  // The first of `names` that is set, or nullptr.
  const char* first_set(std::initializer_list<const char*> names) const {
    for (const char* n : names)
      if (has(n)) return n;
    return nullptr;
  }

 private:
  const std::function<const char*(const char*)>& getenv_;
};

// The names a family gives each value, for the messages (derived values are described in words).
struct Names {
  std::string rank, world_size, local_rank, local_world_size, node_rank, num_nodes;
};

// Each value in range, and consistent with the others.
void check(const DistEnv& d, const Names& n) {
  ANVIL_REQUIRE(d.world_size >= 1, "{}={}: a job has at least one process", n.world_size, d.world_size);
  ANVIL_REQUIRE(d.rank >= 0 && d.rank < d.world_size, "{}={} is not a rank of {}={} (0 to {})", n.rank,
                d.rank, n.world_size, d.world_size, d.world_size - 1);
  ANVIL_REQUIRE(d.local_world_size >= 1 && d.local_world_size <= d.world_size,
                "{}={} does not fit {}={}: a node runs 1 to {} of the job's processes", n.local_world_size,
                d.local_world_size, n.world_size, d.world_size, d.world_size);
  ANVIL_REQUIRE(d.local_rank >= 0 && d.local_rank < d.local_world_size,
                "{}={} is not a local rank of {}={} (0 to {})", n.local_rank, d.local_rank,
                n.local_world_size, d.local_world_size, d.local_world_size - 1);
  ANVIL_REQUIRE(d.num_nodes >= 1 && d.num_nodes <= d.world_size,
                "{}={} does not fit {}={}: a job has 1 to {} nodes", n.num_nodes, d.num_nodes, n.world_size,
                d.world_size, d.world_size);
  ANVIL_REQUIRE(d.node_rank >= 0 && d.node_rank < d.num_nodes, "{}={} is not a node of {}={} (0 to {})",
                n.node_rank, d.node_rank, n.num_nodes, d.num_nodes, d.num_nodes - 1);
}

int master_port(const Env& env) {
  const std::optional<int> port = env.integer("MASTER_PORT");
  if (!port) return DistEnv{}.master_port;
  ANVIL_REQUIRE(*port >= 1 && *port <= 65535,
                "environment variable MASTER_PORT={} is not a TCP port (1 to 65535)", *port);
  return *port;
}

// ceil(a / b) for positive b.
int ceil_div(int a, int b) {
  return (a + b - 1) / b;
}

// torchrun, anvil launch, the DeepSpeed launcher (which names the local size LOCAL_SIZE, the node CROSS_RANK
// and the number of nodes CROSS_SIZE).
DistEnv from_torchrun(const Env& env) {
  const char* family =
      "RANK or WORLD_SIZE is (torchrun, anvil launch and the DeepSpeed launcher set them all)";
  DistEnv d;
  d.launcher = "torchrun";
  d.rank = env.required("RANK", family);
  d.world_size = env.required("WORLD_SIZE", family);
  d.local_rank = env.required("LOCAL_RANK", family);
  ANVIL_REQUIRE(d.world_size >= 1, "environment variable WORLD_SIZE={}: a job has at least one process",
                d.world_size);
  const char* local_size_name = env.first_set({"LOCAL_WORLD_SIZE", "LOCAL_SIZE"});
  const char* node_name = env.first_set({"GROUP_RANK", "CROSS_RANK"});
  const char* nodes_name = env.first_set({"GROUP_WORLD_SIZE", "CROSS_SIZE"});
  const int node = node_name ? *env.integer(node_name) : -1;  // -1: not given
  const int nodes = nodes_name ? *env.integer(nodes_name) : -1;
  Names n{"RANK",
          "WORLD_SIZE",
          "LOCAL_RANK",
          local_size_name ? local_size_name : "LOCAL_WORLD_SIZE (unset: WORLD_SIZE)",
          node_name ? node_name : "the node (RANK / LOCAL_WORLD_SIZE)",
          nodes_name ? nodes_name : "the number of nodes (WORLD_SIZE / LOCAL_WORLD_SIZE)"};
  if (local_size_name) {
    d.local_world_size = *env.integer(local_size_name);
    ANVIL_REQUIRE(d.local_world_size >= 1, "environment variable {}={}: a node runs at least one process",
                  local_size_name, d.local_world_size);
  } else {
    // Only a one-node job may leave it out: then every process is on this node.
    const bool later_node = node > 0;
    ANVIL_REQUIRE(
        !later_node && nodes <= 1,
        "environment variable LOCAL_WORLD_SIZE is not set, but {}={} says the job has several nodes: set "
        "LOCAL_WORLD_SIZE to the number of processes on each node",
        later_node ? node_name : nodes_name, later_node ? node : nodes);
    d.local_world_size = d.world_size;
  }
  // Launchers of this family number the ranks node by node.
  d.node_rank = node_name ? node : d.rank / d.local_world_size;
  d.num_nodes = nodes_name ? nodes : ceil_div(d.world_size, d.local_world_size);
  check(d, n);
  d.master_port = master_port(env);
  if (const auto addr = env.text("MASTER_ADDR"))
    d.master_addr = *addr;
  else
    ANVIL_REQUIRE(
        d.num_nodes == 1,
        "environment variable MASTER_ADDR is not set, but the job has {} nodes: set it to the host of "
        "rank 0, which every node can reach",
        d.num_nodes);
  return d;
}

// mpirun of Open MPI. It tells no node index: ranks are taken to fill one node before the next (mpirun's
// default mapping), which only the node numbers depend on.
DistEnv from_open_mpi(const Env& env) {
  const char* family = "OMPI_COMM_WORLD_SIZE is (mpirun of Open MPI sets them all)";
  DistEnv d;
  d.launcher = "mpirun";
  d.rank = env.required("OMPI_COMM_WORLD_RANK", family);
  d.world_size = env.required("OMPI_COMM_WORLD_SIZE", family);
  d.local_rank = env.required("OMPI_COMM_WORLD_LOCAL_RANK", family);
  d.local_world_size = env.required("OMPI_COMM_WORLD_LOCAL_SIZE", family);
  ANVIL_REQUIRE(d.local_world_size >= 1,
                "environment variable OMPI_COMM_WORLD_LOCAL_SIZE={}: a node runs at least one process",
                d.local_world_size);
  d.node_rank = d.rank / d.local_world_size;
  d.num_nodes = ceil_div(d.world_size, d.local_world_size);
  check(d, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE", "the node (OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_LOCAL_SIZE)",
            "the number of nodes (OMPI_COMM_WORLD_SIZE / OMPI_COMM_WORLD_LOCAL_SIZE)"});
  d.master_port = master_port(env);
  if (const auto addr = env.text("MASTER_ADDR"))
    d.master_addr = *addr;
  else
    ANVIL_REQUIRE(
        d.local_world_size == d.world_size,
        "environment variable MASTER_ADDR is not set, but mpirun placed the {} ranks on several nodes "
        "(OMPI_COMM_WORLD_LOCAL_SIZE={}): pass the host of rank 0 to every rank, e.g. mpirun -x "
        "MASTER_ADDR=HOST -x MASTER_PORT=PORT",
        d.world_size, d.local_world_size);
  return d;
}

// "4(x2),3" -> {4, 4, 3}: SLURM's tasks per node, in node order.
std::vector<int> parse_tasks_per_node(const char* name, const std::string& value) {
  const auto bad = [&](const std::string& why) {
    ANVIL_THROW("environment variable {}=\"{}\" is not a list of task counts like 4(x2),3: {}", name, value,
                why);
  };
  const auto number = [&](std::string_view s) {
    int v = 0;
    const auto [stop, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (s.empty() || ec != std::errc() || stop != s.data() + s.size() || v < 1)
      bad(fmt::format("'{}' is not a positive integer", s));
    return v;
  };
  std::vector<int> out;
  std::string_view rest = value;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const size_t paren = item.find('(');
    if (paren == std::string_view::npos) {
      out.push_back(number(item));
    } else {
      if (!item.ends_with(")") || item.substr(paren + 1, 1) != "x")
        bad(fmt::format("'{}' is not N(xM)", item));
      const int count = number(item.substr(0, paren));
      const int repeat = number(item.substr(paren + 2, item.size() - paren - 3));
      if (repeat > 1'000'000) bad(fmt::format("'{}' repeats too often", item));
      out.insert(out.end(), static_cast<size_t>(repeat), count);
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out;
}

// A task of srun (SLURM_STEP_ID set). A batch script run without srun has SLURM_PROCID and SLURM_NTASKS
// too, of the whole allocation, but it is one process: it is left to the single-process case.
DistEnv from_slurm(const Env& env) {
  const char* family = "SLURM_STEP_ID is (srun sets them all for each task)";
  DistEnv d;
  d.launcher = "slurm";
  d.rank = env.required("SLURM_PROCID", family);
  d.local_rank = env.required("SLURM_LOCALID", family);
  d.node_rank = env.required("SLURM_NODEID", family);
  // The step's values where srun gives them (a step may use part of the job's allocation).
  const char* world_name = env.first_set({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"});
  if (!world_name) world_name = "SLURM_NTASKS";
  d.world_size = env.required(world_name, family);
  const char* per_node_name = env.first_set({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"});
  const char* nodes_name = env.first_set({"SLURM_STEP_NUM_NODES", "SLURM_NNODES"});
  const int nodes = nodes_name ? *env.integer(nodes_name) : -1;  // -1: not given
  std::string local_name;
  if (per_node_name) {
    const std::vector<int> per_node = parse_tasks_per_node(per_node_name, *env.text(per_node_name));
    int total = 0;
    for (const int t : per_node) total += t;
    ANVIL_REQUIRE(total == d.world_size, "environment variable {}=\"{}\" counts {} tasks, but {}={}",
                  per_node_name, *env.text(per_node_name), total, world_name, d.world_size);
    ANVIL_REQUIRE(!nodes_name || nodes == static_cast<int>(per_node.size()),
                  "environment variable {}=\"{}\" lists {} nodes, but {}={}", per_node_name,
                  *env.text(per_node_name), per_node.size(), nodes_name, nodes);
    ANVIL_REQUIRE(d.node_rank >= 0 && d.node_rank < static_cast<int>(per_node.size()),
                  "SLURM_NODEID={} is not a node of {}=\"{}\" (0 to {})", d.node_rank, per_node_name,
                  *env.text(per_node_name), per_node.size() - 1);
    d.local_world_size = per_node[static_cast<size_t>(d.node_rank)];
    d.num_nodes = static_cast<int>(per_node.size());
    local_name = fmt::format("the tasks of node {} in {}", d.node_rank, per_node_name);
  } else {
    d.local_world_size = env.required("SLURM_NTASKS_PER_NODE", family);
    ANVIL_REQUIRE(d.local_world_size >= 1,
                  "environment variable SLURM_NTASKS_PER_NODE={}: a node runs at least one task",
                  d.local_world_size);
    d.num_nodes = nodes_name ? nodes : ceil_div(d.world_size, d.local_world_size);
    local_name = "SLURM_NTASKS_PER_NODE";
  }
  check(d, {"SLURM_PROCID", world_name, "SLURM_LOCALID", local_name, "SLURM_NODEID",
            nodes_name ? nodes_name : "the number of nodes"});
  d.master_port = master_port(env);
  if (const auto addr = env.text("MASTER_ADDR")) {
    d.master_addr = *addr;
  } else {
    // Task 0 runs on the first node of the step, whatever srun's distribution.
    const char* list_name = env.first_set({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
    ANVIL_REQUIRE(
        list_name,
        "neither MASTER_ADDR nor SLURM_STEP_NODELIST / SLURM_JOB_NODELIST is set, so the host of rank 0 "
        "is unknown: export MASTER_ADDR before srun");
    const std::vector<std::string> hosts = expand_slurm_nodelist(*env.text(list_name));
    ANVIL_REQUIRE(!hosts.empty(), "environment variable {} lists no host", list_name);
    d.master_addr = hosts.front();
  }
  return d;
}

// The hosts of one node-list item ("node[01-03]-ib[1,2]"): each bracket is a set of numbers and ranges,
// zero-padded to the width of each range's first number as written.
void expand_item(const std::string& list, std::string_view item, std::string prefix,
                 std::vector<std::string>& out) {
  constexpr size_t kMaxHosts = 1 << 20;
  const size_t open = item.find('[');
  if (open == std::string_view::npos) {
    ANVIL_REQUIRE(item.find(']') == std::string_view::npos, "SLURM node list \"{}\": ']' without '['", list);
    out.push_back(prefix + std::string(item));
    return;
  }
  const size_t close = item.find(']', open);
  ANVIL_REQUIRE(close != std::string_view::npos, "SLURM node list \"{}\": '[' without ']'", list);
  const std::string_view head = item.substr(0, open), ranges = item.substr(open + 1, close - open - 1);
  ANVIL_REQUIRE(head.find(']') == std::string_view::npos && ranges.find('[') == std::string_view::npos,
                "SLURM node list \"{}\": unbalanced brackets", list);
  const std::string_view tail = item.substr(close + 1);
  const auto number = [&](std::string_view s) {
    uint64_t v = 0;
    const auto [stop, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    ANVIL_REQUIRE(!s.empty() && ec == std::errc() && stop == s.data() + s.size(),
                  "SLURM node list \"{}\": '{}' in [{}] is not a number", list, s, ranges);
    return v;
  };
  std::string_view rest = ranges;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view range = rest.substr(0, comma);
    const size_t dash = range.find('-');
    const std::string_view first = range.substr(0, dash);
    const uint64_t lo = number(first);
    const uint64_t hi = dash == std::string_view::npos ? lo : number(range.substr(dash + 1));
    ANVIL_REQUIRE(lo <= hi, "SLURM node list \"{}\": the range {} runs backwards", list, range);
    ANVIL_REQUIRE(hi - lo < kMaxHosts && out.size() + (hi - lo) < kMaxHosts,
                  "SLURM node list \"{}\": too many hosts", list);
    for (uint64_t v = lo; v <= hi; ++v)
      expand_item(list, tail, prefix + std::string(head) + fmt::format("{:0{}}", v, first.size()), out);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list) {
  std::vector<std::string> hosts;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i <= list.size(); ++i) {
    if (i < list.size() && list[i] == '[') ++depth;
    if (i < list.size() && list[i] == ']') --depth;
    ANVIL_REQUIRE(depth == 0 || depth == 1, "SLURM node list \"{}\": unbalanced brackets", list);
    if (i == list.size() || (list[i] == ',' && depth == 0)) {
      const std::string_view item = std::string_view(list).substr(start, i - start);
      ANVIL_REQUIRE(!item.empty() || list.empty(), "SLURM node list \"{}\": an empty host name", list);
      if (!item.empty()) expand_item(list, item, "", hosts);
      start = i + 1;
    }
  }
  ANVIL_REQUIRE(depth == 0, "SLURM node list \"{}\": '[' without ']'", list);
  return hosts;
}

DistEnv read_dist_env(const std::function<const char*(const char*)>& getenv) {
  const Env env(getenv);
  if (env.has("RANK") || env.has("WORLD_SIZE")) return from_torchrun(env);
  if (env.has("OMPI_COMM_WORLD_SIZE")) return from_open_mpi(env);
  if (env.has("SLURM_STEP_ID") && env.has("SLURM_PROCID")) return from_slurm(env);
  return DistEnv{};
}

DistEnv read_dist_env() {
  return read_dist_env([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace anvil::dist
