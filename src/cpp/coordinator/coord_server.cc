#include "coordinator/coord_server.h"

#include <asio.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <thread>
#include <vector>

#include "net/connection.h"
#include "net/connection_limiter.h"
#include "net/coord_messages.h"
#include "net/json_bounds.h"
#include "net/messages.h"
#include "rhino/thread_annotations.h"

namespace rhino {
namespace {

// The server whose handler runs on this thread, if any (InHandlerThread).
thread_local const CoordServer::Impl* tls_handler_of = nullptr;

// How long Shutdown lets the connections write their closing ErrorRsp before
// it stops the network thread anyway (a peer that reads nothing must not hold
// a shutdown for its whole peer timeout).
constexpr uint32_t kCloseDrainMs = 1000;

// One CoordReq waiting for, or in, a handler thread.
struct Task {
  std::weak_ptr<net::Connection> conn;  // weak: a closed connection is freed, its answer dropped
  uint32_t stream_id = 0;
  CoordReq req;
  PeerIdentity caller;  // who the connection proved to be (protocol §2, "Roles")
};

}  // namespace

class CoordServer::Impl {
 public:
  Impl(const CoordServerOptions& options, CoordHandler handler)
      : options_(options),
        handler_(std::move(handler)),
        limiter_("the coordinator (" + options.server_id + ")", LimitsOf(options)),
        acceptor_(io_),
        accept_retry_(io_) {
    conn_options_.worker_id = options.server_id;
    conn_options_.secret = options.secret;
    conn_options_.max_frame_bytes = options.max_frame_bytes;
    conn_options_.heartbeat_ms = options.heartbeat_ms;
    conn_options_.peer_timeout_ms = options.peer_timeout_ms;
  }

  ~Impl() { Shutdown(); }

  Status Listen() {
    RHINO_RETURN_IF_ERROR(net::MakeTlsContext(options_.tls, &conn_options_.tls));
    asio::error_code ec;
    asio::ip::address addr = asio::ip::make_address(options_.host, ec);
    if (ec) return Status::InvalidArgument("coordinator host '" + options_.host + "' is not an IP address: " + ec.message());
    asio::ip::tcp::endpoint ep(addr, options_.port);
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return Status::IOError("coordinator cannot listen on " + Join(options_.host, options_.port) + ": " +
                             ec.message());
    }
    port_ = acceptor_.local_endpoint(ec).port();
    address_ = Join(options_.host, port_);
    Accept();
    work_ = std::make_unique<asio::executor_work_guard<asio::io_context::executor_type>>(io_.get_executor());
    io_thread_ = std::thread([this]() {
      io_.run();
      MutexLock l(&mu_);
      io_done_ = true;
      cv_.SignalAll();
    });
    for (uint32_t i = 0; i < options_.threads; ++i) workers_.emplace_back([this]() { HandlerLoop(false); });
    if (!options_.lane_methods.empty()) {
      for (uint32_t i = 0; i < options_.lane_threads; ++i) workers_.emplace_back([this]() { HandlerLoop(true); });
    }
    return Status::OK();
  }

  uint16_t port() const { return port_; }
  const std::string& host() const { return options_.host; }
  const std::string& address() const { return address_; }
  bool InHandlerThread() const { return tls_handler_of == this; }

  void Shutdown() EXCLUDES(mu_, shutdown_mu_) {
    BeginShutdown();
    // The rest waits for the handler threads, so a handler cannot do it.
    if (InHandlerThread()) return;
    MutexLock once(&shutdown_mu_);  // a concurrent Shutdown waits for this one
    if (shut_down_) return;
    // 1. The handlers under way finish and their answers are sent; what is
    //    still queued is answered Aborted (BeginShutdown set stopping_).
    {
      MutexLock l(&mu_);
      quit_ = true;
    }
    cv_.SignalAll();
    for (auto& t : workers_) t.join();
    workers_.clear();
    // 2. Every connection is told why it closes (an ErrorRsp on stream 0), so
    //    that a client's calls fail with "shutting down", not a bare EOF.
    std::vector<std::shared_ptr<net::Connection>> conns;
    {
      MutexLock l(&mu_);
      for (auto& [raw, weak] : conns_)
        if (auto c = weak.lock()) conns.push_back(std::move(c));
    }
    const Status why = Status::Aborted("the coordinator (" + options_.server_id + ") is shutting down");
    for (auto& c : conns) c->CloseWithError(0, why);
    conns.clear();
    // 3. The network thread ends once those answers are written and the
    //    sockets closed; a peer that does not read is not waited for.
    work_.reset();
    if (io_thread_.joinable()) {
      {
        MutexLock l(&mu_);
        cv_.WaitFor(&mu_, std::chrono::milliseconds(kCloseDrainMs), [this]() {
          mu_.AssertHeld();
          return io_done_;
        });
      }
      io_.stop();
      io_thread_.join();
    }
    shut_down_ = true;
  }

