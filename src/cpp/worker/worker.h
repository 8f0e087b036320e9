// Worker: one host's Rhino runtime (docs/design.md §2): its replica store and the
// data-plane server that takes part in replica chains (docs/protocol.md §4).
// The `rhino worker` daemon (rhino/worker.py) is a thin shell around it.
//
// Lifecycle: Start once, Stop (from any thread, idempotent), Join (blocks
// until stopped). Stop aborts the streams under way (their staging is removed,
// nothing half-done becomes visible) and closes every connection.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "net/frame.h"
#include "replication/server_metrics.h"  // InstanceReplicaState
#include "rhino/status.h"
#include "rhino/tls.h"
#include "service/instance_metrics.h"

namespace rhino {

struct WorkerOptions {
  // ---- identity and storage ----
  std::string id = "worker";  // worker id, sent in the handshake and in error messages
  std::string store_dir;      // the replica store (created if missing)

  // ---- the state service (docs/protocol.md §7) ----
  // Where the live state of the instances this worker hosts lives. Empty: no
  // state service (the worker only takes part in replica chains).
  std::string state_dir;
  // A Unix domain socket for clients on this host (owner-only); empty = none.
  std::string unix_socket;
  uint32_t service_threads = 4;               // sessions of different instances run in parallel
  uint64_t max_session_bytes = 1ull << 30;    // uncommitted writes one session may hold
  uint32_t session_idle_timeout_ms = 600000;  // a session with no request this long is aborted; 0 = never
  uint32_t max_instances = kDefaultMaxInstances;                    // hosted at once; 0 = no bound
  uint32_t max_checkpoint_readers = kDefaultMaxCheckpointReaders;  // open at once; 0 = no bound
  // The early hand-over's background copy of a base (design §4.1): bytes read per second; 0 = no bound.
  uint64_t base_copy_bytes_per_s = 256ull << 20;
  // How a commit replicates its checkpoint down the instance's chain.
  uint32_t replicate_chunk_bytes = 1u << 20;
  uint32_t replicate_window = 16;
  uint32_t replicate_timeout_ms = 60000;

  // ---- network ----
  std::string listen_host = "127.0.0.1";  // docs/design.md §3: loopback unless told otherwise
  uint16_t listen_port = 0;               // 0 = an ephemeral port (see Worker::port)
  std::string secret;                     // shared secret of the cluster (protocol §2)
  // Mutual TLS on every TCP connection the worker accepts or opens (protocol
  // §2, "TLS"); none = plaintext. The Unix socket never uses it.
  TlsFiles tls;
  // Socket I/O only (stream work runs on the disk threads). One thread
  // keeps up with several GB/s; with two, the reactor hands each partial read
  // of a chunk between them, and a replica spent 10-25% more CPU per MB
  // (bench/README.md, "Reading the results").
  uint32_t io_threads = 1;
  uint32_t disk_threads = 2;              // stream work: writes, fsyncs, commits
  uint32_t heartbeat_ms = 500;            // protocol §6
  uint32_t peer_timeout_ms = 3000;        // protocol §6
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;
  // What each listener (TCP, Unix socket) holds at once (protocol §2,
  // "Connection limits"); over one, a connection is refused with
  // ResourceExhausted and the worker serves on. 0 = no bound.
  uint32_t max_connections = kDefaultMaxConnections;
  uint32_t max_unauthenticated_connections = kDefaultMaxUnauthenticatedConnections;
  uint32_t max_connections_per_peer = kDefaultMaxConnectionsPerPeer;  // per peer IP address (TCP)
  uint32_t max_unauthenticated_per_peer = kDefaultMaxUnauthenticatedPerPeer;  // handshakes per peer IP address
  // Streams one peer holds open on one connection (sessions, replication
  // streams, readers); a frame that would open one more is answered
  // ResourceExhausted on its stream. 0 = no bound.
  uint32_t max_streams_per_connection = kDefaultMaxStreamsPerConnection;
  // Bytes of frames queued for one peer on one connection this worker
  // accepted; over it the worker stops reading that peer until half is sent
  // (a peer that sends requests and reads no answers). 0 = no bound.
  uint64_t max_outbound_bytes = kDefaultMaxOutboundBytes;

