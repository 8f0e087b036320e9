// ReplicaStream (replication/replica_stream.h): one checkpoint's stream at
// a chain member. Here: its creation, the open of §4 step 1 (the local
// staging, the space it reserves, the downstream member's open), and the
// routing of frames from either side. Receiving chunks and returning
// credits (§4 steps 2-3) is replica_stream_receive.cc's; the commit on the
// ack path (§4 step 4), aborts and cleanup are replica_stream_finish.cc's.
#include "replication/replica_stream.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>
#include <xxhash.h>
// Bulk hashing (chunks, whole files) through libxxhash's run-time dispatch to
// its AVX2/AVX-512 kernels; the plain entry points are built for baseline
// x86-64 (SSE2). Same hash values either way (the XXH3 spec).
#include <xxh_x86dispatch.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

#include "replication/manifest_check.h"
#include "replication/replica_stream_internal.h"
#include "util/buffer_pool.h"
#include "util/crash_point.h"
#include "util/fs.h"

namespace rhino {
using namespace replica_stream_internal;

namespace {

// A refused stream's log line, at most once a second with a count: a flood of
// oversized manifests must not flood the log.
void LogNoSpace(const Status& why) {
  static std::atomic<uint64_t> refused{0};
  static std::mutex mu;
  static std::chrono::steady_clock::time_point last;
  const uint64_t n = refused.fetch_add(1) + 1;
  std::lock_guard<std::mutex> l(mu);
  const auto now = std::chrono::steady_clock::now();
  if (n > 1 && now - last < std::chrono::seconds(1)) return;
  last = now;
  std::fprintf(stderr, "rhino: %s (%llu streams refused so far)\n", why.message().c_str(),
               static_cast<unsigned long long>(n));
}

}  // namespace

// Bridges a connection's strand to the stream's strand.
class ReplicaStream::Listener : public net::StreamListener {
 public:
  Listener(std::shared_ptr<ReplicaStream> stream, Side side) : stream_(std::move(stream)), side_(side) {}
  void OnFrame(const FrameHeader& h, std::shared_ptr<std::string> payload) override {
    auto s = stream_;
    Side side = side_;
    asio::post(s->strand_, [s, side, h, payload = std::move(payload)]() mutable {
      s->OnFrame(side, h, std::move(payload));
    });
  }
  void OnConnectionClosed(const Status& why) override {
    auto s = stream_;
    Side side = side_;
    asio::post(s->strand_, [s, side, why]() { s->OnConnectionClosed(side, why); });
  }