  CoordServerMetrics Metrics() const EXCLUDES(mu_) {
    CoordServerMetrics m;
    m.frames_in = counters_.frames_in.load();
    m.frames_out = counters_.frames_out.load();
    m.bytes_in = counters_.bytes_in.load();
    m.bytes_out = counters_.bytes_out.load();
    m.frames_rejected = counters_.frames_rejected.load();
    m.auth_failures = counters_.auth_failures.load();
    m.tls_failures = counters_.tls_failures.load();
    m.peers_dead = counters_.peers_dead.load();
    m.open_connections = counters_.open_connections.load();
    m.reads_paused = counters_.reads_paused.load();
    m.outbound_bytes = counters_.outbound_bytes.load();
    m.connections_accepted = connections_accepted_.load();
    m.connections_refused = limiter_.counts().refused;
    m.requests = requests_.load();
    m.requests_failed = requests_failed_.load();
    m.requests_refused = requests_refused_.load();
    MutexLock l(&mu_);
    m.handlers_running = running_;
    m.requests_queued = queue_.size() + lane_queue_.size();
    return m;
  }

 private:
  // Holds a stream while its request is handled: frames of a stream go to its
  // listener, so a second frame on that stream comes here rather than being
  // taken for a new request (protocol §8: one request per stream id).
  class InFlight : public net::StreamListener {
   public:
    InFlight(Impl* server, std::weak_ptr<net::Connection> conn) : server_(server), conn_(std::move(conn)) {}
    void OnFrame(const FrameHeader& h, std::shared_ptr<std::string>) override {
      if (auto c = conn_.lock()) {
        server_->Reject(c, h,
                        Status::Corruption(std::string("unexpected ") + MessageTypeName(h.type) + " on stream " +
                                           std::to_string(h.stream_id) + ", whose CoordReq is still being handled"));
      }
    }
    void OnConnectionClosed(const Status&) override {}

   private:
    Impl* const server_;
    std::weak_ptr<net::Connection> conn_;
  };

  static net::ConnectionLimits LimitsOf(const CoordServerOptions& o) {
    net::ConnectionLimits l;
    l.max_connections = o.max_connections;
    l.max_unauthenticated = o.max_unauthenticated_connections;
    l.max_per_peer = o.max_connections_per_peer;
    l.max_unauthenticated_per_peer = o.max_unauthenticated_per_peer;
    return l;
  }

  static std::string Join(const std::string& host, uint16_t port) {
    const bool v6 = host.find(':') != std::string::npos;
    return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }

