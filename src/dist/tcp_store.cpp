#include "dist/tcp_store.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

#include "anvil/error.hpp"
#include "dist/unique_fd.hpp"

namespace anvil::dist {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The protocol. Every message is a frame: the magic bytes "ANVS", a u32 body length, then the body. A request
// body is an op byte and its fields; a reply body is a status byte and its fields. Integers are
// little-endian; byte strings are a u32 length and the bytes.
//   Set    key value        -> Ok
//   TryGet key              -> Ok value | NotFound
//   Add    key i64          -> Ok i64 (the new value) | Error message
//   Wait   u32 n, n keys, i64 timeout_ms -> Ok once every key is set | Timeout u32 n, the n missing keys
enum class Op : uint8_t { Set = 1, TryGet = 2, Add = 3, Wait = 4 };
enum class Status : uint8_t { Ok = 0, NotFound = 1, Timeout = 2, Error = 3 };

// Frames start with it: a peer that speaks another protocol (a port scanner, another service on the port) is
// told apart at its first bytes.
constexpr uint32_t kMagic = 0x53564e41;  // "ANVS"
constexpr size_t kHeaderBytes = 8;
constexpr uint32_t kMaxFrame = 1u << 30;  // body bytes
// Longer timeouts are clamped to this, so that deadlines never overflow.
constexpr milliseconds kMaxTimeout = std::chrono::hours(24 * 30);

milliseconds clamp_timeout(milliseconds t) {
  return std::clamp(t, milliseconds(0), kMaxTimeout);
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}
void put_i64(std::string& out, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out += static_cast<char>((u >> (8 * i)) & 0xff);
}
void put_bytes(std::string& out, std::string_view s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out += s;
}
uint32_t read_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string frame(std::string_view body) {
  std::string out;
  out.reserve(kHeaderBytes + body.size());
  put_u32(out, kMagic);
  put_u32(out, static_cast<uint32_t>(body.size()));
  out += body;
  return out;
}

std::string status_body(Status s) {
  return std::string(1, static_cast<char>(s));
}

// A frame whose fields do not match its op (not our protocol, or a bug).
struct ProtocolError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Reads the fields of one frame body in order.
class Reader {
 public:
  explicit Reader(std::string_view body) : rest_(body) {}
  explicit Reader(std::string&&) = delete;  // it would view a temporary
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  uint32_t u32() { return read_u32(take(4).data()); }
  int64_t i64() {
    const std::string_view b = take(8);
    uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= uint64_t(static_cast<unsigned char>(b[i])) << (8 * i);
    return static_cast<int64_t>(u);
  }
  std::string bytes() { return std::string(take(u32())); }
  void finish() const {
    if (!rest_.empty()) throw ProtocolError("trailing bytes in a frame");
  }

 private:
  std::string_view take(size_t n) {
    if (rest_.size() < n) throw ProtocolError("frame shorter than its fields");
    const std::string_view s = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return s;
  }
  std::string_view rest_;
};

// "host:port", with brackets around an IPv6 literal.
std::string endpoint(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                             : fmt::format("{}:{}", host, port);
}

int ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
}

