// Connection's write side: frames queued (their checksums computed on the
// caller's thread), written one at a time on the strand, and the bound on
// what is queued for one peer (max_outbound_bytes) that pauses its reading.
#include "net/connection.h"

#include <string>

#include "net/messages.h"

namespace rhino::net {

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

}  // namespace rhino::net
