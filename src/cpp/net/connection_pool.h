// ConnectionPool: at most one authenticated connection per peer address,
// shared by every stream to that peer (docs/protocol.md §1: connections are
// multiplexed). A worker forwards all its streams to a successor over one
// connection; a closed connection leaves the pool and the next Get redials.
//
// Thread-safe.
#pragma once

#include <asio.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "net/connection.h"
#include "rhino/thread_annotations.h"

namespace rhino::net {

class ConnectionPool {
 public:
  using GetHandler = std::function<void(const Status&, std::shared_ptr<Connection>)>;

  // `io`, `counters` (may be null) must outlive the pool.
  ConnectionPool(asio::io_context& io, ConnectionOptions options, ConnectionCounters* counters);
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // Calls `cb` (on an io thread, never inside Get) with an open connection to
  // `address` ("host:port"), dialing and authenticating one if needed.
  void Get(const std::string& address, GetHandler cb);
  // Closes every pooled connection; later Gets fail with Aborted.
  void CloseAll(const Status& why);

 private:
  struct Entry {
    std::shared_ptr<Connection> conn;
    bool ready = false;
    std::vector<GetHandler> waiters;  // while dialing
  };

  // Held by weak pointers in connection callbacks, so a connection that
  // outlives the pool (a stream still holds it) never touches a dead pool.
  struct Shared {
    Mutex mu;
    std::map<std::string, Entry> entries GUARDED_BY(mu);
    bool closed GUARDED_BY(mu) = false;
  };

  asio::io_context& io_;
  const ConnectionOptions options_;
  ConnectionCounters* const counters_;
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
};

}  // namespace rhino::net
