// The job's TCP store: a server and clients in one process (threads), over loopback.
#include "dist/tcp_store.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <set>
#include <thread>

#include "dist/launcher.hpp"
#include "test_util.hpp"

namespace anvil::dist {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::unique_ptr<TcpStore> serve() {
  return std::make_unique<TcpStore>("127.0.0.1", 0, true, 5s);
}
std::unique_ptr<TcpStore> client_of(const TcpStore& server) {
  return std::make_unique<TcpStore>("127.0.0.1", server.port(), false, 5s);
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(TcpStore, SetGetTryGet) {
  auto server = serve();
  EXPECT_TRUE(server->serving());
  EXPECT_GT(server->port(), 0);
  auto client = client_of(*server);
  EXPECT_FALSE(client->serving());
  EXPECT_EQ(client->try_get("a"), std::nullopt);
  client->set("a", "first");
  EXPECT_EQ(server->get("a", 1s), "first");
  server->set("a", "second");  // replaces
  EXPECT_EQ(client->try_get("a"), "second");
  client->set("empty", "");
  EXPECT_EQ(server->try_get("empty"), "");  // set, though empty
}

TEST(TcpStore, ValuesAreBinarySafe) {
  auto server = serve();
  auto client = client_of(*server);
  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes += static_cast<char>(i);
  client->set("bytes", all_bytes);
  EXPECT_EQ(server->get("bytes", 1s), all_bytes);
  std::string big(4 << 20, '\0');  // larger than any socket buffer: sent and received in pieces
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  client->set(std::string("key\0with zero", 13), big);
  EXPECT_EQ(server->get(std::string("key\0with zero", 13), 5s), big);
}

TEST(TcpStore, AddIsAtomicAcrossClientsAndThreads) {
  auto server = serve();
  constexpr int kThreads = 8, kAdds = 200;
  std::vector<std::vector<int64_t>> seen(kThreads * 2);
  std::vector<std::thread> threads;
  auto shared = client_of(*server);  // half the threads share one client, half have their own
  for (int t = 0; t < kThreads * 2; ++t)
    threads.emplace_back([&, t] {
      std::unique_ptr<TcpStore> own = t % 2 ? client_of(*server) : nullptr;
      TcpStore& store = own ? *own : *shared;
      for (int i = 0; i < kAdds; ++i) seen[t].push_back(store.add("counter", 1));
    });
  for (std::thread& t : threads) t.join();
  std::set<int64_t> values;
  for (const auto& v : seen) values.insert(v.begin(), v.end());
  EXPECT_EQ(values.size(), size_t(kThreads * 2 * kAdds));  // every add saw a different count
  EXPECT_EQ(*values.begin(), 1);
  EXPECT_EQ(*values.rbegin(), kThreads * 2 * kAdds);
  EXPECT_EQ(server->try_get("counter"), std::to_string(kThreads * 2 * kAdds));
  EXPECT_EQ(server->add("counter", -kThreads * 2 * kAdds), 0);
  EXPECT_EQ(server->add("fresh", -5), -5);  // a missing key counts as 0
}

TEST(TcpStore, AddOnAValueThatIsNotACounter) {
  auto server = serve();
  server->set("text", "abc");
  test::expect_error([&] { server->add("text", 1); }, {"'text'", "not a counter"});
  EXPECT_EQ(server->add("other", 2), 2);  // the connection still works
}

TEST(TcpStore, GetWaitsForALaterSet) {
  auto server = serve();
  auto client = client_of(*server);
  const auto start = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(200ms);
    auto other = client_of(*server);
    other->set("late", "here");
  });
  EXPECT_EQ(client->get("late", 5s), "here");
  setter.join();
  EXPECT_GE(seconds_since(start), 0.15);
  EXPECT_LT(seconds_since(start), 4.0);
}

TEST(TcpStore, WaitForSeveralKeys) {
  auto server = serve();
  std::vector<std::thread> setters;
  for (int r = 0; r < 4; ++r)
    setters.emplace_back([&, r] {
      auto c = client_of(*server);
      std::this_thread::sleep_for(std::chrono::milliseconds(30 * r));
      c->set("ready/" + std::to_string(r), "1");
    });
  server->wait({"ready/0", "ready/1", "ready/2", "ready/3"}, 5s);
  for (std::thread& t : setters) t.join();
  server->wait({"ready/0", "ready/3"}, 0ms);  // already set: no wait at all
}

TEST(TcpStore, GetTimeoutNamesTheKeyAndTheTimeout) {
  auto server = serve();
  auto client = client_of(*server);
  const auto start = Clock::now();
  test::expect_error(
      [&] { client->get("nccl/unique_id", 300ms); },
      {"timed out after 300 ms", "'nccl/unique_id'", fmt::format("127.0.0.1:{}", server->port())});
  EXPECT_GE(seconds_since(start), 0.25);
  EXPECT_LT(seconds_since(start), 3.0);
  client->set("after", "timeout");  // the connection is still in step
  EXPECT_EQ(client->get("after", 1s), "timeout");
}