// The listening socket of a server on `port` of every interface: IPv6 accepting IPv4 too where the host
// has IPv6 (so that MASTER_ADDR may name the host either way), else IPv4.
UniqueFd listening_socket(int port) {
  for (const int family : {AF_INET6, AF_INET}) {
    UniqueFd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) {
      if (family == AF_INET6 && errno == EAFNOSUPPORT) continue;
      ANVIL_THROW("cannot serve the job's store: socket failed: {}", errno_text(errno));
    }
    // A restarted job may reuse the port while the previous run's connections are in TIME_WAIT.
    const int one = 1, zero = 0;
    if (::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
      ANVIL_THROW("cannot serve the job's store: setsockopt(SO_REUSEADDR) failed: {}", errno_text(errno));
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      if (::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) != 0)
        ANVIL_THROW("cannot serve the job's store: setsockopt(IPV6_V6ONLY) failed: {}", errno_text(errno));
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6, a->sin6_addr = in6addr_any,
      a->sin6_port = htons(static_cast<uint16_t>(port));
      len = sizeof(sockaddr_in6);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET, a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(static_cast<uint16_t>(port));
      len = sizeof(sockaddr_in);
    }
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      const int err = errno;
      if (family == AF_INET6 && (err == EADDRNOTAVAIL || err == EAFNOSUPPORT)) continue;  // IPv6 is off
      if (err == EADDRINUSE)
        ANVIL_THROW(
            "cannot serve the job's store on port {}: the port is in use (bind: {}); pick another "
            "MASTER_PORT (anvil launch --master_port), or stop the process holding it (an earlier run?)",
            port, errno_text(err));
      ANVIL_THROW("cannot serve the job's store on port {}: bind failed: {}", port, errno_text(err));
    }
    if (::listen(fd.get(), SOMAXCONN) != 0)
      ANVIL_THROW("cannot serve the job's store on port {}: listen failed: {}", port, errno_text(errno));
    return fd;
  }
  ANVIL_THROW("cannot serve the job's store: this host has neither IPv6 nor IPv4 sockets");
}

int bound_port(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    ANVIL_THROW("cannot serve the job's store: getsockname failed: {}", errno_text(errno));
  return addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                    : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

void set_no_delay(int fd) {
  // Requests are small and answered at once: do not let Nagle's algorithm hold them back.
  const int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
    ANVIL_THROW("the job's store: setsockopt(TCP_NODELAY) failed: {}", errno_text(errno));
}

// One non-blocking connection attempt to every address of host:port until `deadline`; an empty fd and
// `error` set when none answered.
UniqueFd connect_once(const std::string& host, int port, Clock::time_point deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    error =
        fmt::format("cannot resolve {}: {}", host, rc == EAI_SYSTEM ? errno_text(errno) : gai_strerror(rc));
    return {};
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, ::freeaddrinfo);
  for (const addrinfo* a = found; a; a = a->ai_next) {
    UniqueFd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!fd) {
      error = "socket: " + errno_text(errno);
      continue;
    }
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        error = "connect: " + errno_text(errno);
        continue;
      }
      pollfd p{fd.get(), POLLOUT, 0};
      int n;
      while ((n = ::poll(&p, 1, ms_until(deadline))) < 0 && errno == EINTR) {
      }
      if (n < 0) ANVIL_THROW("the job's store: poll failed: {}", errno_text(errno));
      if (n == 0) {
        error = "connect: timed out";
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        error = "connect: " + errno_text(err);
        continue;
      }
    }
    set_no_delay(fd.get());
    return fd;
  }
  return {};
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// The server: one thread polls the listening socket, every connection and a wake-up pipe. Sockets are
// non-blocking; each connection buffers what it read and what it has to send, so a slow client never
// stalls the others. A Wait that cannot be answered yet parks its connection until its keys are set or its
// deadline passes (the poll timeout is the nearest deadline).

