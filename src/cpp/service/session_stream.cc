#include "service/session_stream.h"

#include <optional>
#include <string_view>
#include <vector>

namespace rhino {

SessionStream::SessionStream(const SessionEnv* env, const std::shared_ptr<net::Connection>& conn, uint32_t stream_id,
                             std::shared_ptr<HostedInstance> inst, uint64_t token)
    : env_(env), conn_(conn), stream_id_(stream_id), inst_(std::move(inst)), token_(token) {}

void SessionStream::OnFrame(const FrameHeader& h, std::shared_ptr<std::string> payload) {
  auto self = shared_from_this();
  // OnFrame runs on the connection's strand: the connection is alive.
  if (auto c = conn_.lock()) c->FrameHandedOff();
  asio::post(inst_->strand(), [self, h, payload]() {
    self->Handle(h, *payload);
    if (auto c = self->conn_.lock()) c->FrameHandled();
  });
}

void SessionStream::OnConnectionClosed(const Status&) {
  // The client died or went away: nothing of its session is visible.
  auto self = shared_from_this();
  asio::post(inst_->strand(), [self]() {
    std::lock_guard<InstanceMutex> l(self->inst_->mu());
    self->inst_->Abort(self->token_);
  });
}

void SessionStream::Open(const SessionOpenReq& req) {
  auto self = shared_from_this();
  asio::post(inst_->strand(), [self, req]() {
    SessionOpenRsp rsp;
    Status s;
    {
      std::lock_guard<InstanceMutex> l(self->inst_->mu());
      s = self->env_->check_epoch(req.operator_id, req.instance, req.epoch);
      if (s.ok()) s = self->inst_->OpenSession(self->token_, req, &rsp);
    }
    if (!s.ok()) {
      rsp = SessionOpenRsp();
      rsp.code = WireCode(s);
      rsp.message = s.message();
    }
    self->Send(MessageType::kSessionOpenRsp, rsp.Encode());
  });
}

void SessionStream::Send(MessageType type, std::string payload) {
  if (auto c = conn_.lock()) c->Send(type, stream_id_, 0, std::move(payload));
}

void SessionStream::Reply(MessageType rsp_type, const Status& s) { Send(rsp_type, ServiceErrorPayload(rsp_type, s)); }

// A malformed frame closes the connection (protocol §1), which aborts the session.
void SessionStream::Malformed(const char* what, const Status& s) {
  if (env_->counters != nullptr) env_->counters->frames_rejected.fetch_add(1);
  if (auto c = conn_.lock()) {
    c->CloseWithError(stream_id_, Status::Corruption(std::string("invalid ") + what + ": " + s.message()));
  }
}

void SessionStream::End() {
  if (auto c = conn_.lock()) c->Detach(stream_id_);
}

void SessionStream::Handle(const FrameHeader& h, const std::string& payload) {
  switch (h.type) {
    case MessageType::kGetReq: return OnGet(payload);
    case MessageType::kWriteReq: return OnWrite(payload);
    case MessageType::kScanReq: return OnScan(payload);
    case MessageType::kSessionCommitReq: return OnCommit(payload);
    case MessageType::kSessionAbortReq: return OnAbort(payload);
    default:
      return Reply(MessageType::kSessionRsp, Status::InvalidArgument(std::string("unexpected ") +
                                                                     MessageTypeName(h.type) + " on a session stream"));
  }
}

void SessionStream::OnGet(const std::string& payload) {
  GetReq req;
  Status s = GetReq::Decode(payload, &req);
  if (!s.ok()) return Malformed("GetReq", s);
  std::string out;
  {
    std::lock_guard<InstanceMutex> l(inst_->mu());
    s = inst_->CheckSession(token_);
    if (s.ok()) s = AnswerGet(*inst_->session_batch(), env_->max_frame_bytes, req, &out);
  }
  if (!s.ok()) return Reply(MessageType::kGetRsp, s);
  Send(MessageType::kGetRsp, std::move(out));
}

Status SessionStream::AnswerGet(const SessionBatch& reads, size_t budget, const GetReq& req, std::string* out) {
  Status too_big;
  Status s = reads.MultiGetAll(
      req.keys, 0, [&](const std::vector<uint8_t>& found, const std::vector<std::string_view>& values) {
        // Answer the longest prefix that fits in one frame; the client asks again for the rest (§7.2).
        size_t size = 16, count = 0;
        for (; count < found.size(); ++count) {
          const size_t add = 1 + (found[count] ? 4 + values[count].size() : 0);
          if (size + add > budget) break;
          size += add;
        }
        if (count == 0 && !found.empty()) {
          too_big = Status::InvalidArgument("a value of " + std::to_string(values[0].size()) +
                                            " bytes does not fit in a frame (max_frame_bytes)");
          return;
        }
        *out = EncodeGetRsp(found, values, count);
      });
  if (s.ok()) s = too_big;
  if (s.ok() && req.keys.empty()) *out = EncodeGetRsp({}, {}, 0);
  return s;
}

void SessionStream::OnWrite(const std::string& payload) {
  WriteReq req;
  Status s = WriteReq::Decode(payload, &req);
  if (!s.ok()) return Malformed("WriteReq", s);
  SessionRsp rsp;
  {
    std::lock_guard<InstanceMutex> l(inst_->mu());
    s = inst_->CheckSession(token_);
    if (s.ok()) s = ApplyWrite(req);
    rsp.count = req.keys.size();
  }
  if (!s.ok()) return Reply(MessageType::kSessionRsp, s);
  Send(MessageType::kSessionRsp, rsp.Encode());
}

Status SessionStream::ApplyWrite(const WriteReq& req) {
  SessionBatch* batch = inst_->session_batch();
  uint64_t bytes = 0;
  for (auto k : req.keys) bytes += k.size();
  for (auto v : req.values) bytes += v.size();
  // --max-session-bytes (§7.2): a write past it is refused and not applied.
  if (batch->bytes() + bytes > env_->max_session_bytes) {
    return Status::InvalidArgument("the session would hold " + std::to_string(batch->bytes() + bytes) +
                                   " bytes of uncommitted writes, over the worker's limit of " +
                                   std::to_string(env_->max_session_bytes) +
                                   " (--max-session-bytes): commit smaller batches");
  }
  if (req.op == static_cast<uint8_t>(WriteOp::kPut)) return batch->Put(req.keys, req.values);
  if (req.op == static_cast<uint8_t>(WriteOp::kDelete)) {
    return req.values.empty() ? batch->Delete(req.keys) : Status::InvalidArgument("a delete carries no values");
  }
  return Status::InvalidArgument("unknown write op " + std::to_string(req.op));
}

void SessionStream::OnScan(const std::string& payload) {
  ScanReq req;
  Status s = ScanReq::Decode(payload, &req);
  if (!s.ok()) return Malformed("ScanReq", s);
  std::string out;
  {
    std::lock_guard<InstanceMutex> l(inst_->mu());
    s = inst_->CheckSession(token_);
    if (s.ok()) s = AnswerScan(*inst_->session_batch(), env_->max_frame_bytes, req, &out);
  }
  if (!s.ok()) return Reply(MessageType::kScanRsp, s);
  Send(MessageType::kScanRsp, std::move(out));
}

Status SessionStream::AnswerScan(const SessionBatch& reads, size_t budget, const ScanReq& req, std::string* out) {
  ScanRspBuilder b;
  bool stopped = false;
  uint32_t last_vnode = req.after_vnode;
  Status too_big;
  Status s = reads.Scan(
      req.has_vnode ? std::optional<uint32_t>(req.vnode) : std::nullopt, req.prefix,
      req.has_after ? std::optional<uint32_t>(req.after_vnode) : std::nullopt,
      req.has_after ? std::optional<std::string_view>(req.after_key) : std::nullopt,
      [&](uint32_t v, std::string_view k, std::string_view val) {
        // One page: at most max_items, at most one frame (§7.2).
        if ((req.max_items != 0 && b.count() >= req.max_items) || b.SizeWith(k.size(), val.size()) > budget) {
          if (b.count() == 0) {
            too_big = Status::InvalidArgument("an entry of " + std::to_string(k.size() + val.size()) +
                                              " bytes does not fit in a frame");
          }
          stopped = true;
          return false;
        }
        b.Add(k, val);
        last_vnode = v;
        return true;
      });
  if (s.ok()) s = too_big;
  if (s.ok()) *out = b.Finish(!stopped, last_vnode);
  return s;
}

void SessionStream::OnCommit(const std::string& payload) {
  SessionCommitReq req;
  Status s = SessionCommitReq::Decode(payload, &req);
  if (!s.ok()) return Malformed("SessionCommitReq", s);
  if (req.mode > static_cast<uint8_t>(CommitMode::kAsync)) {
    return Reply(MessageType::kSessionCommitRsp,
                 Status::InvalidArgument("unknown commit mode " + std::to_string(req.mode)));
  }
  auto self = shared_from_this();
  std::lock_guard<InstanceMutex> l(inst_->mu());
  const std::string op = inst_->config().operator_id;
  const uint32_t i = inst_->config().instance;
  const uint64_t epoch = inst_->config().epoch;
  const SessionEnv* env = env_;
  // The epoch is checked again just before the write (§7.5): a session
  // fenced while it ran commits nothing.
  inst_->Commit(token_, static_cast<CommitMode>(req.mode), req.batch_time_ms,
                [env, op, i, epoch]() { return env->check_epoch(op, i, epoch); },
                [self](const SessionCommitRsp& rsp) {
                  self->Send(MessageType::kSessionCommitRsp, rsp.Encode());
                  self->End();
                });
}

void SessionStream::OnAbort(const std::string& payload) {
  SessionAbortReq req;
  Status s = SessionAbortReq::Decode(payload, &req);
  if (!s.ok()) return Malformed("SessionAbortReq", s);
  {
    std::lock_guard<InstanceMutex> l(inst_->mu());
    inst_->Abort(token_);
  }
  Send(MessageType::kSessionRsp, SessionRsp().Encode());
  End();
}

}  // namespace rhino
