#include "client/state_client.h"

#include <asio.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "net/address.h"
#include "net/connection.h"
#include "rhino/thread_annotations.h"

namespace rhino {
namespace {

// Frame payload left for keys and values after a request's fixed fields.
constexpr uint32_t kRequestOverhead = 64;
// Keys per request: a batch goes as several requests sent back to back, so
// the worker looks up or stages one while the client encodes the next and
// decodes the previous answer (on two cores, the two processes overlap).
constexpr size_t kKeysPerRequest = 32768;  // 8192: get 0.11 s, 32768: 0.094 s, 65536: 0.105 s (100k keys)

// The frames of one stream, as they arrive (a StreamListener on the
// connection's strand feeds it; the requesting thread waits on it).
class Inbox : public net::StreamListener {
 public:
  struct Frame {
    FrameHeader header;
    std::shared_ptr<std::string> payload;
  };

  void OnFrame(const FrameHeader& h, std::shared_ptr<std::string> payload) override {
    std::lock_guard<std::mutex> l(mu_);
    frames_.push_back(Frame{h, std::move(payload)});
    cv_.notify_all();
  }
  void OnConnectionClosed(const Status& why) override {
    std::lock_guard<std::mutex> l(mu_);
    closed_ = why.ok() ? Status::PeerDead("connection closed") : why;
    cv_.notify_all();
  }
  void Fail(const Status& why) { OnConnectionClosed(why); }

  // The next frame of `type` (an ErrorRsp becomes its Status). `peer` names
  // the server in errors.
  Status Next(MessageType type, uint32_t timeout_ms, Frame* out, const char* peer = "the worker") {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_for(l, std::chrono::milliseconds(timeout_ms), [this]() { return !frames_.empty() || !closed_.ok(); })) {
      return Status::Timeout(std::string("no answer from ") + peer + " within " + std::to_string(timeout_ms) + " ms");
    }
    if (frames_.empty()) return closed_;
    *out = std::move(frames_.front());
    frames_.pop_front();
    if (out->header.type == MessageType::kErrorRsp) {
      ErrorRsp e;
      Status s = ErrorRsp::Decode(*out->payload, &e);
      if (!s.ok()) return Status::Corruption(std::string("malformed ErrorRsp from ") + peer + ": " + s.message());
      return Status::FromCode(e.code == 0 ? WireCode(Status::IOError("")) : e.code, e.message);
    }
    if (out->header.type != type) {
      return Status::Corruption(std::string(peer) + " answered " + MessageTypeName(out->header.type) +
                                " where " + MessageTypeName(type) + " was due");
    }
    return Status::OK();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Frame> frames_;
  Status closed_;
};

Status ResponseStatus(uint32_t code, const std::string& message) {
  return code == 0 ? Status::OK() : Status::FromCode(code, message);
}

}  // namespace

class StateClient::Impl {
 public:
  explicit Impl(const StateClientOptions& o) : options_(o) {}
  ~Impl() { Close(); }

  Status Start(const std::string& address, bool unix_socket) {
    address_ = address;
    net::ConnectionOptions co;
    co.worker_id = options_.client_id;
    co.secret = options_.secret;
    co.credential = options_.credential;
    co.max_frame_bytes = options_.max_frame_bytes;
    co.heartbeat_ms = options_.heartbeat_ms;
    co.peer_timeout_ms = options_.peer_timeout_ms;
    if (!unix_socket) {
      co.local_bind_host = options_.local_bind_host;
      RHINO_RETURN_IF_ERROR(net::MakeTlsContext(options_.tls, &co.tls));
    }
    work_ = std::make_unique<asio::executor_work_guard<asio::io_context::executor_type>>(io_.get_executor());
    thread_ = std::thread([this]() { io_.run(); });
    conn_ = net::Connection::Create(io_, net::Connection::Role::kClient, co, nullptr);
    // Kept for the calls made after the close: "closed" alone does not say
    // whether the server shut down, refused a frame or stopped answering.
    conn_->set_close_handler([this](const Status& why) {
      MutexLock l(&close_reason_mu_);
      close_reason_ = why;
    });
    auto ready = std::make_shared<std::pair<std::mutex, std::condition_variable>>();
    auto result = std::make_shared<std::pair<bool, Status>>(false, Status::OK());
    auto cb = [ready, result](const Status& s) {
      std::lock_guard<std::mutex> l(ready->first);
      result->first = true;
      result->second = s;
      ready->second.notify_all();
    };
    if (unix_socket) {
      conn_->StartClientUnix(address, cb);
    } else {
      std::string host;
      uint16_t port = 0;
      RHINO_RETURN_IF_ERROR(net::ParseAddress(address, &host, &port));
      conn_->StartClient(host, port, cb);
    }
    std::unique_lock<std::mutex> l(ready->first);
    ready->second.wait(l, [&]() { return result->first; });  // the handshake has its own deadline
    return result->second;
  }

