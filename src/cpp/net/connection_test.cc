// Connection's read flow control (issue 46, "Bounds everywhere"): a server
// connection stops reading its peer while more than max_outbound_bytes are
// queued for it, or while kMaxFramesInProgress of its frames are handed off
// and not handled, and reads on once the queue has drained to half (the
// frames to half); nothing queued is lost, liveness (§6) still holds.
//
// A real server Connection on 127.0.0.1 (an ephemeral port), on an io thread
// of its own, against a raw blocking client that speaks the §1/§2 wire by
// hand, so that the test decides when the client reads. Both ends' socket
// buffers are made small, so that the kernel holds little of what the server
// writes and the queue is what fills.
#include "net/connection.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "net/auth.h"
#include "net/messages.h"
#include "testing/test_util.h"

namespace rhino::net {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kSecret[] = "connection-test-secret";
// Requests are StoreQueryReq frames of one byte on stream i (1..n), each
// answered by a StoreQueryRsp of `answer_bytes` on the same stream: the
// server's handlers look at neither payload.
constexpr MessageType kRequestType = MessageType::kStoreQueryReq;
constexpr MessageType kAnswerType = MessageType::kStoreQueryRsp;

int64_t MsSince(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

// Waits up to `ms` for `pred`.
template <typename Pred>
bool WaitFor(Pred pred, int ms = 10000) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

std::string Frame(MessageType type, uint32_t stream_id, const std::string& payload) {
  std::string out(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(type, stream_id, 0, payload, out.data());
  return out + payload;
}

// A peer that speaks the protocol by hand over a blocking socket.
class RawClient {
 public:
  // `rcvbuf`: the socket's receive buffer, set before connecting.
  RawClient(uint16_t port, int rcvbuf) : sock_(io_) {
    sock_.open(asio::ip::tcp::v4());
    sock_.set_option(asio::socket_base::receive_buffer_size(rcvbuf));
    sock_.connect({asio::ip::make_address("127.0.0.1"), port});
  }

  // §2 from the client's side, as admin (the root secret itself).
  void Handshake() {
    std::string client_nonce;
    ASSERT_OK(NewNonce(&client_nonce));
    HelloReq hello;
    hello.worker_id = "raw";
    hello.client_nonce = client_nonce;
    Write(Frame(MessageType::kHelloReq, 0, hello.Encode()));
    FrameHeader h;
    std::string p;
    ASSERT_OK(Read(&h, &p));
    ASSERT_EQ(h.type, MessageType::kHelloRsp);
    HelloRsp rsp;
    ASSERT_OK(HelloRsp::Decode(p, &rsp));
    AuthReq auth;
    auth.client_mac = ClientMac(kSecret, rsp.server_nonce, client_nonce);
    Write(Frame(MessageType::kAuthReq, 0, auth.Encode()));
    ASSERT_OK(Read(&h, &p));
    ASSERT_EQ(h.type, MessageType::kAuthRsp);
  }

  // Errors are the reads' to report (a closed connection).
  void Write(const std::string& bytes) {
    asio::error_code ignored;
    asio::write(sock_, asio::buffer(bytes), ignored);
  }
  void Heartbeat() {
    HeartbeatReq hb;
    hb.nonce = ++nonce_;
    Write(Frame(MessageType::kHeartbeatReq, 0, hb.Encode()));
  }

  // One frame, checked as the server checks ours (§1). The server's own
  // heartbeats are skipped.
  Status Read(FrameHeader* h, std::string* payload) {
    for (;;) {
      char head[kFrameHeaderBytes];
      asio::error_code ec;
      asio::read(sock_, asio::buffer(head), ec);
      if (ec) return Status::PeerDead("read: " + ec.message());
      bool intact = false;
      Status s = DecodeFrameHeader(head, kMaxFrameBytesLimit, h, &intact);
      if (!s.ok()) return s;
      payload->assign(h->length, '\0');
      asio::read(sock_, asio::buffer(payload->data(), payload->size()), ec);
      if (ec) return Status::PeerDead("read: " + ec.message());
      s = CheckFramePayload(*h, *payload);
      if (!s.ok()) return s;
      if (h->type != MessageType::kHeartbeatReq && h->type != MessageType::kHeartbeatRsp) return Status::OK();
    }
  }

 private:
  asio::io_context io_;  // never run: the socket is used synchronously
  asio::ip::tcp::socket sock_;
  uint64_t nonce_ = 0;
};

// Hands each request to a thread of its own (as a session hands its requests
// to its instance's strand), which answers it after `delay`.
class HandOffListener : public StreamListener, public std::enable_shared_from_this<HandOffListener> {
 public:
  HandOffListener(std::shared_ptr<Connection> conn, uint32_t stream_id, size_t answer_bytes,
                  std::chrono::milliseconds delay)
      : conn_(conn), stream_id_(stream_id), answer_bytes_(answer_bytes), delay_(delay) {
    worker_ = std::thread([this]() { Run(); });
  }
  ~HandOffListener() override { Stop(); }

  void OnFrame(const FrameHeader&, std::shared_ptr<std::string>) override {
    if (auto c = conn_.lock()) c->FrameHandedOff();
    std::lock_guard<std::mutex> l(mu_);
    ++received_;
    ++pending_;
    max_pending_ = std::max(max_pending_, pending_);
    cv_.notify_one();
  }
  void OnConnectionClosed(const Status&) override {}

  void Stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (worker_.joinable()) worker_.join();
  }
  uint32_t received() {
    std::lock_guard<std::mutex> l(mu_);
    return received_;
  }
  uint32_t max_pending() {
    std::lock_guard<std::mutex> l(mu_);
    return max_pending_;
  }

 private:
  void Run() {
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this]() { return stop_ || pending_ > 0; });
        if (stop_) return;
      }
      std::this_thread::sleep_for(delay_);
      auto c = conn_.lock();
      if (c == nullptr) return;
      c->Send(kAnswerType, stream_id_, 0, std::string(answer_bytes_, 'h'));
      {
        std::lock_guard<std::mutex> l(mu_);
        --pending_;
      }
      c->FrameHandled();
    }
  }

  std::weak_ptr<Connection> conn_;
  const uint32_t stream_id_;
  const size_t answer_bytes_;
  const std::chrono::milliseconds delay_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t received_ = 0, pending_ = 0, max_pending_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

class ConnectionFlowTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (server_ != nullptr) server_->Close(Status::Aborted("test over"));
    if (hand_off_ != nullptr) hand_off_->Stop();
    work_.reset();
    if (io_thread_.joinable()) io_thread_.join();
    hand_off_.reset();
    server_.reset();
  }

  // Starts a server connection on an ephemeral port, with small socket
  // buffers, and a raw client authenticated to it. Each request is answered
  // by `answer_bytes` on its stream: from the connection's strand, or with
  // `hand_off`, by a HandOffListener on stream 1 (every request on stream 1).
  void Start(ConnectionOptions o, size_t answer_bytes, bool hand_off = false,
             std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    o.secret = kSecret;
    o.worker_id = "srv";
    asio::ip::tcp::acceptor acceptor(io_, {asio::ip::make_address("127.0.0.1"), 0});
    server_ = Connection::Create(io_, Connection::Role::kServer, o, &counters_);
    // Made before the connection runs: the test thread reads it too.
    if (hand_off) hand_off_ = std::make_shared<HandOffListener>(server_, 1, answer_bytes, delay);
    std::atomic<bool> accepted{false};
    acceptor.async_accept(server_->socket(), [&accepted](const asio::error_code& ec) {
      EXPECT_FALSE(ec) << ec.message();
      accepted = true;
    });
    io_thread_ = std::thread([this]() { io_.run(); });
    client_ = std::make_unique<RawClient>(acceptor.local_endpoint().port(), 4096);
    ASSERT_TRUE(WaitFor([&]() { return accepted.load(); }));
    server_->socket().set_option(asio::socket_base::send_buffer_size(4096));
    server_->set_close_handler([this](const Status& why) {
      std::lock_guard<std::mutex> l(mu_);
      closed_ = why.ToString();
    });
    server_->set_unclaimed_handler([this, answer_bytes, hand_off, delay](
                                       const std::shared_ptr<Connection>& c, const FrameHeader& h,
                                       std::shared_ptr<std::string> payload) -> std::shared_ptr<StreamListener> {
      if (hand_off) {
        hand_off_->OnFrame(h, std::move(payload));  // the stream's first request
        return hand_off_;
      }
      requests_seen_.fetch_add(1);
      c->Send(kAnswerType, h.stream_id, 0, std::string(answer_bytes, 'a'));
      return nullptr;
    });
    server_->StartServer([](const Status& s) { EXPECT_OK(s); });
    client_->Handshake();
  }

  std::string closed() {
    std::lock_guard<std::mutex> l(mu_);
    return closed_;
  }

  // Waits until the server has read no new request for `quiet_ms`; returns the count.
  template <typename Count>
  uint32_t Settle(Count count, int quiet_ms = 300) {
    uint32_t last = count();
    auto since = Clock::now();
    while (MsSince(since) < quiet_ms) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      const uint32_t now = count();
      if (now != last) {
        last = now;
        since = Clock::now();
      }
    }
    return last;
  }

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_{asio::make_work_guard(io_)};
  std::thread io_thread_;
  ConnectionCounters counters_;
  std::shared_ptr<Connection> server_;
  std::unique_ptr<RawClient> client_;
  std::shared_ptr<HandOffListener> hand_off_;
  std::atomic<uint32_t> requests_seen_{0};
  std::mutex mu_;
  std::string closed_;
};

