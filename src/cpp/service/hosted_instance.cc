#include "service/hosted_instance.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>

#include <cstdio>
#include <thread>

#include "util/crash_point.h"
#include "util/fs.h"

namespace rhino {

namespace {

bool SameBases(const std::map<uint32_t, VnodeBase>& a, const std::map<uint32_t, VnodeBase>& b) {
  if (a.size() != b.size()) return false;
  for (auto x = a.begin(), y = b.begin(); x != a.end(); ++x, ++y) {
    if (x->first != y->first || x->second.operator_id != y->second.operator_id ||
        x->second.instance != y->second.instance || x->second.checkpoint != y->second.checkpoint ||
        x->second.hosts != y->second.hosts) {
      return false;
    }
  }
  return true;
}

}  // namespace
namespace {

using json = nlohmann::json;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

HostedInstance::HostedInstance(const InstanceEnv& env, InstanceConfig config, asio::thread_pool& pool)
    : env_(env),
      strand_(asio::make_strand(pool.get_executor())),
      config_(std::move(config)),
      dir_(env.state_dir, config_.operator_id, config_.instance) {
  m_.operator_id = config_.operator_id;
  m_.instance = config_.instance;
  placed_epoch_ = config_.epoch;
  placed_chain_version_ = config_.chain_version;
}

void InstanceMutex::lock() {
  m_.lock();
  owner_->ApplyDeferredPlacement();
}

bool InstanceMutex::try_lock() {
  if (!m_.try_lock()) return false;
  owner_->ApplyDeferredPlacement();
  return true;
}

HostedInstance::~HostedInstance() { Close(); }

Status HostedInstance::CloseAndMark() {
  Close();
  return dir_.MarkClosed();
}

namespace {

// Makes a directory built by UnsyncedRestore durable, on a thread of its own:
// the journal commits it waits for are off the failover's critical path (the
// worker's pool threads run sessions). Until it is done, a crash of the host
// may leave the directory damaged, and a restarted worker rebuilds it from the
// store (HostedInstance::Rebuild); so a failure here is only logged. With
// `config`, the instance's config a takeover saved without syncing too: until
// then a crash may leave the config of before the takeover, and the restarted
// worker, a new incarnation, is failed over like a dead one (design §3).
void SyncInBackground(std::string worker_id, std::string db_dir, std::string config = "") {
  std::thread([worker_id = std::move(worker_id), db_dir = std::move(db_dir), config = std::move(config)]() {
    Status s = fs::FsyncDirTree(db_dir);
    if (s.ok() && !config.empty()) s = fs::FsyncPath(config);
    if (s.ok()) s = fs::FsyncParent(db_dir);
    if (!s.ok() && fs::Exists(db_dir)) {
      std::fprintf(stderr, "rhino worker %s: making %s durable: %s (a restart would rebuild it from the store)\n",
                   worker_id.c_str(), db_dir.c_str(), s.ToString().c_str());
    }
  }).detach();
}

}  // namespace

RestoreOptions HostedInstance::UnsyncedRestore() {
  RestoreOptions r;
  r.durable = false;
  r.take_standby = true;  // a replica's ready directory, when it holds that checkpoint
  r.latency_critical = true;  // the recovered batch waits on it (util/sched.h)
  return r;
}

StateOptions HostedInstance::UnsyncedOptions() const {
  StateOptions o = Options(false);
  o.sync_open = false;
  return o;
}

StateOptions HostedInstance::Options(bool create) const {
  StateOptions o;
  o.partitioner = config_.partitioner;
  o.operator_id = config_.operator_id;
  o.instance = config_.instance;
  o.vnodes = config_.vnodes;
  o.error_if_missing = !create;
  return o;
}

Status HostedInstance::Open(const InstanceEnv& env, InstanceConfig config, asio::thread_pool& pool,
                            std::shared_ptr<HostedInstance>* out) {
  std::shared_ptr<HostedInstance> h(new HostedInstance(env, std::move(config), pool));
  std::lock_guard<InstanceMutex> l(h->mu_);
  const bool create = h->config_.db_name.empty();
  if (create) h->config_.db_name = InstanceDir::NewDbName();
  RHINO_RETURN_IF_ERROR(h->dir_.Create());
  RHINO_RETURN_IF_ERROR(StateBackend::Open(h->dir_.DbDir(h->config_.db_name), h->Options(create), &h->db_));
  h->config_.vnodes = h->db_->vnodes();
  RHINO_RETURN_IF_ERROR(h->dir_.SaveConfig(h->config_));
  h->dir_.ClearClosed();
  *out = std::move(h);
  return Status::OK();
}

Status HostedInstance::Takeover(const InstanceEnv& env, InstanceConfig config, uint64_t checkpoint_id,
                                asio::thread_pool& pool, std::shared_ptr<HostedInstance>* out, TakeoverStats* stats) {
  Manifest m;
  RHINO_RETURN_IF_ERROR(env.store->ReadManifest(config.operator_id, config.instance, checkpoint_id, &m));
  config.partitioner = m.partitioner;
  config.vnodes = m.vnodes;
  std::shared_ptr<HostedInstance> h(new HostedInstance(env, std::move(config), pool));
  std::lock_guard<InstanceMutex> l(h->mu_);
  const std::string old_db = h->config_.db_name;
  // Checkpoints after the one taken over belong to a history that ends here.
  std::vector<uint64_t> dropped;
  auto t0 = std::chrono::steady_clock::now();
  RHINO_RETURN_IF_ERROR(env.store->DiscardAfter(h->config_.operator_id, h->config_.instance, checkpoint_id, &dropped));
  stats->discard_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  h->config_.db_name = InstanceDir::NewDbName();
  RHINO_RETURN_IF_ERROR(h->dir_.Create());
  RHINO_RETURN_IF_ERROR(StateBackend::Restore(*env.store, h->config_.operator_id, h->config_.instance, checkpoint_id,
                                              h->dir_.DbDir(h->config_.db_name), UnsyncedRestore(), h->UnsyncedOptions(),
                                              &h->db_, &stats->restore));
  if (h->config_.redo_version && *h->config_.redo_version == checkpoint_id) {
    RHINO_RETURN_IF_ERROR(h->ApplyOps(h->config_.redo));
  } else if (h->config_.redo_version && *h->config_.redo_version > checkpoint_id) {
    h->config_.redo_version.reset();  // a reconfiguration of a later history: not ours
    h->config_.redo.clear();
  }  // else kept: a rollback to that version (a re-executed batch) needs it
  h->config_.vnodes = h->db_->vnodes();
  // The new chain may hold checkpoints after c of the old primary's history.
  h->config_.discard_pending = !h->config_.chain.empty();
  h->config_.discard_after = checkpoint_id;
  t0 = std::chrono::steady_clock::now();
  // Not synced here: its fsyncs waited 5-54 ms for the journal on a busy disk
  // (the recovery bench's `save_s`); durable with the directory, below.
  RHINO_RETURN_IF_ERROR(h->dir_.SaveConfig(h->config_, /*sync=*/false));
  stats->save_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  SyncInBackground(env.worker_id, h->dir_.DbDir(h->config_.db_name), h->dir_.ConfigPath());
  if (!old_db.empty() && old_db != h->config_.db_name) fs::RemoveAll(h->dir_.DbDir(old_db));
  h->shipper_.StartFrom(checkpoint_id);
  h->dir_.ClearClosed();
  *out = std::move(h);
  return Status::OK();
}

Status HostedInstance::Rebuild(const InstanceEnv& env, InstanceConfig config, asio::thread_pool& pool,
                               std::shared_ptr<HostedInstance>* out) {
  std::vector<uint64_t> ids;
  RHINO_RETURN_IF_ERROR(env.store->ListCheckpoints(config.operator_id, config.instance, &ids));
  if (ids.empty()) {
    return Status::NotFound(Describe(config) + " has no checkpoint in this worker's store to rebuild its state from");
  }
  const uint64_t newest = ids.back();
  std::shared_ptr<HostedInstance> h(new HostedInstance(env, std::move(config), pool));
  std::lock_guard<InstanceMutex> l(h->mu_);
  const std::string old_db = h->config_.db_name;
  h->config_.db_name = InstanceDir::NewDbName();
  RHINO_RETURN_IF_ERROR(h->dir_.Create());
  RestoreStats stats;
  RHINO_RETURN_IF_ERROR(StateBackend::Restore(*env.store, h->config_.operator_id, h->config_.instance, newest,
                                              h->dir_.DbDir(h->config_.db_name), RestoreOptions(), h->Options(false),
                                              &h->db_, &stats));
  if (h->config_.redo_version && *h->config_.redo_version == newest) {
    // The live state had the handover at the barrier after `newest` applied.
    RHINO_RETURN_IF_ERROR(h->ApplyOps(h->config_.redo));
  }
  h->config_.vnodes = h->db_->vnodes();
  RHINO_RETURN_IF_ERROR(h->dir_.SaveConfig(h->config_));
  if (!old_db.empty() && old_db != h->config_.db_name) fs::RemoveAll(h->dir_.DbDir(old_db));
  h->dir_.ClearClosed();
  *out = std::move(h);
  return Status::OK();
}

Status HostedInstance::SetPlacement(uint64_t epoch, const std::vector<std::string>& chain, uint64_t chain_version) {
  if (epoch < config_.epoch) {
    return Status::StaleEpoch(Describe(config_) + " is hosted here at epoch " + std::to_string(config_.epoch) +
                              ", above " + std::to_string(epoch));
  }
  if (chain_version < config_.chain_version) {
    return Status::StaleChainVersion(Describe(config_) + " has chain version " +
                                     std::to_string(config_.chain_version) + ", above " +
                                     std::to_string(chain_version));
  }
  config_.epoch = epoch;
  config_.chain = chain;
  config_.chain_version = chain_version;
  {
    std::lock_guard<std::mutex> l(deferred_mu_);
    placed_epoch_ = epoch;
    placed_chain_version_ = chain_version;
  }
  return dir_.SaveConfig(config_);
}

Status HostedInstance::DeferPlacement(uint64_t epoch, const std::vector<std::string>& chain, uint64_t chain_version) {
  std::lock_guard<std::mutex> l(deferred_mu_);
  // Stale against what is placed or already deferred: the same checks as SetPlacement's.
  const uint64_t e = deferred_ ? deferred_->epoch : placed_epoch_;
  const uint64_t v = deferred_ ? deferred_->chain_version : placed_chain_version_;
  if (epoch < e) {
    return Status::StaleEpoch(Describe(config_) + " is placed here at epoch " +
                              std::to_string(e) + ", above " + std::to_string(epoch));
  }
  if (chain_version < v) {
    return Status::StaleChainVersion(Describe(config_) + " has chain version " +
                                     std::to_string(v) + ", above " + std::to_string(chain_version));
  }
  // Durable before the answer: a worker restarted before mu is next taken
  // hosts the instance at this placement (InstanceDir::ListHostable).
  RHINO_RETURN_IF_ERROR(dir_.SavePlacement(epoch, chain, chain_version));
  deferred_ = Placement{epoch, chain, chain_version};
  return Status::OK();
}

void HostedInstance::ApplyDeferredPlacement() {
  std::optional<Placement> p;
  {
    std::lock_guard<std::mutex> l(deferred_mu_);
    p.swap(deferred_);
    if (!p) return;
    if (p->epoch < config_.epoch || (p->epoch == config_.epoch && p->chain_version < config_.chain_version)) return;
    placed_epoch_ = p->epoch;
    placed_chain_version_ = p->chain_version;
  }
  config_.epoch = p->epoch;
  config_.chain = std::move(p->chain);
  config_.chain_version = p->chain_version;
  // placement.json holds it durably until instance.json is saved again:
  // nothing to write here, on the path of whoever took the lock.
}

std::optional<uint64_t> HostedInstance::version() const {
  if (!db_) return std::nullopt;
  return db_->version();
}

Status HostedInstance::Recover() {
  std::vector<uint64_t> ids;
  RHINO_RETURN_IF_ERROR(env_.store->ListCheckpoints(config_.operator_id, config_.instance, &ids));
  std::optional<uint64_t> newest;
  if (!ids.empty()) newest = ids.back();
  std::optional<uint64_t> live = db_ ? db_->version() : std::nullopt;
  if (live == newest) return Status::OK();
  // A commit wrote version v and the worker died before checkpoint v was
  // committed: the client never got an ack and will run the batch again.
  return RollbackTo(newest);
}

void HostedInstance::Close() {
  std::unique_ptr<StateBackend> db;
  {
    shipper_.Cancel("the instance was closed");
    session_.reset();
    // A compaction runs off the lock on this DB (BeginCompaction): stop it,
    // and wait (mu_ released meanwhile) until it no longer uses the DB.
    // Every caller but the destructor holds mu_; the destructor never meets
    // a compaction, which holds a reference to the instance.
    while (compacting_) {
      db_->AbortCompaction();
      compacted_.wait(mu_);
    }
    db = std::move(db_);
  }
}

Status HostedInstance::BeginCompaction(StateBackend** db) {
  if (!db_) return Status::UnknownInstance(Describe(config_) + " is closed");
  if (session_) return Status::SessionBusy(Describe(config_) + " has an open session: compact between batches");
  if (compacting_) return Status::SessionBusy(Describe(config_) + " is being compacted already");
  compacting_ = true;
  *db = db_.get();
  return Status::OK();
}

void HostedInstance::EndCompaction() {
  compacting_ = false;
  compacted_.notify_all();
}

Status HostedInstance::RollbackTo(std::optional<uint64_t> version) {
  shipper_.Cancel("batch " + (version ? std::to_string(*version + 1) : std::string("0")) + " is re-executed");
  const std::string old_name = config_.db_name;
  const std::string new_name = InstanceDir::NewDbName();
  std::vector<uint32_t> vnodes = db_ ? db_->vnodes() : config_.vnodes;
  db_.reset();
  std::vector<uint64_t> dropped;
  Status s = env_.store->DiscardAfter(config_.operator_id, config_.instance, version, &dropped);
  if (s.ok()) {
    if (version) {
      RestoreStats stats;
      s = StateBackend::Restore(*env_.store, config_.operator_id, config_.instance, *version, dir_.DbDir(new_name),
                                UnsyncedRestore(), UnsyncedOptions(), &db_, &stats);
      if (s.ok()) SyncInBackground(env_.worker_id, dir_.DbDir(new_name));
    } else {
      config_.vnodes = vnodes;
      s = StateBackend::Open(dir_.DbDir(new_name), Options(true), &db_);
    }
  }
  if (!s.ok()) {
    // Keep serving the state we had rather than nothing.
    fs::RemoveAll(dir_.DbDir(new_name));
    Status r = StateBackend::Open(dir_.DbDir(old_name), Options(false), &db_);
    return Status::FromCode(WireCode(s), "cannot roll " + Describe(config_) + " back to " +
                                             (version ? "checkpoint " + std::to_string(*version) : "empty") + ": " +
                                             s.message() + (r.ok() ? "" : "; reopening its state failed too: " + r.message()));
  }
  config_.db_name = new_name;
  if (version && config_.redo_version == version) {
    // Checkpoint b predates the handover at the barrier after b: run it again.
    Status r = ApplyOps(config_.redo);
    if (!r.ok()) return Status::FromCode(WireCode(r), "rolling " + Describe(config_) + " back to checkpoint " +
                                                          std::to_string(*version) + ", redoing its handover: " + r.message());
  }
  config_.vnodes = db_->vnodes();
  if (!config_.chain.empty()) {
    // Drop what the chain holds after `version` (the lowest point rolled back to).
    if (!config_.discard_pending || !version || (config_.discard_after && *version < *config_.discard_after)) {
      config_.discard_after = version;
    }
    config_.discard_pending = true;
  }
  RHINO_RETURN_IF_ERROR(dir_.SaveConfig(config_));
  fs::RemoveAll(dir_.DbDir(old_name));
  m_.rollbacks++;
  shipper_.RolledBackTo(version);
  return Status::OK();
}

Status HostedInstance::OpenSession(uint64_t token, const SessionOpenReq& req, SessionOpenRsp* rsp) {
  const uint64_t batch = req.batch;
  const uint64_t epoch = req.epoch;
  if (!db_) return Status::UnknownInstance(Describe(config_) + " is closed");
  if (session_) {
    return Status::SessionBusy(Describe(config_) + " already has an open session (batch " +
                               std::to_string(session_->batch_id) + ")");
  }
  if (compacting_) return Status::SessionBusy(Describe(config_) + " is being compacted (the compact action)");
  if (epoch != config_.epoch) {
    return Status::StaleEpoch("session at epoch " + std::to_string(epoch) + " for " + Describe(config_) +
                              ", which this worker hosts at epoch " + std::to_string(config_.epoch));
  }
  // The attempt fence (protocol §7.2 step 1): Spark never legitimately runs a
  // batch older than the last one the coordinator committed (that one may run
  // again: a replay), and a task of a superseded attempt (a lower token than
  // one already seen here) is a zombie. Checked before the rollback below, so
  // a refused session changes nothing.
  if (req.has_attempt && max_attempt_ && req.attempt < *max_attempt_) {
    return Status::StaleAttempt("a session of attempt " + std::to_string(req.attempt) + " for batch " +
                                std::to_string(batch) + " of " + Describe(config_) + ", where attempt " +
                                std::to_string(*max_attempt_) + " has begun since: a task of a superseded attempt");
  }
  std::optional<uint64_t> committed = max_committed_;
  if (req.has_attempt && req.has_committed && (!committed || req.committed > *committed)) committed = req.committed;
  if (committed && batch < *committed) {
    return Status::StaleAttempt("a session for batch " + std::to_string(batch) + " of " + Describe(config_) +
                                ", older than batch " + std::to_string(*committed) +
                                ", which the coordinator has committed: only that batch (a replay) or the next runs");
  }
  // Only a session that passed the fence raises it.
  if (req.has_attempt) max_attempt_ = req.attempt;
  max_committed_ = committed;
  // Design §5: the session for batch b sees exactly version b-1. A fenced
  // session sees the operator's last committed batch as its attempt began,
  // which the coordinator's begin_batch makes b-1 too, except where it was
  // asked to start the operator at b (issue 47: an operator inserted into a
  // running chain starts from no version at b > 0; one re-added after a removal
  // resumes at b from the batch it last committed, across the gap). The
  // highest committed batch any session has shown, not the request's own: a
  // session naming an older one cannot roll back what was committed since.
  std::optional<uint64_t> want;
  if (batch > 0) want = batch - 1;
  const bool named = req.has_attempt && (!committed || *committed < batch);
  if (named) want = committed;
  std::optional<uint64_t> live = db_->version();
  // A batch run again without its fence naming the base (a replay) goes back
  // to what its first run was built on, which its commit recorded.
  if (!named && live && *live == batch) {
    if (std::optional<VersionBase> recorded = db_->BaseOf(batch)) want = recorded->version;
  }
  bool rolled_back = false;
  if (live != want) {
    const bool ahead = live && (!want || *live > *want);
    if (!ahead) {
      return Status::InvalidArgument("batch " + std::to_string(batch) + " of " + Describe(config_) +
                                     " needs the state at version " + (want ? std::to_string(*want) : "none") +
                                     ", but it is at " + (live ? "version " + std::to_string(*live) : "no version") +
                                     ": earlier batches were not committed here");
    }
    // Batch b runs again (a retried, speculative or re-run task): back to the
    // version it sees by a local hard-link restore. Only the last batch can run
    // again, so the live state must be at b itself: Spark runs b+1 only after
    // b's commit, so a session for an older batch at this epoch is stale work
    // (a zombie task of a superseded attempt), and honouring it would erase
    // committed batches (issue 46). (Where want is b-1 this is the one-version
    // rule; after a gap, b's own rollback goes back over the gap.)
    if (*live != batch) {
      return Status::StaleEpoch("a session for batch " + std::to_string(batch) + " of " + Describe(config_) +
                                " at epoch " + std::to_string(epoch) + ", whose state is at version " +
                                std::to_string(*live) + ": only the last committed batch runs again"
                                " (a task of a superseded attempt?)");
    }
    if (want) {
      std::vector<uint64_t> ids;
      RHINO_RETURN_IF_ERROR(env_.store->ListCheckpoints(config_.operator_id, config_.instance, &ids));
      if (!std::binary_search(ids.begin(), ids.end(), *want)) {
        return Status::NotFound("batch " + std::to_string(batch) + " of " + Describe(config_) +
                                " is re-executed, but checkpoint " + std::to_string(*want) +
                                " is not in this worker's store to roll back to");
      }
    }
    RHINO_RETURN_IF_ERROR(RollbackTo(want));
    rolled_back = true;
  }
  session_ = std::make_unique<Session>();
  session_->token = token;
  session_->batch_id = batch;
  session_->epoch = epoch;
  if (want != (batch > 0 ? std::optional<uint64_t>(batch - 1) : std::nullopt)) session_->base = VersionBase{want};
  session_->writes = std::make_unique<SessionBatch>(db_.get());
  // Vnodes taken on a base read what they do not hold through to it.
  std::map<uint32_t, VnodeBase> bases = db_->VnodeBases();
  if (bases.empty()) {
    base_reader_.reset();
  } else {
    if (!base_reader_ || !SameBases(base_reader_->bases(), bases)) {
      base_reader_ = std::make_unique<RemoteBaseReader>(std::move(bases), env_.peers);
    }
    session_->writes->SetBaseReader(base_reader_.get());
  }
  m_.sessions_opened++;
  rsp->has_version = want.has_value();
  rsp->version = want.value_or(0);
  rsp->rolled_back = rolled_back;
  return Status::OK();
}

Status HostedInstance::CheckSession(uint64_t token) {
  if (!session_ || session_->token != token) {
    auto it = expired_.find(token);
    if (it != expired_.end()) return Status::Aborted("the session on " + Describe(config_) + " " + it->second);
    return Status::Aborted("the session on " + Describe(config_) + " is no longer open");
  }
  session_->last_activity = std::chrono::steady_clock::now();
  return Status::OK();
}

bool HostedInstance::ExpireIdleSession(std::chrono::steady_clock::duration idle) {
  if (!session_ || std::chrono::steady_clock::now() - session_->last_activity < idle) return false;
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(idle).count();
  expired_[session_->token] = "was aborted by the worker after " + std::to_string(secs) +
                              " s without a request (--session-idle-timeout)";
  while (expired_.size() > 64) expired_.erase(expired_.begin());
  session_.reset();  // nothing of it was written
  m_.sessions_aborted++;
  m_.sessions_expired++;
  return true;
}

void HostedInstance::Abort(uint64_t token) {
  if (session_ && session_->token == token) {
    session_.reset();  // nothing of it was written
    m_.sessions_aborted++;
  }
}

void HostedInstance::Commit(uint64_t token, CommitMode mode, std::optional<int64_t> batch_time_ms,
                            const std::function<Status()>& check_epoch, CommitReply reply) {
  SessionCommitRsp rsp;
  auto fail = [&](const Status& s) {
    m_.commit_failures++;
    rsp.code = WireCode(s);
    rsp.message = s.message();
    reply(rsp);
  };
  Status s = CheckSession(token);
  if (!s.ok()) return fail(s);
  DelayPoint("service.commit");  // a test's slow commit, holding the instance (mu_)
  std::unique_ptr<Session> sess = std::move(session_);
  // Fenced while the session ran: nothing of it is written (design §5).
  // Placed at a new epoch meanwhile (a re-open between its frames, or one
  // deferred until this commit took the instance) counts as fenced too.
  s = check_epoch();
  if (s.ok() && sess->epoch != config_.epoch) {
    s = Status::StaleEpoch("the session on " + Describe(config_) + " was opened at epoch " +
                           std::to_string(sess->epoch) + "; the instance has moved to epoch " +
                           std::to_string(config_.epoch));
  }
  if (!s.ok()) {
    m_.sessions_aborted++;
    return fail(s);
  }
  const uint64_t b = sess->batch_id;
  const std::optional<uint64_t> before = db_->version();
  const uint64_t keys = sess->writes->count(), bytes = sess->writes->bytes();
  const double t0 = Now();
  s = sess->writes->Commit(b, batch_time_ms, sess->base);
  const double t1 = Now();
  if (!s.ok()) return fail(s);
  // A worker killed here has version b written but no checkpoint b: its
  // restart rolls back to b-1 (Recover), and the unacknowledged batch runs again.
  CrashPoint("service.after_write");
  Manifest m;
  s = db_->Checkpoint(env_.store, b, config_.epoch, &m);
  const double t2 = Now();
  if (!s.ok()) {
    // Without checkpoint b the write is not a commit: undo it, so the live
    // state and the store agree again.
    Status r = RollbackTo(before);
    return fail(r.ok() ? s : Status::FromCode(WireCode(s), s.message() + "; undoing the write failed: " + r.message()));
  }
  CrashPoint("service.after_checkpoint");  // before the chain has it: the client got no ack
  m_.commits++;
  m_.keys_written += keys;
  m_.bytes_written += bytes;
  m_.write_seconds += t1 - t0;
  m_.checkpoint_seconds += t2 - t1;
  rsp.version = b;
  json stats{{"write_s", t1 - t0},
             {"checkpoint_s", t2 - t1},
             {"keys", keys},
             {"bytes", bytes},
             {"checkpoint_bytes", m.total_bytes()},
             {"delta_bytes", m.delta_bytes()},
             {"delta_files", m.delta_files()},
             {"files", m.files.size()}};
  if (config_.chain.empty()) {
    stats["replication"] = "none";
    shipper_.CompleteWithoutChain(b);
    MaybeClearRedo(b);
    rsp.stats = stats.dump();
    reply(rsp);
    return;
  }
  stats["replication"] = mode == CommitMode::kBarrier ? "complete" : "pending";
  stats["chain"] = config_.chain;
  rsp.stats = stats.dump();
  if (mode == CommitMode::kBarrier) return shipper_.Ship(b, rsp, std::move(reply));
  shipper_.Ship(b, rsp, nullptr);
  reply(rsp);
}

Status HostedInstance::Send(uint64_t id, std::function<void(const ReplicationResult&)> done,
                            std::unique_ptr<ReplicationHandle>* handle) {
  ReplicateOptions o = env_.replicate;
  o.on_done = std::move(done);
  // Returns at once: the transfer runs on the replication's own threads.
  return ReplicateCheckpoint(env_.store, config_.operator_id, config_.instance, id, config_.chain,
                             config_.chain_version, env_.credential, o, handle);
}

Status HostedInstance::Discarded() {
  config_.discard_pending = false;
  return dir_.SaveConfig(config_);
}

void HostedInstance::Post(std::function<void()> fn) {
  std::weak_ptr<HostedInstance> weak = weak_from_this();
  asio::post(strand_, [weak, fn = std::move(fn)]() {
    if (auto self = weak.lock()) fn();  // the instance, and so its shipper, lives while fn runs
  });
}

InstanceMetrics HostedInstance::Metrics() {
  InstanceMetrics m = m_;
  m.epoch = config_.epoch;
  auto v = version();
  m.has_version = v.has_value();
  m.version = v.value_or(0);
  m.session_open = session_ != nullptr;
  m.replications_pending = shipper_.pending();
  m.has_complete = shipper_.last_complete().has_value();
  m.last_complete = shipper_.last_complete().value_or(0);
  m.bytes_replicated = shipper_.bytes_shipped();
  m.replicate_seconds = shipper_.ship_seconds();
  m.vnodes = static_cast<uint32_t>(config_.vnodes.size());
  return m;
}

}  // namespace rhino
