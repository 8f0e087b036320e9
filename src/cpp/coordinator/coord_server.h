// CoordServer: the transport of the coordinator (docs/protocol.md §8). The
// coordinator's logic lives in Python (design §2); this is the part that
// speaks the protocol: it listens, authenticates every connection with the
// cluster's shared secret exactly as a worker does (§2), and hands each
// CoordReq to a handler, whose answer goes back as a CoordRsp on the
// request's stream.
//
// - Many requests may be in flight on one connection, each on its own stream
//   id; any further frame on a stream whose request is still in flight is a
//   protocol violation.
// - Handlers run on the server's own threads (`threads` of them), never on a
//   connection's strand: a handler may block for seconds (a handover waits for
//   workers), and the connections must keep reading, answering heartbeats and
//   taking other requests meanwhile. Handlers run concurrently with each
//   other; a request waits in a queue while every thread is busy.
// - Any frame other than a CoordReq after the handshake, and a CoordReq that
//   does not decode, closes that connection with an ErrorRsp (counted in
//   frames_rejected); other connections go on. A CoordReq whose args are not
//   JSON is answered InvalidArgument without calling the handler.
//
// Lifecycle: Start (binds and serves), Shutdown (idempotent; the destructor
// calls it; from a handler it only begins it). Thread-safety: every public
// method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "net/frame.h"
#include "rhino/credential.h"
#include "rhino/status.h"
#include "rhino/tls.h"

namespace rhino {

struct CoordServerOptions {
  // ---- identity ----
  std::string server_id = "coordinator";  // sent in the handshake (HelloRsp.worker_id) and in errors
  std::string secret;                     // the cluster's shared secret (protocol §2); required
  TlsFiles tls;                           // mutual TLS on every connection (protocol §2, "TLS"); none = plaintext

  // ---- network ----
  std::string host = "127.0.0.1";  // an IP address; loopback unless told otherwise (design §3)
  uint16_t port = 0;               // 0 = an ephemeral port (see CoordServer::port)
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;
  uint32_t heartbeat_ms = 500;      // protocol §6; >= 1
  uint32_t peer_timeout_ms = 3000;  // protocol §6; > heartbeat_ms
  // What the listener holds at once (protocol §2, "Connection limits"); over
  // one, a connection is refused with ResourceExhausted. 0 = no bound.
  uint32_t max_connections = kDefaultMaxConnections;
  uint32_t max_unauthenticated_connections = kDefaultMaxUnauthenticatedConnections;
  uint32_t max_connections_per_peer = kDefaultMaxConnectionsPerPeer;  // per peer IP address
  uint32_t max_unauthenticated_per_peer = kDefaultMaxUnauthenticatedPerPeer;  // handshakes per peer IP address

  // ---- handlers ----
  uint32_t threads = 4;  // handler threads, >= 1: how many requests are handled at once
  // The methods of the liveness lane (for the coordinator: heartbeat, status),
  // handled by `lane_threads` threads of their own, so that they never queue
  // behind requests that hold the coordinator's lock or call workers (a
  // heartbeat that waits there makes a live worker look dead). Empty: no lane.
  std::vector<std::string> lane_methods;
  uint32_t lane_threads = 1;  // >= 1 when lane_methods is not empty
};

// Answers one request. Called on a handler thread, with the method (valid:
// [a-z_]{1,64}), the args (a JSON document, already checked to parse) and who
// the caller proved to be (its role and scope: protocol §2, "Roles"; the
// handler decides what that role may ask, §8.2). On
// OK, *result_json (empty on entry) is the answer, a JSON document; any other
// Status goes back to the client with its code and message, and *result_json
// is dropped. It must not throw; if it does, the client is answered IOError.
using CoordHandler =
    std::function<Status(const std::string& method, const std::string& args_json, const PeerIdentity& caller,
                         std::string* result_json)>;

// Counters since Start. Each is a snapshot; they are not read atomically together.
struct CoordServerMetrics {
  // The connections' (as net::ConnectionCounters).
  uint64_t frames_in = 0;
  uint64_t frames_out = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t frames_rejected = 0;  // invalid frames (§1) and unexpected types
  uint64_t auth_failures = 0;    // §2
  uint64_t tls_failures = 0;     // §2, "TLS": refused certificates, plaintext peers
  uint64_t peers_dead = 0;       // §6 timeouts
  int64_t open_connections = 0;
  uint64_t reads_paused = 0;    // connections that stopped reading a peer over max_outbound_bytes (§2)
  int64_t outbound_bytes = 0;   // now, queued for writing, all connections
  uint64_t connections_accepted = 0;
  uint64_t connections_refused = 0;  // over a connection limit (CoordServerOptions)
  // The requests'.
  uint64_t requests = 0;          // CoordReqs accepted for handling
  uint64_t requests_failed = 0;   // answered with a code != 0 (by the handler or the server)
  uint64_t requests_refused = 0;  // answered Aborted without running: the server was shutting down
  uint64_t handlers_running = 0;  // now
  uint64_t requests_queued = 0;   // now, waiting for a handler thread
};

class CoordServer {
 public:
  // Validates `options`, binds host:port and starts serving. `handler` is
  // called on the server's handler threads until Shutdown returns.
  static Status Start(const CoordServerOptions& options, CoordHandler handler, std::unique_ptr<CoordServer>* out);
  // Shutdown(). REQUIRES: not on one of this server's handler threads (it
  // would wait for itself).
  ~CoordServer();
  CoordServer(const CoordServer&) = delete;
  CoordServer& operator=(const CoordServer&) = delete;

  // The bound port (the kernel's choice when options.port was 0).
  uint16_t port() const;
  const std::string& host() const;
  // "host:port" ("[v6]:port" for an IPv6 host): what clients connect to.
  std::string address() const;

  // Stops accepting connections and requests, lets the handlers under way
  // finish (their answers are still sent), answers the requests still queued
  // with Aborted, then closes every connection with an ErrorRsp (Aborted,
  // "coordinator ... is shutting down") and stops the network thread. When it
  // returns, no handler is running and none will be called again.
  // Idempotent; a concurrent call waits for the first. From a handler thread
  // it only begins the shutdown (no waiting) and returns; a later call from
  // another thread, or the destructor, completes it.
  void Shutdown();
  // True on this server's handler threads (while a handler may run there).
  bool InHandlerThread() const;

  CoordServerMetrics Metrics() const;

  class Impl;

 private:
  explicit CoordServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rhino
