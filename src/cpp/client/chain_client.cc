#include "client/chain_client.h"

#include <fcntl.h>
#include <unistd.h>

#include <asio.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "net/connection.h"
#include "net/messages.h"
#include "rhino/manifest.h"
#include "rhino/replica_store.h"
#include "rhino/thread_annotations.h"
#include "util/buffer_pool.h"

namespace rhino {

const char* ReplicationStateName(ReplicationState s) {
  switch (s) {
    case ReplicationState::kConnecting: return "connecting";
    case ReplicationState::kOpening: return "opening";
    case ReplicationState::kTransferring: return "transferring";
    case ReplicationState::kCommitting: return "committing";
    case ReplicationState::kComplete: return "complete";
    case ReplicationState::kFailed: return "failed";
  }
  return "unknown";
}

// One replication: a runner thread drives §4 with blocking waits on a
// condition variable; an io thread runs the connection, whose frames update
// the shared state below.
class ReplicationHandle::Job : public std::enable_shared_from_this<ReplicationHandle::Job> {
 public:
  Job(const ReplicaStore* store, std::string operator_id, uint32_t instance, uint64_t checkpoint_id,
      std::vector<std::string> chain, uint64_t chain_version, Credential credential, ReplicateOptions options)
      : store_(store),
        operator_id_(std::move(operator_id)),
        instance_(instance),
        checkpoint_id_(checkpoint_id),
        chain_(std::move(chain)),
        chain_version_(chain_version),
        credential_(std::move(credential)),
        options_(std::move(options)) {}

  ~Job() {
    if (!runner_.joinable()) return;
    if (runner_.get_id() == std::this_thread::get_id()) {
      runner_.detach();  // the runner dropped the last reference: it is ending anyway
    } else {
      runner_.join();
    }
  }

  void Start() {
    deadline_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.timeout_ms);
    runner_ = std::thread([self = shared_from_this()]() { self->Run(); });
  }

  void JoinRunner() {
    if (runner_.joinable() && runner_.get_id() != std::this_thread::get_id()) runner_.join();
  }

  void Cancel() EXCLUDES(mu_) {
    MutexLock l(&mu_);
    cancelled_ = true;
    cv_.SignalAll();
  }

  ReplicationProgress Progress() const EXCLUDES(mu_) {
    MutexLock l(&mu_);
    return progress_;
  }

  bool Done() const EXCLUDES(mu_) {
    MutexLock l(&mu_);
    return done_;
  }

  bool Wait(int64_t timeout_ms, ReplicationResult* out) const EXCLUDES(mu_) {
    MutexLock l(&mu_);
    auto done = [this]() {
      mu_.AssertHeld();
      return done_;
    };
    if (timeout_ms < 0) {
      cv_.Wait(&mu_, done);
    } else if (!cv_.WaitFor(&mu_, std::chrono::milliseconds(timeout_ms), done)) {
      return false;
    }
    *out = result_;
    return true;
  }

