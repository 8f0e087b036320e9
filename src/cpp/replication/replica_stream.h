// ReplicaStream: one checkpoint streaming through one chain member
// (docs/protocol.md §4; Rhino paper §4.2.2, phase 2).
//
// The member sits between its predecessor ("upstream": the primary or w(i-1))
// and, unless it is the tail, its successor ("downstream": w(i+1)):
//
//   open      validate the manifest, compute need_i, forward OpenStreamReq,
//             answer need_i and `window` credits (§4 step 1)
//   transfer  write each chunk to tmp/<staging>/<file index>, hash it, fsync
//             and check each finished file; forward chunks of files the
//             successor needs, and send it files it needs that this member
//             already holds, from the pool (§4 step 2)
//   credits   one credit back upstream per chunk once it is on disk and, if
//             forwarded, written to the successor's socket (§4 step 3)
//   commit    CommitReq goes down the chain; the tail commits first, each
//             member commits after its successor's CommitRsp{ok} (§4 step 4)
//   abort     any failure: staging removed, nothing committed, AbortReq
//             downstream and an error upstream (§4, last paragraph)
//
// Threading: every event (frames from either side, send completions, the
// downstream dial) is posted to the stream's strand on the worker's disk
// thread pool, so the stream's state needs no lock and its blocking disk work
// never stalls a socket.
#pragma once

#include <asio.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "net/connection.h"
#include "net/connection_pool.h"
#include "net/messages.h"
#include "replication/fence_table.h"
#include "replication/file_syncer.h"
#include "replication/server_metrics.h"
#include "rhino/manifest.h"
#include "rhino/replica_store.h"

struct XXH3_state_s;

namespace rhino {

class ReplicaStream;

// What a stream needs from the worker around it. All pointers outlive every
// stream (the worker drains streams before tearing these down).
struct StreamEnv {
  std::string worker_id;
  ReplicaStore* store = nullptr;
  net::ConnectionPool* pool = nullptr;
  FenceTable* fences = nullptr;
  ServerMetrics* metrics = nullptr;
  net::ConnectionCounters* counters = nullptr;
  asio::thread_pool* disk = nullptr;
  asio::io_context* io = nullptr;  // for the idle timer
  // A stream with no frame from either neighbour for this long is aborted
  // (Timeout): a stuck but connected predecessor cannot pin staging files
  // and the store's shared lock (which holds off GC) forever.
  uint32_t idle_timeout_ms = 60000;
  uint32_t max_window = 64;
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;
  // Called once, on the stream's strand, when the stream has finished.
  std::function<void(ReplicaStream*)> on_finished;
  // Called when a stream raised the chain version of its instance: older
  // streams of that instance must be fenced off (protocol §5).
  std::function<void(const std::string& operator_id, uint32_t instance, uint64_t version)> on_fence_raised;
};

class ReplicaStream : public std::enable_shared_from_this<ReplicaStream> {
 public:
  // `req` is the decoded OpenStreamReq that opened the stream.
  static std::shared_ptr<ReplicaStream> Create(const StreamEnv* env, std::shared_ptr<net::Connection> upstream,
                                               uint32_t upstream_stream_id, uint64_t chain_version,
                                               OpenStreamReq req);
  ~ReplicaStream();

  // The listener to attach on the upstream connection for this stream id.
  std::shared_ptr<net::StreamListener> upstream_listener();
  // Starts §4 step 1.
  void Open();
  // Aborts the stream (fencing by a newer chain version, shutdown).
  void Abort(const Status& why);

  const std::string& operator_id() const { return operator_id_; }
  uint32_t instance() const { return instance_; }
  uint64_t chain_version() const { return chain_version_; }

 private:
  class Listener;
  enum class Side { kUpstream, kDownstream };
  enum class Phase { kOpening, kTransferring, kCommitting, kFinished };
  struct HeldChunk {  // an upstream chunk waiting to be forwarded downstream
    uint32_t file_index;
    uint64_t offset;
    uint32_t size;
    std::shared_ptr<const std::string> payload;
  };

  ReplicaStream(const StreamEnv* env, std::shared_ptr<net::Connection> upstream, uint32_t upstream_stream_id,
                uint64_t chain_version, OpenStreamReq req);