TEST_F(ConnectionFlowTest, ReadingPausesAtTheOutboundBoundAndResumesOnceItDrainsWithNothingLost) {
  constexpr uint64_t kBound = 256 << 10;
  constexpr size_t kAnswerBytes = 32 << 10;
  constexpr uint32_t kRequests = 200;  // 6.4 MB of answers owed, 25 times the bound
  ConnectionOptions o;
  o.max_outbound_bytes = kBound;
  o.peer_timeout_ms = 20000;  // the client reads nothing for a while, on purpose
  Start(o, kAnswerBytes);
  std::string requests;
  for (uint32_t i = 1; i <= kRequests; ++i) requests += Frame(kRequestType, i, "q");
  client_->Write(requests);  // 7 KB: the sockets' buffers take it all

  // The client reads nothing: the server stops reading once the queue passes the bound.
  const uint32_t seen = Settle([this]() { return requests_seen_.load(); });
  EXPECT_EQ(counters_.reads_paused.load(), 1u);
  EXPECT_LT(seen, kRequests / 4) << "the server read on past its outbound bound";
  const int64_t queued = counters_.outbound_bytes.load();
  EXPECT_GT(queued, static_cast<int64_t>(kBound));
  // Past the bound by at most two answers: the one that passed it, and the
  // answer to the request read before the check saw it (an answer is
  // queued from a post, after the connection read its next frame).
  EXPECT_LE(queued, static_cast<int64_t>(kBound + 2 * (kFrameHeaderBytes + kAnswerBytes)));
  EXPECT_TRUE(server_->is_open());

  // Now it reads: every answer comes, in order, whole; reading resumed.
  for (uint32_t i = 1; i <= kRequests; ++i) {
    FrameHeader h;
    std::string p;
    ASSERT_OK(client_->Read(&h, &p));
    ASSERT_EQ(h.type, kAnswerType);
    ASSERT_EQ(h.stream_id, i);
    ASSERT_EQ(p, std::string(kAnswerBytes, 'a'));
  }
  EXPECT_EQ(requests_seen_.load(), kRequests);
  EXPECT_GE(counters_.reads_paused.load(), 2u) << "once the client read, the server resumed and paused again";
  EXPECT_TRUE(WaitFor([this]() { return counters_.outbound_bytes.load() == 0; }));
  EXPECT_TRUE(server_->is_open()) << closed();
  EXPECT_EQ(counters_.peers_dead.load(), 0u);
}

