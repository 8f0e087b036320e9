#include "worker/worker.h"

#include <csignal>
#include <thread>

#include "net/connection.h"
#include "net/connection_pool.h"
#include "net/frame.h"
#include "net/messages.h"
#include "replication/replica_server.h"
#include "replication/server_metrics.h"
#include "rhino/replica_store.h"
#include "rhino/thread_annotations.h"
#include "service/state_service.h"
#include "store/retention.h"
#include "util/buffer_pool.h"
#include "worker/frame_dispatcher.h"

namespace rhino {

class Worker::Impl {
 public:
  ~Impl() { Stop(); }

  Status Start(const WorkerOptions& o) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    if (started_) return Status::InvalidArgument("worker already started");
    RHINO_RETURN_IF_ERROR(CheckOptions(o));
    // RLIMIT_FSIZE must give EFBIG (a clean NoSpace abort), not SIGXFSZ.
    std::signal(SIGXFSZ, SIG_IGN);
    options_ = o;
    // Opening the store removes staging left by a killed predecessor process.
    RHINO_RETURN_IF_ERROR(ReplicaStore::Open(o.store_dir, &store_));
    // Every file is read now: a bad certificate fails the start, not the first peer.
    RHINO_RETURN_IF_ERROR(net::MakeTlsContext(o.tls, &tls_));
    const net::ConnectionOptions co = ConnectionOptionsOf(o, tls_);
    io_ = std::make_unique<asio::io_context>();
    work_ = std::make_unique<asio::executor_work_guard<asio::io_context::executor_type>>(io_->get_executor());
    disk_ = std::make_unique<asio::thread_pool>(o.disk_threads);
    pool_ = std::make_unique<net::ConnectionPool>(*io_, co, &counters_);
    Status s = StartService(o);
    if (s.ok()) {
      // The service (if any) exists before the server can hand it a frame.
      dispatcher_ = std::make_unique<FrameDispatcher>(o.id, service_.get(), &counters_);
      ReplicaServerOptions so;
      so.connection = co;
      so.max_window = o.max_window;
      so.stream_idle_timeout_ms = o.stream_idle_timeout_ms;
      so.limits.max_connections = o.max_connections;
      so.limits.max_unauthenticated = o.max_unauthenticated_connections;
      so.limits.max_per_peer = o.max_connections_per_peer;
      so.limits.max_unauthenticated_per_peer = o.max_unauthenticated_per_peer;
      FrameDispatcher* d = dispatcher_.get();
      server_ = std::make_unique<ReplicaServer>(
          *io_, *disk_, store_.get(), pool_.get(), &metrics_, &counters_, so,
          [d](const std::shared_ptr<net::Connection>& c, const FrameHeader& h, std::shared_ptr<std::string> p) {
            return d->Dispatch(c, h, std::move(p));
          });
      s = server_->Listen(o.listen_host, o.listen_port);
    }
    if (s.ok() && !o.unix_socket.empty()) s = server_->ListenUnix(o.unix_socket);
    if (!s.ok()) {
      if (service_) service_->Shutdown();
      server_.reset();
      dispatcher_.reset();
      service_.reset();
      pool_.reset();
      disk_->join();
      disk_.reset();
      return s;
    }
    port_ = server_->port();
    for (uint32_t i = 0; i < o.io_threads; ++i) threads_.emplace_back([this]() { io_->run(); });
    if (o.keep_checkpoints > 0) retention_ = std::thread([this]() { RetentionLoop(); });
    started_ = true;
    return Status::OK();
  }