  // ---- called on the connection's strand ----
  void OnFrame(const FrameHeader& h, const std::string& payload) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    Status s;
    if (h.chain_version != chain_version_) {
      s = Status::Corruption("w1 answered with chain version " + std::to_string(h.chain_version));
    } else {
      switch (h.type) {
        case MessageType::kOpenStreamRsp:
          s = OpenStreamRsp::Decode(payload, &open_rsp_);
          if (s.ok()) have_open_ = true;
          break;
        case MessageType::kCreditRsp: {
          CreditRsp c;
          s = CreditRsp::Decode(payload, &c);
          if (s.ok() && c.credits > progress_.in_flight) s = Status::Corruption("w1 returned more credits than it lent");
          if (s.ok()) {
            progress_.credits += c.credits;
            progress_.in_flight -= c.credits;
          }
          break;
        }
        case MessageType::kCommitRsp:
          s = CommitRsp::Decode(payload, &commit_rsp_);
          if (s.ok()) have_commit_ = true;
          break;
        case MessageType::kErrorRsp: {
          ErrorRsp e;
          s = ErrorRsp::Decode(payload, &e);
          if (s.ok()) s = Status::FromCode(e.code, e.message);
          if (s.ok()) s = Status::IOError("w1 sent an ErrorRsp with code 0");
          break;
        }
        default:
          s = Status::Corruption(std::string("w1 sent an unexpected ") + MessageTypeName(h.type));
      }
    }
    if (!s.ok() && failure_.ok()) failure_ = s;
    cv_.SignalAll();
  }

  void OnClosed(const Status& why) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    if (failure_.ok()) {
      failure_ = why.ok() ? Status::PeerDead("connection to w1 closed") : why;
    }
    cv_.SignalAll();
  }

 private:
  class Listener : public net::StreamListener {
   public:
    explicit Listener(std::shared_ptr<Job> job) : job_(std::move(job)) {}
    void OnFrame(const FrameHeader& h, std::shared_ptr<std::string> payload) override { job_->OnFrame(h, *payload); }
    void OnConnectionClosed(const Status& why) override { job_->OnClosed(why); }

   private:
    std::shared_ptr<Job> job_;
  };

  // Until pred() (called with mu_ held), a failure, a cancel or the deadline.
  template <typename Pred>
  Status WaitFor(Pred pred, const char* what) REQUIRES(mu_) {
    for (;;) {
      if (pred()) return Status::OK();
      if (!failure_.ok()) return failure_;
      if (cancelled_) return Status::Aborted("replication of checkpoint " + std::to_string(checkpoint_id_) + " cancelled");
      if (!cv_.WaitUntil(&mu_, deadline_) && !pred() && failure_.ok() && !cancelled_) {
        // §4 step 5: no ack within the timeout means not complete.
        return Status::Timeout("checkpoint " + std::to_string(checkpoint_id_) + " of " + operator_id_ + "/" +
                               std::to_string(instance_) + " was not acknowledged within " +
                               std::to_string(options_.timeout_ms) + " ms (while " + what + ")");
      }
    }
  }

  void SetState(ReplicationState s) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    progress_.state = s;
  }

  // §4 in order: connect to w1, open the stream, send what it needs, commit.
  Status Steps(ReplicationResult* result) {
    Manifest m;
    RHINO_RETURN_IF_ERROR(store_->ReadManifest(operator_id_, instance_, checkpoint_id_, &m));
    RHINO_RETURN_IF_ERROR(Connect());
    std::vector<uint32_t> needed;
    RHINO_RETURN_IF_ERROR(OpenStream(m, &needed, result));
    for (uint32_t i : needed) RHINO_RETURN_IF_ERROR(SendFile(m, i));
    return CommitStream();
  }

  // An authenticated connection to w1 (protocol §2).
  Status Connect() {
    std::string host;
    uint16_t port = 0;
    RHINO_RETURN_IF_ERROR(net::ParseAddress(chain_[0], &host, &port));
    net::ConnectionOptions co;
    co.worker_id = options_.client_id;
    co.credential = credential_;
    co.tls = options_.tls;
    co.max_frame_bytes = options_.max_frame_bytes;
    co.heartbeat_ms = options_.heartbeat_ms;
    co.peer_timeout_ms = options_.peer_timeout_ms;
    conn_ = net::Connection::Create(io_, net::Connection::Role::kClient, co, nullptr);
    bool connected = false;
    Status connect_status;
    conn_->StartClient(host, port, [this, &connected, &connect_status](const Status& s) {
      MutexLock l(&mu_);
      connected = true;
      connect_status = s;
      cv_.SignalAll();
    });
    MutexLock l(&mu_);
    Status s = WaitFor([&]() { return connected; }, "connecting to w1");
    if (!s.ok()) {
      // The ready callback refers to locals: make sure it has run.
      l.Unlock();
      conn_->Close(s);
      l.Lock();
      cv_.Wait(&mu_, [&]() { return connected; });
      return s;
    }
    return connect_status;
  }

  // §4 step 1: open, learning what w1 needs (ascending manifest indexes).
  Status OpenStream(const Manifest& m, std::vector<uint32_t>* needed, ReplicationResult* result) {
    sid_ = conn_->NewStreamId();
    conn_->Attach(sid_, std::make_shared<Listener>(shared_from_this()));
    OpenStreamReq req;
    req.operator_id = operator_id_;
    req.instance = instance_;
    req.checkpoint_id = checkpoint_id_;
    req.chunk_bytes = options_.chunk_bytes;
    req.window = options_.window;
    req.downstream.assign(chain_.begin() + 1, chain_.end());
    req.manifest = m.Serialize();
    SetState(ReplicationState::kOpening);
    conn_->Send(MessageType::kOpenStreamReq, sid_, chain_version_, req.Encode());
    MutexLock l(&mu_);
    RHINO_RETURN_IF_ERROR(WaitFor(
        [this]() {
          mu_.AssertHeld();
          return have_open_;
        },
        "opening the stream"));
    if (open_rsp_.code != 0) return Status::FromCode(open_rsp_.code, open_rsp_.message);
    *needed = open_rsp_.needed;
    result->member_needed_files = open_rsp_.member_needed_files;
    result->member_needed_bytes = open_rsp_.member_needed_bytes;
    for (size_t k = 0; k < needed->size(); ++k) {
      if ((*needed)[k] >= m.files.size() || (k > 0 && (*needed)[k] <= (*needed)[k - 1])) {
        return Status::Corruption("w1's needed list is not ascending manifest indexes");
      }
      progress_.bytes_total += m.files[(*needed)[k]].size;
    }
    if (open_rsp_.credits == 0 && !needed->empty()) return Status::Corruption("w1 granted no credits");
    progress_.files_total = static_cast<uint32_t>(needed->size());
    progress_.credits = open_rsp_.credits;
    progress_.state = ReplicationState::kTransferring;
    return Status::OK();
  }

  // §4 steps 2-3: one file w1 needs, one chunk per credit.
  Status SendFile(const Manifest& m, uint32_t i) {
    const FileEntry& f = m.files[i];
    std::string path;
    RHINO_RETURN_IF_ERROR(store_->PoolPath(f.identity, &path));
    int fd = f.size > 0 ? ::open(path.c_str(), O_RDONLY | O_CLOEXEC) : -1;
    if (f.size > 0 && fd < 0) return Status::FromErrno(errno, "open pooled " + f.name);
    if (fd >= 0) ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    Status s;
    for (uint64_t off = 0; off < f.size && s.ok();) {
      {
        MutexLock l(&mu_);
        s = WaitFor(
            [this]() {
              mu_.AssertHeld();
              return progress_.credits > 0;
            },
            "waiting for credits");
        if (!s.ok()) break;
        --progress_.credits;
        ++progress_.in_flight;
      }
      const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(options_.chunk_bytes, f.size - off));
      s = SendChunk(fd, f, i, off, n);
      off += n;
    }
    if (fd >= 0) ::close(fd);
    RHINO_RETURN_IF_ERROR(s);
    MutexLock l(&mu_);
    ++progress_.files_sent;
    return Status::OK();
  }

  // Reads bytes [off, off+n) of the pooled file straight into a ChunkReq.
  Status SendChunk(int fd, const FileEntry& f, uint32_t i, uint64_t off, uint32_t n) {
    std::shared_ptr<std::string> payload = BufferPool::Shared().Get(ChunkReq::kPrefixBytes + n);
    std::string prefix;
    ChunkReq::AppendPrefix(&prefix, i, off, n);
    std::memcpy(payload->data(), prefix.data(), ChunkReq::kPrefixBytes);
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd, payload->data() + ChunkReq::kPrefixBytes + done, n - done,
                          static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return Status::FromErrno(errno, "read pooled " + f.name);
      if (r == 0) return Status::Corruption("pooled " + f.name + " is shorter than its manifest size");
      done += static_cast<size_t>(r);
    }
    conn_->Send(MessageType::kChunkReq, sid_, chain_version_, std::shared_ptr<const std::string>(payload));
    MutexLock l(&mu_);
    progress_.bytes_sent += n;
    return Status::OK();
  }

  // §4 steps 4-5: complete only on w1's CommitRsp{ok}, within the timeout.
  Status CommitStream() {
    SetState(ReplicationState::kCommitting);
    conn_->Send(MessageType::kCommitReq, sid_, chain_version_, CommitReq().Encode());
    MutexLock l(&mu_);
    RHINO_RETURN_IF_ERROR(WaitFor(
        [this]() {
          mu_.AssertHeld();
          return have_commit_;
        },
        "waiting for the chain to commit"));
    if (commit_rsp_.code != 0) return Status::FromCode(commit_rsp_.code, commit_rsp_.message);
    return Status::OK();
  }

  void Run() {
    auto t0 = std::chrono::steady_clock::now();
    auto work = asio::make_work_guard(io_);
    std::thread io_thread([this]() { io_.run(); });
    ReplicationResult result;
    result.checkpoint_id = checkpoint_id_;
    Status s = Steps(&result);
    if (conn_ != nullptr) {
      if (!s.ok() && sid_ != 0 && conn_->is_open()) {
        // Tell the chain to discard what it staged, then close once sent.
        AbortReq a;
        a.reason = s.message();
        auto sent = std::make_shared<std::promise<void>>();
        auto fut = sent->get_future();
        conn_->Send(MessageType::kAbortReq, sid_, chain_version_,
                    std::make_shared<const std::string>(a.Encode()), [sent]() { sent->set_value(); });
        fut.wait_for(std::chrono::milliseconds(500));
      }
      conn_->Close(Status::Aborted("replication finished"));
    }
    work.reset();
    io_thread.join();
    conn_.reset();
    ReplicationResult done_copy;
    {
      MutexLock l(&mu_);
      result.status = s;
      result.bytes_sent = progress_.bytes_sent;
      result.files_sent = progress_.files_sent;
      result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      progress_.state = s.ok() ? ReplicationState::kComplete : ReplicationState::kFailed;
      result_ = std::move(result);
      done_ = true;
      done_copy = result_;
      cv_.SignalAll();
    }
    // Outside the lock: the callback may start the next replication or
    // answer a client (the state service's barrier commit).
    if (options_.on_done) options_.on_done(done_copy);
  }

  const ReplicaStore* const store_;  // outlives the handle, which joins the runner
  const std::string operator_id_;
  const uint32_t instance_;
  const uint64_t checkpoint_id_;
  const std::vector<std::string> chain_;
  const uint64_t chain_version_;
  const Credential credential_;
  const ReplicateOptions options_;
  std::chrono::steady_clock::time_point deadline_;
  std::thread runner_;
  asio::io_context io_;
  std::shared_ptr<net::Connection> conn_;  // runner thread only
  uint32_t sid_ = 0;                       // runner thread only

  mutable Mutex mu_;
  mutable CondVar cv_;
  ReplicationProgress progress_ GUARDED_BY(mu_);
  Status failure_ GUARDED_BY(mu_);  // first failure seen on the connection
  bool cancelled_ GUARDED_BY(mu_) = false;
  bool have_open_ GUARDED_BY(mu_) = false;
  OpenStreamRsp open_rsp_ GUARDED_BY(mu_);
  bool have_commit_ GUARDED_BY(mu_) = false;
  CommitRsp commit_rsp_ GUARDED_BY(mu_);
  bool done_ GUARDED_BY(mu_) = false;
  ReplicationResult result_ GUARDED_BY(mu_);
};

