// Connection: one authenticated, multiplexed connection (net/connection.h).
// Here: its life (the transport set up over TCP, a Unix socket or TLS; the
// liveness clock of §6; closing) and its streams' listeners. The handshake
// of §2 is connection_handshake.cc's, the read side connection_read.cc's and
// the write side connection_write.cc's.
#include "net/connection.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "net/messages.h"

namespace rhino::net {
namespace {

// "ip:port" of a TCP peer, "unix" for a Unix-socket peer (it has no name).
std::string DescribePeer(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  if (ss.ss_family == AF_UNIX) return "unix";
  return "?";
}


int64_t MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

std::shared_ptr<Connection> Connection::Create(asio::io_context& io, Role role, const ConnectionOptions& options,
                                               ConnectionCounters* counters) {
  return std::shared_ptr<Connection>(new Connection(io, role, options, counters));
}

Connection::Connection(asio::io_context& io, Role role, const ConnectionOptions& options,
                       ConnectionCounters* counters)
    : role_(role),
      options_(options),
      counters_(counters),
      strand_(asio::make_strand(io)),
      socket_(strand_),
      timer_(strand_) {}

Connection::~Connection() {
  if (counters_ != nullptr && started_ != Clock::time_point()) counters_->open_connections.fetch_sub(1);
  if (counters_ != nullptr) counters_->outbound_bytes.fetch_sub(static_cast<int64_t>(queued_bytes_));
}

std::string Connection::peer_id() const {
  std::lock_guard<std::mutex> l(peer_mu_);
  return peer_id_;
}

PeerIdentity Connection::peer() const {
  PeerIdentity out;
  {
    std::lock_guard<std::mutex> l(peer_mu_);
    out.role = peer_role_;
    out.scope = peer_scope_;
    out.id = peer_id_;
  }
  out.address = remote_;
  return out;
}

const std::string& Connection::Key() const {
  return options_.credential.key.empty() ? options_.secret : options_.credential.key;
}

void Connection::StartServer(ReadyHandler ready) {
  asio::post(strand_, [self = shared_from_this(), ready = std::move(ready)]() mutable {
    self->ready_ = std::move(ready);
    self->remote_ = DescribePeer(self->socket_.native_handle());
    if (self->options_.tls && !self->IsUnixSocket()) {
      // The handshake deadline (Tick) covers the TLS handshake: a peer that
      // never sends its ClientHello is closed after peer_timeout_ms.
      self->StartClock();
      self->StartTls(asio::ssl::stream_base::server, [self]() { self->BeginSession(); });
      return;
    }
    self->BeginSession();
    // Server side of §2: wait for HelloReq.
  });
}

void Connection::Refuse(const Status& why) {
  asio::post(strand_, [self = shared_from_this(), why]() {
    self->remote_ = DescribePeer(self->socket_.native_handle());
    if (self->options_.tls && !self->IsUnixSocket()) {
      self->DoClose(why);
      return;
    }
    // The handshake deadline (Tick) bounds a peer that does not read the answer.
    self->StartClock();
    self->CloseWithError(0, why);
  });
}

void Connection::StartClient(const std::string& host, uint16_t port, ReadyHandler ready) {
  asio::post(strand_, [self = shared_from_this(), host, port, ready = std::move(ready)]() mutable {
    self->ready_ = std::move(ready);
    self->remote_ = host + ":" + std::to_string(port);
    self->tls_name_ = host;
    asio::error_code ec;
    asio::ip::address addr = asio::ip::make_address(host, ec);
    if (ec) {
      self->DoClose(Status::InvalidArgument("'" + host + "' is not an IP address: " + ec.message()));
      return;
    }
    asio::ip::tcp::endpoint ep(addr, port);
    if (!self->options_.local_bind_host.empty()) {
      asio::ip::address local = asio::ip::make_address(self->options_.local_bind_host, ec);
      if (!ec) {
        asio::ip::tcp::endpoint local_ep(local, 0);
        self->socket_.open(asio::generic::stream_protocol(local_ep.protocol()), ec);
        if (!ec) self->socket_.bind(asio::generic::stream_protocol::endpoint(local_ep), ec);
      }
      if (ec) {
        self->DoClose(Status::IOError("cannot bind to " + self->options_.local_bind_host + ": " + ec.message()));
        return;
      }
    }
    self->Connect(asio::generic::stream_protocol::endpoint(ep));
  });
}

void Connection::StartClientUnix(const std::string& path, ReadyHandler ready) {
  asio::post(strand_, [self = shared_from_this(), path, ready = std::move(ready)]() mutable {
    self->ready_ = std::move(ready);
    self->remote_ = "unix:" + path;
    // sockaddr_un holds 107 bytes of path and a NUL.
    if (path.empty() || path.size() > 107) {
      self->DoClose(Status::InvalidArgument("a Unix socket path must have 1 to 107 bytes, got " +
                                            std::to_string(path.size()) + ": " + path));
      return;
    }
    self->Connect(asio::generic::stream_protocol::endpoint(asio::local::stream_protocol::endpoint(path)));
  });
}

void Connection::StartClock() {
  if (started_ != Clock::time_point()) return;
  started_ = Clock::now();
  last_recv_ = last_send_ = started_;
  if (counters_ != nullptr) counters_->open_connections.fetch_add(1);
  timer_.expires_after(std::chrono::milliseconds(0));
  timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](const asio::error_code& e) {
    if (!e) self->Tick();
  }));
}

