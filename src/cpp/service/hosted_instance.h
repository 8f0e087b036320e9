// HostedInstance: one operator instance whose live state a worker hosts
// (docs/design.md §2 "state service"). The worker keeps its RocksDB open
// across micro-batches and serves it to one session at a time; a commit
// writes the session's updates at version b, takes checkpoint b into the
// worker's own replica store, and replicates its delta down the instance's
// chain (Rhino paper §4.2.2) — all here, in C++, never in the client. Its
// files on disk are its InstanceDir's (instance_dir.h).
//
// Thread-safety: every method runs with mu() held (but DeferPlacement); the
// state service runs them on the instance's strand, so the frames of a session are handled in
// order, and takes mu() of two instances (in address order) to move vnodes.
// No call to a peer is made with mu() held (the discard of §7.3 runs on the
// strand without it); replications run on their own threads. Shipping its
// checkpoints down the chain is its ChainShipper's (chain_shipper.h).
#pragma once

#include <asio.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "client/chain_client.h"
#include "net/service_messages.h"
#include "rhino/partitioner.h"
#include "rhino/replica_store.h"
#include "rhino/state_backend.h"
#include "rhino/status.h"
#include "client/state_client.h"
#include "service/base_reader.h"
#include "service/chain_shipper.h"
#include "service/instance_dir.h"
#include "service/instance_metrics.h"
#include "state/session_batch.h"

namespace rhino {

// Where the instances of one worker live, and what they share.
struct InstanceEnv {
  std::string worker_id;
  std::string state_dir;
  ReplicaStore* store = nullptr;
  Credential credential;    // the worker's own (protocol §2, "Roles"): to replicate down the chains
  // How this worker connects to another (its id, credential, TLS, bounds):
  // to read the base of a vnode taken on one (design §4.1).
  StateClientOptions peers;
  ReplicateOptions replicate;
  // Asks each chain member to drop the instance's checkpoints after `after`
  // (a re-executed batch replaces them); set by the state service.
  std::function<Status(const InstanceConfig&, std::optional<uint64_t> after)> discard_on_chain;
};

// Where a takeover's time goes, besides the store's restore: the `takeover`
// answer gives each (protocol.md §7.1).
struct TakeoverStats {
  RestoreStats restore;
  double discard_seconds = 0;  // dropping the store's checkpoints after the one taken over
  double save_seconds = 0;     // making the instance's new config durable
};

class HostedInstance;

// The instance's mutex. Taking it first applies a placement that a re-open
// deferred while the instance was busy (HostedInstance::DeferPlacement), so
// whoever holds the instance next sees the epoch and chain it was fenced at.
// A Lockable: use it with std::lock_guard, std::unique_lock, std::scoped_lock.
class InstanceMutex {
 public:
  explicit InstanceMutex(HostedInstance* owner) : owner_(owner) {}
  InstanceMutex(const InstanceMutex&) = delete;
  InstanceMutex& operator=(const InstanceMutex&) = delete;
  void lock();
  bool try_lock();
  void unlock() { m_.unlock(); }

 private:
  HostedInstance* owner_;
  std::mutex m_;
};

// Privately a ChainShipper::Host: the shipper's one way to the instance.
class HostedInstance : public std::enable_shared_from_this<HostedInstance>, private ChainShipper::Host {
 public:
  using CommitReply = std::function<void(const SessionCommitRsp&)>;

  // Opens the instance described by `config` (its db_name must exist), or
  // creates an empty one if config.db_name is empty. Hosting it clears its
  // CLOSED marker, as does Takeover.
  static Status Open(const InstanceEnv& env, InstanceConfig config, asio::thread_pool& pool,
                     std::shared_ptr<HostedInstance>* out);
  // Builds the instance from checkpoint `checkpoint_id` of this worker's own
  // replica store by hard links (the takeover of design §4); the partitioner
  // and vnodes come from the checkpoint's manifest.
  // `redo` (with `redo_version`) is the reconfiguration the coordinator
  // applied on top of that checkpoint at the old primary: it runs again here
  // if the checkpoint taken over is that version.
  static Status Takeover(const InstanceEnv& env, InstanceConfig config, uint64_t checkpoint_id,
                         asio::thread_pool& pool, std::shared_ptr<HostedInstance>* out, TakeoverStats* stats);
  // When Open (or the Recover after it) fails on a restarted worker: builds
  // the instance again from the newest checkpoint of this worker's store.
  // A takeover or rollback builds its directory without syncing, so a host
  // crash can damage it; its committed state is in the store. NotFound if the
  // store holds no checkpoint of it.
  static Status Rebuild(const InstanceEnv& env, InstanceConfig config, asio::thread_pool& pool,
                        std::shared_ptr<HostedInstance>* out);
  ~HostedInstance() override;