class TcpStore::Server {
 public:
  explicit Server(int port) : listen_(listening_socket(port)), port_(bound_port(listen_.get())) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
      ANVIL_THROW("cannot serve the job's store: pipe2 failed: {}", errno_text(errno));
    wake_read_ = UniqueFd(fds[0]), wake_write_ = UniqueFd(fds[1]);
    thread_ = std::thread([this] { serve(); });
  }
  ~Server() {
    const char byte = 0;
    // EAGAIN: the pipe is full, so a wake-up is already pending.
    while (::write(wake_write_.get(), &byte, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  int port() const { return port_; }

 private:
  struct PendingWait {
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };
  struct Conn {
    explicit Conn(UniqueFd f) : fd(std::move(f)) {}
    UniqueFd fd;
    std::string in, out;
    bool closed = false;  // the peer left, or spoke another protocol: dropped at the end of the turn
    std::optional<PendingWait> wait;
  };

  void serve() noexcept {
    try {
      loop();
    } catch (const std::exception& e) {
      // The clients see their connections close; rank 0's output says why.
      std::fprintf(stderr, "anvil: the job's store stopped serving: %s\n", e.what());
    }
    conns_.clear();
    listen_.reset();
  }

  void loop() {
    std::vector<pollfd> fds;
    for (;;) {
      fds.clear();
      fds.push_back({wake_read_.get(), POLLIN, 0});
      fds.push_back({listen_.get(), POLLIN, 0});
      for (const auto& c : conns_)
        fds.push_back({c->fd.get(), static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
      const int n = ::poll(fds.data(), fds.size(), poll_timeout());
      if (n < 0) {
        if (errno == EINTR) continue;
        throw Error(fmt::format("poll failed: {}", errno_text(errno)));
      }
      if (fds[0].revents) return;  // the destructor asks to stop
      const size_t polled = conns_.size();
      if (fds[1].revents & POLLIN) accept_all();
      for (size_t i = 0; i < polled; ++i) {
        const short events = fds[i + 2].revents;
        if (events & (POLLIN | POLLHUP | POLLERR)) read_from(*conns_[i]);
        if (events & POLLOUT) flush(*conns_[i]);
      }
      do {
        for (const auto& c : conns_) handle_requests(*c);
      } while (answer_waits());  // a connection whose wait ended may have requests queued behind it
      for (const auto& c : conns_)
        if (!c->closed) flush(*c);
      std::erase_if(conns_, [](const auto& c) { return c->closed; });
    }
  }

  int poll_timeout() const {
    std::optional<Clock::time_point> next;
    for (const auto& c : conns_)
      if (c->wait && !c->closed && (!next || c->wait->deadline < *next)) next = c->wait->deadline;
    return next ? ms_until(*next) : -1;
  }

  void accept_all() {
    for (;;) {
      UniqueFd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (fd) {
        set_no_delay(fd.get());
        conns_.push_back(std::make_unique<Conn>(std::move(fd)));
        continue;
      }
      if (errno == EINTR) continue;
      // EAGAIN: no more pending; the others: that client gave up before we accepted it.
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EPROTO) return;
      throw Error(fmt::format("accept4 failed: {}", errno_text(errno)));
    }
  }

  static void read_from(Conn& c) {
    char buf[64 * 1024];
    for (;;) {
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, 0);
      if (n > 0) {
        c.in.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      c.closed = true;  // end of stream, or a reset: the client is gone
      return;
    }
  }

  static void flush(Conn& c) {
    size_t sent = 0;
    while (sent < c.out.size()) {
      const ssize_t n = ::send(c.fd.get(), c.out.data() + sent, c.out.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      c.closed = true;
      return;
    }
    c.out.erase(0, sent);
  }

  // Answers the complete requests `c` has sent, up to one that has to wait.
  void handle_requests(Conn& c) {
    size_t pos = 0;
    while (!c.closed && !c.wait && c.in.size() - pos >= kHeaderBytes) {
      const uint32_t len = read_u32(c.in.data() + pos + 4);
      if (read_u32(c.in.data() + pos) != kMagic || len == 0 || len > kMaxFrame) {
        c.closed = true;
        break;
      }
      if (c.in.size() - pos - kHeaderBytes < len) break;
      try {
        handle(c, std::string_view(c.in).substr(pos + kHeaderBytes, len));
      } catch (const ProtocolError&) {
        c.closed = true;
      }
      pos += kHeaderBytes + len;
    }
    c.in.erase(0, pos);
  }

  void handle(Conn& c, std::string_view body) {
    Reader r(body);
    const auto op = static_cast<Op>(r.u8());
    std::string reply;
    switch (op) {
      case Op::Set: {
        std::string key = r.bytes();
        std::string value = r.bytes();
        r.finish();
        data_[std::move(key)] = std::move(value);
        reply = status_body(Status::Ok);
        break;
      }
      case Op::TryGet: {
        const std::string key = r.bytes();
        r.finish();
        const auto it = data_.find(key);
        if (it == data_.end()) {
          reply = status_body(Status::NotFound);
        } else {
          reply = status_body(Status::Ok);
          put_bytes(reply, it->second);
        }
        break;
      }
      case Op::Add: {
        const std::string key = r.bytes();
        const int64_t delta = r.i64();
        r.finish();
        reply = add(key, delta);
        break;
      }
      case Op::Wait: {
        const uint32_t count = r.u32();
        std::vector<std::string> keys;
        for (uint32_t i = 0; i < count; ++i) keys.push_back(r.bytes());
        const milliseconds timeout = clamp_timeout(milliseconds(r.i64()));
        r.finish();
        c.wait = PendingWait{std::move(keys), Clock::now() + timeout};
        return;  // answered by answer_waits, at once if every key is set
      }
      default:
        throw ProtocolError("unknown op");
    }
    c.out += frame(reply);
  }

  std::string add(const std::string& key, int64_t delta) {
    int64_t value = 0;
    const auto it = data_.find(key);
    if (it != data_.end()) {
      const std::string& text = it->second;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        std::string reply = status_body(Status::Error);
        put_bytes(reply,
                  fmt::format("key '{}' holds a value that is not a counter ({} bytes)", key, text.size()));
        return reply;
      }
    }
    int64_t sum = 0;
    if (__builtin_add_overflow(value, delta, &sum)) {
      std::string reply = status_body(Status::Error);
      put_bytes(reply, fmt::format("counter '{}' would overflow: {} + {}", key, value, delta));
      return reply;
    }
    data_[key] = std::to_string(sum);
    std::string reply = status_body(Status::Ok);
    put_i64(reply, sum);
    return reply;
  }

  // Answers the waits whose keys are all set or whose deadline passed; true if any was answered.
  bool answer_waits() {
    const Clock::time_point now = Clock::now();
    bool answered = false;
    for (const auto& c : conns_) {
      if (!c->wait || c->closed) continue;
      std::vector<std::string> missing;
      for (const std::string& k : c->wait->keys)
        if (!data_.contains(k)) missing.push_back(k);
      if (!missing.empty() && now < c->wait->deadline) continue;
      std::string reply = status_body(missing.empty() ? Status::Ok : Status::Timeout);
      if (!missing.empty()) {
        put_u32(reply, static_cast<uint32_t>(missing.size()));
        for (const std::string& k : missing) put_bytes(reply, k);
      }
      c->out += frame(reply);
      c->wait.reset();
      answered = true;
    }
    return answered;
  }

  UniqueFd listen_;
  int port_ = 0;
  UniqueFd wake_read_, wake_write_;
  std::unordered_map<std::string, std::string> data_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::thread thread_;  // last: it starts once everything it uses exists
};

// ---------------------------------------------------------------------------------------------------------
// The client: a pool of connections, one per request in flight, so that a thread blocked in a long wait
// (a failure watchdog, say) does not hold up the other threads' requests. A connection that failed is
// dropped, never reused: after a timeout its stream is out of step.

class TcpStore::Client {
 public:
  Client(std::string host, int port, milliseconds connect_timeout) : host_(std::move(host)), port_(port) {
    const Clock::time_point deadline = Clock::now() + clamp_timeout(connect_timeout);
    std::string error;
    for (;;) {
      UniqueFd fd = connect_once(host_, port_, deadline, error);
      if (fd) {
        idle_.push_back(std::move(fd));
        return;
      }
      const Clock::time_point now = Clock::now();
      if (now >= deadline) break;
      std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(100), deadline - now));
    }
    ANVIL_THROW(
        "cannot reach the job's store at {} within {} ms ({}): check that rank 0 is running (it serves the "
        "store), that MASTER_ADDR and MASTER_PORT name its host and port, and that no firewall blocks the "
        "port",
        where(), connect_timeout.count(), error);
  }

  // Sends the request `body` and returns the reply body; throws anvil::Error when the store is gone or no
  // reply came before `deadline`.
  std::string call(std::string_view body, Clock::time_point deadline) {
    UniqueFd fd = take_connection(deadline);
    const std::string request = frame(body);
    send_all(fd.get(), request, deadline);
    char header[kHeaderBytes];
    recv_exact(fd.get(), header, kHeaderBytes, deadline);
    const uint32_t len = read_u32(header + 4);
    if (read_u32(header) != kMagic || len == 0 || len > kMaxFrame)
      ANVIL_THROW(
          "the job's store at {} sent a malformed reply: is another service listening on MASTER_PORT?",
          where());
    std::string reply(len, '\0');
    recv_exact(fd.get(), reply.data(), len, deadline);
    give_back(std::move(fd));
    return reply;
  }

  std::string where() const { return endpoint(host_, port_); }

 private:
  UniqueFd take_connection(Clock::time_point deadline) {
    {
      const std::lock_guard lock(mutex_);
      if (!idle_.empty()) {
        UniqueFd fd = std::move(idle_.back());
        idle_.pop_back();
        return fd;
      }
    }
    // The server was up when this client connected: a refused connection now means it is gone.
    std::string error;
    UniqueFd fd = connect_once(host_, port_, deadline, error);
    if (!fd)
      ANVIL_THROW(
          "the job's store at {} is gone ({}): rank 0, which serves it, has exited or stopped serving (see "
          "its output for why)",
          where(), error);
    return fd;
  }

  void give_back(UniqueFd fd) {
    const std::lock_guard lock(mutex_);
    idle_.push_back(std::move(fd));
  }

  [[noreturn]] void closed(const std::string& detail) const {
    ANVIL_THROW(
        "the job's store at {} closed the connection{}: rank 0, which serves it, has exited or stopped "
        "serving (see its output for why)",
        where(), detail.empty() ? "" : " (" + detail + ")");
  }

  void wait_ready(int fd, short events, Clock::time_point deadline) const {
    for (;;) {
      if (Clock::now() >= deadline)
        ANVIL_THROW(
            "no reply in time from the job's store at {}: rank 0, which serves it, is stopped or hung",
            where());
      pollfd p{fd, events, 0};
      const int n = ::poll(&p, 1, ms_until(deadline));
      if (n > 0) return;
      if (n < 0 && errno != EINTR)
        ANVIL_THROW("the job's store at {}: poll failed: {}", where(), errno_text(errno));
    }
  }

  void send_all(int fd, std::string_view data, Clock::time_point deadline) const {
    while (!data.empty()) {
      const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        wait_ready(fd, POLLOUT, deadline);
      } else {
        closed("send: " + errno_text(errno));
      }
    }
  }

  void recv_exact(int fd, char* out, size_t size, Clock::time_point deadline) const {
    while (size > 0) {
      const ssize_t n = ::recv(fd, out, size, 0);
      if (n > 0) {
        out += n, size -= static_cast<size_t>(n);
      } else if (n == 0) {
        closed("");
      } else if (errno == EINTR) {
        continue;
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        wait_ready(fd, POLLIN, deadline);
      } else {
        closed("recv: " + errno_text(errno));
      }
    }
  }

  std::string host_;
  int port_;
  std::mutex mutex_;
  std::vector<UniqueFd> idle_;
};

