#include "replication/replica_server.h"

#include <chrono>

#include "net/messages.h"
#include "net/permissions.h"

#include <sys/stat.h>
#include <unistd.h>

namespace rhino {

ReplicaServer::ReplicaServer(asio::io_context& io, asio::thread_pool& disk, ReplicaStore* store,
                             net::ConnectionPool* pool, ServerMetrics* metrics, net::ConnectionCounters* counters,
                             const ReplicaServerOptions& options, net::Connection::UnclaimedHandler others)
    : io_(io),
      disk_(disk),
      store_(store),
      metrics_(metrics),
      counters_(counters),
      options_(options),
      others_(std::move(others)),
      fences_(store->dir()),
      acceptor_(io),
      unix_acceptor_(io),
      accept_retry_(io),
      tcp_limiter_("worker " + options.connection.worker_id + "'s TCP listener", options.limits),
      unix_limiter_("worker " + options.connection.worker_id + "'s Unix socket", options.limits) {
  env_.worker_id = options.connection.worker_id;
  env_.store = store;
  env_.pool = pool;
  env_.fences = &fences_;
  env_.metrics = metrics;
  env_.counters = counters;
  env_.disk = &disk;
  env_.io = &io;
  env_.idle_timeout_ms = options.stream_idle_timeout_ms;
  env_.max_window = options.max_window;
  env_.max_frame_bytes = options.connection.max_frame_bytes;
  env_.on_finished = [this](ReplicaStream* s) { OnStreamFinished(s); };
  env_.on_fence_raised = [this](const std::string& op, uint32_t inst, uint64_t v) { FenceOlder(op, inst, v); };
}

ReplicaServer::~ReplicaServer() = default;

Status ReplicaServer::Listen(const std::string& host, uint16_t port) {
  asio::error_code ec;
  asio::ip::address addr = asio::ip::make_address(host, ec);
  if (ec) return Status::InvalidArgument("listen host '" + host + "' is not an IP address: " + ec.message());
  asio::ip::tcp::endpoint ep(addr, port);
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::ip::tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::IOError("cannot listen on " + host + ":" + std::to_string(port) + ": " + ec.message());
  port_ = acceptor_.local_endpoint(ec).port();
  Accept();
  return Status::OK();
}

Status ReplicaServer::ListenUnix(const std::string& path) {
  if (path.empty() || path.size() > 107) {
    return Status::InvalidArgument("a Unix socket path must have 1 to 107 bytes, got " + std::to_string(path.size()) +
                                   ": " + path);
  }
  asio::error_code ec;
  asio::local::stream_protocol::endpoint ep(path);
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return Status::AlreadyExists(path + " exists and is not a socket");
    // A socket left by a killed worker: replace it, unless a live one answers.
    asio::local::stream_protocol::socket probe(io_);
    probe.connect(ep, ec);
    if (!ec) return Status::Busy("another process is listening on " + path);
    ::unlink(path.c_str());
    ec.clear();
  }
  unix_acceptor_.open(ep.protocol(), ec);
  if (!ec) unix_acceptor_.bind(ep, ec);
  // Owner-only before listen(): until then a connect is refused anyway.
  if (!ec && ::chmod(path.c_str(), 0600) != 0) ec = asio::error_code(errno, asio::system_category());
  if (!ec) unix_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    asio::error_code ignored;
    unix_acceptor_.close(ignored);
    return Status::IOError("cannot listen on Unix socket " + path + ": " + ec.message());
  }
  unix_path_ = path;
  AcceptUnix();
  return Status::OK();
}

void ReplicaServer::Accept() {
  auto conn = net::Connection::Create(io_, net::Connection::Role::kServer, options_.connection, counters_);
  acceptor_.async_accept(conn->socket(), [this, conn](const asio::error_code& ec) { OnAccepted(conn, ec, false); });
}

void ReplicaServer::AcceptUnix() {
  auto conn = net::Connection::Create(io_, net::Connection::Role::kServer, options_.connection, counters_);
  unix_acceptor_.async_accept(conn->socket(), [this, conn](const asio::error_code& ec) { OnAccepted(conn, ec, true); });
}

void ReplicaServer::OnAccepted(const std::shared_ptr<net::Connection>& conn, const asio::error_code& ec,
                               bool unix_socket) {
  if (ec == asio::error::operation_aborted) return;  // Shutdown
  auto again = [this, unix_socket]() {
    if (unix_socket) {
      AcceptUnix();
    } else {
      Accept();
    }
  };
  std::shared_ptr<net::ConnectionLimiter::Slot> slot;
  if (!ec) {
    // Admitted before its handshake costs anything (protocol §2, "Connection
    // limits"); a refused peer gets the reason and the listener serves on.
    net::ConnectionLimiter& limiter = unix_socket ? unix_limiter_ : tcp_limiter_;
    Status admitted = limiter.Admit(unix_socket ? "" : net::PeerAddressOf(conn->socket().native_handle()), &slot);
    if (!admitted.ok()) {
      {
        MutexLock l(&mu_);
        if (stopping_) return;
      }
      conn->Refuse(admitted);
      again();
      return;
    }
  }
  {
    MutexLock l(&mu_);
    if (stopping_) return;
    if (!ec) conns_[conn.get()] = conn;
  }
  if (!ec) {
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
    conn->StartServer([slot](const Status& s) {
      if (s.ok()) slot->Authenticated();
    });
    again();
    return;
  }
  // e.g. EMFILE: back off instead of spinning on a failing accept.
  accept_retry_.expires_after(std::chrono::milliseconds(100));
  accept_retry_.async_wait([again](const asio::error_code& e) {
    if (!e) again();
  });
}

