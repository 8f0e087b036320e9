// Connection: one authenticated, multiplexed, framed TCP connection on Asio
// (docs/protocol.md §1, §2, §6).
//
// - Frames are read by an async loop and validated in §1's order before any
//   payload byte is acted on; an invalid frame gets an ErrorRsp and closes the
//   connection (never the process).
// - Before the §2 handshake completes only HelloReq/HelloRsp/AuthReq/AuthRsp
//   are accepted.
// - Many streams share one connection: frames are routed by stream id to the
//   StreamListener attached to that id; stream 0 carries connection-level
//   frames (heartbeats, errors). Frames for an id with no listener go to the
//   "unclaimed" handler (the server opens streams there).
// - Idle connections exchange heartbeats every heartbeat_ms; a peer silent for
//   peer_timeout_ms, or a write stuck that long, is declared dead (§6).
// - Server side, the frames queued for writing are bounded in bytes
//   (max_outbound_bytes): over it the connection stops reading the peer's
//   next frame until the queue drains to half of it, so a peer that sends
//   requests and reads no answers cannot make us buffer answers without bound.
//   So are the frames listeners have taken and not yet handled
//   (kMaxFramesInProgress), whose answers are still to come.
//
// Thread-safety: every public method may be called from any thread. All
// socket work runs on the connection's strand; handlers (listeners, unclaimed,
// ready, close, on_sent) run on that strand too, so they must not block: post
// real work elsewhere. No handler is ever called from inside a public method.
#pragma once

#include <asio.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "net/address.h"
#include "net/frame.h"
#include "net/tls.h"
#include "rhino/credential.h"
#include "rhino/status.h"

namespace rhino::net {

struct ConnectionOptions {
  std::string worker_id;  // our name, sent in the handshake
  // Server: the cluster's root secret, from which it derives the key of the
  // role each client names (§2, "Roles"). Client: the root secret, proved
  // itself (as admin) when `credential` has no key.
  std::string secret;
  // Client: the role (and scope) to prove, with its key (rhino/credential.h).
  Credential credential;
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;
  uint32_t heartbeat_ms = 500;
  uint32_t peer_timeout_ms = 3000;
  // Server side: streams the peer may hold open on this connection (§1); a
  // frame that would open one more is answered ResourceExhausted on its
  // stream, logged, and the connection serves on. 0 = no bound.
  uint32_t max_streams = kDefaultMaxStreamsPerConnection;
  // Server side: bytes (headers and payloads) of the frames queued for
  // writing to the peer. Over it, no further frame is read from the peer
  // until the queue drains to half of it: frames already queued are all
  // sent, and answers to requests already read may still be queued, so this
  // is where reading stops, not a cap on the queue. 0 = no bound.
  uint64_t max_outbound_bytes = kDefaultMaxOutboundBytes;
  // Client side: bind the local end to this address (e.g. the worker's own
  // 127.0.0.N) so that peers see where traffic comes from. Empty = any.
  std::string local_bind_host;
  // TLS on TCP (never on a Unix socket): null = plaintext. A client verifies
  // that the server's certificate names the address it dialled (§2, "TLS").
  TlsContext tls;
};

// Counters shared by all connections of one process or worker (metrics).
// Each is atomic because many connections on many io threads update them.
struct ConnectionCounters {
  std::atomic<uint64_t> frames_in{0};
  std::atomic<uint64_t> frames_out{0};
  std::atomic<uint64_t> bytes_in{0};
  std::atomic<uint64_t> bytes_out{0};
  std::atomic<uint64_t> frames_rejected{0};  // invalid frames (§1) and protocol violations
  std::atomic<uint64_t> auth_failures{0};    // §2 failures, either side
  std::atomic<uint64_t> tls_failures{0};     // TLS handshakes that failed, either side
  std::atomic<uint64_t> peers_dead{0};       // §6 timeouts
  std::atomic<int64_t> open_connections{0};
  // Times a connection stopped reading because its peer let more than
  // max_outbound_bytes queue up (it reads its answers slower than they come).
  std::atomic<uint64_t> reads_paused{0};
  // Bytes queued for writing right now, all connections (headers included).
  std::atomic<int64_t> outbound_bytes{0};
};

// Receives the frames of one stream. Called on the connection's strand.
class StreamListener {
 public:
  virtual ~StreamListener() = default;
  virtual void OnFrame(const FrameHeader& header, std::shared_ptr<std::string> payload) = 0;
  // The connection closed (peer death, protocol error, local close).
  virtual void OnConnectionClosed(const Status& why) = 0;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  enum class Role { kClient, kServer };
  using ReadyHandler = std::function<void(const Status&)>;
  using CloseHandler = std::function<void(const Status&)>;
  // Gets frames of stream ids with no listener. It may return a listener,
  // which is attached to that stream id at once (before the next frame is
  // read): this is how the server opens a stream.
  using UnclaimedHandler = std::function<std::shared_ptr<StreamListener>(
      const std::shared_ptr<Connection>&, const FrameHeader&, std::shared_ptr<std::string>)>;