  void Stop() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    if (!started_ || stopped_) return;
    if (stopping_) {
      while (!stopped_) cv_.Wait(&mu_);
      return;
    }
    stopping_ = true;
    retention_cv_.SignalAll();
    l.Unlock();
    if (retention_.joinable()) retention_.join();
    // Streams first (they tell their peers and remove their staging), then
    // connections, then the threads.
    server_->Shutdown(5000);
    pool_->CloseAll(Status::Aborted("worker " + options_.id + " is shutting down"));
    // After the connections: sessions still open are aborted, instances closed.
    if (service_) service_->Shutdown();
    // Let the close and abort frames go out before the loop stops.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    work_.reset();
    io_->stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
    disk_->join();
    // Order matters: the acceptor dies before its io_context; the io_context
    // then drops the handlers that hold the last connections and streams,
    // whose strands live on the disk pool, which goes last.
    server_.reset();
    dispatcher_.reset();
    {
      MutexLock g(&mu_);
      service_.reset();
    }
    pool_.reset();
    io_.reset();
    disk_.reset();
    l.Lock();
    stopped_ = true;
    cv_.SignalAll();
  }

  void Join() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    while (started_ && !stopped_) cv_.Wait(&mu_);
  }

  uint16_t port() const { return port_; }

  WorkerMetrics Metrics() EXCLUDES(mu_, retention_mu_, metrics_.mu) {
    WorkerMetrics m;
    {
      // Stop resets service_ under mu_: a metrics scrape never sees it freed.
      MutexLock l(&mu_);
      if (service_ && !stopping_) m.hosted = service_->Metrics();
    }
    m.bytes_received = metrics_.bytes_received.load();
    m.bytes_sent = metrics_.bytes_sent.load();
    m.bytes_written = metrics_.bytes_written.load();
    m.net_bytes_in = counters_.bytes_in.load();
    m.net_bytes_out = counters_.bytes_out.load();
    m.active_streams = metrics_.active_streams.load();
    m.in_flight_credits = metrics_.in_flight_credits.load();
    m.streams_opened = metrics_.streams_opened.load();
    m.checkpoints_complete = metrics_.checkpoints_complete.load();
    m.checkpoints_aborted = metrics_.checkpoints_aborted.load();
    m.auth_failures = counters_.auth_failures.load();
    m.tls_failures = counters_.tls_failures.load();
    m.rejected_frames = counters_.frames_rejected.load();
    m.stale_rejections = metrics_.stale_rejections.load();
    m.peers_dead = counters_.peers_dead.load();
    m.open_connections = counters_.open_connections.load();
    m.reads_paused = counters_.reads_paused.load();
    m.outbound_bytes = counters_.outbound_bytes.load();
    m.buffer_pool_cached_bytes = BufferPool::Shared().cached_bytes();
    {
      MutexLock l(&retention_mu_);
      m.checkpoints_retired = retired_;
      m.gc_files_removed = gc_files_;
      m.gc_bytes_removed = gc_bytes_;
      m.gc_deferred = gc_deferred_;
      m.pool_files = pool_files_;
      m.pool_bytes = pool_bytes_;
      m.gc_pins = gc_pins_;
      m.retention_errors = retention_errors_;
      m.retention_last_error = retention_last_error_;
    }
    MutexLock l(&metrics_.mu);
    for (const auto& [key, st] : metrics_.instances) m.instances.push_back(st);
    return m;
  }

 private:
  static Status CheckOptions(const WorkerOptions& o) {
    if (o.store_dir.empty()) return Status::InvalidArgument("worker needs a store directory");
    if (o.io_threads == 0 || o.disk_threads == 0 || o.service_threads == 0) {
      return Status::InvalidArgument("thread counts must be >= 1");
    }
    if (o.max_window == 0) return Status::InvalidArgument("max_window must be >= 1");
    if (o.keep_checkpoints == 1) {
      // A re-executed batch b rolls back to checkpoint b-1 (design §5).
      return Status::InvalidArgument("keep_checkpoints must be 0 (keep all) or >= 2, got 1");
    }
    if (o.keep_checkpoints > 0 && o.retention_interval_ms == 0) {
      return Status::InvalidArgument("retention_interval_ms must be >= 1");
    }
    if (o.secret.empty()) return Status::InvalidArgument("worker needs a non-empty shared secret");
    // A peer is declared dead after peer_timeout_ms without a frame, and idle
    // connections send a heartbeat every heartbeat_ms (protocol §6): the
    // timeout must leave room for at least one heartbeat to arrive.
    if (o.heartbeat_ms == 0) return Status::InvalidArgument("heartbeat_ms must be >= 1");
    if (o.peer_timeout_ms <= o.heartbeat_ms) {
      return Status::InvalidArgument("peer_timeout_ms (" + std::to_string(o.peer_timeout_ms) +
                                     ") must exceed heartbeat_ms (" + std::to_string(o.heartbeat_ms) + ")");
    }
    // Every control message must fit in one frame; a cap keeps a peer from
    // making us allocate an arbitrary buffer for one frame.
    if (o.max_frame_bytes < kMaxMessageBytes || o.max_frame_bytes > kMaxFrameBytesLimit) {
      return Status::InvalidArgument("max_frame_bytes must be in [" + std::to_string(kMaxMessageBytes) + ", " +
                                     std::to_string(kMaxFrameBytesLimit) + "], got " +
                                     std::to_string(o.max_frame_bytes));
    }
    if (o.state_dir.empty() && !o.unix_socket.empty()) {
      return Status::InvalidArgument("a Unix socket serves the state service, which needs a state directory");
    }
    return Status::OK();
  }

  static net::ConnectionOptions ConnectionOptionsOf(const WorkerOptions& o, const net::TlsContext& tls) {
    net::ConnectionOptions co;
    co.tls = tls;
    co.worker_id = o.id;
    co.secret = o.secret;  // the server side: every role's key derives from it
    // The client side (the pool's connections down a chain): the worker's own role.
    co.credential = Credential::FromRoot(o.secret, PeerRole::kWorker, o.id);
    co.max_frame_bytes = o.max_frame_bytes;
    co.max_streams = o.max_streams_per_connection;
    co.max_outbound_bytes = o.max_outbound_bytes;
    co.heartbeat_ms = o.heartbeat_ms;
    co.peer_timeout_ms = o.peer_timeout_ms;
    co.local_bind_host = o.listen_host;
    return co;
  }

  // The state service (protocol §7), if the worker has a state directory:
  // it re-hosts the instances found there before the worker listens.
  Status StartService(const WorkerOptions& o) {
    if (o.state_dir.empty()) return Status::OK();
    StateServiceOptions ss;
    ss.worker_id = o.id;
    ss.state_dir = o.state_dir;
    ss.secret = o.secret;
    ss.tls = o.tls;
    ss.replicate.tls = tls_;
    ss.threads = o.service_threads;
    ss.max_frame_bytes = o.max_frame_bytes;
    ss.max_session_bytes = o.max_session_bytes;
    ss.session_idle_timeout_ms = o.session_idle_timeout_ms;
    ss.max_instances = o.max_instances;
    ss.max_checkpoint_readers = o.max_checkpoint_readers;
    ss.base_copy_bytes_per_s = o.base_copy_bytes_per_s;
    ss.peer_timeout_ms = o.peer_timeout_ms;
    ss.replicate.chunk_bytes = o.replicate_chunk_bytes;
    ss.replicate.window = o.replicate_window;
    ss.replicate.timeout_ms = o.replicate_timeout_ms;
    ss.replicate.heartbeat_ms = o.heartbeat_ms;
    ss.replicate.peer_timeout_ms = o.peer_timeout_ms;
    ss.replicate.max_frame_bytes = o.max_frame_bytes;
    service_ = std::make_unique<StateService>(store_.get(), &counters_, ss);
    return service_->Start();
  }

  // Every retention_interval_ms: old checkpoints out, unreferenced files freed
  // (store/retention.h). Off the io and disk threads: GC lists the pool.
  void RetentionLoop() EXCLUDES(mu_, retention_mu_) {
    const auto interval = std::chrono::milliseconds(options_.retention_interval_ms);
    MutexLock l(&mu_);
    while (!stopping_) {
      retention_cv_.WaitFor(&mu_, interval, [this]() {
        mu_.AssertHeld();
        return stopping_;
      });
      if (stopping_) break;
      StateService* service = service_.get();  // reset only after this thread is joined
      l.Unlock();
      RetentionFloor floor_of;
      if (service) {
        floor_of = [service](const std::string& op, uint32_t i) { return service->RetentionFloor(op, i); };
      }
      RetentionStats st;
      Status s = ApplyRetention(store_.get(), options_.keep_checkpoints, floor_of, &st);
      {
        MutexLock g(&retention_mu_);
        retired_ += st.checkpoints_removed;
        gc_files_ += st.files_removed;
        gc_bytes_ += st.bytes_removed;
        if (st.gc_deferred) ++gc_deferred_;
        if (st.gc_ran) {
          pool_files_ = st.pool_files;
          pool_bytes_ = st.pool_bytes;
          gc_pins_ = st.pins;
        }
        if (!s.ok()) {
          ++retention_errors_;
          retention_last_error_ = s.ToString();
        }
      }
      l.Lock();
    }
  }

  Mutex mu_;
  CondVar cv_;
  bool started_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool stopped_ GUARDED_BY(mu_) = false;
  WorkerOptions options_;
  uint16_t port_ = 0;
  ServerMetrics metrics_;
  net::ConnectionCounters counters_;
  net::TlsContext tls_;  // built once at Start from options_.tls; null = plaintext
  std::unique_ptr<ReplicaStore> store_;
  std::unique_ptr<asio::io_context> io_;
  std::unique_ptr<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::unique_ptr<asio::thread_pool> disk_;
  std::unique_ptr<net::ConnectionPool> pool_;
  std::unique_ptr<StateService> service_;
  std::unique_ptr<FrameDispatcher> dispatcher_;  // hands the service its frames
  std::unique_ptr<ReplicaServer> server_;
  std::vector<std::thread> threads_;
  std::thread retention_;
  CondVar retention_cv_;  // with mu_: wakes the retention loop at Stop
  Mutex retention_mu_;
  uint64_t retired_ GUARDED_BY(retention_mu_) = 0;
  uint64_t gc_files_ GUARDED_BY(retention_mu_) = 0;
  uint64_t gc_bytes_ GUARDED_BY(retention_mu_) = 0;
  uint64_t gc_deferred_ GUARDED_BY(retention_mu_) = 0;
  uint64_t pool_files_ GUARDED_BY(retention_mu_) = 0;
  uint64_t pool_bytes_ GUARDED_BY(retention_mu_) = 0;
  uint64_t gc_pins_ GUARDED_BY(retention_mu_) = 0;
  uint64_t retention_errors_ GUARDED_BY(retention_mu_) = 0;
  std::string retention_last_error_ GUARDED_BY(retention_mu_);
};

Worker::Worker() : impl_(std::make_unique<Impl>()) {}
Worker::~Worker() { impl_->Stop(); }
Status Worker::Start(const WorkerOptions& options) { return impl_->Start(options); }
void Worker::Stop() { impl_->Stop(); }
void Worker::Join() { impl_->Join(); }
uint16_t Worker::port() const { return impl_->port(); }
WorkerMetrics Worker::Metrics() const { return impl_->Metrics(); }

}  // namespace rhino