void Connection::Connect(const asio::generic::stream_protocol::endpoint& ep) {
  StartClock();  // the handshake deadline (peer_timeout_ms) covers the connect as well
  socket_.async_connect(ep, asio::bind_executor(strand_, [self = shared_from_this()](const asio::error_code& e) {
    if (self->state_.load() == State::kClosed) return;
    if (e) {
      self->DoClose(Status::PeerDead("cannot connect to " + self->remote_ + ": " + e.message()));
      return;
    }
    if (self->options_.tls && !self->IsUnixSocket()) {
      self->StartTls(asio::ssl::stream_base::client, [self]() { self->SendHello(); });
      return;
    }
    self->SendHello();
  }));
}

bool Connection::IsUnixSocket() {
  asio::error_code ec;
  return socket_.local_endpoint(ec).protocol().family() == AF_UNIX;
}

void Connection::StartTls(asio::ssl::stream_base::handshake_type type, std::function<void()> then) {
  tls_ = std::make_unique<asio::ssl::stream<Socket&>>(socket_, *options_.tls);
  SSL* ssl = tls_->native_handle();
  if (type == asio::ssl::stream_base::client) {
    // The server's certificate must name the address we dialled (an IP
    // address SAN; StartClient takes addresses only).
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    asio::error_code ec;
    asio::ip::make_address(tls_name_, ec);
    int ok = ec ? X509_VERIFY_PARAM_set1_host(param, tls_name_.c_str(), 0)
                : X509_VERIFY_PARAM_set1_ip_asc(param, tls_name_.c_str());
    if (ok != 1) {
      DoClose(Status::TlsFailed("cannot verify a TLS certificate for '" + tls_name_ + "'"));
      return;
    }
  }
  tls_->async_handshake(type, asio::bind_executor(strand_, [self = shared_from_this(), ssl,
                                                             then = std::move(then)](const asio::error_code& e) {
    if (self->state_.load() == State::kClosed) return;
    if (e) {
      if (self->counters_ != nullptr) self->counters_->tls_failures.fetch_add(1);
      Status why = Status::TlsFailed("TLS handshake with " + self->remote_ + " failed: " + DescribeTlsFailure(e, ssl));
      if (self->role_ == Role::kServer) {
        // The refused peer may be anyone: the listener's log is where an operator
        // sees a misconfigured host (or a stranger) knocking.
        std::fprintf(stderr, "rhino %s: refused a connection: %s\n", self->options_.worker_id.c_str(),
                     why.message().c_str());
      }
      self->DoClose(why);
      return;
    }
    then();
  }));
}

void Connection::BeginSession() {
  asio::error_code ec;
  socket_.set_option(asio::ip::tcp::no_delay(true), ec);  // fails harmlessly on a Unix socket
  if (IsUnixSocket()) {
    // A Unix socket moves at most its buffer per wake-up (about 200 KB by
    // default); a session's answer frames are megabytes. TCP on loopback
    // sizes its own buffers.
    socket_.set_option(asio::socket_base::send_buffer_size(4 << 20), ec);
    socket_.set_option(asio::socket_base::receive_buffer_size(4 << 20), ec);
    ec.clear();
  }
  StartClock();
  ReadHeader();
}

// ---- liveness (§6) ----

