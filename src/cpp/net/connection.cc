#include "net/connection.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "net/auth.h"
#include "net/cert_roles.h"
#include "net/permissions.h"
#include "rhino/messages.h"
#include "util/buffer_pool.h"

namespace rhino::net {
namespace {

// A refused stream's log line, at most once a second with a count.
void LogStreamRefusal(const Status& why) {
  static std::atomic<uint64_t> refused{0};
  static std::mutex mu;
  static std::chrono::steady_clock::time_point last;
  const uint64_t n = refused.fetch_add(1) + 1;
  std::lock_guard<std::mutex> l(mu);
  const auto now = std::chrono::steady_clock::now();
  if (n > 1 && now - last < std::chrono::seconds(1)) return;
  last = now;
  std::fprintf(stderr, "rhino: %s: refused (%llu so far)\n", why.message().c_str(),
               static_cast<unsigned long long>(n));
}

// A connection that stopped reading its peer: one log line at most a second,
// with a count, as a peer that never reads pauses it again and again.
void LogReadPause(const std::string& worker_id, const std::string& remote, uint64_t queued, uint64_t bound) {
  static std::atomic<uint64_t> paused{0};
  static std::mutex mu;
  static std::chrono::steady_clock::time_point last;
  const uint64_t n = paused.fetch_add(1) + 1;
  std::lock_guard<std::mutex> l(mu);
  const auto now = std::chrono::steady_clock::now();
  if (n > 1 && now - last < std::chrono::seconds(1)) return;
  last = now;
  std::fprintf(stderr,
               "rhino: %s: peer %s reads its answers slower than they come: %llu bytes are queued for it "
               "(max_outbound_bytes %llu); reading from it paused until half is sent (%llu pauses so far)\n",
               worker_id.c_str(), remote.c_str(), static_cast<unsigned long long>(queued),
               static_cast<unsigned long long>(bound), static_cast<unsigned long long>(n));
}

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

}  // namespace
namespace {

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

void Connection::SendHello() {
  BeginSession();
  // Client side of §2: HelloReq with a fresh nonce.
  Status s = NewNonce(&client_nonce_);
  if (!s.ok()) {
    DoClose(s);
    return;
  }
  HelloReq hello;
  hello.worker_id = options_.worker_id;
  hello.client_nonce = client_nonce_;
  if (!options_.credential.key.empty() && !options_.credential.root) {  // a role's key (§2, "Roles")
    hello.has_role = true;
    hello.role = RoleName(options_.credential.role);
    hello.scope = options_.credential.scope;
  }
  SendNow(MessageType::kHelloReq, 0, hello.Encode());
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

// ---- reading (§1) ----

void Connection::ReadHeader() {
  if (state_.load() == State::kClosed || closing_) return;
  WithStream([this](auto& stream) {
    asio::async_read(stream, asio::buffer(header_buf_, kFrameHeaderBytes),
                     asio::bind_executor(strand_, [self = shared_from_this()](const asio::error_code& ec, size_t) {
                       self->OnHeader(ec);
                     }));
  });
}

void Connection::OnHeader(const asio::error_code& ec) {
  if (state_.load() == State::kClosed || closing_) return;
  if (ec) {
    DoClose(ReadFailure("connection to " + remote_ + " closed: ", ec));
    return;
  }
  last_recv_ = Clock::now();
  bool intact = false;
  FrameHeader h;
  Status s = DecodeFrameHeader(header_buf_, options_.max_frame_bytes, &h, &intact);
  if (!s.ok()) {
    Reject(intact ? h.stream_id : 0, s);
    return;
  }
  if (role_ == Role::kServer && state_.load() == State::kHandshake && h.length > kMaxHandshakeFrameBytes) {
    // Before authentication a peer is anybody: it gets no buffer of up to
    // max_frame_bytes (§2). Logged at most once a second: a flood must not
    // flood the log too.
    static std::atomic<int64_t> last_log_s{0};
    const int64_t now_s =
        std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()).count();
    int64_t last = last_log_s.load();
    if (now_s != last && last_log_s.compare_exchange_strong(last, now_s)) {
      std::fprintf(stderr, "rhino: %s sent a %u-byte frame before authenticating (at most %u): connection closed\n",
                   remote_.c_str(), h.length, kMaxHandshakeFrameBytes);
    }
    Reject(0, Status::InvalidArgument("a frame of " + std::to_string(h.length) +
                                      " bytes before authentication is over the pre-auth limit of " +
                                      std::to_string(kMaxHandshakeFrameBytes) + " bytes"));
    return;
  }
  cur_ = h;
  // Allocated only now that the length is known to be within bounds (§1 step 3).
  // Pooled: a chunk's buffer is reused rather than freshly mapped and zeroed
  // (util/buffer_pool.h); async_read overwrites all of it or the frame is dropped.
  payload_ = BufferPool::Shared().Get(h.length);
  if (h.length == 0) {
    OnPayload(asio::error_code());
    return;
  }
  ReadPayload(0);
}

namespace {
// A chunk's payload (up to 1 MiB) reaches a loopback socket in 64 KiB
// segments, and the reading thread was woken for each: `perf` of an r=2
// transfer put more of the middle member's socket thread in being
// scheduled, polled and woken (and of its peers in waking it) than in
// copying. With the socket's low-water mark at the part of the payload still
// due, capped, the kernel wakes the reader once per that many bytes. In
// alternating 2 GB transfers, 256 KiB took r=1 from 808 to 963 MB/s and r=2
// from 441 to 501 MB/s (medians of 4), with about a sixth less CPU on every
// member; 512 KiB did the same, 1 MiB slightly less.
constexpr size_t kPayloadLowWaterCap = size_t{256} << 10;
// Below this a payload is read as it comes (mark 1).
constexpr size_t kPayloadLowWaterMin = 4096;
}  // namespace

void Connection::SetReceiveLowWater(size_t bytes) {
  // Under TLS the socket carries records, not our frames: a mark sized for a
  // frame's payload could leave the TLS layer waiting for bytes that a
  // shorter record never brings.
  if (bytes == rcvlowat_ || tls_) return;
  asio::error_code ec;
  socket_.set_option(asio::socket_base::receive_low_watermark(static_cast<int>(bytes)), ec);
  rcvlowat_ = ec ? 1 : bytes;  // without it, reads just wake more often
}

void Connection::ReadPayload(size_t done) {
  const size_t remaining = payload_->size() - done;
  // Small frames (headers, acks, control) keep a mark of 1: the mark is
  // what makes a waiting reader readable at all.
  SetReceiveLowWater(remaining > kPayloadLowWaterMin ? std::min(remaining, kPayloadLowWaterCap) : 1);
  WithStream([this, done, remaining](auto& stream) {
    stream.async_read_some(
        asio::buffer(payload_->data() + done, remaining),
        asio::bind_executor(strand_, [self = shared_from_this(), done](const asio::error_code& e, size_t n) {
          if (self->state_.load() == State::kClosed || self->closing_) return;
          if (!e && done + n < self->payload_->size()) {
            self->ReadPayload(done + n);
            return;
          }
          self->SetReceiveLowWater(1);
          self->OnPayload(e);
        }));
  });
}

void Connection::OnPayload(const asio::error_code& ec) {
  if (state_.load() == State::kClosed || closing_) return;
  if (ec) {
    DoClose(ReadFailure("connection to " + remote_ + " closed mid-frame: ", ec));
    return;
  }
  last_recv_ = Clock::now();
  Status s = CheckFramePayload(cur_, *payload_);  // §1 step 5
  if (!s.ok()) {
    Reject(cur_.stream_id, s);
    return;
  }
  if (counters_ != nullptr) {
    counters_->frames_in.fetch_add(1);
    counters_->bytes_in.fetch_add(kFrameHeaderBytes + cur_.length);
  }
  std::shared_ptr<std::string> payload = std::move(payload_);
  Dispatch(cur_, std::move(payload));
  ReadNextOrPause();
}

void Connection::ReadNextOrPause() {
  if (state_.load() != State::kOpen || write_failed_) {
    ReadHeader();  // the handshake, or a drain before closing: never paused
    return;
  }
  // Server side only: a client's queue holds what its own code chose to send
  // (credits pace it), and two ends that each stopped reading until the other
  // read would wait for each other until both timed out.
  if (!outbound_full_ && role_ == Role::kServer && options_.max_outbound_bytes != 0 &&
      queued_bytes_ > options_.max_outbound_bytes) {
    outbound_full_ = true;
    if (counters_ != nullptr) counters_->reads_paused.fetch_add(1);
    LogReadPause(options_.worker_id, remote_, queued_bytes_, options_.max_outbound_bytes);
  }
  if (outbound_full_ || frames_in_progress_.load() >= kMaxFramesInProgress) {
    reading_stopped_ = true;
    return;
  }
  ReadHeader();
}

void Connection::MaybeResumeReading() {
  if (!reading_stopped_ || state_.load() == State::kClosed) return;
  if (!write_failed_ && (outbound_full_ || frames_in_progress_.load() > kMaxFramesInProgress / 2)) return;
  reading_stopped_ = false;
  // The peer's frames (heartbeats included) waited in the socket because we
  // did not read them: its silence meanwhile was ours, not its own (Tick).
  last_recv_ = Clock::now();
  ReadHeader();
}

void Connection::FrameHandled() {
  // Frames are handed off only on the strand, when a frame is read, and none
  // is read once kMaxFramesInProgress are in progress: so after reading
  // stopped the count only falls, and passes half exactly once, by this
  // decrement, which posts the resume (after the stop: both on the strand).
  if (frames_in_progress_.fetch_sub(1) - 1 == kMaxFramesInProgress / 2) {
    asio::post(strand_, [self = shared_from_this()]() { self->MaybeResumeReading(); });
  }
}

Status Connection::ReadFailure(const std::string& what, const asio::error_code& ec) {
  // A TLS error: in TLS 1.3 a server checks the client's certificate after
  // the client's side of the handshake completed, so a refused client learns
  // it here, from the server's alert, before §2's handshake could finish.
  if (tls_ && ec.category() == asio::error::get_ssl_category()) {
    if (counters_ != nullptr && state_.load() == State::kHandshake) counters_->tls_failures.fetch_add(1);
    return Status::TlsFailed(what + DescribeTlsFailure(ec, tls_->native_handle()));
  }
  return Status::PeerDead(what + ec.message());
}

void Connection::Dispatch(const FrameHeader& h, std::shared_ptr<std::string> payload) {
  if (state_.load() == State::kHandshake) {
    HandleHandshake(h, *payload);
    return;
  }
  if (state_.load() != State::kOpen) return;
  if (h.stream_id == 0) {
    HandleConnectionFrame(h, *payload);
    return;
  }
  switch (h.type) {
    case MessageType::kHelloReq:
    case MessageType::kHelloRsp:
    case MessageType::kAuthReq:
    case MessageType::kAuthRsp:
    case MessageType::kHeartbeatReq:
    case MessageType::kHeartbeatRsp:
      Reject(h.stream_id, Status::Corruption(std::string(MessageTypeName(h.type)) +
                                             " is a connection-level message but came on stream " +
                                             std::to_string(h.stream_id)));
      return;
    default:
      break;
  }
  auto it = listeners_.find(h.stream_id);
  if (it != listeners_.end()) {
    it->second->OnFrame(h, std::move(payload));
  } else if (unclaimed_) {
    if (role_ == Role::kServer && options_.max_streams != 0 && listeners_.size() >= options_.max_streams) {
      // A peer that holds this many streams open gets no more until one ends
      // (issue 46: streams per connection are bounded).
      if (counters_ != nullptr) counters_->frames_rejected.fetch_add(1);
      Status why = Status::ResourceExhausted(options_.worker_id + ": peer " + remote_ + " holds " +
                                             std::to_string(listeners_.size()) +
                                             " streams open on one connection (max_streams_per_connection " +
                                             std::to_string(options_.max_streams) + ")");
      LogStreamRefusal(why);
      SendNow(MessageType::kErrorRsp, h.stream_id, ErrorRsp::From(why).Encode());
      return;
    }
    std::shared_ptr<StreamListener> l = unclaimed_(shared_from_this(), h, std::move(payload));
    if (l != nullptr && state_.load() != State::kClosed) listeners_[h.stream_id] = std::move(l);
  }
  // else: a late frame of a finished stream (e.g. a credit after an abort).
}

void Connection::HandleHandshake(const FrameHeader& h, const std::string& payload) {
  if (h.type == MessageType::kErrorRsp) {
    ErrorRsp e;
    Status s = ErrorRsp::Decode(payload, &e);
    DoClose(s.ok() ? Status::FromCode(e.code, remote_ + ": " + e.message) : s);
    return;
  }
  if (role_ == Role::kServer && h.type == MessageType::kHelloReq && !hello_done_) {
    HelloReq req;
    Status s = HelloReq::Decode(payload, &req);
    if (s.ok() && req.proto != kProtocolVersion) {
      s = Status::InvalidArgument("unsupported protocol " + std::to_string(req.proto));
    }
    if (s.ok() && req.client_nonce.size() != kNonceBytes) s = Status::Corruption("client nonce is not 16 bytes");
    if (s.ok()) s = NewNonce(&server_nonce_);
    if (!s.ok()) {
      Reject(0, s);
      return;
    }
    // The key the client proves: its role's, derived from the root secret
    // this server holds (§2, "Roles"); without a role, the root itself, as
    // admin (the first handshake's form).
    PeerRole role = PeerRole::kAdmin;
    if (req.has_role) {
      s = ParseRole(req.role, &role);
      if (s.ok()) s = CheckScope(role, req.scope);
      if (!s.ok()) {
        Reject(0, Status::InvalidArgument("HelloReq: " + s.message()));
        return;
      }
      server_key_ = CredentialKey(options_.secret, role, req.scope);
    } else {
      server_key_ = options_.secret;
    }
    {
      std::lock_guard<std::mutex> l(peer_mu_);
      peer_id_ = req.worker_id;
      peer_role_ = role;
      peer_scope_ = req.has_role ? req.scope : std::string();
    }
    client_nonce_ = req.client_nonce;
    hello_done_ = true;
    HelloRsp rsp;
    rsp.worker_id = options_.worker_id;
    rsp.server_nonce = server_nonce_;
    rsp.server_mac = ServerMac(server_key_, client_nonce_, server_nonce_);
    SendNow(MessageType::kHelloRsp, 0, rsp.Encode());
    return;
  }
  if (role_ == Role::kServer && h.type == MessageType::kAuthReq && hello_done_) {
    OnAuthReq(payload);
    return;
  }
  if (role_ == Role::kClient && h.type == MessageType::kHelloRsp && !hello_done_) {
    HelloRsp rsp;
    Status s = HelloRsp::Decode(payload, &rsp);
    if (!s.ok()) {
      Reject(0, s);
      return;
    }
    // Mutual authentication: talk only to a server that knows the secret too.
    if (rsp.server_nonce.size() != kNonceBytes ||
        !MacEquals(rsp.server_mac, ServerMac(Key(), client_nonce_, rsp.server_nonce))) {
      if (counters_ != nullptr) counters_->auth_failures.fetch_add(1);
      DoClose(Status::AuthFailed("authentication failed: server " + remote_ + " does not know the shared secret"));
      return;
    }
    {
      std::lock_guard<std::mutex> l(peer_mu_);
      peer_id_ = rsp.worker_id;
    }
    hello_done_ = true;
    AuthReq req;
    req.client_mac = ClientMac(Key(), rsp.server_nonce, client_nonce_);
    SendNow(MessageType::kAuthReq, 0, req.Encode());
    return;
  }
  if (role_ == Role::kClient && h.type == MessageType::kAuthRsp && hello_done_) {
    AuthRsp rsp;
    Status s = AuthRsp::Decode(payload, &rsp);
    if (!s.ok()) {
      Reject(0, s);
      return;
    }
    if (!rsp.ok) {
      DoClose(Status::AuthFailed("server " + remote_ + " refused our authentication"));
      return;
    }
    state_.store(State::kOpen);
    FinishHandshake(Status::OK());
    return;
  }
  // §2: any other frame before AuthRsp closes the connection.
  Reject(0, Status::Corruption(std::string(MessageTypeName(h.type)) + " before authentication completed"));
}

void Connection::OnAuthReq(const std::string& payload) {
  AuthReq req;
  Status s = AuthReq::Decode(payload, &req);
  if (!s.ok()) {
    Reject(0, s);
    return;
  }
  if (!MacEquals(req.client_mac, ClientMac(server_key_, server_nonce_, client_nonce_))) {
    if (counters_ != nullptr) counters_->auth_failures.fetch_add(1);
    CloseWithError(0, Status::AuthFailed("authentication failed: peer " + remote_ +
                                         " does not know the shared secret (or the key of the role it named)"));
    return;
  }
  // The role is proved; under TLS the peer's certificate must admit it too (§2, "TLS").
  PeerRole proved;
  {
    std::lock_guard<std::mutex> l(peer_mu_);
    proved = peer_role_;
  }
  s = CheckCertificateAdmits(proved);
  if (!s.ok()) {
    LogRefusal(s);
    CloseWithError(0, s);
    return;
  }
  AuthRsp rsp;
  rsp.ok = true;
  SendNow(MessageType::kAuthRsp, 0, rsp.Encode());
  state_.store(State::kOpen);
  FinishHandshake(Status::OK());
}

Status Connection::CheckCertificateAdmits(PeerRole role) {
  if (!tls_) return Status::OK();  // plaintext, or a Unix socket: the keys alone
  X509* cert = SSL_get0_peer_certificate(tls_->native_handle());  // not ours to free
  std::string peer = remote_;
  {
    std::lock_guard<std::mutex> l(peer_mu_);
    if (!peer_id_.empty()) peer += " (" + peer_id_ + ")";
  }
  return CheckCertificateRole(CertificateRoles(cert), role, "rhino " + options_.worker_id, peer);
}

void Connection::HandleConnectionFrame(const FrameHeader& h, const std::string& payload) {
  switch (h.type) {
    case MessageType::kHeartbeatReq: {
      HeartbeatReq req;
      Status s = HeartbeatReq::Decode(payload, &req);
      if (!s.ok()) return Reject(0, s);
      HeartbeatRsp rsp;
      rsp.nonce = req.nonce;
      SendNow(MessageType::kHeartbeatRsp, 0, rsp.Encode());
      return;
    }
    case MessageType::kHeartbeatRsp: {
      HeartbeatRsp rsp;
      Status s = HeartbeatRsp::Decode(payload, &rsp);
      if (!s.ok()) return Reject(0, s);
      return;  // receiving it was the point (last_recv_)
    }
    case MessageType::kErrorRsp: {
      ErrorRsp e;
      Status s = ErrorRsp::Decode(payload, &e);
      DoClose(s.ok() ? Status::FromCode(e.code, remote_ + " closed the connection: " + e.message) : s);
      return;
    }
    default:
      Reject(0, Status::Corruption(std::string(MessageTypeName(h.type)) + " on stream 0"));
  }
}

void Connection::FinishHandshake(const Status& s) {
  if (ready_) {
    auto r = std::move(ready_);
    ready_ = nullptr;
    r(s);
  }
}

// ---- writing ----

void Connection::Send(MessageType type, uint32_t stream_id, uint64_t chain_version,
                      std::shared_ptr<const std::string> payload, std::function<void()> on_sent) {
  Outgoing o;
  // Checksums are computed on the caller's thread, off the strand.
  EncodeFrameHeader(type, stream_id, chain_version, *payload, o.header.data());
  o.payload = std::move(payload);
  o.on_sent = std::move(on_sent);
  asio::post(strand_, [self = shared_from_this(), o = std::move(o)]() mutable {
    // Stream frames wait for the handshake: a client may queue its first
    // request as soon as it is ready, never before, so this only guards misuse.
    self->Enqueue(std::move(o));
  });
}

void Connection::SendNow(MessageType type, uint32_t stream_id, std::string payload) {
  Outgoing o;
  auto p = std::make_shared<const std::string>(std::move(payload));
  EncodeFrameHeader(type, stream_id, 0, *p, o.header.data());
  o.payload = std::move(p);
  Enqueue(std::move(o));
}

void Connection::Enqueue(Outgoing o) {
  if (state_.load() == State::kClosed || write_failed_) return;
  const uint64_t bytes = kFrameHeaderBytes + o.payload->size();
  queued_bytes_ += bytes;
  if (counters_ != nullptr) counters_->outbound_bytes.fetch_add(static_cast<int64_t>(bytes));
  queue_.push_back(std::move(o));
  if (!writing_) WriteNext();
}

void Connection::WriteNext() {
  if (queue_.empty() || state_.load() == State::kClosed) {
    writing_ = false;
    return;
  }
  writing_ = true;
  write_started_ = last_send_ = Clock::now();
  Outgoing& o = queue_.front();  // deque references survive push_back
  std::array<asio::const_buffer, 2> bufs = {asio::buffer(o.header), asio::buffer(*o.payload)};
  WithStream([this, &bufs](auto& stream) {
    asio::async_write(stream, bufs,
                      asio::bind_executor(strand_, [self = shared_from_this()](const asio::error_code& ec, size_t) {
                        self->OnWritten(ec);
                      }));
  });
}

void Connection::OnWritten(const asio::error_code& ec) {
  if (state_.load() == State::kClosed) return;
  if (ec) {
    const Status failed = Status::PeerDead("write to " + remote_ + " failed: " + ec.message());
    if (closing_ || state_.load() != State::kOpen) {
      DoClose(failed);
      return;
    }
    // A write fails when the peer has closed, but what it sent before closing
    // may still be unread here: a server that answers a request and then shuts
    // down resets the connection when our next heartbeat reaches it, and the
    // answer sits in our receive queue (the kernel hands queued data out before
    // the error). Closing now would fail that request with this write's error,
    // so the read side drains first and closes with what it finds (the peer's
    // ErrorRsp, or its EOF); Tick closes with this status if it does not.
    write_failed_ = true;
    write_failed_status_ = failed;
    write_failed_at_ = Clock::now();
    queue_.clear();
    Dequeued(queued_bytes_);
    writing_ = false;
    asio::error_code ignored;
    socket_.shutdown(asio::socket_base::shutdown_send, ignored);
    outbound_full_ = false;
    MaybeResumeReading();  // the drain above needs the read side, holds or not
    return;
  }
  Outgoing o = std::move(queue_.front());
  queue_.pop_front();
  Dequeued(kFrameHeaderBytes + o.payload->size());
  if (counters_ != nullptr) {
    counters_->frames_out.fetch_add(1);
    counters_->bytes_out.fetch_add(kFrameHeaderBytes + o.payload->size());
  }
  if (o.on_sent) o.on_sent();
  if (queue_.empty() && closing_) {
    DoClose(closing_status_);
    return;
  }
  // Half the bound, not the bound itself: a peer that reads slowly is paused
  // once per half-bound of answers it reads, not once per frame.
  if (outbound_full_ && queued_bytes_ <= options_.max_outbound_bytes / 2) {
    outbound_full_ = false;
    MaybeResumeReading();
  }
  WriteNext();
}

void Connection::Dequeued(uint64_t n) {
  queued_bytes_ -= n;
  if (counters_ != nullptr) counters_->outbound_bytes.fetch_sub(static_cast<int64_t>(n));
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