  void Close() {
    std::lock_guard<std::mutex> l(close_mu_);
    if (closed_) return;
    closed_ = true;
    if (conn_) conn_->Close(Status::Aborted("the client closed the connection"));
    work_.reset();
    // Let the close run, then stop the loop.
    if (thread_.joinable()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      io_.stop();
      thread_.join();
    }
    conn_.reset();
  }

  bool is_open() const { return conn_ && conn_->is_open(); }

  std::shared_ptr<Inbox> NewStream(uint32_t* id) {
    auto inbox = std::make_shared<Inbox>();
    if (!conn_ || !conn_->is_open()) {
      MutexLock l(&close_reason_mu_);
      inbox->Fail(Status::PeerDead("the connection to " + address_ + " is closed" +
                                   (close_reason_.ok() ? std::string() : ": " + close_reason_.message())));
      *id = 0;
      return inbox;
    }
    *id = conn_->NewStreamId();
    conn_->Attach(*id, inbox);
    return inbox;
  }
  void Detach(uint32_t id) {
    if (conn_ && id != 0) conn_->Detach(id);
  }
  void Send(MessageType type, uint32_t id, std::string payload) {
    if (conn_) conn_->Send(type, id, 0, std::move(payload));
  }

  const StateClientOptions options_;
  // Session streams, by id: the inboxes of open sessions.
  std::mutex sessions_mu_;
  std::map<uint32_t, std::shared_ptr<Inbox>> sessions_;