void Connection::Tick() {
  if (state_.load() == State::kClosed) return;
  const int64_t timeout = options_.peer_timeout_ms;
  if (state_.load() == State::kHandshake && MsSince(started_) > timeout) {
    if (counters_ != nullptr) counters_->peers_dead.fetch_add(1);
    DoClose(Status::Timeout("handshake with " + remote_ + " did not complete within " + std::to_string(timeout) +
                            " ms"));
    return;
  }
  // While we do not read (reading_stopped_), the peer's frames wait unread:
  // its silence is ours. The write check below still closes a peer that
  // accepts nothing at all while a frame waits for it.
  if (!reading_stopped_ && MsSince(last_recv_) > timeout) {
    if (counters_ != nullptr) counters_->peers_dead.fetch_add(1);
    DoClose(Status::PeerDead("peer " + remote_ + " sent nothing for " + std::to_string(MsSince(last_recv_)) +
                             " ms (peer_timeout_ms " + std::to_string(timeout) + ")"));
    return;
  }
  if (writing_ && MsSince(write_started_) > timeout) {
    if (counters_ != nullptr) counters_->peers_dead.fetch_add(1);
    DoClose(Status::PeerDead("peer " + remote_ + " accepted no data for " + std::to_string(timeout) + " ms"));
    return;
  }
  if (closing_ && MsSince(write_started_) > timeout) {
    DoClose(closing_status_);
    return;
  }
  if (write_failed_ && MsSince(write_failed_at_) > kWriteFailedDrainMs) {
    DoClose(write_failed_status_);
    return;
  }
  if (state_.load() == State::kOpen && !writing_ && MsSince(last_send_) >= options_.heartbeat_ms) {
    HeartbeatReq hb;
    hb.nonce = ++heartbeat_nonce_;
    SendNow(MessageType::kHeartbeatReq, 0, hb.Encode());
  }
  int64_t period = std::max<int64_t>(10, std::min<int64_t>(options_.heartbeat_ms, timeout / 4));
  timer_.expires_after(std::chrono::milliseconds(period));
  timer_.async_wait(asio::bind_executor(strand_, [self = shared_from_this()](const asio::error_code& e) {
    if (!e) self->Tick();
  }));
}

// ---- closing ----

void Connection::Reject(uint32_t stream_id, const Status& why) {
  if (counters_ != nullptr) counters_->frames_rejected.fetch_add(1);
  CloseWithError(stream_id, Status::Corruption("invalid frame from " + remote_ + ": " + why.message()));
}

void Connection::CloseWithError(uint32_t stream_id, const Status& why) {
  asio::dispatch(strand_, [self = shared_from_this(), stream_id, why]() {
    if (self->state_.load() == State::kClosed || self->closing_) return;
    self->closing_ = true;
    self->closing_status_ = why;
    self->write_started_ = Clock::now();
    self->SendNow(MessageType::kErrorRsp, stream_id, ErrorRsp::From(why).Encode());
  });
}

void Connection::Close(const Status& why) {
  asio::post(strand_, [self = shared_from_this(), why]() { self->DoClose(why); });
}

void Connection::DoClose(const Status& why) {
  if (state_.exchange(State::kClosed) == State::kClosed) return;
  asio::error_code ec;
  timer_.cancel();
  socket_.shutdown(asio::socket_base::shutdown_both, ec);
  socket_.close(ec);
  queue_.clear();
  Dequeued(queued_bytes_);
  writing_ = false;
  Status s = why.ok() ? Status::Aborted("connection to " + remote_ + " closed") : why;
  FinishHandshake(s);
  auto listeners = std::move(listeners_);
  listeners_.clear();
  for (auto& [id, l] : listeners) l->OnConnectionClosed(s);
  if (on_close_) {
    auto cb = std::move(on_close_);
    on_close_ = nullptr;
    cb(s);
  }
  unclaimed_ = nullptr;  // it may hold references back to our owner
}

void Connection::Attach(uint32_t stream_id, std::shared_ptr<StreamListener> listener) {
  asio::post(strand_, [self = shared_from_this(), stream_id, listener = std::move(listener)]() mutable {
    if (self->state_.load() == State::kClosed) {
      listener->OnConnectionClosed(Status::PeerDead("connection to " + self->remote_ + " is closed"));
      return;
    }
    self->listeners_[stream_id] = std::move(listener);
  });
}

void Connection::Detach(uint32_t stream_id) {
  asio::post(strand_, [self = shared_from_this(), stream_id]() { self->listeners_.erase(stream_id); });
}

}  // namespace rhino::net