std::shared_ptr<net::StreamListener> ReplicaServer::OnUnclaimed(const std::shared_ptr<net::Connection>& conn,
                                                                const FrameHeader& h,
                                                                std::shared_ptr<std::string> payload) {
  switch (h.type) {
    case MessageType::kOpenStreamReq: {
      OpenStreamReq req;
      Status s = OpenStreamReq::Decode(*payload, &req);
      if (!s.ok()) {
        if (counters_ != nullptr) counters_->frames_rejected.fetch_add(1);
        conn->CloseWithError(h.stream_id, Status::Corruption("invalid OpenStreamReq: " + s.message()));
        return nullptr;
      }
      s = net::PermitRequest(conn->peer(), h.type, req.operator_id, "worker " + options_.connection.worker_id);
      if (!s.ok()) {
        net::LogRefusal(s);
        OpenStreamRsp rsp;
        rsp.code = WireCode(s);
        rsp.message = s.message();
        conn->Send(MessageType::kOpenStreamRsp, h.stream_id, h.chain_version, rsp.Encode());
        return nullptr;
      }
      std::shared_ptr<ReplicaStream> stream;
      {
        MutexLock l(&mu_);
        if (stopping_) {
          OpenStreamRsp rsp;
          rsp.code = static_cast<uint32_t>(Status::Code::kAborted);
          rsp.message = "worker " + options_.connection.worker_id + " is shutting down";
          conn->Send(MessageType::kOpenStreamRsp, h.stream_id, h.chain_version, rsp.Encode());
          return nullptr;
        }
        stream = ReplicaStream::Create(&env_, conn, h.stream_id, h.chain_version, std::move(req));
        streams_[stream.get()] = stream;
      }
      stream->Open();
      return stream->upstream_listener();
    }
    case MessageType::kStoreQueryReq:
      AnswerStoreQuery(conn, h, *payload);
      return nullptr;
    default:
      return others_ ? others_(conn, h, std::move(payload)) : nullptr;
  }
}

void ReplicaServer::AnswerStoreQuery(const std::shared_ptr<net::Connection>& conn, const FrameHeader& h,
                                     const std::string& payload) {
  StoreQueryReq req;
  Status s = StoreQueryReq::Decode(payload, &req);
  if (!s.ok()) {
    if (counters_ != nullptr) counters_->frames_rejected.fetch_add(1);
    conn->CloseWithError(h.stream_id, Status::Corruption("invalid StoreQueryReq: " + s.message()));
    return;
  }
  s = net::PermitRequest(conn->peer(), h.type, req.operator_id, "worker " + options_.connection.worker_id);
  if (!s.ok()) {
    net::LogRefusal(s);
    StoreQueryRsp rsp;
    rsp.code = WireCode(s);
    rsp.message = s.message();
    conn->Send(MessageType::kStoreQueryRsp, h.stream_id, h.chain_version, rsp.Encode());
    return;
  }
  // Directory listing is disk work: off the connection's strand.
  asio::post(disk_, [this, conn, h, req]() {
    StoreQueryRsp rsp;
    Status st = store_->ListCheckpoints(req.operator_id, req.instance, &rsp.checkpoints);
    rsp.code = WireCode(st);
    rsp.message = st.message();
    conn->Send(MessageType::kStoreQueryRsp, h.stream_id, h.chain_version, rsp.Encode());
  });
}

void ReplicaServer::FenceOlder(const std::string& operator_id, uint32_t instance, uint64_t version) {
  std::vector<std::shared_ptr<ReplicaStream>> fenced;
  {
    MutexLock l(&mu_);
    for (auto& [raw, s] : streams_) {
      if (s->operator_id() == operator_id && s->instance() == instance && s->chain_version() < version) {
        fenced.push_back(s);
      }
    }
  }
  for (auto& s : fenced) {
    metrics_->stale_rejections.fetch_add(1);
    s->Abort(Status::StaleChainVersion("fenced off by chain version " + std::to_string(version)));
  }
}

void ReplicaServer::OnStreamFinished(ReplicaStream* stream) {
  std::shared_ptr<ReplicaStream> keep;  // released outside the lock
  MutexLock l(&mu_);
  auto it = streams_.find(stream);
  if (it != streams_.end()) {
    keep = std::move(it->second);
    streams_.erase(it);
  }
  cv_.SignalAll();
}

void ReplicaServer::Shutdown(int wait_ms) {
  std::vector<std::shared_ptr<ReplicaStream>> streams;
  std::vector<std::shared_ptr<net::Connection>> conns;
  {
    MutexLock l(&mu_);
    stopping_ = true;
    for (auto& [raw, s] : streams_) streams.push_back(s);
    for (auto& [raw, c] : conns_)
      if (auto sp = c.lock()) conns.push_back(sp);
  }
  asio::post(io_, [this]() {
    asio::error_code ec;
    acceptor_.close(ec);
    if (unix_acceptor_.is_open()) {
      unix_acceptor_.close(ec);
      ::unlink(unix_path_.c_str());
    }
    accept_retry_.cancel();
  });
  for (auto& s : streams) s->Abort(Status::Aborted("worker is shutting down"));
  {
    MutexLock l(&mu_);
    cv_.WaitFor(&mu_, std::chrono::milliseconds(wait_ms), [this]() {
      mu_.AssertHeld();
      return streams_.empty();
    });
  }
  for (auto& c : conns) c->Close(Status::Aborted("worker is shutting down"));
}

}  // namespace rhino
