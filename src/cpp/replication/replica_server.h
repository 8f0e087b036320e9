// ReplicaServer: the worker side of the data plane (docs/protocol.md §2-§6).
//
// It accepts connections, authenticates them (Connection), and serves the
// streams its peers open: an OpenStreamReq creates a ReplicaStream, which does
// the §4 work; a StoreQueryReq is answered from the replica store. Every other
// frame that no stream listens to goes to the handler the owner gives it (the
// worker's frame dispatcher, which knows the state service): the data plane
// knows nothing above it (docs/design.md §2, "Include layering"). It owns the
// chain-version fences (§5) and fences off older streams of an instance when a
// newer chain shows up.
//
// Thread-safety: Listen/Shutdown from one controlling thread; everything else
// runs on the io and disk threads of the owning Worker.
#pragma once

#include <asio.hpp>

#include <map>
#include <memory>
#include <set>
#include <string>

#include "net/connection.h"
#include "net/connection_limiter.h"
#include "net/connection_pool.h"
#include "replication/fence_table.h"
#include "replication/replica_stream.h"
#include "replication/server_metrics.h"
#include "rhino/replica_store.h"
#include "rhino/thread_annotations.h"

namespace rhino {

struct ReplicaServerOptions {
  net::ConnectionOptions connection;  // identity, secret, frame limit, liveness
  uint32_t max_window = 64;
  uint32_t stream_idle_timeout_ms = 60000;
  // Per listener (the TCP one and the Unix socket each): how many
  // connections, handshakes in progress and connections per peer address it
  // holds at once (net/connection_limiter.h, protocol §2).
  net::ConnectionLimits limits;
};

class ReplicaServer {
 public:
  // All pointers must outlive the server. `others` gets the frames the server
  // does not claim (see above), on the connection's strand; it must be
  // callable until Shutdown returns.
  ReplicaServer(asio::io_context& io, asio::thread_pool& disk, ReplicaStore* store, net::ConnectionPool* pool,
                ServerMetrics* metrics, net::ConnectionCounters* counters, const ReplicaServerOptions& options,
                net::Connection::UnclaimedHandler others);
  ~ReplicaServer();

  // Binds and starts accepting. `port` 0 picks an ephemeral port (see port()).
  Status Listen(const std::string& host, uint16_t port);
  // Also accepts on a Unix domain socket at `path`, for clients on the same
  // host (protocol §7.1): created owner-only (0600) before it listens, so no
  // other user can connect even for a moment; the secret is still required.
  // An existing socket file is replaced only if nothing answers on it.
  Status ListenUnix(const std::string& path);
  uint16_t port() const { return port_; }
  // What each listener holds now, and has refused.
  net::ConnectionLimiterCounts tcp_counts() const { return tcp_limiter_.counts(); }
  net::ConnectionLimiterCounts unix_counts() const { return unix_limiter_.counts(); }

  // Stops accepting, aborts every stream ("worker shutting down"), closes
  // every accepted connection, and waits up to `wait_ms` for the streams to
  // finish their cleanup (staging removed).
  void Shutdown(int wait_ms) EXCLUDES(mu_);

 private:
  void Accept();
  void AcceptUnix();
  void OnAccepted(const std::shared_ptr<net::Connection>& conn, const asio::error_code& ec, bool unix_socket)
      EXCLUDES(mu_);
  std::shared_ptr<net::StreamListener> OnUnclaimed(const std::shared_ptr<net::Connection>& conn,
                                                   const FrameHeader& h, std::shared_ptr<std::string> payload)
      EXCLUDES(mu_);
  void AnswerStoreQuery(const std::shared_ptr<net::Connection>& conn, const FrameHeader& h,
                        const std::string& payload);
  void FenceOlder(const std::string& operator_id, uint32_t instance, uint64_t version) EXCLUDES(mu_);
  void OnStreamFinished(ReplicaStream* stream) EXCLUDES(mu_);

  asio::io_context& io_;
  asio::thread_pool& disk_;
  ReplicaStore* const store_;
  ServerMetrics* const metrics_;
  net::ConnectionCounters* const counters_;
  const ReplicaServerOptions options_;
  const net::Connection::UnclaimedHandler others_;
  FenceTable fences_;
  StreamEnv env_;
  asio::ip::tcp::acceptor acceptor_;
  asio::local::stream_protocol::acceptor unix_acceptor_;
  std::string unix_path_;
  asio::steady_timer accept_retry_;
  uint16_t port_ = 0;
  net::ConnectionLimiter tcp_limiter_;
  net::ConnectionLimiter unix_limiter_;

  Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::map<ReplicaStream*, std::shared_ptr<ReplicaStream>> streams_ GUARDED_BY(mu_);
  std::map<net::Connection*, std::weak_ptr<net::Connection>> conns_ GUARDED_BY(mu_);
};

}  // namespace rhino
