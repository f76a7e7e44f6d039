#include "dist/launcher.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <system_error>
#include <thread>
#include <utility>

#ifdef ANVIL_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "anvil/error.hpp"
#include "dist/unique_fd.hpp"

extern char** environ;

namespace anvil::dist {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == sep) out.push_back(s.substr(start, i - start)), start = i + 1;
  return out;
}

std::string this_host() {
  char name[HOST_NAME_MAX + 1] = {};
  if (::gethostname(name, sizeof name - 1) != 0)
    ANVIL_THROW("anvil launch: gethostname failed: {}", errno_text(errno));
  return name;
}

bool is_this_host(const std::string& host) {
  if (host == "localhost" || host == "127.0.0.1") return true;
  const std::string me = this_host();
  return host == me || host == me.substr(0, me.find('.'));
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGTERM:
      return "SIGTERM";
    default:
      return fmt::format("signal {}", sig);
  }
}

// "exited with code 3", "was killed by signal 9 (SIGKILL)", from a waitpid status.
std::string describe_exit(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  const int sig = WTERMSIG(status);
  return fmt::format("was killed by signal {} ({})", sig, signal_name(sig));
}

int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The CPUs this process may run on (its affinity mask: what a container or `taskset` leaves it).
int cpu_count() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));  // more CPUs than the mask holds
}

// `name` as execve needs it: a path as given, or the first executable file of that name in PATH.
std::string resolve_program(const std::string& name) {
  ANVIL_REQUIRE(!name.empty(), "anvil launch: the program to run is an empty string");
  if (name.find('/') != std::string::npos) {
    if (::access(name.c_str(), X_OK) != 0)
      ANVIL_THROW("anvil launch: cannot run {}: {}", name, errno_text(errno));
    return name;
  }
  const char* path = std::getenv("PATH");
  for (const std::string& dir : split(path ? path : "/usr/local/bin:/usr/bin:/bin", ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
  }
  ANVIL_THROW("anvil launch: {}: no such program in PATH", name);
}

// argv / envp for execve: pointers into `strings`, then a null.
std::vector<char*> c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// The signals the launcher handles arrive as bytes on a pipe (the self-pipe trick), so that the wait loop
// sees them through poll() whichever thread the kernel delivered them to. One instance at a time.
int g_signal_pipe = -1;

void on_signal(int sig) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(sig);
  // A full pipe already holds enough wake-ups.
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe, &byte, 1);
  errno = saved;
}

constexpr int kHandledSignals[] = {SIGCHLD, SIGINT, SIGTERM};

class SignalPipe {
 public:
  SignalPipe() {
    ANVIL_ASSERT(g_signal_pipe < 0, "one launch at a time");
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
      ANVIL_THROW("anvil launch: pipe2 failed: {}", errno_text(errno));
    read_ = UniqueFd(fds[0]), write_ = UniqueFd(fds[1]);
    g_signal_pipe = write_.get();
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (size_t i = 0; i < std::size(kHandledSignals); ++i) {
      if (::sigaction(kHandledSignals[i], &sa, &old_[i]) != 0) {
        const int err = errno;
        restore(i);
        ANVIL_THROW("anvil launch: sigaction({}) failed: {}", signal_name(kHandledSignals[i]),
                    errno_text(err));
      }
    }
    installed_ = std::size(kHandledSignals);
  }
  ~SignalPipe() { restore(installed_); }
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const { return read_.get(); }

