// Checkpoint readers: reading a committed checkpoint of an instance from this
// worker's own replica store, with no running query and without touching the
// instance's live state or its sessions (docs/protocol.md §7.9).
//
// A reader is a session opened with SessionOpenReq.read_checkpoint. The
// worker restores the checkpoint by hard links (the restore of takeover and
// rollback, O(files)) into a fresh directory under <state_dir>/tmp, opens it
// read-only, and answers GetReq and ScanReq from it as a session does;
// WriteReq and SessionCommitReq are refused. The directory goes when the
// reader ends: SessionAbortReq, a closed connection, the idle timeout, the
// worker's shutdown; a worker killed meanwhile empties <state_dir>/tmp when it
// starts again. Any number of readers may be open, on any instance, whether
// this worker hosts it (its primary), holds it as a replica, or neither.
//
// Thread-safety: a ReaderStream handles its frames in order on its own strand
// of the service's pool; End may be called from any thread (the sweeper, the
// shutdown), and waits for a request in progress.
#pragma once

#include <asio.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "net/connection.h"
#include "net/service_messages.h"
#include "rhino/replica_store.h"
#include "rhino/state_backend.h"
#include "rhino/thread_annotations.h"
#include "state/session_batch.h"

namespace rhino {

// What every reader of a worker shares; owned by the state service.
struct ReaderEnv {
  std::string worker_id;
  std::string work_dir;  // <state_dir>/tmp, emptied when the worker starts
  ReplicaStore* store = nullptr;
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;  // one answer's budget
  net::ConnectionCounters* counters = nullptr;       // frames rejected
};

// One checkpoint restored into a directory of its own and open read-only.
// Destroying it closes the DB, then removes the directory.
class CheckpointView {
 public:
  // Checkpoint `checkpoint` of (operator_id, instance), the newest if unset:
  // NotFound naming the three if the store does not hold it, Corruption if
  // its manifest or files are damaged.
  static Status Open(const ReaderEnv& env, const std::string& operator_id, uint32_t instance,
                     std::optional<uint64_t> checkpoint, std::unique_ptr<CheckpointView>* out);
  ~CheckpointView();
  CheckpointView(const CheckpointView&) = delete;
  CheckpointView& operator=(const CheckpointView&) = delete;

  uint64_t checkpoint() const { return checkpoint_; }
  std::optional<uint64_t> version() const { return db_->version(); }
  std::vector<uint32_t> vnodes() const { return db_->vnodes(); }
  // A session's read path over the checkpoint, with no writes of its own.
  const SessionBatch& reads() const { return *reads_; }

 private:
  CheckpointView() = default;
  std::string dir_;
  uint64_t checkpoint_ = 0;
  std::unique_ptr<StateBackend> db_;
  std::unique_ptr<SessionBatch> reads_;
};

class ReaderStream;

// The readers open on a worker, for the idle sweep and the shutdown.
class ReaderTable {
 public:
  void Add(uint64_t token, const std::shared_ptr<ReaderStream>& r) EXCLUDES(mu_);
  void Remove(uint64_t token) EXCLUDES(mu_);
  std::vector<std::shared_ptr<ReaderStream>> All() EXCLUDES(mu_);
  // Adds `r` unless `max` readers (0: no bound) are open already: false then.
  bool AddIfRoom(uint64_t token, const std::shared_ptr<ReaderStream>& r, size_t max) EXCLUDES(mu_);

 private:
  Mutex mu_;
  std::map<uint64_t, std::weak_ptr<ReaderStream>> readers_ GUARDED_BY(mu_);
};

class ReaderStream : public net::StreamListener, public std::enable_shared_from_this<ReaderStream> {
 public:
  // `env` must outlive the stream; `token` is unique to this reader.
  ReaderStream(const ReaderEnv* env, std::shared_ptr<ReaderTable> table, asio::thread_pool& pool,
               const std::shared_ptr<net::Connection>& conn, uint32_t stream_id, uint64_t token);

  void OnFrame(const FrameHeader& h, std::shared_ptr<std::string> payload) override;
  void OnConnectionClosed(const Status&) override;

  // Restores and opens the checkpoint on the stream's strand, then answers
  // the SessionOpenReq (frames pipelined after it queue up behind).
  void Open(const SessionOpenReq& req);
  // Ends the reader if no request came for `idle` (--session-idle-timeout).
  void ExpireIfIdle(std::chrono::steady_clock::duration idle);
  // Drops the checkpoint and its directory; later requests are answered
  // Aborted with `why`. Idempotent.
  void End(const std::string& why) EXCLUDES(mu_);

 private:
  void Send(MessageType type, std::string payload);
  void Reply(MessageType rsp_type, const Status& s);
  void Malformed(const char* what, const Status& s);
  void Handle(const FrameHeader& h, const std::string& payload);  // on the strand
  void OnRead(const FrameHeader& h, const std::string& payload);   // GetReq, ScanReq
  void OnAbort(const std::string& payload);
  void Opened(const SessionOpenReq& req, Status s, std::unique_ptr<CheckpointView> view);
  Status CheckOpen() REQUIRES(mu_);

  const ReaderEnv* const env_;
  const std::shared_ptr<ReaderTable> table_;
  asio::strand<asio::thread_pool::executor_type> strand_;
  std::weak_ptr<net::Connection> conn_;
  const uint32_t stream_id_;
  const uint64_t token_;

  Mutex mu_;
  std::unique_ptr<CheckpointView> view_ GUARDED_BY(mu_);  // set by the open, dropped by End
  std::string what_ GUARDED_BY(mu_);                      // "checkpoint c of op/i", for errors
  bool ended_ GUARDED_BY(mu_) = false;
  std::string why_ GUARDED_BY(mu_);  // why it ended
  std::chrono::steady_clock::time_point last_activity_ GUARDED_BY(mu_) = std::chrono::steady_clock::now();
};

}  // namespace rhino