  // ---- flow control (protocol §4 step 3) ----
  // Most credits granted per stream, whatever the sender asks: memory per
  // stream is at most max_window x chunk_bytes in each direction.
  uint32_t max_window = 64;
  // A stream with no frame from its predecessor or successor for this long is
  // aborted, so a stuck peer cannot pin staging files. 0 = never.
  uint32_t stream_idle_timeout_ms = 60000;

  // ---- retention (store/retention.h) ----
  // Checkpoints kept per instance in the replica store (more for an instance
  // hosted here whose last complete checkpoint is older); the files only the
  // others reference are freed. 0 = keep every checkpoint; else at least 2.
  uint32_t keep_checkpoints = 3;
  uint32_t retention_interval_ms = 10000;  // how often the pass runs
};

struct WorkerMetrics {
  // bytes
  uint64_t bytes_received = 0;  // chunk bytes from predecessors
  uint64_t bytes_sent = 0;      // chunk bytes to successors (forwarded or read from the pool)
  uint64_t bytes_written = 0;   // chunk bytes written to staging files
  uint64_t net_bytes_in = 0;    // all frame bytes, headers included
  uint64_t net_bytes_out = 0;
  // streams and flow control
  int64_t active_streams = 0;
  int64_t in_flight_credits = 0;  // chunk buffers held right now, all streams
  uint64_t streams_opened = 0;
  uint64_t checkpoints_complete = 0;  // committed here
  uint64_t checkpoints_aborted = 0;   // streams that ended without a commit
  // security and liveness
  uint64_t auth_failures = 0;
  uint64_t tls_failures = 0;   // TLS handshakes that failed (a refused certificate, a plaintext peer)
  uint64_t rejected_frames = 0;
  uint64_t stale_rejections = 0;  // frames or streams refused for a stale chain version
  uint64_t peers_dead = 0;
  int64_t open_connections = 0;
  // outbound bounds: times a connection stopped reading a peer that let more
  // than max_outbound_bytes queue up, and the bytes queued now, all connections
  uint64_t reads_paused = 0;
  int64_t outbound_bytes = 0;
  // memory: free chunk buffers kept for reuse (util/buffer_pool.h; at most 32 MiB)
  uint64_t buffer_pool_cached_bytes = 0;
  // retention: old checkpoints uncommitted, and the pooled files (bytes) freed
  uint64_t checkpoints_retired = 0;
  uint64_t gc_files_removed = 0;
  uint64_t gc_bytes_removed = 0;
  uint64_t gc_deferred = 0;  // passes whose GC found the store busy (a restore or a stream opening) and waited
  // The replica store's pool as the last GC pass left it, and the pins it honoured (streams under way).
  uint64_t pool_files = 0;
  uint64_t pool_bytes = 0;
  uint64_t gc_pins = 0;
  uint64_t retention_errors = 0;  // passes that failed (the error is kept below)
  std::string retention_last_error;
  std::vector<InstanceReplicaState> instances;
  // The instances whose live state this worker hosts (state service).
  std::vector<InstanceMetrics> hosted;
};

class Worker {
 public:
  Worker();
  ~Worker();  // stops and joins
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Opens the store (cleaning staging left by dead processes), binds, listens
  // and starts the threads. Also makes SIGXFSZ ignored process-wide, so that
  // a file-size limit surfaces as EFBIG (Status::NoSpace), not as a kill.
  Status Start(const WorkerOptions& options);
  void Stop();
  void Join();

  uint16_t port() const;  // the bound port, valid after Start
  WorkerMetrics Metrics() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rhino