// ---------------------------------------------------------------------------------------------------------

namespace {

// The status byte of `reply`, its fields left in `r`; an Error reply becomes anvil::Error naming `what`.
Status read_status(Reader& r, const std::string& what, const std::string& where) {
  const auto status = static_cast<Status>(r.u8());
  if (status == Status::Error) ANVIL_THROW("the job's store at {} refused {}: {}", where, what, r.bytes());
  return status;
}

void check_size(const std::string& key, size_t bytes) {
  ANVIL_REQUIRE(bytes <= kMaxFrame - 64, "the job's store holds at most {} bytes per request; '{}' needs {}",
                kMaxFrame - 64, key, bytes);
}

}  // namespace

TcpStore::TcpStore(std::string host, int port, bool serve, milliseconds connect_timeout)
    : host_(std::move(host)), port_(port) {
  ANVIL_REQUIRE(port >= 0 && port <= 65535, "the job's store: port {} is not a TCP port (0-65535)", port);
  ANVIL_REQUIRE(serve || port != 0, "the job's store: a client needs the server's port, not 0");
  if (serve) {
    server_ = std::make_unique<Server>(port);
    port_ = server_->port();
  }
  client_ = std::make_unique<Client>(host_, port_, connect_timeout);
}

TcpStore::~TcpStore() = default;