  // ---- all below run on strand_ ----
  void DoOpen();
  Status PrepareLocal();
  // Admits the stream's need against the store's free space less what open
  // streams may still write and a margin (ServerMetrics::reserved_bytes), or
  // refuses it with NoSpace (issue 46: a manifest's sizes drive fallocate).
  Status Reserve(uint64_t need_bytes);
  void Unreserve(uint64_t bytes);  // written, or the stream ended
  void OnDownstreamConnected(const Status& s, std::shared_ptr<net::Connection> conn);
  void OnFrame(Side side, const FrameHeader& h, std::shared_ptr<std::string> payload);
  void OnUpstreamFrame(const FrameHeader& h, std::shared_ptr<std::string> payload);
  void OnDownstreamFrame(const FrameHeader& h, std::shared_ptr<std::string> payload);
  void OnConnectionClosed(Side side, const Status& why);
  void OnDownstreamOpened(const OpenStreamRsp& rsp);
  void AnswerOpen();
  Status OnChunk(const ChunkReq& chunk, std::shared_ptr<std::string> payload);
  void RejectFrame(Side side, const FrameHeader& h, const Status& why);
  Status Here(const Status& s) const;  // prefixes Where() to a locally made error
  Status FinishFile();
  void ReturnCredits(uint32_t n);
  Status Pump();
  Status SendFromPool(uint32_t file_index);
  void OnForwarded();
  void MaybeForwardCommit();
  void CommitLocal();
  void RefreshStandbyLater();
  void Fail(const Status& why, bool tell_upstream, bool tell_downstream);
  void Finish();
  void CloseFiles();
  void ArmIdleTimer();
  std::string Where() const;  // "worker w2 (op/inst checkpoint c)"

  const StreamEnv* const env_;
  // The destructor may run after the server (and env_) is gone, when the
  // worker's io_context drops the handlers holding the last references.
  ServerMetrics* const metrics_;
  asio::strand<asio::thread_pool::executor_type> strand_;
  std::shared_ptr<net::Connection> up_;
  const uint32_t up_sid_;
  const uint64_t chain_version_;
  Phase phase_ = Phase::kOpening;
  std::unique_ptr<asio::steady_timer> idle_timer_;
  std::chrono::steady_clock::time_point last_activity_ = std::chrono::steady_clock::now();

  // request (immutable after construction: the server reads the identity)
  const std::string operator_id_;
  const uint32_t instance_;
  const uint64_t checkpoint_id_;
  OpenStreamReq req_;  // its manifest bytes are dropped once forwarded
  uint32_t chunk_bytes_ = 0;
  uint32_t window_ = 0;
  Manifest manifest_;

  // local side (§4 steps 1-2)
  std::unique_ptr<ReplicaStore::Pin> pin_;
  int64_t reserved_ = 0;  // of ServerMetrics::reserved_bytes: this stream's need less what it wrote  // keeps GC off the manifest's files until commit/abort
  std::string staging_;
  std::vector<uint32_t> need_self_;  // manifest indexes this member lacks, ascending
  std::vector<char> self_needs_;     // by manifest index
  std::vector<uint32_t> recv_order_; // need_self_ without empty files
  size_t recv_pos_ = 0;
  uint64_t recv_off_ = 0;
  int recv_fd_ = -1;
  XXH3_state_s* recv_hash_ = nullptr;
  std::unique_ptr<SyncBatch> syncs_;  // received files on their way to disk
  uint32_t up_credits_ = 0;  // credits the predecessor still holds
  uint32_t held_count_ = 0;  // chunk buffers whose credit is not yet returned

  // downstream side
  std::shared_ptr<net::Connection> down_;
  uint32_t down_sid_ = 0;
  std::vector<uint32_t> need_down_;
  std::vector<char> down_needs_;
  std::vector<uint32_t> send_order_;  // need_down_ without empty files
  size_t send_pos_ = 0;
  uint64_t send_off_ = 0;
  uint32_t down_credits_ = 0;
  int pool_fd_ = -1;  // pool file being sent downstream (this member already held it)
  std::deque<HeldChunk> held_;
  std::vector<uint32_t> member_needed_files_;
  std::vector<uint64_t> member_needed_bytes_;
  bool commit_requested_ = false;
  bool commit_forwarded_ = false;
};

}  // namespace rhino