  InstanceMutex& mu() { return mu_; }
  asio::strand<asio::thread_pool::executor_type>& strand() { return strand_; }
  const InstanceConfig& config() const { return config_; }

  // ---- configuration (REQUIRES: mu held) ----
  Status SetPlacement(uint64_t epoch, const std::vector<std::string>& chain, uint64_t chain_version);
  // A failover's re-open of an instance that is busy (a commit of the
  // cancelled attempt holds mu for seconds): the placement is made durable
  // (placement.json) and applied when mu is next taken, by whatever comes
  // next (the rerun's session, a replicate), instead of the failover waiting
  // for the doomed commit. The epoch fence itself is already durable
  // (state service's RaiseEpoch), so the commit cannot complete at the old
  // epoch after its last check. Does NOT need mu: it takes only its own.
  Status DeferPlacement(uint64_t epoch, const std::vector<std::string>& chain, uint64_t chain_version);
  // After a restart: brings the live state back to the newest checkpoint of
  // the store (a commit whose checkpoint never completed was never acknowledged).
  Status Recover();
  // Closes the DB; nothing works afterwards. Pending replications are cancelled.
  void Close();
  // Close, and the CLOSED marker: the files stay, but a restarted worker no
  // longer hosts the instance (§7.1 close).
  Status CloseAndMark();

  // ---- sessions (design §5; REQUIRES: mu held) ----
  bool has_session() const { return session_ != nullptr; }
  uint64_t session_token() const { return session_ ? session_->token : 0; }
  // `req`'s batch, epoch and attempt fence (protocol §7.2 step 1).
  Status OpenSession(uint64_t token, const SessionOpenReq& req, SessionOpenRsp* rsp);
  Status CheckSession(uint64_t token);
  // Aborts the open session if nothing of it came for `idle` (a client that
  // hangs but keeps its connection alive); true if it did.
  bool ExpireIdleSession(std::chrono::steady_clock::duration idle);
  SessionBatch* session_batch() { return session_->writes.get(); }
  // Commit: the reply is called once, on any thread (at once, or when the chain acks).
  // `batch_time_ms`, if set, becomes the TTL clock, written with the version.
  void Commit(uint64_t token, CommitMode mode, std::optional<int64_t> batch_time_ms,
              const std::function<Status()>& check_epoch, CommitReply reply);
  void Abort(uint64_t token);

  // ---- vnode moves (REQUIRES: mu held, no session) ----
  Status ImportFromCheckpoint(const std::string& from_operator, uint32_t from_instance, uint64_t checkpoint_id,
                              const std::vector<uint32_t>& vnodes, std::vector<uint32_t>* imported);
  Status MoveVnodesTo(HostedInstance* target, const std::vector<uint32_t>& vnodes, std::vector<uint32_t>* moved);
  // A handover's step at this instance, at the barrier after batch `version`
  // (design §4 step 4): applies `ops` to the live state (it must be at
  // `version`) and records them as the redo of that version. A new instance
  // (no version, no checkpoint) is instead set to `version` and checkpointed
  // as `version`, with its imports, since it has no checkpoint to redo on;
  // then *replicating is true and `reply` is called once that checkpoint is
  // complete on the chain (at once if the chain is empty).
  Status Reconfigure(uint64_t version, const std::vector<ReconfigOp>& ops, bool* replicating, CommitReply reply);

  // ---- vnodes on a base (design §4.1; REQUIRES: mu held) ----
  // The vnodes on a base not merged yet (none if closed).
  std::map<uint32_t, VnodeBase> Bases() const;
  // Merges vnode `vnode`'s base from `files` (BaseFileWriter's, for `base`):
  // SessionBusy with a session open (merge between batches), Aborted if the
  // vnode is no longer on that base (a rollback or a drop since the copy began).
  Status MergeBase(uint32_t vnode, const VnodeBase& base, const std::vector<std::string>& files,
                   MergeBaseStats* stats);
  // A fresh directory for a base's files (removed by the caller).
  std::string BaseWorkDir(uint32_t vnode) const { return dir_.WorkDir("base-" + std::to_string(vnode)); }
  // A writer of `vnode`'s base files with the state's own options.
  std::unique_ptr<BaseFileWriter> NewBaseFileWriter(const std::string& dir) const;

  // ---- compaction (§7.1 compact) ----
  // A full compaction runs off mu, so that status, metrics and retention
  // never wait for it: BeginCompaction (REQUIRES mu held; SessionBusy with a
  // session open) marks the instance busy and hands out its DB, which stays
  // open until EndCompaction (REQUIRES mu held): a session open meanwhile is
  // SessionBusy, and Close aborts the compaction and waits for its end.
  Status BeginCompaction(StateBackend** db);
  void EndCompaction();