void TcpStore::set(const std::string& key, const std::string& value) {
  check_size(key, key.size() + value.size());
  std::string body(1, static_cast<char>(Op::Set));
  put_bytes(body, key);
  put_bytes(body, value);
  try {
    const std::string reply = client_->call(body, Clock::now() + kReplyTimeout);
    Reader r(reply);
    ANVIL_REQUIRE(read_status(r, "set('" + key + "')", client_->where()) == Status::Ok,
                  "the job's store at {} gave an unexpected reply to set('{}')", client_->where(), key);
  } catch (const ProtocolError& e) {
    ANVIL_THROW("the job's store at {} gave a malformed reply to set('{}'): {}", client_->where(), key,
                e.what());
  }
}

std::optional<std::string> TcpStore::try_get(const std::string& key) {
  check_size(key, key.size());
  std::string body(1, static_cast<char>(Op::TryGet));
  put_bytes(body, key);
  try {
    const std::string reply = client_->call(body, Clock::now() + kReplyTimeout);
    Reader r(reply);
    const Status s = read_status(r, "get('" + key + "')", client_->where());
    if (s == Status::NotFound) return std::nullopt;
    ANVIL_REQUIRE(s == Status::Ok, "the job's store at {} gave an unexpected reply to get('{}')",
                  client_->where(), key);
    return r.bytes();
  } catch (const ProtocolError& e) {
    ANVIL_THROW("the job's store at {} gave a malformed reply to get('{}'): {}", client_->where(), key,
                e.what());
  }
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  check_size(key, key.size());
  std::string body(1, static_cast<char>(Op::Add));
  put_bytes(body, key);
  put_i64(body, delta);
  try {
    const std::string reply = client_->call(body, Clock::now() + kReplyTimeout);
    Reader r(reply);
    ANVIL_REQUIRE(read_status(r, "add('" + key + "')", client_->where()) == Status::Ok,
                  "the job's store at {} gave an unexpected reply to add('{}')", client_->where(), key);
    return r.i64();
  } catch (const ProtocolError& e) {
    ANVIL_THROW("the job's store at {} gave a malformed reply to add('{}'): {}", client_->where(), key,
                e.what());
  }
}

