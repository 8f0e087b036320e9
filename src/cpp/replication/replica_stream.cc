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
#include "util/buffer_pool.h"
#include "util/crash_point.h"
#include "util/fs.h"

namespace rhino {
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

std::string Hex128(XXH128_hash_t h) {
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return hex;
}

bool SameFiles(const Manifest& a, const Manifest& b) {
  if (a.files.size() != b.files.size()) return false;
  for (size_t i = 0; i < a.files.size(); ++i) {
    if (a.files[i].name != b.files[i].name || a.files[i].identity != b.files[i].identity) return false;
  }
  return true;
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

// ---- §4 steps 2-3: chunks and credits ----

Status ReplicaStream::OnChunk(const ChunkReq& c, std::shared_ptr<std::string> payload) {
  if (up_credits_ == 0) return Status::Corruption("predecessor sent a chunk without a credit (§4 step 3)");
  --up_credits_;
  ++held_count_;
  env_->metrics->in_flight_credits.fetch_add(1);
  if (recv_pos_ >= recv_order_.size()) {
    return Status::Corruption("chunk of file index " + std::to_string(c.file_index) +
                              ", but every needed file has arrived");
  }
  const uint32_t want = recv_order_[recv_pos_];
  const FileEntry& f = manifest_.files[want];
  if (c.file_index != want) {
    return Status::Corruption("chunk of file index " + std::to_string(c.file_index) + ", expected " +
                              std::to_string(want) + " (files come in manifest order)");
  }
  if (c.offset != recv_off_) {
    return Status::Corruption("chunk of " + f.name + " at offset " + std::to_string(c.offset) + ", expected " +
                              std::to_string(recv_off_));
  }
  if (c.data.empty() || c.data.size() > chunk_bytes_ || recv_off_ + c.data.size() > f.size) {
    return Status::Corruption("chunk of " + f.name + " has a bad size " + std::to_string(c.data.size()));
  }
  if (recv_fd_ < 0) {
    // Staged under its manifest index, never under a name from the network.
    std::string path = fs::Join(staging_, std::to_string(want));
    recv_fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (recv_fd_ < 0) return Status::FromErrno(errno, "create staging file for " + f.name);
    // Reserve the whole file first: a member without room for it fails now,
    // clearly, instead of after part of it is written, and the file's blocks
    // are allocated at once instead of page by page. File systems without
    // fallocate (EOPNOTSUPP) just skip the reservation.
    if (::fallocate(recv_fd_, 0, 0, static_cast<off_t>(f.size)) != 0 && errno != EOPNOTSUPP && errno != ENOSYS) {
      return Status::FromErrno(errno, "reserve " + std::to_string(f.size) + " bytes for staging file of " + f.name);
    }
    XXH3_128bits_reset(recv_hash_);
  }
  size_t done = 0;
  while (done < c.data.size()) {
    ssize_t n = ::write(recv_fd_, c.data.data() + done, c.data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "write staging file for " + f.name);
    }
    done += static_cast<size_t>(n);
  }
#ifdef SYNC_FILE_RANGE_WRITE
  // Start writeback now, without waiting for it, so that the fsync at the
  // end of the file (§4 step 2) finds little left to do and does not stall
  // the stream's pipeline (RocksDB's bytes_per_sync, for the same reason).
  ::sync_file_range(recv_fd_, static_cast<off_t>(recv_off_), static_cast<off_t>(c.data.size()),
                    SYNC_FILE_RANGE_WRITE);
#endif
  CrashPoint("replica.after_chunk_write");
  XXH3_128bits_update(recv_hash_, c.data.data(), c.data.size());
  env_->metrics->bytes_received.fetch_add(c.data.size());
  env_->metrics->bytes_written.fetch_add(c.data.size());
  Unreserve(c.data.size());
  recv_off_ += c.data.size();
  if (!down_needs_.empty() && down_needs_[want]) {
    held_.push_back(HeldChunk{want, c.offset, static_cast<uint32_t>(c.data.size()), std::move(payload)});
  } else {
    ReturnCredits(1);  // on disk, nothing to forward: the buffer is free
  }
  if (recv_off_ == f.size) RHINO_RETURN_IF_ERROR(FinishFile());
  return Pump();
}

Status ReplicaStream::FinishFile() {
  const uint32_t i = recv_order_[recv_pos_];
  const FileEntry& f = manifest_.files[i];
  int fd = recv_fd_;
  recv_fd_ = -1;
  std::string got = Hex128(XXH3_128bits_digest(recv_hash_));
  if (got != f.checksum) {
    ::close(fd);
    return Status::Corruption("file " + f.name + " fails its XXH3-128 check: received " + got + ", manifest says " +
                              f.checksum);
  }
  // §4 step 2: durable before the commit, but fsync'ed off this strand, so
  // that the next file's chunks keep flowing (file_syncer.h). CommitLocal
  // waits for the batch.
  if (syncs_ == nullptr) syncs_ = std::make_unique<SyncBatch>();
  syncs_->Add(fd, "staging file for " + f.name);
  ++recv_pos_;
  recv_off_ = 0;
  return Status::OK();
}

void ReplicaStream::ReturnCredits(uint32_t n) {
  up_credits_ += n;
  held_count_ -= n;
  env_->metrics->in_flight_credits.fetch_sub(n);
  CreditRsp c;
  c.credits = n;
  up_->Send(MessageType::kCreditRsp, up_sid_, chain_version_, c.Encode());
}

Status ReplicaStream::Pump() {
  if (down_ == nullptr || phase_ == Phase::kOpening || phase_ == Phase::kFinished) return Status::OK();
  const auto& files = manifest_.files;
  while (down_credits_ > 0 && send_pos_ < send_order_.size()) {
    const uint32_t i = send_order_[send_pos_];
    uint32_t sent = 0;
    if (self_needs_[i]) {
      if (held_.empty()) break;  // wait for the predecessor
      HeldChunk& hc = held_.front();
      if (hc.file_index != i || hc.offset != send_off_) {
        return Status::Corruption("internal: forwarding out of order");
      }
      // The payload bytes go on unchanged under a new header (zero copy).
      // Its credit returns upstream once the successor's socket has it.
      down_->Send(MessageType::kChunkReq, down_sid_, chain_version_, hc.payload,
                  [self = shared_from_this()]() { asio::post(self->strand_, [self]() { self->OnForwarded(); }); });
      sent = hc.size;
      held_.pop_front();
    } else {
      RHINO_RETURN_IF_ERROR(SendFromPool(i));
      sent = static_cast<uint32_t>(std::min<uint64_t>(chunk_bytes_, files[i].size - send_off_));
    }
    env_->metrics->bytes_sent.fetch_add(sent);
    --down_credits_;
    send_off_ += sent;
    if (send_off_ == files[i].size) {
      ++send_pos_;
      send_off_ = 0;
      if (pool_fd_ >= 0) {
        ::close(pool_fd_);
        pool_fd_ = -1;
      }
    }
  }
  MaybeForwardCommit();
  return Status::OK();
}

Status ReplicaStream::SendFromPool(uint32_t i) {
  const FileEntry& f = manifest_.files[i];
  if (pool_fd_ < 0) {
    std::string pooled;
    RHINO_RETURN_IF_ERROR(env_->store->PoolPath(f.identity, &pooled));
    pool_fd_ = ::open(pooled.c_str(), O_RDONLY | O_CLOEXEC);
    if (pool_fd_ < 0) return Status::FromErrno(errno, "open pooled " + f.name + " to send it on");
  }
  const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(chunk_bytes_, f.size - send_off_));
  std::shared_ptr<std::string> payload = BufferPool::Shared().Get(ChunkReq::kPrefixBytes + n);
  std::string prefix;
  ChunkReq::AppendPrefix(&prefix, i, send_off_, n);
  std::memcpy(payload->data(), prefix.data(), ChunkReq::kPrefixBytes);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(pool_fd_, payload->data() + ChunkReq::kPrefixBytes + done, n - done,
                        static_cast<off_t>(send_off_ + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::FromErrno(errno, "read pooled " + f.name);
    if (r == 0) return Status::Corruption("pooled " + f.name + " is shorter than its manifest size");
    done += static_cast<size_t>(r);
  }
  down_->Send(MessageType::kChunkReq, down_sid_, chain_version_, std::shared_ptr<const std::string>(payload));
  return Status::OK();
}

void ReplicaStream::OnForwarded() {
  if (phase_ == Phase::kFinished) return;
  last_activity_ = std::chrono::steady_clock::now();
  ReturnCredits(1);
}

// ---- §4 step 4: commit on the ack path ----

void ReplicaStream::MaybeForwardCommit() {
  if (!commit_requested_ || commit_forwarded_) return;
  if (req_.downstream.empty()) {
    commit_forwarded_ = true;
    CommitLocal();  // the tail commits first
    return;
  }
  if (down_ == nullptr || send_pos_ < send_order_.size()) return;  // chunks still owed downstream
  commit_forwarded_ = true;
  // This member's files are durable before its successor may commit, as when
  // each file was fsync'ed inline: a successor never holds a checkpoint that
  // failed to reach this member's disk.
  if (syncs_ != nullptr) {
    Status s = syncs_->Wait();
    if (!s.ok()) return Fail(Here(s), true, true);
  }
  // Same connection, after the last chunk: the successor sees it last.
  down_->Send(MessageType::kCommitReq, down_sid_, chain_version_, CommitReq().Encode());
}

void ReplicaStream::CommitLocal() {
  // A chain that moved on while we waited must not gain a commit (§5).
  Status s = env_->fences->Check(operator_id_, instance_, chain_version_);
  if (!s.ok()) {
    env_->metrics->stale_rejections.fetch_add(1);
    return Fail(Here(s), true, false);
  }
  if (syncs_ != nullptr) {
    s = syncs_->Wait();  // every received file fsync'ed (§4 step 2), usually all but the last already
    if (!s.ok()) return Fail(Here(s), true, false);
  }
  CrashPoint("replica.before_commit");
  for (uint32_t i : need_self_) {
    s = env_->store->AdoptVerifiedFile(fs::Join(staging_, std::to_string(i)), manifest_.files[i]);
    if (!s.ok()) return Fail(Here(s), true, false);
  }
  s = env_->store->CommitManifest(manifest_);
  if (s.IsAlreadyExists()) {
    // A retry of a checkpoint this member committed before (its ack was lost).
    Manifest existing;
    if (env_->store->ReadManifest(operator_id_, instance_, checkpoint_id_, &existing).ok() &&
        SameFiles(existing, manifest_)) {
      s = Status::OK();
    }
  }
  if (!s.ok()) return Fail(Here(s), true, false);
  CrashPoint("replica.after_commit");
  env_->metrics->checkpoints_complete.fetch_add(1);
  env_->metrics->NoteCommitted(operator_id_, instance_, checkpoint_id_);
  up_->Send(MessageType::kCommitRsp, up_sid_, chain_version_, CommitRsp().Encode());
  RefreshStandbyLater();
  Finish();
}

// After the ack, off this strand: the standby directory a takeover renames
// into place (replica_store.h, RefreshStandby). The disk pool outlives every
// task posted to it (the worker joins it before the store goes).
void ReplicaStream::RefreshStandbyLater() {
  asio::post(*env_->disk, [store = env_->store, worker = env_->worker_id, op = operator_id_, i = instance_]() {
    Status s = store->RefreshStandby(op, i);
    if (!s.ok()) {
      std::fprintf(stderr, "rhino worker %s: standby directory of %s/%u: %s (a takeover builds it instead)\n",
                   worker.c_str(), op.c_str(), i, s.ToString().c_str());
    }
  });
}

// ---- abort and cleanup ----

void ReplicaStream::Fail(const Status& why, bool tell_upstream, bool tell_downstream) {
  if (phase_ == Phase::kFinished) return;
  env_->metrics->checkpoints_aborted.fetch_add(1);
  if (tell_downstream && down_ != nullptr) {
    AbortReq a;
    a.reason = why.message();
    down_->Send(MessageType::kAbortReq, down_sid_, chain_version_, a.Encode());
  }
  if (tell_upstream && up_ != nullptr) {
    if (phase_ == Phase::kOpening) {
      OpenStreamRsp rsp;
      rsp.code = WireCode(why);
      rsp.message = why.message();
      up_->Send(MessageType::kOpenStreamRsp, up_sid_, chain_version_, rsp.Encode());
    } else {
      up_->Send(MessageType::kErrorRsp, up_sid_, chain_version_, ErrorRsp::From(why).Encode());
    }
  }
  Finish();
}

void ReplicaStream::Finish() {
  phase_ = Phase::kFinished;
  metrics_->active_streams.fetch_sub(1);
  CloseFiles();
  syncs_.reset();  // files still waiting for an fsync are just closed
  // Partial data is discarded; committed files live on under their pool names.
  if (!staging_.empty()) fs::RemoveAll(staging_);
  staging_.clear();
  pin_.reset();
  Unreserve(UINT64_MAX);
  held_.clear();
  env_->metrics->in_flight_credits.fetch_sub(held_count_);
  held_count_ = 0;
  if (idle_timer_ != nullptr) idle_timer_->cancel();
  if (up_ != nullptr) up_->Detach(up_sid_);
  if (down_ != nullptr) down_->Detach(down_sid_);
  up_.reset();
  down_.reset();
  if (env_->on_finished) env_->on_finished(this);
}

void ReplicaStream::ArmIdleTimer() {
  if (env_->io == nullptr || env_->idle_timeout_ms == 0 || phase_ == Phase::kFinished) return;
  if (idle_timer_ == nullptr) idle_timer_ = std::make_unique<asio::steady_timer>(*env_->io);
  // Checked a few times per period; the timer holds no reference to the stream.
  idle_timer_->expires_after(std::chrono::milliseconds(std::max<uint32_t>(10, env_->idle_timeout_ms / 4)));
  std::weak_ptr<ReplicaStream> weak = shared_from_this();
  idle_timer_->async_wait([weak](const asio::error_code& ec) {
    if (ec) return;
    auto self = weak.lock();
    if (self == nullptr) return;
    asio::post(self->strand_, [self]() {
      if (self->phase_ == Phase::kFinished) return;
      auto idle = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                        self->last_activity_);
      if (idle.count() >= self->env_->idle_timeout_ms) {
        self->Fail(self->Here(Status::Timeout("no frame from either neighbour for " + std::to_string(idle.count()) +
                                              " ms")),
                   true, true);
        return;
      }
      self->ArmIdleTimer();
    });
  });
}

void ReplicaStream::CloseFiles() {
  if (recv_fd_ >= 0) ::close(recv_fd_);
  recv_fd_ = -1;
  if (pool_fd_ >= 0) ::close(pool_fd_);
  pool_fd_ = -1;
  if (recv_hash_ != nullptr) XXH3_freeState(recv_hash_);
  recv_hash_ = nullptr;
}

}  // namespace rhino