ReplicationHandle::ReplicationHandle(std::shared_ptr<Job> job) : job_(std::move(job)) {}

ReplicationHandle::~ReplicationHandle() {
  job_->Cancel();
  job_->JoinRunner();
}

ReplicationProgress ReplicationHandle::Progress() const { return job_->Progress(); }
bool ReplicationHandle::Done() const { return job_->Done(); }
bool ReplicationHandle::Wait(int64_t timeout_ms, ReplicationResult* result) const {
  return job_->Wait(timeout_ms, result);
}
void ReplicationHandle::Cancel() { job_->Cancel(); }

Status ReplicateCheckpoint(const ReplicaStore* store, const std::string& operator_id, uint32_t instance,
                           uint64_t checkpoint_id, const std::vector<std::string>& chain, uint64_t chain_version,
                           const Credential& credential, const ReplicateOptions& options,
                           std::unique_ptr<ReplicationHandle>* out) {
  if (store == nullptr) return Status::InvalidArgument("no replica store to replicate from");
  if (chain.empty()) return Status::InvalidArgument("the replica chain is empty");
  if (chain.size() > kMaxChainLength) {
    return Status::InvalidArgument("a chain has at most " + std::to_string(kMaxChainLength) + " members");
  }
  for (const auto& a : chain) {
    std::string host;
    uint16_t port;
    RHINO_RETURN_IF_ERROR(net::ParseAddress(a, &host, &port));
  }
  if (!IsValidOperatorId(operator_id)) return Status::InvalidArgument("invalid operator id '" + operator_id + "'");
  if (options.chunk_bytes == 0 || options.chunk_bytes > options.max_frame_bytes - ChunkReq::kPrefixBytes) {
    return Status::InvalidArgument("chunk_bytes must be in [1, max_frame_bytes - 16]");
  }
  if (options.window == 0) return Status::InvalidArgument("window must be at least 1");
  if (options.timeout_ms == 0) return Status::InvalidArgument("timeout must be positive");
  auto job = std::make_shared<ReplicationHandle::Job>(store, operator_id, instance, checkpoint_id, chain,
                                                      chain_version, credential, options);
  job->Start();
  *out = std::make_unique<ReplicationHandle>(std::move(job));
  return Status::OK();
}