 private:
  std::shared_ptr<ReplicaStream> stream_;
  const Side side_;
};

std::shared_ptr<ReplicaStream> ReplicaStream::Create(const StreamEnv* env, std::shared_ptr<net::Connection> upstream,
                                                     uint32_t upstream_stream_id, uint64_t chain_version,
                                                     OpenStreamReq req) {
  return std::shared_ptr<ReplicaStream>(
      new ReplicaStream(env, std::move(upstream), upstream_stream_id, chain_version, std::move(req)));
}

ReplicaStream::ReplicaStream(const StreamEnv* env, std::shared_ptr<net::Connection> upstream,
                             uint32_t upstream_stream_id, uint64_t chain_version, OpenStreamReq req)
    : env_(env),
      metrics_(env->metrics),
      strand_(asio::make_strand(*env->disk)),
      up_(std::move(upstream)),
      up_sid_(upstream_stream_id),
      chain_version_(chain_version),
      operator_id_(req.operator_id),
      instance_(req.instance),
      checkpoint_id_(req.checkpoint_id),
      req_(std::move(req)) {
  env_->metrics->active_streams.fetch_add(1);
  env_->metrics->streams_opened.fetch_add(1);
}

ReplicaStream::~ReplicaStream() {
  CloseFiles();
  if (phase_ != Phase::kFinished) metrics_->active_streams.fetch_sub(1);
}

std::shared_ptr<net::StreamListener> ReplicaStream::upstream_listener() {
  return std::make_shared<Listener>(shared_from_this(), Side::kUpstream);
}

void ReplicaStream::Open() {
  asio::post(strand_, [self = shared_from_this()]() { self->DoOpen(); });
}

void ReplicaStream::Abort(const Status& why) {
  asio::post(strand_, [self = shared_from_this(), why]() { self->Fail(self->Here(why), true, true); });
}

std::string ReplicaStream::Where() const {
  return "worker " + env_->worker_id + " (" + operator_id_ + "/" + std::to_string(instance_) + " checkpoint " +
         std::to_string(checkpoint_id_) + ")";
}

Status ReplicaStream::Here(const Status& s) const {
  return Status::FromCode(static_cast<uint32_t>(s.code()), Where() + ": " + s.message());
}

// ---- §4 step 1: open ----

void ReplicaStream::DoOpen() {
  ArmIdleTimer();
  Status s = CheckOpenStreamReq(req_, env_->max_frame_bytes, &manifest_);
  if (!s.ok()) {
    if (env_->counters != nullptr) env_->counters->frames_rejected.fetch_add(1);
    Fail(Here(s), true, false);
    return;
  }
  // §5: a stream of an older chain is refused; a newer one fences older streams.
  bool raised = false;
  s = env_->fences->Observe(operator_id_, instance_, chain_version_, &raised);
  if (!s.ok()) {
    if (s.IsStaleChainVersion()) env_->metrics->stale_rejections.fetch_add(1);
    Fail(Here(s), true, false);
    return;
  }
  if (raised && env_->on_fence_raised) env_->on_fence_raised(operator_id_, instance_, chain_version_);
  env_->metrics->NoteOpened(operator_id_, instance_, checkpoint_id_, chain_version_);
  s = PrepareLocal();
  if (!s.ok()) {
    Fail(Here(s), true, false);
    return;
  }
  if (req_.downstream.empty()) {  // the tail
    AnswerOpen();
    return;
  }
  env_->pool->Get(req_.downstream[0], [self = shared_from_this()](const Status& st,
                                                                   std::shared_ptr<net::Connection> conn) {
    asio::post(self->strand_, [self, st, conn]() { self->OnDownstreamConnected(st, conn); });
  });
}

Status ReplicaStream::PrepareLocal() {
  chunk_bytes_ = req_.chunk_bytes;
  window_ = std::min(req_.window, env_->max_window);
  ReplicaStore* store = env_->store;
  // GC must not reclaim a pooled file this stream counts on from computing
  // need_i until its manifest is committed: a pin of the manifest's files,
  // made under the shared lock before the pool is looked at. The lock itself
  // is held only while this function runs, so that GC, which takes it
  // exclusively, never waits for a stream's whole life (issue 46).
  std::unique_ptr<ReplicaStore::Lock> lock;
  RHINO_RETURN_IF_ERROR(store->AcquireLock(false, &lock));
  RHINO_RETURN_IF_ERROR(store->PinManifest(manifest_, &pin_));
  Manifest existing;
  Status s = store->ReadManifest(operator_id_, instance_, checkpoint_id_, &existing);
  if (s.ok() && !SameFiles(existing, manifest_)) {
    return Status::AlreadyExists("checkpoint " + std::to_string(checkpoint_id_) +
                                 " is already committed here with different files");
  }
  if (!s.ok() && !s.IsNotFound()) return s;

  // need_i: the files whose content identity the pool lacks, each identity once.
  const auto& files = manifest_.files;
  self_needs_.assign(files.size(), 0);
  std::set<std::string> seen;
  uint64_t need_bytes = 0;
  for (uint32_t i = 0; i < files.size(); ++i) {
    if (!seen.insert(files[i].identity).second) continue;
    std::string pooled;
    RHINO_RETURN_IF_ERROR(store->PoolPath(files[i].identity, &pooled));
    if (fs::Exists(pooled)) continue;
    need_self_.push_back(i);
    self_needs_[i] = 1;
    need_bytes += files[i].size;
    if (files[i].size > 0) recv_order_.push_back(i);
  }
  member_needed_files_ = {static_cast<uint32_t>(need_self_.size())};
  member_needed_bytes_ = {need_bytes};
  if (need_self_.empty()) return Status::OK();
  RHINO_RETURN_IF_ERROR(Reserve(need_bytes));
  RHINO_RETURN_IF_ERROR(store->NewStagingDir("stream", &staging_));
  // Empty files get no chunks: create (and check) them now.
  for (uint32_t i : need_self_) {
    if (files[i].size != 0) continue;
    if (Hex128(XXH3_128bits(nullptr, 0)) != files[i].checksum) {
      return Status::Corruption("empty file " + files[i].name + " has a checksum that is not the empty one");
    }
    std::string path = fs::Join(staging_, std::to_string(i));
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return Status::FromErrno(errno, "create " + path);
    ::close(fd);
  }
  recv_hash_ = XXH3_createState();
  if (recv_hash_ == nullptr) return Status::IOError("out of memory for a hash state");
  return Status::OK();
}

Status ReplicaStream::Reserve(uint64_t need_bytes) {
  struct statvfs st;
  if (::statvfs(env_->store->dir().c_str(), &st) != 0) return Status::FromErrno(errno, "statvfs " + env_->store->dir());
  const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  const uint64_t total = static_cast<uint64_t>(st.f_blocks) * st.f_frsize;
  // Kept free for the commits themselves (manifests, fences, the live state's
  // own writes on a worker that hosts instances): 1% of the disk, at least 64 MiB.
  const uint64_t keep = std::max<uint64_t>(64ull << 20, total / 100);
  const int64_t need = static_cast<int64_t>(std::min<uint64_t>(need_bytes, INT64_MAX / 4));
  const int64_t others = env_->metrics->reserved_bytes.fetch_add(need);
  const uint64_t promised = static_cast<uint64_t>(std::max<int64_t>(0, others));
  if (need_bytes > free_bytes || promised + need_bytes + keep > free_bytes) {
    env_->metrics->reserved_bytes.fetch_sub(need);
    Status s = Status::NoSpace("worker " + env_->worker_id + " cannot take checkpoint " +
                               std::to_string(checkpoint_id_) + " of " + operator_id_ + "/" +
                               std::to_string(instance_) + ": it needs " + std::to_string(need_bytes) +
                               " bytes here, and the store's disk has " + std::to_string(free_bytes) +
                               " free, of which " + std::to_string(promised) + " are promised to open streams and " +
                               std::to_string(keep) + " kept for commits");
    LogNoSpace(s);
    return s;
  }
  reserved_ = need;
  return Status::OK();
}

void ReplicaStream::Unreserve(uint64_t bytes) {
  const int64_t n = std::min<int64_t>(reserved_, static_cast<int64_t>(std::min<uint64_t>(bytes, INT64_MAX / 4)));
  if (n <= 0) return;
  reserved_ -= n;
  env_->metrics->reserved_bytes.fetch_sub(n);
}

void ReplicaStream::OnDownstreamConnected(const Status& s, std::shared_ptr<net::Connection> conn) {
  if (phase_ == Phase::kFinished) return;
  if (!s.ok()) {
    Fail(Status::FromCode(static_cast<uint32_t>(s.code()),
                          Where() + ": cannot reach successor " + req_.downstream[0] + ": " + s.message()),
         true, false);
    return;
  }
  down_ = std::move(conn);
  down_sid_ = down_->NewStreamId();
  down_->Attach(down_sid_, std::make_shared<Listener>(shared_from_this(), Side::kDownstream));
  OpenStreamReq fwd;
  fwd.operator_id = operator_id_;
  fwd.instance = instance_;
  fwd.checkpoint_id = checkpoint_id_;
  fwd.chunk_bytes = chunk_bytes_;
  fwd.window = window_;
  fwd.downstream.assign(req_.downstream.begin() + 1, req_.downstream.end());
  fwd.manifest = std::move(req_.manifest);
  req_.manifest.clear();
  down_->Send(MessageType::kOpenStreamReq, down_sid_, chain_version_, fwd.Encode());
}

void ReplicaStream::OnDownstreamOpened(const OpenStreamRsp& rsp) {
  if (phase_ != Phase::kOpening) {
    Fail(Here(Status::Corruption("successor sent a second OpenStreamRsp")), true, true);
    return;
  }
  if (rsp.code != 0) {
    Fail(Status::FromCode(rsp.code, rsp.message), true, false);
    return;
  }
  const auto& files = manifest_.files;
  down_needs_.assign(files.size(), 0);
  for (size_t k = 0; k < rsp.needed.size(); ++k) {
    uint32_t i = rsp.needed[k];
    if (i >= files.size() || (k > 0 && i <= rsp.needed[k - 1])) {
      Fail(Here(Status::Corruption("successor's needed list is not ascending manifest indexes")), true, true);
      return;
    }
    // A file the successor needs and this member does not receive must be
    // read from this member's pool (§4 step 1: the bulk-copy path).
    std::string pooled;
    if (!self_needs_[i] && !(env_->store->PoolPath(files[i].identity, &pooled).ok() && fs::Exists(pooled))) {
      Fail(Here(Status::Corruption("successor needs " + files[i].name + ", which this member neither holds nor receives")),
           true, true);
      return;
    }
    down_needs_[i] = 1;
    if (files[i].size > 0) send_order_.push_back(i);
  }
  if (rsp.credits == 0) {
    Fail(Here(Status::Corruption("successor granted no credits")), true, true);
    return;
  }
  need_down_ = rsp.needed;
  down_credits_ = rsp.credits;
  member_needed_files_.insert(member_needed_files_.end(), rsp.member_needed_files.begin(),
                              rsp.member_needed_files.end());
  member_needed_bytes_.insert(member_needed_bytes_.end(), rsp.member_needed_bytes.begin(),
                              rsp.member_needed_bytes.end());
  AnswerOpen();
  Status s = Pump();  // files this member holds can flow to the successor at once
  if (!s.ok()) Fail(Here(s), true, true);
}

void ReplicaStream::AnswerOpen() {
  OpenStreamRsp rsp;
  rsp.needed = need_self_;
  rsp.credits = window_;
  rsp.member_needed_files = member_needed_files_;
  rsp.member_needed_bytes = member_needed_bytes_;
  up_credits_ = window_;
  phase_ = Phase::kTransferring;
  up_->Send(MessageType::kOpenStreamRsp, up_sid_, chain_version_, rsp.Encode());
}

// ---- frames ----

void ReplicaStream::OnFrame(Side side, const FrameHeader& h, std::shared_ptr<std::string> payload) {
  if (phase_ == Phase::kFinished) return;
  last_activity_ = std::chrono::steady_clock::now();
  // §5: every frame carries the chain version.
  if (h.chain_version != chain_version_) {
    Status s = h.chain_version < chain_version_
                   ? Status::StaleChainVersion("frame of chain version " + std::to_string(h.chain_version) +
                                               " on a stream of version " + std::to_string(chain_version_))
                   : Status::Corruption("chain version changed mid-stream");
    if (s.IsStaleChainVersion()) env_->metrics->stale_rejections.fetch_add(1);
    Fail(Here(s), true, true);
    return;
  }
  Status f = env_->fences->Check(operator_id_, instance_, chain_version_);
  if (!f.ok()) {
    env_->metrics->stale_rejections.fetch_add(1);
    Fail(Here(f), true, true);
    return;
  }
  if (side == Side::kUpstream) {
    OnUpstreamFrame(h, std::move(payload));
  } else {
    OnDownstreamFrame(h, std::move(payload));
  }
}

void ReplicaStream::RejectFrame(Side side, const FrameHeader& h, const Status& why) {
  // §1 step 6: an undecodable payload is an invalid frame: ErrorRsp and close.
  if (env_->counters != nullptr) env_->counters->frames_rejected.fetch_add(1);
  auto& conn = side == Side::kUpstream ? up_ : down_;
  if (conn != nullptr) conn->CloseWithError(h.stream_id, Here(why));
  Fail(Here(why), side != Side::kUpstream, side != Side::kDownstream);
}

void ReplicaStream::OnUpstreamFrame(const FrameHeader& h, std::shared_ptr<std::string> payload) {
  switch (h.type) {
    case MessageType::kChunkReq: {
      ChunkReq c;
      Status s = ChunkReq::Decode(*payload, &c);
      if (!s.ok()) return RejectFrame(Side::kUpstream, h, s);
      if (phase_ != Phase::kTransferring) {
        return Fail(Here(Status::Corruption("ChunkReq outside the transfer phase")), true, true);
      }
      s = OnChunk(c, std::move(payload));
      if (!s.ok()) Fail(Here(s), true, true);
      return;
    }
    case MessageType::kCommitReq: {
      CommitReq c;
      Status s = CommitReq::Decode(*payload, &c);
      if (!s.ok()) return RejectFrame(Side::kUpstream, h, s);
      if (phase_ != Phase::kTransferring) {
        return Fail(Here(Status::Corruption("CommitReq outside the transfer phase")), true, true);
      }
      if (recv_pos_ < recv_order_.size() || recv_off_ != 0) {
        return Fail(Here(Status::Corruption("CommitReq before every needed file arrived")), true, true);
      }
      commit_requested_ = true;
      phase_ = Phase::kCommitting;
      MaybeForwardCommit();
      return;
    }
    case MessageType::kAbortReq: {
      AbortReq a;
      Status s = AbortReq::Decode(*payload, &a);
      Fail(Status::Aborted(Where() + ": aborted by its predecessor: " + (s.ok() ? a.reason : s.message())), false,
           true);
      return;
    }
    default:
      Fail(Here(Status::Corruption(std::string(MessageTypeName(h.type)) + " is not expected from a predecessor")),
           true, true);
  }
}

void ReplicaStream::OnDownstreamFrame(const FrameHeader& h, std::shared_ptr<std::string> payload) {
  switch (h.type) {
    case MessageType::kOpenStreamRsp: {
      OpenStreamRsp rsp;
      Status s = OpenStreamRsp::Decode(*payload, &rsp);
      if (!s.ok()) return RejectFrame(Side::kDownstream, h, s);
      OnDownstreamOpened(rsp);
      return;
    }
    case MessageType::kCreditRsp: {
      CreditRsp c;
      Status s = CreditRsp::Decode(*payload, &c);
      if (!s.ok()) return RejectFrame(Side::kDownstream, h, s);
      if (phase_ == Phase::kOpening || static_cast<uint64_t>(down_credits_) + c.credits > (1u << 20)) {
        return Fail(Here(Status::Corruption("successor sent an impossible credit")), true, true);
      }
      down_credits_ += c.credits;
      s = Pump();
      if (!s.ok()) Fail(Here(s), true, true);
      return;
    }
    case MessageType::kCommitRsp: {
      CommitRsp c;
      Status s = CommitRsp::Decode(*payload, &c);
      if (!s.ok()) return RejectFrame(Side::kDownstream, h, s);
      if (!commit_forwarded_) return Fail(Here(Status::Corruption("CommitRsp before CommitReq")), true, true);
      if (c.code != 0) return Fail(Status::FromCode(c.code, c.message), true, false);
      CommitLocal();  // §4 step 4: the successor has committed, now this member
      return;
    }
    case MessageType::kErrorRsp: {
      ErrorRsp e;
      Status s = ErrorRsp::Decode(*payload, &e);
      if (!s.ok()) return RejectFrame(Side::kDownstream, h, s);
      Fail(Status::FromCode(e.code, e.message), true, false);
      return;
    }
    default:
      Fail(Here(Status::Corruption(std::string(MessageTypeName(h.type)) + " is not expected from a successor")),
           true, true);
  }
}

void ReplicaStream::OnConnectionClosed(Side side, const Status& why) {
  if (phase_ == Phase::kFinished) return;
  if (side == Side::kUpstream) {
    Fail(Status::Aborted(Where() + ": predecessor gone: " + why.message()), false, true);
  } else {
    Fail(Status::PeerDead(Where() + ": successor " + req_.downstream[0] + " gone: " + why.message()), true, false);
  }
}

}  // namespace rhino