  // ---- status ----
  InstanceMetrics Metrics();
  // "complete", "pending", "failed" (with *message) or "unknown".
  std::string ReplicationStateOf(uint64_t checkpoint_id, std::string* message) const {
    return shipper_.StateOf(checkpoint_id, message);
  }
  std::optional<uint64_t> version() const;
  // The live state's TTL clock (state_backend.h), if it has one.
  std::optional<int64_t> ttl_clock() const { return db_ ? db_->ttl_clock() : std::nullopt; }
  // The newest checkpoint the whole chain holds, if any (store/retention.h).
  std::optional<uint64_t> last_complete() const { return shipper_.last_complete(); }

 private:
  struct Session {
    uint64_t token = 0;
    uint64_t batch_id = 0;
    uint64_t epoch = 0;
    // What the session sees, where that is not batch_id - 1 (issue 47: an
    // explicit start); its commit records it with the version.
    std::optional<VersionBase> base;
    std::unique_ptr<SessionBatch> writes;
    std::chrono::steady_clock::time_point last_activity = std::chrono::steady_clock::now();
    std::string expired;  // why the worker ended it, for the client's next request
  };

  HostedInstance(const InstanceEnv& env, InstanceConfig config, asio::thread_pool& pool);
  StateOptions Options(bool create) const;
  // Options(false) for a restore whose open does not fsync (open_without_sync.h).
  StateOptions UnsyncedOptions() const;
  // The restore of a takeover, a rollback or a handover's origin: the
  // checkpoint stays durable in the store, so the directory is built and
  // opened without waiting for the disk (open_without_sync.h says why), and a
  // batch waits on it, so it runs as latency-critical work.
  static RestoreOptions UnsyncedRestore();
  // Rebuilds the live state at `version` (empty if unset) and drops the
  // store's checkpoints after it (design §5: re-execution).
  Status RollbackTo(std::optional<uint64_t> version);
  // Runs reconfiguration steps on the live state.
  Status ApplyOps(const std::vector<ReconfigOp>& ops);
  // A checkpoint after the redo's version is complete: the redo is in it.
  void MaybeClearRedo(uint64_t complete_id);

  // ---- ChainShipper::Host (REQUIRES: mu held, but Discard and Post) ----
  const InstanceConfig& placement() const override { return config_; }
  bool discard_pending() const override { return config_.discard_pending && env_.discard_on_chain != nullptr; }
  Status Send(uint64_t id, std::function<void(const ReplicationResult&)> done,
              std::unique_ptr<ReplicationHandle>* handle) override;
  Status Discard(const InstanceConfig& asked) override { return env_.discard_on_chain(asked, asked.discard_after); }
  Status Discarded() override;
  void Complete(uint64_t id) override { MaybeClearRedo(id); }
  void Post(std::function<void()> fn) override;
  void Lock() override { mu_.lock(); }
  void Unlock() override { mu_.unlock(); }

  // Applies a deferred placement (InstanceMutex::lock, with mu held).
  friend class InstanceMutex;
  void ApplyDeferredPlacement();

  const InstanceEnv env_;
  asio::strand<asio::thread_pool::executor_type> strand_;
  InstanceMutex mu_{this};
  InstanceConfig config_;
  const InstanceDir dir_;  // of config_'s (operator_id, instance), which never change
  // A placement a re-open deferred, and the epoch and chain version of
  // config_ as last placed (readable without mu): under deferred_mu_, which
  // is taken after mu_ or alone, never before it.
  struct Placement {
    uint64_t epoch = 0;
    std::vector<std::string> chain;
    uint64_t chain_version = 0;
  };
  std::mutex deferred_mu_;
  std::optional<Placement> deferred_;
  uint64_t placed_epoch_ = 0;
  uint64_t placed_chain_version_ = 0;
  std::unique_ptr<StateBackend> db_;
  // The reader of the bases of the vnodes taken on one (design §4.1), kept
  // across sessions while those bases stay the same.
  std::unique_ptr<RemoteBaseReader> base_reader_;
  bool compacting_ = false;                  // between BeginCompaction and EndCompaction
  std::condition_variable_any compacted_;    // notified by EndCompaction; waits on mu_
  std::unique_ptr<Session> session_;
  // The attempt fence (protocol §7.2 step 1, issue 46): the highest attempt
  // token a session has shown here, and the highest committed batch a session
  // said the coordinator holds. A session of a lower token (a superseded
  // attempt) or of an older batch is refused. In memory: a restarted worker
  // learns them again from the next attempt's first session.
  std::optional<uint64_t> max_attempt_;
  std::optional<uint64_t> max_committed_;
  std::map<uint64_t, std::string> expired_;  // token -> why, for sessions the worker ended
  InstanceMetrics m_;  // its counters; the shipper keeps the replication's
  // Declared last: destroyed first, its replication joined while the rest
  // of the instance still exists.
  ChainShipper shipper_{this};
};

}  // namespace rhino