// ---- StoreQuery ----

namespace {

struct QueryState {
  bool done = false;
  Status status;
  std::vector<uint64_t> checkpoints;
};

class QueryListener : public net::StreamListener {
 public:
  QueryListener(std::shared_ptr<QueryState> st, std::shared_ptr<net::Connection> conn)
      : st_(std::move(st)), conn_(std::move(conn)) {}
  void OnFrame(const FrameHeader& h, std::shared_ptr<std::string> payload) override {
    if (st_->done) return;
    st_->done = true;
    if (h.type == MessageType::kStoreQueryRsp) {
      StoreQueryRsp rsp;
      st_->status = StoreQueryRsp::Decode(*payload, &rsp);
      if (st_->status.ok()) st_->status = Status::FromCode(rsp.code, rsp.message);
      st_->checkpoints = std::move(rsp.checkpoints);
    } else if (h.type == MessageType::kErrorRsp) {
      ErrorRsp e;
      st_->status = ErrorRsp::Decode(*payload, &e);
      if (st_->status.ok()) st_->status = Status::FromCode(e.code, e.message);
    } else {
      st_->status = Status::Corruption(std::string("unexpected answer ") + MessageTypeName(h.type));
    }
    conn_->Close(Status::OK());
  }
  void OnConnectionClosed(const Status& why) override {
    if (st_->done) return;
    st_->done = true;
    st_->status = why;
  }

