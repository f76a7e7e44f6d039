// The job's key-value store over TCP, as torch's TCPStore: global rank 0 serves it (a background thread that
// serves every connection from one poll loop) and every process, rank 0 included, is a client with one
// connection. It only bootstraps a job (addresses, unique ids, start-up checks, failure notices): requests
// are small and rare, so the protocol is a plain length-prefixed request/response of our own.
//
// Nothing waits forever: a blocking get/wait ends at its timeout (the server tracks it and answers), any
// other request gets its reply within kReplyTimeout, and a server that went away (rank 0 exited) makes the
// next operation throw anvil::Error saying so. Connection errors name host:port and what to check.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/store.hpp"

namespace anvil::dist {

class TcpStore final : public Store {
 public:
  // How long a client waits for the reply to set/try_get/add (a live server answers in microseconds; only
  // a stopped or hung rank 0 takes longer), and beyond a wait's own timeout for its reply.
  static constexpr std::chrono::seconds kReplyTimeout{60};

  // `serve`: this process serves the store on `port` of every interface of this host (0 picks a free
  // port: see port()), then connects to it at host:port like every other process. Otherwise it connects to
  // the store at host:port, retrying until `connect_timeout` passes (rank 0 may start later than the
  // others), then throws anvil::Error naming host:port and what to check.
  TcpStore(std::string host, int port, bool serve, std::chrono::milliseconds connect_timeout);
  ~TcpStore() override;  // stops serving (the other clients' next operations then fail) and disconnects
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  const std::string& host() const { return host_; }
  int port() const { return port_; }  // the port served or connected to (never 0)
  bool serving() const { return server_ != nullptr; }

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  // The counter is stored as its decimal text: get() of a counter returns e.g. "3".
  int64_t add(const std::string& key, int64_t delta) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;

 private:
  class Server;
  class Client;
  std::string host_;
  int port_ = 0;
  std::unique_ptr<Server> server_;  // declared before client_: the client disconnects first
  std::unique_ptr<Client> client_;
};

}  // namespace anvil::dist