  // `counters` may be null; it must outlive the connection.
  static std::shared_ptr<Connection> Create(asio::io_context& io, Role role, const ConnectionOptions& options,
                                            ConnectionCounters* counters);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Set before Start*; not thread-safe with respect to Start*.
  void set_unclaimed_handler(UnclaimedHandler h) { unclaimed_ = std::move(h); }
  void set_close_handler(CloseHandler h) { on_close_ = std::move(h); }

  // Server: the socket to accept into (TCP or Unix domain: a generic stream
  // socket takes either), then StartServer.
  using Socket = asio::generic::stream_protocol::socket;
  Socket& socket() { return socket_; }
  void StartServer(ReadyHandler ready);
  // Server: refuses the accepted connection instead (a listener over its
  // limits, net/connection_limiter.h): without TLS the peer gets an ErrorRsp
  // with `why` on stream 0 (a client's handshake fails with it), then the
  // connection closes; under TLS it closes at once, as no TLS handshake is
  // spent on it. The close handler runs as for any close.
  void Refuse(const Status& why);
  // Client: connects to host:port and authenticates. `ready` is called once:
  // OK when authenticated, else the reason (AuthFailed, PeerDead, Timeout...).
  void StartClient(const std::string& host, uint16_t port, ReadyHandler ready);
  // Client over a Unix domain socket at `path` (a client on the same host).
  void StartClientUnix(const std::string& path, ReadyHandler ready);

  // Queues one frame. `on_sent` runs once the frame is fully written to the
  // socket (the kernel holds it): the credit protocol (§4 step 3) counts a
  // chunk as accepted downstream only then. It never runs if the connection
  // closes first. Payload is shared, not copied: forwarding reuses it.
  void Send(MessageType type, uint32_t stream_id, uint64_t chain_version,
            std::shared_ptr<const std::string> payload, std::function<void()> on_sent = nullptr);
  void Send(MessageType type, uint32_t stream_id, uint64_t chain_version, std::string payload) {
    Send(type, stream_id, chain_version, std::make_shared<const std::string>(std::move(payload)));
  }

  // Routes frames of `stream_id` to `listener` until Detach or close. If the
  // connection is already closed, the listener is told so (asynchronously).
  void Attach(uint32_t stream_id, std::shared_ptr<StreamListener> listener);
  void Detach(uint32_t stream_id);
  // A fresh stream id for a stream this side initiates (never 0).
  uint32_t NewStreamId() { return next_stream_id_.fetch_add(1); }

  // A listener that hands a frame to threads of its own (a session's request,
  // answered on its instance's strand) calls FrameHandedOff from OnFrame, and
  // FrameHandled once that frame is handled, from any thread. While
  // kMaxFramesInProgress are in progress, no further frame is read from the
  // peer until half of them are handled: otherwise a peer that pipelines
  // requests and reads no answers would have them all read before their
  // answers could fill the outbound queue and pause reading
  // (max_outbound_bytes), and all their answers queued after.
  static constexpr uint32_t kMaxFramesInProgress = 16;
  void FrameHandedOff() { frames_in_progress_.fetch_add(1); }
  void FrameHandled();

  // Closes now; queued frames are dropped. Idempotent.
  void Close(const Status& why);
  // Sends an ErrorRsp on `stream_id`, then closes once it is written.
  void CloseWithError(uint32_t stream_id, const Status& why);

  bool is_open() const { return state_.load() == State::kOpen; }
  // The peer's worker id, known after the handshake.
  std::string peer_id() const;
  // Server: who the peer proved to be in the handshake (its role and scope),
  // known once the connection is open (§2, "Roles").
  PeerIdentity peer() const;
  // "ip:port" of the peer, for messages.
  const std::string& remote() const { return remote_; }

 private:
  enum class State { kHandshake, kOpen, kClosed };
  using Clock = std::chrono::steady_clock;
  struct Outgoing {
    std::array<char, kFrameHeaderBytes> header;
    std::shared_ptr<const std::string> payload;
    std::function<void()> on_sent;
  };

  Connection(asio::io_context& io, Role role, const ConnectionOptions& options, ConnectionCounters* counters);