 private:
  std::shared_ptr<QueryState> st_;
  std::shared_ptr<net::Connection> conn_;
};

}  // namespace

Status QueryStore(const std::string& address, const Credential& credential, const std::string& operator_id,
                  uint32_t instance, uint32_t timeout_ms, std::vector<uint64_t>* checkpoints,
                  const net::TlsContext& tls) {
  std::string host;
  uint16_t port = 0;
  RHINO_RETURN_IF_ERROR(net::ParseAddress(address, &host, &port));
  if (timeout_ms == 0) return Status::InvalidArgument("timeout must be positive");
  asio::io_context io;  // single-threaded: everything below runs inside run_for
  net::ConnectionOptions co;
  co.worker_id = "query";
  co.credential = credential;
  co.tls = tls;
  co.peer_timeout_ms = timeout_ms;
  auto conn = net::Connection::Create(io, net::Connection::Role::kClient, co, nullptr);
  auto st = std::make_shared<QueryState>();
  conn->StartClient(host, port, [conn, st, operator_id, instance](const Status& s) {
    if (!s.ok()) {
      if (!st->done) {
        st->done = true;
        st->status = s;
      }
      return;
    }
    uint32_t sid = conn->NewStreamId();
    conn->Attach(sid, std::make_shared<QueryListener>(st, conn));
    StoreQueryReq req;
    req.operator_id = operator_id;
    req.instance = instance;
    conn->Send(MessageType::kStoreQueryReq, sid, 0, req.Encode());
  });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!st->done && std::chrono::steady_clock::now() < deadline && !io.stopped()) {
    io.run_one_until(deadline);
  }
  conn->Close(Status::OK());
  io.restart();
  io.run_for(std::chrono::milliseconds(100));  // let the close run, dropping the handlers' references
  if (!st->done) return Status::Timeout("no answer from " + address + " within " + std::to_string(timeout_ms) + " ms");
  RHINO_RETURN_IF_ERROR(st->status);
  *checkpoints = std::move(st->checkpoints);
  return Status::OK();
}

}  // namespace rhino