  // The signals received since the last call, in order.
  std::vector<int> drain() {
    std::vector<int> out;
    unsigned char buf[64];
    for (;;) {
      const ssize_t n = ::read(read_.get(), buf, sizeof buf);
      if (n > 0) {
        out.insert(out.end(), buf, buf + n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
        ANVIL_THROW("anvil launch: read of the signal pipe failed: {}", errno_text(errno));
      return out;
    }
  }

 private:
  void restore(size_t count) noexcept {
    for (size_t i = 0; i < count; ++i) ::sigaction(kHandledSignals[i], &old_[i], nullptr);
    g_signal_pipe = -1;
  }
  UniqueFd read_, write_;
  struct sigaction old_[std::size(kHandledSignals)]{};
  size_t installed_ = 0;
};

// Sends `sig` to the process group of `pid` (the child and what it started), or to the child alone if its
// group is gone.
void signal_group(pid_t pid, int sig) {
  // Our own children: ESRCH (gone, or no group of their own) is the only failure.
  if (::kill(-pid, sig) != 0 && errno == ESRCH) ::kill(pid, sig);
}

// The children of one launch. Whatever still runs when this goes away (an error while starting them) is
// killed and reaped.
class Children {
 public:
  Children() = default;
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;
  ~Children() {
    for (Child& c : children_) {
      if (!c.running) continue;
      signal_group(c.pid, SIGKILL);
      int status = 0;
      while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }

  void start(const std::string& program, const std::vector<std::string>& argv,
             const std::vector<std::string>& env, int rank) {
    const std::vector<char*> args = c_strings(argv), envp = c_strings(env);
    // The child reports a failed execve through this pipe; a successful one closes it (O_CLOEXEC).
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) ANVIL_THROW("anvil launch: pipe2 failed: {}", errno_text(errno));
    UniqueFd error_read(fds[0]), error_write(fds[1]);
    // Signals stay blocked across fork, so that the child restores the default actions before any arrives.
    sigset_t all, old;
    sigfillset(&all);
    if (const int err = ::pthread_sigmask(SIG_BLOCK, &all, &old); err != 0)
      ANVIL_THROW("anvil launch: pthread_sigmask failed: {}", errno_text(err));
    const pid_t launcher = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // The child: async-signal-safe calls only, until execve. A failing setpgid or prctl leaves a child
      // that signal_group still reaches, or that outlives a killed launcher: nothing to report it through.
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      for (const int sig : kHandledSignals) ::sigaction(sig, &dfl, nullptr);
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(127);  // the launcher died before PR_SET_PDEATHSIG took hold
      ::sigprocmask(SIG_SETMASK, &old, nullptr);
      ::execve(program.c_str(), args.data(), envp.data());
      const int err = errno;
      [[maybe_unused]] const ssize_t n = ::write(error_write.get(), &err, sizeof err);
      ::_exit(127);
    }
    const int fork_errno = errno;
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (pid < 0) ANVIL_THROW("anvil launch: fork failed for rank {}: {}", rank, errno_text(fork_errno));
    children_.push_back({rank, pid, true});
    // Set from both sides, so that the group exists whichever runs first. EACCES: the child already ran
    // execve (and so set it itself).
    if (::setpgid(pid, pid) != 0 && errno != EACCES && errno != ESRCH)
      ANVIL_THROW("anvil launch: setpgid failed for rank {} (pid {}): {}", rank, pid, errno_text(errno));
    error_write.reset();
    int exec_errno = 0;
    ssize_t n;
    while ((n = ::read(error_read.get(), &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
    }
    if (n < 0)
      ANVIL_THROW("anvil launch: read from rank {}'s start-up pipe failed: {}", rank, errno_text(errno));
    if (n == sizeof exec_errno) {
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      children_.back().running = false;
      ANVIL_THROW("anvil launch: cannot run {}: execve failed: {}", program, errno_text(exec_errno));
    }
  }

  // Waits until every child has exited; see launch().
  int supervise(SignalPipe& signals, std::chrono::seconds kill_timeout) {
    std::optional<int> exit_code;  // set once the job is stopping: what the launcher exits with
    std::optional<Clock::time_point> kill_at;
    bool killed = false;
    const auto stop = [&](int sig, int code) {
      exit_code = code;
      // Every group, also those of children that exited: what they started may still run.
      for (const Child& c : children_) signal_group(c.pid, sig);
      kill_at = Clock::now() + kill_timeout;
    };
    for (;;) {
      for (Child& c : children_) {
        if (!c.running) continue;
        int status = 0;
        pid_t r;
        while ((r = ::waitpid(c.pid, &status, WNOHANG)) < 0 && errno == EINTR) {
        }
        if (r < 0)
          ANVIL_THROW("anvil launch: waitpid for rank {} (pid {}) failed: {}", c.rank, c.pid,
                      errno_text(errno));
        if (r == 0) continue;
        c.running = false;
        if (exit_code || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) continue;
        const bool others =
            std::any_of(children_.begin(), children_.end(), [](const Child& o) { return o.running; });
        fmt::print(stderr, "anvil launch: rank {} (pid {}) {}{}\n", c.rank, c.pid, describe_exit(status),
                   others ? "; stopping the other ranks" : "");
        std::fflush(stderr);
        stop(SIGTERM, exit_code_of(status));
      }
      if (std::none_of(children_.begin(), children_.end(), [](const Child& c) { return c.running; }))
        return exit_code.value_or(0);
      if (kill_at && !killed && Clock::now() >= *kill_at) {
        for (const Child& c : children_) {
          if (!c.running) continue;
          fmt::print(stderr,
                     "anvil launch: rank {} (pid {}) still runs {} s after SIGTERM; sending SIGKILL\n",
                     c.rank, c.pid, kill_timeout.count());
          signal_group(c.pid, SIGKILL);
        }
        killed = true;
      }
      // Woken by SIGCHLD; the timeout is a safety net, or the SIGKILL deadline.
      int timeout_ms = 1000;
      if (kill_at && !killed)
        timeout_ms = static_cast<int>(std::clamp<int64_t>(
            std::chrono::ceil<std::chrono::milliseconds>(*kill_at - Clock::now()).count(), 0, 1000));
      pollfd p{signals.fd(), POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) < 0 && errno != EINTR)
        ANVIL_THROW("anvil launch: poll failed: {}", errno_text(errno));
      for (const int sig : signals.drain()) {
        if (sig == SIGCHLD) continue;
        if (!exit_code) {
          fmt::print(stderr, "anvil launch: got {}; passing it on to the ranks\n", signal_name(sig));
          stop(sig, 128 + sig);
        } else if (!killed) {  // asked again: no more grace
          fmt::print(stderr, "anvil launch: got {} while stopping; sending SIGKILL to the ranks\n",
                     signal_name(sig));
          for (const Child& c : children_)
            if (c.running) signal_group(c.pid, SIGKILL);
          killed = true;
        }
        std::fflush(stderr);
      }
    }
  }

 private:
  struct Child {
    int rank;
    pid_t pid;
    bool running;
  };
  std::vector<Child> children_;
};

}  // namespace

void validate_launch_options(const LaunchOptions& o) {
  ANVIL_REQUIRE(
      !o.command.empty(),
      "anvil launch: give the command to run: anvil launch [options] COMMAND ARGS... (an anvil command) "
      "or anvil launch [options] -- PROGRAM ARGS...");
  ANVIL_REQUIRE(o.nproc_per_node >= 1, "--nproc_per_node {}: run at least one process per node",
                o.nproc_per_node);
  ANVIL_REQUIRE(o.nnodes >= 1, "--nnodes {}: a job has at least one node", o.nnodes);
  ANVIL_REQUIRE(int64_t(o.nnodes) * o.nproc_per_node <= INT_MAX,
                "--nnodes {} x --nproc_per_node {}: too many processes", o.nnodes, o.nproc_per_node);
  ANVIL_REQUIRE(o.node_rank >= 0 && o.node_rank < o.nnodes,
                "--node_rank {} with --nnodes {}: the node rank is 0 to {}", o.node_rank, o.nnodes,
                o.nnodes - 1);
  ANVIL_REQUIRE(o.master_port >= 0 && o.master_port <= 65535,
                "--master_port {}: not a TCP port (1 to 65535, or 0 for a free one)", o.master_port);
  ANVIL_REQUIRE(
      o.master_port != 0 || o.nnodes == 1,
      "--master_port 0 with --nnodes {}: a free port of this host is unknown to the other nodes; give "
      "every node the same port",
      o.nnodes);
  ANVIL_REQUIRE(!o.master_addr.empty(),
                "--master_addr: give the host of node 0 (default 127.0.0.1 for one node)");
  ANVIL_REQUIRE(o.kill_timeout.count() >= 0, "--kill_timeout {}: give a number of seconds, 0 or more",
                o.kill_timeout.count());
  ANVIL_REQUIRE(!o.cuda_visible_devices || !o.cuda_visible_devices->empty(),
                "anvil launch: no GPU selected for the children");
}

std::vector<std::string> child_environment(const LaunchOptions& o, int local_rank,
                                           const std::vector<std::string>& inherited,
                                           std::optional<int> omp_threads) {
  ANVIL_ASSERT(o.master_port > 0, "the master port is resolved before the children start (got {})",
               o.master_port);
  ANVIL_ASSERT(local_rank >= 0 && local_rank < o.nproc_per_node, "local rank {} of {}", local_rank,
               o.nproc_per_node);
  std::vector<std::pair<std::string, std::string>> job = {
      {"RANK", std::to_string(o.node_rank * o.nproc_per_node + local_rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
  };
  if (o.cuda_visible_devices) job.emplace_back("CUDA_VISIBLE_DEVICES", *o.cuda_visible_devices);
  if (omp_threads) job.emplace_back("OMP_NUM_THREADS", std::to_string(*omp_threads));
  std::vector<std::string> env;
  for (const std::string& entry : inherited) {
    const std::string name = entry.substr(0, entry.find('='));
    if (std::none_of(job.begin(), job.end(), [&](const auto& kv) { return kv.first == name; }))
      env.push_back(entry);
  }
  for (const auto& [name, value] : job) env.push_back(name + "=" + value);
  return env;
}

std::vector<std::string> select_gpus(const std::string& include, const std::string& exclude,
                                     const std::vector<std::string>& visible) {
  ANVIL_REQUIRE(include.empty() || exclude.empty(), "--include {} and --exclude {}: give one of them",
                include, exclude);
  ANVIL_ASSERT(!include.empty() || !exclude.empty(), "select_gpus needs --include or --exclude");
  const bool including = !include.empty();
  const std::string flag = including ? "--include" : "--exclude";
  const std::string& spec = including ? include : exclude;
  const std::string seen =
      std::getenv("CUDA_VISIBLE_DEVICES")
          ? "visible here (CUDA_VISIBLE_DEVICES=" + std::string(std::getenv("CUDA_VISIBLE_DEVICES")) + ")"
          : "visible here";
  std::optional<std::vector<size_t>> indices;  // nullopt: the whole host
  bool host_named = false;
  for (const std::string& entry : split(spec, '@')) {
    const size_t colon = entry.find(':');
    const std::string host = entry.substr(0, colon);
    ANVIL_REQUIRE(!host.empty(), "{} {}: an entry without a host; write e.g. localhost:0,2", flag, spec);
    ANVIL_REQUIRE(
        is_this_host(host),
        "{} {}: {} is not this host; anvil launch starts processes on this host only (localhost, {}): run "
        "it on each node, with --nnodes and --node_rank",
        flag, spec, host, this_host());
    ANVIL_REQUIRE(!host_named, "{} {}: this host is named twice", flag, spec);
    ANVIL_REQUIRE(!visible.empty(), "{} {}: no GPU is {}", flag, spec, seen);
    host_named = true;
    if (colon == std::string::npos) continue;
    indices.emplace();
    for (const std::string& id : split(entry.substr(colon + 1), ',')) {
      size_t index = 0;
      const auto [end, ec] = std::from_chars(id.data(), id.data() + id.size(), index);
      ANVIL_REQUIRE(!id.empty() && ec == std::errc() && end == id.data() + id.size(),
                    "{} {}: '{}' is not a GPU index (0, 1, ...)", flag, spec, id);
      ANVIL_REQUIRE(index < visible.size(), "{} {}: there is no GPU {}: {} GPU(s) {}", flag, spec, index,
                    visible.size(), seen);
      ANVIL_REQUIRE(std::find(indices->begin(), indices->end(), index) == indices->end(),
                    "{} {}: GPU {} is named twice", flag, spec, index);
      indices->push_back(index);
    }
  }
  std::vector<std::string> out;
  if (including) {
    if (!indices) return visible;
    for (const size_t i : *indices) out.push_back(visible[i]);
  } else if (indices) {
    for (size_t i = 0; i < visible.size(); ++i)
      if (std::find(indices->begin(), indices->end(), i) == indices->end()) out.push_back(visible[i]);
  }
  ANVIL_REQUIRE(!out.empty(), "{} {}: no GPU is left to run on ({} GPU(s) {})", flag, spec, visible.size(),
                seen);
  return out;
}

std::vector<std::string> visible_gpus() {
  std::vector<std::string> out;
  if (const char* listed = std::getenv("CUDA_VISIBLE_DEVICES")) {  // "" hides every GPU
    for (const std::string& entry : split(listed, ','))
      if (!entry.empty()) out.push_back(entry);
    return out;
  }
  int count = 0;
#ifdef ANVIL_WITH_CUDA
  // Counts without creating a context; an error (no driver, no GPU) means none.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    count = 0;
    (void)cudaGetLastError();
  }
#endif
  for (int i = 0; i < count; ++i) out.push_back(std::to_string(i));
  return out;
}

namespace {

// Whether a TCP port of every interface can be bound now (IPv4; the store listens dual-stack).
bool port_bindable(int port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) ANVIL_THROW("anvil launch: socket failed while picking a free port: {}", errno_text(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(uint16_t(port));
  return ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

// The first port of the kernel's ephemeral range (where port-0 binds draw from), 32768 if unknown.
int ephemeral_low() {
  std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  int low = 32768, high = 60999;
  if (f) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  return low;
}

}  // namespace

int free_tcp_port() {
  // A port below the ephemeral range: between this pick and the store's bind in rank 0, other processes'
  // port-0 binds (Gloo's connections, other jobs' clients) cannot take it, as they could an ephemeral one.
  const int low = ephemeral_low();
  if (low > 2048) {
    const int first = std::max(1024, low - 16384);
    std::random_device rd;
    std::uniform_int_distribution<int> pick(first, low - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      const int port = pick(rd);
      if (port_bindable(port)) return port;
    }
  }
  // Else an ephemeral one.
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) ANVIL_THROW("anvil launch: socket failed while picking a free port: {}", errno_text(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    ANVIL_THROW("anvil launch: bind failed while picking a free port: {}", errno_text(errno));
  socklen_t len = sizeof addr;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    ANVIL_THROW("anvil launch: getsockname failed while picking a free port: {}", errno_text(errno));
  return ntohs(addr.sin_port);
}

int launch(const LaunchOptions& options) {
  validate_launch_options(options);
  LaunchOptions o = options;
  if (o.master_port == 0) o.master_port = free_tcp_port();
  const std::string program = resolve_program(o.command.front());
  std::vector<std::string> inherited;
  for (char** e = environ; *e; ++e) inherited.emplace_back(*e);
  // As torchrun: many processes each running an OpenMP pool of every CPU would oversubscribe the host.
  std::optional<int> omp_threads;
  if (!std::getenv("OMP_NUM_THREADS")) {
    const int cpus = cpu_count();
    omp_threads = std::max(1, cpus / o.nproc_per_node);
    fmt::print(stderr,
               "anvil launch: OMP_NUM_THREADS is not set; each process gets OMP_NUM_THREADS={} ({} CPUs / {} "
               "processes). Set it to tune.\n",
               *omp_threads, cpus, o.nproc_per_node);
    std::fflush(stderr);
  }
  SignalPipe signals;
  Children children;  // after `signals`: stopped and reaped before the handlers go
  for (int local = 0; local < o.nproc_per_node; ++local)
    children.start(program, o.command, child_environment(o, local, inherited, omp_threads),
                   o.node_rank * o.nproc_per_node + local);
  return children.supervise(signals, o.kill_timeout);
}

}  // namespace anvil::dist