 private:
  asio::io_context io_;
  std::unique_ptr<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::thread thread_;
  std::shared_ptr<net::Connection> conn_;
  std::mutex close_mu_;
  bool closed_ = false;
  std::string address_;  // set by Start, before any call
  Mutex close_reason_mu_;
  Status close_reason_ GUARDED_BY(close_reason_mu_);  // why the connection closed
};

Status StateClient::Connect(const std::string& address, const StateClientOptions& options,
                            std::shared_ptr<StateClient>* out) {
  if (options.secret.empty() && options.credential.key.empty()) {
    return Status::InvalidArgument("a state client needs the cluster's shared secret or a role's credential");
  }
  if (options.max_frame_bytes < kMaxMessageBytes || options.max_frame_bytes > kMaxFrameBytesLimit) {
    return Status::InvalidArgument("max_frame_bytes must be in [" + std::to_string(kMaxMessageBytes) + ", " +
                                   std::to_string(kMaxFrameBytesLimit) + "]");
  }
  std::shared_ptr<StateClient> c(new StateClient());
  c->options_ = options;
  std::string target = address;
  if (target.rfind("unix:", 0) == 0) {
    c->unix_ = true;
    target = target.substr(5);
  } else if (target.find('/') != std::string::npos) {
    c->unix_ = true;
  }
  c->address_ = target;
  c->impl_ = std::make_shared<Impl>(options);
  RHINO_RETURN_IF_ERROR(c->impl_->Start(target, c->unix_));
  *out = std::move(c);
  return Status::OK();
}

StateClient::~StateClient() {
  if (impl_) impl_->Close();
}

void StateClient::Close() { impl_->Close(); }
bool StateClient::is_open() const { return impl_->is_open(); }

Status StateClient::Instance(InstanceAction action, const std::string& operator_id, uint32_t instance,
                             uint64_t epoch, const std::string& args_json, std::string* result_json) {
  uint32_t id = 0;
  auto inbox = impl_->NewStream(&id);
  InstanceReq req;
  req.action = static_cast<uint8_t>(action);
  req.operator_id = operator_id;
  req.instance = instance;
  req.epoch = epoch;
  req.args = args_json;
  if (id != 0) impl_->Send(MessageType::kInstanceReq, id, req.Encode());
  Inbox::Frame f;
  Status s = inbox->Next(MessageType::kInstanceRsp, impl_->options_.request_timeout_ms, &f);
  impl_->Detach(id);
  RHINO_RETURN_IF_ERROR(s);
  InstanceRsp rsp;
  s = InstanceRsp::Decode(*f.payload, &rsp);
  if (!s.ok()) return Status::Corruption("malformed InstanceRsp: " + s.message());
  RHINO_RETURN_IF_ERROR(ResponseStatus(rsp.code, rsp.message));
  *result_json = std::move(rsp.result);
  return Status::OK();
}

Status StateClient::Coord(const std::string& method, const std::string& args_json, std::string* result_json) {
  // Checked before sending: the coordinator closes a connection that sends a
  // malformed CoordReq (§1), which would fail every other call on it too.
  if (!IsValidCoordMethod(method)) {
    return Status::InvalidArgument("a coordinator method is 1 to " + std::to_string(kMaxCoordMethodBytes) +
                                   " bytes of [a-z_], got '" + method.substr(0, 80) + "'");
  }
  CoordReq req;
  req.method = method;
  req.args = args_json;
  std::string payload = req.Encode();
  if (args_json.size() > kMaxCoordArgsBytes || payload.size() > impl_->options_.max_frame_bytes) {
    return Status::InvalidArgument("the args of " + method + " have " + std::to_string(args_json.size()) +
                                   " bytes, more than a CoordReq carries (" +
                                   std::to_string(std::min<size_t>(kMaxCoordArgsBytes,
                                                                   impl_->options_.max_frame_bytes - 8 -
                                                                       method.size())) +
                                   ")");
  }
  uint32_t id = 0;
  auto inbox = impl_->NewStream(&id);
  if (id != 0) impl_->Send(MessageType::kCoordReq, id, std::move(payload));
  Inbox::Frame f;
  Status s = inbox->Next(MessageType::kCoordRsp, impl_->options_.request_timeout_ms, &f, "the coordinator");
  impl_->Detach(id);
  RHINO_RETURN_IF_ERROR(s);
  CoordRsp rsp;
  s = CoordRsp::Decode(*f.payload, &rsp);
  if (!s.ok()) return Status::Corruption("malformed CoordRsp: " + s.message());
  RHINO_RETURN_IF_ERROR(ResponseStatus(rsp.code, rsp.message));
  *result_json = std::move(rsp.result);
  return Status::OK();
}

Status StateClient::OpenSession(const std::string& operator_id, uint32_t instance, uint64_t batch, uint64_t epoch,
                                std::unique_ptr<ClientSession>* out, SessionOpenRsp* info,
                                std::optional<uint64_t> attempt, std::optional<uint64_t> committed) {
  if (committed && !attempt) return Status::InvalidArgument("a committed batch is sent with an attempt token only");
  SessionOpenReq req;
  req.operator_id = operator_id;
  req.instance = instance;
  req.batch = batch;
  req.epoch = epoch;
  req.has_attempt = attempt.has_value();
  req.attempt = attempt.value_or(0);
  req.has_committed = committed.has_value();
  req.committed = committed.value_or(0);
  return Open(req, out, info);
}

Status StateClient::ReadCheckpoint(const std::string& operator_id, uint32_t instance,
                                   std::optional<uint64_t> checkpoint, std::unique_ptr<ClientSession>* out,
                                   SessionOpenRsp* info) {
  SessionOpenReq req;
  req.operator_id = operator_id;
  req.instance = instance;
  req.read_checkpoint = true;
  req.has_checkpoint = checkpoint.has_value();
  req.checkpoint = checkpoint.value_or(0);
  Status s = Open(req, out, info);
  if (s.ok() && !info->reading) {
    out->reset();  // aborts the session it opened
    return Status::Corruption("the worker opened a session where a checkpoint reader was asked for");
  }
  return s;
}

Status StateClient::Open(const SessionOpenReq& req, std::unique_ptr<ClientSession>* out, SessionOpenRsp* info) {
  uint32_t id = 0;
  auto inbox = impl_->NewStream(&id);
  if (id != 0) impl_->Send(MessageType::kSessionOpenReq, id, req.Encode());
  Inbox::Frame f;
  Status s = inbox->Next(MessageType::kSessionOpenRsp, impl_->options_.request_timeout_ms, &f);
  if (s.ok()) {
    s = SessionOpenRsp::Decode(*f.payload, info);
    if (!s.ok()) s = Status::Corruption("malformed SessionOpenRsp: " + s.message());
  }
  if (s.ok()) s = ResponseStatus(info->code, info->message);
  if (!s.ok()) {
    impl_->Detach(id);
    return s;
  }
  {
    std::lock_guard<std::mutex> l(impl_->sessions_mu_);
    impl_->sessions_[id] = inbox;
  }
  std::unique_ptr<ClientSession> session(new ClientSession());
  session->impl_ = impl_;
  session->stream_id_ = id;
  session->batch_ = req.batch;
  session->open_ = true;
  session->frame_budget_ = impl_->options_.max_frame_bytes - kRequestOverhead;
  session->round_trips_ = 1;  // the open
  *out = std::move(session);
  return Status::OK();
}

// ---- ClientSession ----

namespace {

std::shared_ptr<Inbox> SessionInbox(StateClient::Impl* impl, uint32_t id) {
  std::lock_guard<std::mutex> l(impl->sessions_mu_);
  auto it = impl->sessions_.find(id);
  return it == impl->sessions_.end() ? nullptr : it->second;
}

}  // namespace

ClientSession::~ClientSession() {
  if (open_) Abort("the client dropped the session").ok();
}

Status ClientSession::Get(
    const std::vector<std::string_view>& keys,
    const std::function<void(size_t, bool, std::string_view, const std::shared_ptr<std::string>&)>& fn) {
  if (!open_) return Status::Aborted("the session is no longer open");
  auto inbox = SessionInbox(impl_.get(), stream_id_);
  if (!inbox) return Status::Aborted("the session is no longer open");
  const uint32_t timeout = impl_->options_.request_timeout_ms;
  // Requests of at most one frame each, sent back to back; an answer that
  // could not hold every value covers a prefix, and the rest is asked again.
  // [begin, end) per request in flight, and its wave: 0 for the requests
  // sent up front, w + 1 for a re-ask sent on an answer of wave w.
  struct InFlight {
    size_t begin, end, wave;
  };
  std::deque<InFlight> pending;
  size_t waves = 0;
  auto send = [&](size_t begin, size_t end, size_t wave = 0) {
    GetReq req;
    req.keys.assign(keys.begin() + begin, keys.begin() + end);
    impl_->Send(MessageType::kGetReq, stream_id_, req.Encode());
    pending.push_back(InFlight{begin, end, wave});
    waves = std::max(waves, wave + 1);
  };
  // Checked before anything is sent: a refusal half-way would leave answers of the
  // frames already sent unread, and the session's stream out of step.
  for (size_t i = 0; i < keys.size(); ++i) {
    if (4 + keys[i].size() > frame_budget_) {
      return Status::InvalidArgument("key " + std::to_string(i) + " of " + std::to_string(keys[i].size()) +
                                     " bytes does not fit in a frame; nothing was read");
    }
  }
  size_t begin = 0, bytes = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t cost = 4 + keys[i].size();
    if (bytes + cost > frame_budget_ || i - begin == kKeysPerRequest) {
      send(begin, i);
      begin = i;
      bytes = 0;
    }
    bytes += cost;
  }
  if (begin < keys.size()) send(begin, keys.size());
  Status first;
  while (!pending.empty()) {
    const auto [b, e, wave] = pending.front();
    pending.pop_front();
    Inbox::Frame f;
    Status s = inbox->Next(MessageType::kGetRsp, timeout, &f);
    if (!s.ok()) {
      open_ = false;  // the stream is out of step: the session cannot go on
      round_trips_ += waves;
      return s;
    }
    GetRsp rsp;
    s = GetRsp::Decode(*f.payload, &rsp);
    if (s.ok()) s = ResponseStatus(rsp.code, rsp.message);
    if (!s.ok()) {
      if (first.ok()) first = s;
      continue;
    }
    const size_t answered = rsp.found.size();
    if (answered > e - b || (answered == 0 && e > b)) {
      open_ = false;
      round_trips_ += waves;
      return Status::Corruption("the worker answered " + std::to_string(answered) + " of " + std::to_string(e - b) + " keys");
    }
    size_t v = 0;
    for (size_t j = 0; j < answered; ++j) {
      const bool found = rsp.found[j] != 0;
      fn(b + j, found, found ? rsp.values[v++] : std::string_view(), f.payload);
    }
    if (b + answered < e && first.ok()) send(b + answered, e, wave + 1);
  }
  round_trips_ += waves;
  return first;
}

