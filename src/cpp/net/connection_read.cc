// Connection's read side (protocol §1): frame headers and payloads read off
// the socket, paused while too many frames are in progress or too much is
// queued for a peer that does not read, and each frame dispatched to the
// handshake, the connection itself (heartbeats, errors) or its stream's
// listener.
#include "net/connection.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include "net/messages.h"
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

}  // namespace

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

}  // namespace rhino::net