  // Refuses new connections and requests. Any thread, any number of times.
  void BeginShutdown() EXCLUDES(mu_) {
    {
      MutexLock l(&mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.SignalAll();
    asio::post(io_, [this]() {
      asio::error_code ec;
      acceptor_.close(ec);
      accept_retry_.cancel();
    });
  }

  // ---- the network thread ----

  void Accept() {
    auto conn = net::Connection::Create(io_, net::Connection::Role::kServer, conn_options_, &counters_);
    acceptor_.async_accept(conn->socket(), [this, conn](const asio::error_code& ec) { OnAccepted(conn, ec); });
  }

  void OnAccepted(const std::shared_ptr<net::Connection>& conn, const asio::error_code& ec) {
    if (ec == asio::error::operation_aborted) return;  // Shutdown closed the acceptor
    // Admitted before its handshake costs anything (protocol §2, "Connection
    // limits"); a refused peer gets the reason and the listener serves on.
    std::shared_ptr<net::ConnectionLimiter::Slot> slot;
    if (!ec) {
      Status admitted = limiter_.Admit(net::PeerAddressOf(conn->socket().native_handle()), &slot);
      if (!admitted.ok()) {
        {
          MutexLock l(&mu_);
          if (stopping_) return;
        }
        conn->Refuse(admitted);
        Accept();
        return;
      }
    }
    {
      MutexLock l(&mu_);
      if (stopping_) return;
      if (!ec) conns_[conn.get()] = conn;
    }
    if (ec) {
      // e.g. EMFILE: back off instead of spinning on a failing accept.
      accept_retry_.expires_after(std::chrono::milliseconds(100));
      accept_retry_.async_wait([this](const asio::error_code& e) {
        if (!e) Accept();
      });
      return;
    }
    connections_accepted_.fetch_add(1);
    net::Connection* raw = conn.get();
    conn->set_unclaimed_handler([this](const std::shared_ptr<net::Connection>& c, const FrameHeader& h,
                                       std::shared_ptr<std::string> payload) {
      return OnUnclaimed(c, h, std::move(payload));
    });
    // The slot is held until the connection closes; the handshake's success
    // moves it out of the unauthenticated count.
    conn->set_close_handler([this, raw, slot](const Status&) {
      MutexLock l(&mu_);
      conns_.erase(raw);
    });
    // The handshake (§2) is the connection's own business.
    conn->StartServer([slot](const Status& s) {
      if (s.ok()) slot->Authenticated();
    });
    Accept();
  }

  void Reject(const std::shared_ptr<net::Connection>& conn, const FrameHeader& h, const Status& why) {
    counters_.frames_rejected.fetch_add(1);
    conn->CloseWithError(h.stream_id, why);
  }

  // On the connection's strand: must not block, so the request is queued for
  // a handler thread.
  std::shared_ptr<net::StreamListener> OnUnclaimed(const std::shared_ptr<net::Connection>& conn,
                                                   const FrameHeader& h, std::shared_ptr<std::string> payload) {
    if (h.type != MessageType::kCoordReq) {
      Reject(conn, h,
             Status::Corruption(std::string("unexpected ") + MessageTypeName(h.type) + " sent to the coordinator"));
      return nullptr;
    }
    Task t;
    Status s = CoordReq::Decode(*payload, &t.req);
    if (!s.ok()) {
      Reject(conn, h, Status::Corruption("invalid CoordReq: " + s.message()));
      return nullptr;
    }
    t.conn = conn;
    t.stream_id = h.stream_id;
    t.caller = conn->peer();
    const bool lane = InLane(t.req.method);
    {
      MutexLock l(&mu_);
      if (!stopping_) {
        requests_.fetch_add(1);
        (lane ? lane_queue_ : queue_).push_back(std::move(t));
        // one condition for both queues: wake them all, the right one takes it
        cv_.SignalAll();
        return std::make_shared<InFlight>(this, conn);
      }
    }
    requests_refused_.fetch_add(1);
    requests_failed_.fetch_add(1);
    CoordRsp rsp;
    rsp.code = WireCode(Status::Aborted(""));
    rsp.message = "the coordinator (" + options_.server_id + ") is shutting down";
    conn->Send(MessageType::kCoordRsp, h.stream_id, 0, rsp.Encode());
    return nullptr;
  }

  // ---- the handler threads ----

  bool InLane(const std::string& method) const {
    for (const auto& m : options_.lane_methods)
      if (m == method) return true;
    return false;
  }

  // `lane`: this thread serves the liveness lane's queue (lane_methods).
  void HandlerLoop(bool lane) {
    tls_handler_of = this;
    for (;;) {
      Task t;
      bool refuse = false;
      {
        MutexLock l(&mu_);
        std::deque<Task>& q = lane ? lane_queue_ : queue_;
        while (q.empty() && !quit_) cv_.Wait(&mu_);
        if (q.empty()) break;  // quit_, and nothing left to answer
        t = std::move(q.front());
        q.pop_front();
        refuse = stopping_;
        ++running_;
      }
      CoordRsp rsp;
      if (refuse) {
        // Not started before the shutdown began: not started at all, and
        // the client is told so at once rather than left to time out.
        requests_refused_.fetch_add(1);
        rsp.code = WireCode(Status::Aborted(""));
        rsp.message = "the coordinator (" + options_.server_id + ") is shutting down";
      } else {
        Handle(t.req, t.caller, &rsp);
      }
      if (rsp.code != 0) requests_failed_.fetch_add(1);
      Answer(t, std::move(rsp));
      MutexLock l(&mu_);
      --running_;
    }
    tls_handler_of = nullptr;
  }

  void Handle(const CoordReq& req, const PeerIdentity& caller, CoordRsp* rsp) {
    Status s;
    // The args come from the network; the handler gets a JSON document of
    // bounded depth or is not called (nlohmann's parser also rejects strings
    // that are not UTF-8; net/json_bounds.h says why the depth).
    s = CheckJson(req.args, kMaxCoordArgsDepth, "the args of " + req.method);
    if (s.ok()) {
      try {
        s = handler_(req.method, req.args, caller, &rsp->result);
      } catch (const std::exception& e) {
        s = Status::IOError(std::string("the coordinator's handler of ") + req.method + " threw: " + e.what());
      } catch (...) {
        s = Status::IOError(std::string("the coordinator's handler of ") + req.method + " threw");
      }
    }
    if (s.ok()) {
      // An answer that cannot travel is an error the client can read, not a
      // frame its connection would reject (and close) for its length.
      const size_t frame_payload = 4 + 4 + 4 + rsp->result.size();
      if (rsp->result.size() > kMaxCoordResultBytes || frame_payload > options_.max_frame_bytes) {
        s = Status::InvalidArgument("the result of " + req.method + " has " + std::to_string(rsp->result.size()) +
                                    " bytes, more than a CoordRsp carries (" +
                                    std::to_string(std::min<size_t>(kMaxCoordResultBytes,
                                                                    options_.max_frame_bytes - 12)) +
                                    ")");
      }
    }
    rsp->code = WireCode(s);
    rsp->message = s.message();
    if (!s.ok()) rsp->result.clear();
  }

  void Answer(const Task& t, CoordRsp rsp) {
    auto conn = t.conn.lock();
    if (!conn) return;  // the client went away; nobody to answer
    // The stream is freed before its answer goes out, on the same strand:
    // the other order let a client that reuses the id as soon as it has the
    // answer (which the write may deliver before the next post runs) be taken
    // for a second request on a stream in flight.
    conn->Detach(t.stream_id);
    conn->Send(MessageType::kCoordRsp, t.stream_id, 0, rsp.Encode());
  }

  const CoordServerOptions options_;
  const CoordHandler handler_;
  net::ConnectionOptions conn_options_;
  // Declared before io_: connections still owned by io_'s handlers when it is
  // destroyed update these from their destructors.
  net::ConnectionCounters counters_;
  // Atomic: updated by the network and handler threads, read by Metrics.
  std::atomic<uint64_t> connections_accepted_{0};
  // Before io_ too: the slots the connections hold share its counts.
  net::ConnectionLimiter limiter_;
  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> requests_failed_{0};
  std::atomic<uint64_t> requests_refused_{0};

  asio::io_context io_;
  std::unique_ptr<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  asio::ip::tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_;
  uint16_t port_ = 0;
  std::string address_;
  std::thread io_thread_;
  std::vector<std::thread> workers_;

  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool quit_ GUARDED_BY(mu_) = false;  // handler threads exit when idle
  bool io_done_ GUARDED_BY(mu_) = false;
  std::deque<Task> queue_ GUARDED_BY(mu_);
  std::deque<Task> lane_queue_ GUARDED_BY(mu_);  // lane_methods' requests
  uint64_t running_ GUARDED_BY(mu_) = 0;
  std::map<net::Connection*, std::weak_ptr<net::Connection>> conns_ GUARDED_BY(mu_);

  Mutex shutdown_mu_;  // serializes the waiting part of Shutdown
  bool shut_down_ GUARDED_BY(shutdown_mu_) = false;
};

Status CoordServer::Start(const CoordServerOptions& options, CoordHandler handler,
                          std::unique_ptr<CoordServer>* out) {
  if (!handler) return Status::InvalidArgument("a coordinator server needs a handler");
  if (options.secret.empty()) return Status::InvalidArgument("a coordinator server needs the cluster's shared secret");
  if (options.threads == 0) return Status::InvalidArgument("a coordinator server needs threads >= 1");
  if (!options.lane_methods.empty() && options.lane_threads == 0) {
    return Status::InvalidArgument("a coordinator server with lane_methods needs lane_threads >= 1");
  }
  // As a worker (protocol §6): a live idle peer must be heard from in time.
  if (options.heartbeat_ms == 0) return Status::InvalidArgument("heartbeat_ms must be >= 1");
  if (options.peer_timeout_ms <= options.heartbeat_ms) {
    return Status::InvalidArgument("peer_timeout_ms (" + std::to_string(options.peer_timeout_ms) +
                                   ") must exceed heartbeat_ms (" + std::to_string(options.heartbeat_ms) + ")");
  }
  if (options.max_frame_bytes < kMaxMessageBytes || options.max_frame_bytes > kMaxFrameBytesLimit) {
    return Status::InvalidArgument("max_frame_bytes must be in [" + std::to_string(kMaxMessageBytes) + ", " +
                                   std::to_string(kMaxFrameBytesLimit) + "], got " +
                                   std::to_string(options.max_frame_bytes));
  }
  auto impl = std::make_unique<Impl>(options, std::move(handler));
  RHINO_RETURN_IF_ERROR(impl->Listen());
  out->reset(new CoordServer(std::move(impl)));
  return Status::OK();
}

CoordServer::CoordServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CoordServer::~CoordServer() = default;  // ~Impl shuts down

uint16_t CoordServer::port() const { return impl_->port(); }
const std::string& CoordServer::host() const { return impl_->host(); }
std::string CoordServer::address() const { return impl_->address(); }
void CoordServer::Shutdown() { impl_->Shutdown(); }
bool CoordServer::InHandlerThread() const { return impl_->InHandlerThread(); }
CoordServerMetrics CoordServer::Metrics() const { return impl_->Metrics(); }

}  // namespace rhino
