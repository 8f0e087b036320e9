#include "service/checkpoint_reader.h"

#include <algorithm>

#include "rhino/manifest.h"
#include "service/session_stream.h"
#include "util/fs.h"

namespace rhino {
namespace {

std::string Describe(const std::string& op, uint32_t instance) { return op + "/" + std::to_string(instance); }

// A reader scans and looks up what one client asks for, page by page: a small
// block cache of its own is enough, and a worker may have many readers open.
constexpr uint64_t kReaderBlockCacheBytes = 16ull << 20;

}  // namespace

// ---------------------------------------------------------------- the view

Status CheckpointView::Open(const ReaderEnv& env, const std::string& op, uint32_t instance,
                            std::optional<uint64_t> wanted, std::unique_ptr<CheckpointView>* out) {
  if (!IsValidOperatorId(op)) {
    return Status::InvalidArgument("invalid operator id '" + op + "' (want [A-Za-z0-9_.-]{1,128})");
  }
  const std::string where = " in worker " + env.worker_id + "'s replica store";
  std::vector<uint64_t> ids;
  RHINO_RETURN_IF_ERROR(env.store->ListCheckpoints(op, instance, &ids));
  if (ids.empty()) {
    return Status::NotFound((wanted ? "checkpoint " + std::to_string(*wanted) + " of " : "no checkpoint of ") +
                            Describe(op, instance) + (wanted ? " is not" : " is") + where + " (it holds none)");
  }
  const uint64_t id = wanted.value_or(ids.back());
  if (!std::binary_search(ids.begin(), ids.end(), id)) {
    return Status::NotFound("checkpoint " + std::to_string(id) + " of " + Describe(op, instance) + " is not" + where +
                            " (it holds " + std::to_string(ids.size()) + ", " + std::to_string(ids.front()) + " to " +
                            std::to_string(ids.back()) + ")");
  }
  auto fail = [&](const Status& s) {
    return Status::FromCode(WireCode(s), "cannot read checkpoint " + std::to_string(id) + " of " +
                                             Describe(op, instance) + " on worker " + env.worker_id + ": " +
                                             s.message());
  };
  Manifest m;
  Status s = env.store->ReadManifest(op, instance, id, &m);
  if (!s.ok()) return fail(s);
  StateOptions o;
  o.partitioner = m.partitioner;
  o.operator_id = op;
  o.instance = instance;
  o.read_only = true;  // nothing of a reader can reach the files it shares with the pool
  o.block_cache_bytes = kReaderBlockCacheBytes;
  std::unique_ptr<CheckpointView> v(new CheckpointView());
  v->checkpoint_ = id;
  v->dir_ = fs::Join(env.work_dir, "read-" + fs::RandomHex(8));
  RestoreStats stats;
  // The restore of takeover and rollback: hard links, checked by size (not
  // by re-hashing every byte, O(bytes)); RocksDB's block checksums catch a
  // damaged block when it is read. A failed restore leaves no directory.
  s = StateBackend::Restore(*env.store, op, instance, id, v->dir_, RestoreOptions(), o, &v->db_, &stats);
  if (!s.ok()) {
    v->dir_.clear();
    return fail(s);
  }
  v->reads_ = std::make_unique<SessionBatch>(v->db_.get());
  *out = std::move(v);
  return Status::OK();
}

CheckpointView::~CheckpointView() {
  reads_.reset();
  db_.reset();  // closed before its files go
  if (!dir_.empty()) fs::RemoveAll(dir_);
}

// ---------------------------------------------------------------- the table

void ReaderTable::Add(uint64_t token, const std::shared_ptr<ReaderStream>& r) {
  MutexLock l(&mu_);
  readers_[token] = r;
}

bool ReaderTable::AddIfRoom(uint64_t token, const std::shared_ptr<ReaderStream>& r, size_t max) {
  MutexLock l(&mu_);
  if (max > 0) {
    for (auto it = readers_.begin(); it != readers_.end();) {  // readers that ended are not counted
      it = it->second.expired() ? readers_.erase(it) : std::next(it);
    }
    if (readers_.size() >= max) return false;
  }
  readers_[token] = r;
  return true;
}

void ReaderTable::Remove(uint64_t token) {
  MutexLock l(&mu_);
  readers_.erase(token);
}

std::vector<std::shared_ptr<ReaderStream>> ReaderTable::All() {
  MutexLock l(&mu_);
  std::vector<std::shared_ptr<ReaderStream>> out;
  for (auto it = readers_.begin(); it != readers_.end();) {
    if (auto r = it->second.lock()) {
      out.push_back(std::move(r));
      ++it;
    } else {
      it = readers_.erase(it);
    }
  }
  return out;
}

// ---------------------------------------------------------------- the stream

ReaderStream::ReaderStream(const ReaderEnv* env, std::shared_ptr<ReaderTable> table, asio::thread_pool& pool,
                           const std::shared_ptr<net::Connection>& conn, uint32_t stream_id, uint64_t token)
    : env_(env),
      table_(std::move(table)),
      strand_(asio::make_strand(pool.get_executor())),
      conn_(conn),
      stream_id_(stream_id),
      token_(token) {}

void ReaderStream::OnFrame(const FrameHeader& h, std::shared_ptr<std::string> payload) {
  auto self = shared_from_this();
  // OnFrame runs on the connection's strand: the connection is alive.
  if (auto c = conn_.lock()) c->FrameHandedOff();
  asio::post(strand_, [self, h, payload]() {
    self->Handle(h, *payload);
    if (auto c = self->conn_.lock()) c->FrameHandled();
  });
}

void ReaderStream::OnConnectionClosed(const Status&) {
  // On the strand, after a request in progress (never blocking the connection's thread).
  auto self = shared_from_this();
  asio::post(strand_, [self]() { self->End("ended: its connection closed"); });
}

void ReaderStream::Open(const SessionOpenReq& req) {
  auto self = shared_from_this();
  asio::post(strand_, [self, req]() {
    std::unique_ptr<CheckpointView> view;
    Status s = CheckpointView::Open(*self->env_, req.operator_id, req.instance,
                                    req.has_checkpoint ? std::optional<uint64_t>(req.checkpoint) : std::nullopt, &view);
    self->Opened(req, s, std::move(view));
  });
}

void ReaderStream::Opened(const SessionOpenReq& req, Status s, std::unique_ptr<CheckpointView> view) {
  SessionOpenRsp rsp;
  if (s.ok()) {
    MutexLock l(&mu_);
    if (ended_) {
      s = Status::Aborted("the reader " + why_);  // the view goes with `view`, off the lock
    } else {
      rsp.reading = true;
      rsp.checkpoint = view->checkpoint();
      rsp.vnodes = view->vnodes();
      rsp.has_version = view->version().has_value();
      rsp.version = view->version().value_or(0);
      what_ = "checkpoint " + std::to_string(view->checkpoint()) + " of " + Describe(req.operator_id, req.instance);
      view_ = std::move(view);
      last_activity_ = std::chrono::steady_clock::now();
    }
  }
  if (!s.ok()) {
    // It never opened: nothing to keep, and the stream is free again.
    End("did not open: " + s.message());
    Send(MessageType::kSessionOpenRsp, ServiceErrorPayload(MessageType::kSessionOpenRsp, s));
    if (auto c = conn_.lock()) c->Detach(stream_id_);
    return;
  }
  Send(MessageType::kSessionOpenRsp, rsp.Encode());
}

void ReaderStream::ExpireIfIdle(std::chrono::steady_clock::duration idle) {
  auto self = shared_from_this();
  asio::post(strand_, [self, idle]() {
    {
      MutexLock l(&self->mu_);
      if (!self->view_ || std::chrono::steady_clock::now() - self->last_activity_ < idle) return;
    }
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(idle).count();
    self->End("was closed by the worker after " + std::to_string(secs) +
              " s without a request (--session-idle-timeout)");
  });
}

void ReaderStream::End(const std::string& why) {
  std::unique_ptr<CheckpointView> view;
  {
    MutexLock l(&mu_);
    if (ended_) return;
    ended_ = true;
    why_ = why;
    view = std::move(view_);
  }
  table_->Remove(token_);
  // `view` goes here, off the lock: the DB closes, then its directory is removed.
}

Status ReaderStream::CheckOpen() {
  if (!view_) return Status::Aborted("the checkpoint reader" + (what_.empty() ? "" : " of " + what_) + " " + why_);
  last_activity_ = std::chrono::steady_clock::now();
  return Status::OK();
}

void ReaderStream::Send(MessageType type, std::string payload) {
  if (auto c = conn_.lock()) c->Send(type, stream_id_, 0, std::move(payload));
}

void ReaderStream::Reply(MessageType rsp_type, const Status& s) { Send(rsp_type, ServiceErrorPayload(rsp_type, s)); }

// A malformed frame closes the connection (protocol §1), which ends the reader.
void ReaderStream::Malformed(const char* what, const Status& s) {
  if (env_->counters != nullptr) env_->counters->frames_rejected.fetch_add(1);
  if (auto c = conn_.lock()) {
    c->CloseWithError(stream_id_, Status::Corruption(std::string("invalid ") + what + ": " + s.message()));
  }
}

void ReaderStream::Handle(const FrameHeader& h, const std::string& payload) {
  switch (h.type) {
    case MessageType::kGetReq:
    case MessageType::kScanReq: return OnRead(h, payload);
    case MessageType::kSessionAbortReq: return OnAbort(payload);
    case MessageType::kWriteReq:
      // Refused, not fatal: the reader stays open for reads.
      return Reply(MessageType::kSessionRsp,
                   Status::InvalidArgument("a checkpoint reader is read-only: it takes no writes"));
    case MessageType::kSessionCommitReq:
      // A commit ends a session whatever its outcome (the client stops
      // listening on the stream): refused, and the reader ends with it.
      End("ended with a commit, which a reader refuses");
      Reply(MessageType::kSessionCommitRsp,
            Status::InvalidArgument("a checkpoint reader is read-only: there is nothing to commit"));
      if (auto c = conn_.lock()) c->Detach(stream_id_);
      return;
    default:
      return Reply(MessageType::kSessionRsp, Status::InvalidArgument(std::string("unexpected ") +
                                                                     MessageTypeName(h.type) + " on a reader stream"));
  }
}

void ReaderStream::OnRead(const FrameHeader& h, const std::string& payload) {
  const bool get = h.type == MessageType::kGetReq;
  const MessageType rsp_type = get ? MessageType::kGetRsp : MessageType::kScanRsp;
  GetReq get_req;
  ScanReq scan_req;
  Status s = get ? GetReq::Decode(payload, &get_req) : ScanReq::Decode(payload, &scan_req);
  if (!s.ok()) return Malformed(get ? "GetReq" : "ScanReq", s);
  std::string out;
  {
    MutexLock l(&mu_);  // End waits for this request
    s = CheckOpen();
    if (s.ok()) {
      s = get ? SessionStream::AnswerGet(view_->reads(), env_->max_frame_bytes, get_req, &out)
              : SessionStream::AnswerScan(view_->reads(), env_->max_frame_bytes, scan_req, &out);
    }
  }
  if (!s.ok()) return Reply(rsp_type, s);
  Send(rsp_type, std::move(out));
}

void ReaderStream::OnAbort(const std::string& payload) {
  SessionAbortReq req;
  Status s = SessionAbortReq::Decode(payload, &req);
  if (!s.ok()) return Malformed("SessionAbortReq", s);
  End("was closed by the client");
  Send(MessageType::kSessionRsp, SessionRsp().Encode());
  if (auto c = conn_.lock()) c->Detach(stream_id_);
}

}  // namespace rhino