TEST_F(ConnectionFlowTest, WithoutABoundTheServerReadsEverythingAndQueuesEveryAnswer) {
  // The case the bound is for, as a control: 0 = no bound.
  constexpr size_t kAnswerBytes = 32 << 10;
  constexpr uint32_t kRequests = 200;
  ConnectionOptions o;
  o.max_outbound_bytes = 0;
  o.peer_timeout_ms = 20000;
  Start(o, kAnswerBytes);
  std::string requests;
  for (uint32_t i = 1; i <= kRequests; ++i) requests += Frame(kRequestType, i, "q");
  client_->Write(requests);
  EXPECT_EQ(Settle([this]() { return requests_seen_.load(); }), kRequests);
  EXPECT_EQ(counters_.reads_paused.load(), 0u);
  EXPECT_GT(counters_.outbound_bytes.load(), static_cast<int64_t>(kRequests - 10) * static_cast<int64_t>(kAnswerBytes));
}

TEST_F(ConnectionFlowTest, FramesHandedOffAreBoundedWhereTheirAnswersAreNotYetQueued) {
  // A listener that answers on a thread of its own: without kMaxFramesInProgress
  // the connection would read all 200 requests (7 KB) before the first answer
  // is queued, and queue all 200 answers after, whatever the outbound bound.
  constexpr uint64_t kBound = 256 << 10;
  constexpr size_t kAnswerBytes = 32 << 10;
  constexpr uint32_t kRequests = 200;
  ConnectionOptions o;
  o.max_outbound_bytes = kBound;
  o.peer_timeout_ms = 20000;
  Start(o, kAnswerBytes, /*hand_off=*/true, std::chrono::milliseconds(2));
  std::string requests;
  for (uint32_t i = 0; i < kRequests; ++i) requests += Frame(kRequestType, 1, "q");
  client_->Write(requests);
  const uint32_t seen = Settle([this]() { return hand_off_->received(); });
  EXPECT_LE(hand_off_->max_pending(), Connection::kMaxFramesInProgress);
  EXPECT_LT(seen, kRequests / 4);
  // The bound, passed by at most the answers of the frames in progress when it was.
  EXPECT_GE(counters_.reads_paused.load(), 1u);
  EXPECT_LE(counters_.outbound_bytes.load(),
            static_cast<int64_t>(kBound + (Connection::kMaxFramesInProgress + 1) * (kFrameHeaderBytes + kAnswerBytes)));
  for (uint32_t i = 0; i < kRequests; ++i) {
    FrameHeader h;
    std::string p;
    ASSERT_OK(client_->Read(&h, &p));
    ASSERT_EQ(h.type, kAnswerType);
    ASSERT_EQ(h.stream_id, 1u);
    ASSERT_EQ(p.size(), kAnswerBytes);
  }
  EXPECT_EQ(hand_off_->received(), kRequests);
  EXPECT_TRUE(server_->is_open()) << closed();
}

TEST_F(ConnectionFlowTest, FramesHandedOffAloneHoldReadingUntilHalfAreHandled) {
  // No outbound bound, a slow handler: the connection never has more than
  // kMaxFramesInProgress of the stream's frames in progress, and reads on.
  constexpr uint32_t kRequests = 100;
  ConnectionOptions o;
  o.max_outbound_bytes = 0;
  Start(o, 16, /*hand_off=*/true, std::chrono::milliseconds(3));
  std::string requests;
  for (uint32_t i = 0; i < kRequests; ++i) requests += Frame(kRequestType, 1, "q");
  client_->Write(requests);
  for (uint32_t i = 0; i < kRequests; ++i) {
    FrameHeader h;
    std::string p;
    ASSERT_OK(client_->Read(&h, &p));
    ASSERT_EQ(h.stream_id, 1u);
  }
  EXPECT_EQ(hand_off_->received(), kRequests);
  EXPECT_LE(hand_off_->max_pending(), Connection::kMaxFramesInProgress);
  EXPECT_GE(hand_off_->max_pending(), Connection::kMaxFramesInProgress / 2) << "the requests were not pipelined";
  EXPECT_EQ(counters_.reads_paused.load(), 0u);  // holds are flow control, not outbound pauses
}