namespace {

std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (const std::string& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
  return out;
}

}  // namespace

void TcpStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  size_t bytes = 0;
  for (const std::string& k : keys) bytes += k.size() + 4;
  check_size(quoted_list(keys), bytes);
  timeout = clamp_timeout(timeout);
  std::string body(1, static_cast<char>(Op::Wait));
  put_u32(body, static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) put_bytes(body, k);
  put_i64(body, timeout.count());
  // The server answers at the deadline; the margin is for a server that cannot answer at all.
  try {
    const std::string reply = client_->call(body, Clock::now() + timeout + kReplyTimeout);
    Reader r(reply);
    const Status s = read_status(r, "wait(" + quoted_list(keys) + ")", client_->where());
    if (s == Status::Ok) return;
    ANVIL_REQUIRE(s == Status::Timeout, "the job's store at {} gave an unexpected reply to wait({})",
                  client_->where(), quoted_list(keys));
    std::vector<std::string> missing(r.u32());
    for (std::string& k : missing) k = r.bytes();
    if (keys.size() == 1)
      ANVIL_THROW(
          "timed out after {} ms waiting for key '{}' in the job's store at {}: no rank set it in time (did "
          "another rank fail or start late? see its output)",
          timeout.count(), keys[0], client_->where());
    ANVIL_THROW(
        "timed out after {} ms waiting for keys {} in the job's store at {}; still missing: {} (did another "
        "rank fail or start late? see its output)",
        timeout.count(), quoted_list(keys), client_->where(), quoted_list(missing));
  } catch (const ProtocolError& e) {
    ANVIL_THROW("the job's store at {} gave a malformed reply to wait({}): {}", client_->where(),
                quoted_list(keys), e.what());
  }
}

std::string TcpStore::get(const std::string& key, milliseconds timeout) {
  wait({key}, timeout);
  std::optional<std::string> value = try_get(key);
  ANVIL_ASSERT(value.has_value(), "key '{}' was set, then missing: the store never deletes keys", key);
  return std::move(*value);
}

}  // namespace anvil::dist