TEST(TcpStore, WaitTimeoutNamesTheMissingKeys) {
  auto server = serve();
  server->set("rank/0", "x");
  test::expect_error([&] { server->wait({"rank/0", "rank/1"}, 100ms); }, {"still missing: 'rank/1'"});
}

// A blocked wait does not hold up the other threads' requests on the same client.
TEST(TcpStore, ABlockedWaitDoesNotBlockOtherThreads) {
  auto server = serve();
  auto client = client_of(*server);
  std::thread waiter([&] { EXPECT_EQ(client->get("released", 10s), "yes"); });
  std::this_thread::sleep_for(100ms);
  const auto start = Clock::now();
  client->set("other", "1");
  EXPECT_EQ(client->try_get("other"), "1");
  EXPECT_LT(seconds_since(start), 1.0);
  client->set("released", "yes");
  waiter.join();
}

TEST(TcpStore, ConnectTimeoutNamesHostAndPort) {
  const int port = free_tcp_port();  // nothing listens there
  const auto start = Clock::now();
  test::expect_error([&] { TcpStore("127.0.0.1", port, false, 300ms); },
                     {fmt::format("127.0.0.1:{}", port), "within 300 ms", "rank 0 is running", "MASTER_ADDR",
                      "MASTER_PORT", "firewall"});
  EXPECT_GE(seconds_since(start), 0.25);
  EXPECT_LT(seconds_since(start), 3.0);
}

TEST(TcpStore, UnresolvableHostIsNamed) {
  test::expect_error([&] { TcpStore("no-such-host.invalid", 29500, false, 100ms); },
                     {"no-such-host.invalid:29500", "cannot resolve no-such-host.invalid"});
}

// Rank 0 may start after the others: their clients keep trying until the connect timeout.
TEST(TcpStore, ClientWaitsForALateServer) {
  const int port = free_tcp_port();
  std::unique_ptr<TcpStore> server;
  std::thread late([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStore>("127.0.0.1", port, true, 5s);
  });
  TcpStore client("127.0.0.1", port, false, 10s);
  late.join();
  client.set("k", "v");
  EXPECT_EQ(server->try_get("k"), "v");
}

TEST(TcpStore, ServerThatWentAwayGivesACleanError) {
  auto server = serve();
  auto client = client_of(*server);
  client->set("k", "v");
  const std::string where = fmt::format("127.0.0.1:{}", server->port());
  server.reset();  // rank 0 exits
  test::expect_error([&] { client->set("k", "w"); }, {where, "rank 0", "exited"});
  test::expect_error([&] { client->try_get("k"); }, {where, "rank 0"});
}

TEST(TcpStore, ServerGoingAwayEndsAPendingWait) {
  auto server = serve();
  auto client = client_of(*server);
  const auto start = Clock::now();
  std::thread stop([&] {
    std::this_thread::sleep_for(200ms);
    server.reset();
  });
  test::expect_error([&] { client->get("never", 20s); }, {"closed the connection", "rank 0"});
  stop.join();
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(TcpStore, PortInUse) {
  auto server = serve();
  test::expect_error([&] { TcpStore("127.0.0.1", server->port(), true, 1s); },
                     {fmt::format("port {}", server->port()), "in use", "MASTER_PORT"});
}

// A connection speaking another protocol is dropped; the others are served on.
TEST(TcpStore, StrayConnectionIsDropped) {
  auto server = serve();
  auto client = client_of(*server);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(::send(fd, junk.data(), junk.size(), 0), ssize_t(junk.size()));
  char buf[16];
  EXPECT_EQ(::recv(fd, buf, sizeof buf, 0), 0);  // closed by the server, without a reply
  ::close(fd);
  client->set("still", "served");
  EXPECT_EQ(client->get("still", 1s), "served");
}

// A client that reached another service (MASTER_PORT of something else) says so instead of waiting.
TEST(TcpStore, AnotherServiceOnThePort) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  std::thread banner([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    const std::string hello = "SSH-2.0-OpenSSH_9.6\r\n";
    if (fd >= 0) {
      EXPECT_EQ(::send(fd, hello.data(), hello.size(), 0), ssize_t(hello.size()));
    }
    char buf[64];
    while (fd >= 0 && ::recv(fd, buf, sizeof buf, 0) > 0) {
    }
    ::close(fd);
  });
  const int port = ntohs(addr.sin_port);
  {
    TcpStore client("127.0.0.1", port, false, 2s);
    const auto start = Clock::now();
    test::expect_error([&] { client.set("k", "v"); }, {fmt::format("127.0.0.1:{}", port), "malformed reply"});
    EXPECT_LT(seconds_since(start), 5.0);
  }
  banner.join();
  ::close(listener);
}

}  // namespace
}  // namespace anvil::dist