TEST_F(ConnectionFlowTest, APeerThatReadsSlowlyIsNotDeclaredDeadWhileReadingIsPaused) {
  // The server reads nothing of the client's (its heartbeats included) while
  // paused, and stays paused longer than peer_timeout_ms: the client drains
  // half the bound at one small answer per 40 ms. Each answer is accepted
  // well within the timeout, so the client is alive; it must not be declared
  // "sent nothing for peer_timeout_ms".
  constexpr uint64_t kBound = 64 << 10;
  constexpr size_t kAnswerBytes = 1 << 10;
  constexpr uint32_t kRequests = 120;
  ConnectionOptions o;
  o.max_outbound_bytes = kBound;
  o.heartbeat_ms = 100;
  o.peer_timeout_ms = 1000;  // half the bound drains in about 32 x 40 ms = 1.3 s
  Start(o, kAnswerBytes);
  std::string requests;
  for (uint32_t i = 1; i <= kRequests; ++i) requests += Frame(kRequestType, i, "q");
  client_->Write(requests);
  ASSERT_TRUE(WaitFor([this]() { return counters_.reads_paused.load() >= 1; }));
  auto last_heartbeat = Clock::now();
  const auto start = Clock::now();
  for (uint32_t i = 1; i <= kRequests; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
    if (MsSince(last_heartbeat) >= 100) {  // a live client's heartbeats, unread while paused
      client_->Heartbeat();
      last_heartbeat = Clock::now();
    }
    FrameHeader h;
    std::string p;
    const Status read = client_->Read(&h, &p);
    ASSERT_TRUE(read.ok()) << "answer " << i << " after " << MsSince(start) << " ms: " << read.ToString() << "; "
                           << closed();
    ASSERT_EQ(h.stream_id, i);
  }
  EXPECT_TRUE(server_->is_open()) << closed();
  EXPECT_EQ(counters_.peers_dead.load(), 0u) << closed();
  EXPECT_GE(MsSince(start), 2 * o.peer_timeout_ms);
}

TEST_F(ConnectionFlowTest, APeerThatReadsNothingIsStillDeclaredDeadWhileReadingIsPaused) {
  // A stuck peer (it sends heartbeats but never reads) while reading is
  // paused: the server's write stalls, and "accepted no data" closes it.
  constexpr uint64_t kBound = 64 << 10;
  ConnectionOptions o;
  o.max_outbound_bytes = kBound;
  o.heartbeat_ms = 100;
  o.peer_timeout_ms = 1000;
  Start(o, 32 << 10);
  std::string requests;
  for (uint32_t i = 1; i <= 50; ++i) requests += Frame(kRequestType, i, "q");
  client_->Write(requests);
  ASSERT_TRUE(WaitFor([this]() { return counters_.reads_paused.load() >= 1; }));
  const auto paused = Clock::now();
  while (closed().empty() && MsSince(paused) < 10000) {
    client_->Heartbeat();  // alive, as far as its heartbeats go, but reading nothing
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_NE(closed().find("accepted no data for 1000 ms"), std::string::npos) << closed();
  // The stalled write may have begun a little before the pause.
  EXPECT_GE(MsSince(paused), 500);
  EXPECT_EQ(counters_.peers_dead.load(), 1u);
  EXPECT_EQ(counters_.outbound_bytes.load(), 0) << "a closed connection's queue is not counted";
}

}  // namespace
}  // namespace rhino::net