  // All private methods run on strand_.
  void BeginSession();
  void ReadHeader();
  void OnHeader(const asio::error_code& ec);
  void ReadPayload(size_t done);
  void SetReceiveLowWater(size_t bytes);
  void OnPayload(const asio::error_code& ec);
  void Dispatch(const FrameHeader& h, std::shared_ptr<std::string> payload);
  void HandleHandshake(const FrameHeader& h, const std::string& payload);
  // Server side of §2: the client's AuthReq, then (under TLS) its certificate's roles.
  void OnAuthReq(const std::string& payload);
  // Server side, under TLS: PermissionDenied unless the peer's certificate
  // admits `role` (its "rhino-role:" SANs, net/cert_roles.h; none: any role).
  Status CheckCertificateAdmits(PeerRole role);
  void HandleConnectionFrame(const FrameHeader& h, const std::string& payload);
  void Enqueue(Outgoing o);
  void WriteNext();
  void OnWritten(const asio::error_code& ec);
  // After a frame is dispatched: reads the next one, unless the outbound queue
  // is over max_outbound_bytes (until OnWritten drains it to half) or a
  // listener's frames in progress reach kMaxFramesInProgress (until half are
  // handled).
  void ReadNextOrPause();
  // Reads on, if reading stopped and nothing holds it stopped any more.
  void MaybeResumeReading();
  // Drops `n` bytes from the queued count (written, or cleared by a close).
  void Dequeued(uint64_t n);
  void Tick();
  void Reject(uint32_t stream_id, const Status& why);
  void DoClose(const Status& why);
  void FinishHandshake(const Status& s);
  void Connect(const asio::generic::stream_protocol::endpoint& ep);
  // Client: the §2 handshake's first frame.
  void SendHello();
  // Client: the key it proves (its credential's, else the root secret).
  const std::string& Key() const;
  bool IsUnixSocket();
  // The TLS handshake over the connected socket, then `then` (on the strand).
  void StartTls(asio::ssl::stream_base::handshake_type type, std::function<void()> then);
  // Runs `f` with the stream to read and write: the TLS stream once there is
  // one, else the socket. Both are driven from the strand only.
  template <typename F>
  void WithStream(F&& f) {
    if (tls_) {
      f(*tls_);
    } else {
      f(socket_);
    }
  }
  // Starts the liveness clock and the heartbeat timer (§6), once.
  void StartClock();
  void SendNow(MessageType type, uint32_t stream_id, std::string payload);
  // The Status for a failed read: TlsFailed for a TLS error, else PeerDead.
  Status ReadFailure(const std::string& what, const asio::error_code& ec);

  const Role role_;
  const ConnectionOptions options_;
  ConnectionCounters* const counters_;
  asio::strand<asio::io_context::executor_type> strand_;
  Socket socket_;
  // Declared after socket_, so destroyed before it (it refers to it).
  std::unique_ptr<asio::ssl::stream<Socket&>> tls_;
  std::string tls_name_;  // client: the address dialled, which the server's certificate must name
  asio::steady_timer timer_;
  // Read by is_open() from any thread; written on the strand.
  std::atomic<State> state_{State::kHandshake};
  // Stream ids are handed out from any thread.
  std::atomic<uint32_t> next_stream_id_{1};
  // Frames listeners handed off and have not handled: raised on the strand,
  // lowered from any thread.
  std::atomic<uint32_t> frames_in_progress_{0};

  // ---- strand-only state ----
  UnclaimedHandler unclaimed_;
  CloseHandler on_close_;
  ReadyHandler ready_;
  std::string remote_;
  std::string peer_id_;  // these three are also read by peer_id() and peer() under peer_mu_
  PeerRole peer_role_ = PeerRole::kAdmin;
  std::string peer_scope_;
  mutable std::mutex peer_mu_;
  std::string server_key_;  // server: the key the client named in HelloReq (§2, "Roles")
  std::string client_nonce_, server_nonce_;
  bool hello_done_ = false;
  char header_buf_[kFrameHeaderBytes];
  FrameHeader cur_;
  std::shared_ptr<std::string> payload_;
  size_t rcvlowat_ = 1;  // the socket's SO_RCVLOWAT, as last set
  std::deque<Outgoing> queue_;
  uint64_t queued_bytes_ = 0;  // headers and payloads in queue_, the frame being written included
  bool outbound_full_ = false;  // queued_bytes_ passed max_outbound_bytes, and has not drained to half yet
  bool reading_stopped_ = false;  // ReadNextOrPause read no next frame; MaybeResumeReading does
  bool writing_ = false;
  bool closing_ = false;  // CloseWithError: stop reading, close when the queue drains
  Status closing_status_;
  // A write failed: nothing more is written, the read side drains what the
  // peer sent before it closed (OnWritten says why), for at most this long.
  static constexpr int64_t kWriteFailedDrainMs = 1000;
  bool write_failed_ = false;
  Status write_failed_status_;
  Clock::time_point write_failed_at_;
  Clock::time_point started_, last_recv_, last_send_, write_started_;
  uint64_t heartbeat_nonce_ = 0;
  std::map<uint32_t, std::shared_ptr<StreamListener>> listeners_;
};

}  // namespace rhino::net