Status ClientSession::Write(WriteOp op, const std::vector<std::string_view>& keys,
                            const std::vector<std::string_view>* values) {
  if (!open_) return Status::Aborted("the session is no longer open");
  if (values && values->size() != keys.size()) {
    return Status::InvalidArgument(std::to_string(keys.size()) + " keys but " + std::to_string(values->size()) + " values");
  }
  auto inbox = SessionInbox(impl_.get(), stream_id_);
  if (!inbox) return Status::Aborted("the session is no longer open");
  size_t frames = 0;
  auto send = [&](size_t begin, size_t end) {
    WriteReq req;
    req.op = static_cast<uint8_t>(op);
    req.keys.assign(keys.begin() + begin, keys.begin() + end);
    if (values) req.values.assign(values->begin() + begin, values->begin() + end);
    impl_->Send(MessageType::kWriteReq, stream_id_, req.Encode());
    ++frames;
  };
  auto cost_of = [&](size_t i) { return 4 + keys[i].size() + (values ? 4 + (*values)[i].size() : 0); };
  // Checked before anything is sent: a refusal half-way would leave some frames applied
  // and their answers unread (the session's stream out of step).
  for (size_t i = 0; i < keys.size(); ++i) {
    if (cost_of(i) > frame_budget_) {
      return Status::InvalidArgument("entry " + std::to_string(i) + " (a key of " + std::to_string(keys[i].size()) +
                                     " bytes" + (values ? " and a value of " + std::to_string((*values)[i].size()) +
                                                          " bytes" : std::string()) +
                                     ") does not fit in a frame of " + std::to_string(frame_budget_) +
                                     " bytes (max_frame_bytes); nothing of this batch was written");
    }
  }
  size_t begin = 0, bytes = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const size_t cost = cost_of(i);
    if (bytes + cost > frame_budget_ || i - begin == kKeysPerRequest) {
      send(begin, i);
      begin = i;
      bytes = 0;
    }
    bytes += cost;
  }
  if (begin < keys.size() || keys.empty()) send(begin, keys.size());
  ++round_trips_;  // every frame was sent before the first answer is read
  Status first;
  for (size_t k = 0; k < frames; ++k) {
    Inbox::Frame f;
    Status s = inbox->Next(MessageType::kSessionRsp, impl_->options_.request_timeout_ms, &f);
    if (!s.ok()) {
      open_ = false;
      return s;
    }
    SessionRsp rsp;
    s = SessionRsp::Decode(*f.payload, &rsp);
    if (s.ok()) s = ResponseStatus(rsp.code, rsp.message);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status ClientSession::Put(const std::vector<std::string_view>& keys, const std::vector<std::string_view>& values) {
  return Write(WriteOp::kPut, keys, &values);
}

Status ClientSession::Delete(const std::vector<std::string_view>& keys) { return Write(WriteOp::kDelete, keys, nullptr); }

Status ClientSession::ScanPage(const ScanReq& req, ScanRsp* out, std::shared_ptr<std::string>* payload) {
  if (!open_) return Status::Aborted("the session is no longer open");
  auto inbox = SessionInbox(impl_.get(), stream_id_);
  if (!inbox) return Status::Aborted("the session is no longer open");
  impl_->Send(MessageType::kScanReq, stream_id_, req.Encode());
  ++round_trips_;
  Inbox::Frame f;
  Status s = inbox->Next(MessageType::kScanRsp, impl_->options_.request_timeout_ms, &f);
  if (!s.ok()) {
    open_ = false;
    return s;
  }
  *payload = f.payload;
  s = ScanRsp::Decode(**payload, out);
  if (!s.ok()) return Status::Corruption("malformed ScanRsp: " + s.message());
  return ResponseStatus(out->code, out->message);
}

Status ClientSession::ScanMany(const std::vector<ScanReq>& reqs, std::vector<ScanRsp>* out,
                               std::vector<std::shared_ptr<std::string>>* payloads) {
  if (!open_) return Status::Aborted("the session is no longer open");
  auto inbox = SessionInbox(impl_.get(), stream_id_);
  if (!inbox) return Status::Aborted("the session is no longer open");
  out->assign(reqs.size(), ScanRsp());
  payloads->assign(reqs.size(), nullptr);
  if (reqs.empty()) return Status::OK();
  // All requests first: the worker handles a session's frames in order, so
  // it answers them one after the other while the client waits once.
  for (const ScanReq& r : reqs) impl_->Send(MessageType::kScanReq, stream_id_, r.Encode());
  ++round_trips_;
  Status first;
  for (size_t i = 0; i < reqs.size(); ++i) {
    Inbox::Frame f;
    Status s = inbox->Next(MessageType::kScanRsp, impl_->options_.request_timeout_ms, &f);
    if (!s.ok()) {
      open_ = false;  // answers are missing: the stream is out of step
      return s;
    }
    (*payloads)[i] = f.payload;
    s = ScanRsp::Decode(*f.payload, &(*out)[i]);
    s = s.ok() ? ResponseStatus((*out)[i].code, (*out)[i].message)
               : Status::Corruption("malformed ScanRsp: " + s.message());
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status ClientSession::Commit(CommitMode mode, std::optional<int64_t> batch_time_ms, SessionCommitRsp* out) {
  if (!open_) return Status::Aborted("the session is no longer open");
  auto inbox = SessionInbox(impl_.get(), stream_id_);
  open_ = false;
  if (!inbox) return Status::Aborted("the session is no longer open");
  SessionCommitReq req;
  req.mode = static_cast<uint8_t>(mode);
  req.batch_time_ms = batch_time_ms;
  impl_->Send(MessageType::kSessionCommitReq, stream_id_, req.Encode());
  ++round_trips_;
  Inbox::Frame f;
  Status s = inbox->Next(MessageType::kSessionCommitRsp, impl_->options_.request_timeout_ms, &f);
  {
    std::lock_guard<std::mutex> l(impl_->sessions_mu_);
    impl_->sessions_.erase(stream_id_);
  }
  impl_->Detach(stream_id_);
  RHINO_RETURN_IF_ERROR(s);
  s = SessionCommitRsp::Decode(*f.payload, out);
  if (!s.ok()) return Status::Corruption("malformed SessionCommitRsp: " + s.message());
  return ResponseStatus(out->code, out->message);
}

Status ClientSession::Abort(const std::string& reason) {
  if (!open_) return Status::OK();
  open_ = false;
  auto inbox = SessionInbox(impl_.get(), stream_id_);
  if (!inbox) return Status::OK();
  SessionAbortReq req;
  req.reason = reason;
  impl_->Send(MessageType::kSessionAbortReq, stream_id_, req.Encode());
  ++round_trips_;
  Inbox::Frame f;
  // The worker drops the session's writes whether or not this answer comes.
  Status s = inbox->Next(MessageType::kSessionRsp, std::min<uint32_t>(impl_->options_.request_timeout_ms, 10000), &f);
  {
    std::lock_guard<std::mutex> l(impl_->sessions_mu_);
    impl_->sessions_.erase(stream_id_);
  }
  impl_->Detach(stream_id_);
  return s;
}

}  // namespace rhino
