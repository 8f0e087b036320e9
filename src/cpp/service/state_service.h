// StateService: the part of a worker that hosts the live state of instances
// and serves it to clients (docs/design.md §2, docs/protocol.md §7).
//
// - InstanceReq: open, close, take over, fence, import and move vnodes, list,
//   status. Every one carries the configuration epoch; a request of an epoch
//   below the highest this worker has seen for the instance is refused with
//   StaleEpoch (§7.5). Epochs are persisted under <state_dir>/fences/, so a
//   restarted worker stays fenced.
// - Sessions: a SessionOpenReq on a fresh stream id opens a session on that
//   stream; its Get/Write/Scan frames follow on the same stream, then a
//   SessionCommitReq or SessionAbortReq ends it. A closed connection aborts
//   the session: nothing of it is visible.
//
// Work runs on the service's own threads, never on the connection strands or
// on the data plane's disk threads: a barrier commit waits for a chain whose
// members need their disk threads free. Each instance has a strand, so the
// frames of a session are handled in order and sessions of different
// instances run in parallel; admin requests run on one admin strand.
#pragma once

#include <asio.hpp>

#include <chrono>
#include <map>
#include <thread>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "net/connection.h"
#include "net/service_messages.h"
#include "replication/fence_table.h"
#include "rhino/thread_annotations.h"
#include "service/base_copier.h"
#include "service/checkpoint_holds.h"
#include "service/checkpoint_reader.h"
#include "service/hosted_instance.h"
#include "service/session_stream.h"

namespace rhino {

struct StateServiceOptions {
  std::string worker_id = "worker";
  std::string state_dir;
  std::string secret;
  TlsFiles tls;  // for its clients of other workers; replicate.tls is the built context
  uint32_t threads = 4;
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;
  // The most a session may hold in uncommitted writes (key and value bytes).
  uint64_t max_session_bytes = 1ull << 30;
  ReplicateOptions replicate;
  uint32_t peer_timeout_ms = 3000;
  // A session with no request for this long is aborted (a client that hangs
  // with its connection still alive would hold its instance forever). 0 = never.
  uint32_t session_idle_timeout_ms = 600000;
  // What a peer can make the worker hold (protocol §7.1, "Bounds"): hosted
  // instances (each a RocksDB open, its column families and threads) and
  // open checkpoint readers (each a hard-link restore and a RocksDB open).
  // Over one, the request is refused with ResourceExhausted. 0 = no bound.
  uint32_t max_instances = kDefaultMaxInstances;
  uint32_t max_checkpoint_readers = kDefaultMaxCheckpointReaders;
  // The early hand-over's background copy (design §4.1): bytes of a base's
  // entries read per second, at most (0: no bound).
  uint64_t base_copy_bytes_per_s = 256ull << 20;
};

class StateService {
 public:
  StateService(ReplicaStore* store, net::ConnectionCounters* counters, const StateServiceOptions& options);
  ~StateService();
  StateService(const StateService&) = delete;
  StateService& operator=(const StateService&) = delete;

  // Re-hosts the instances found under state_dir, each brought back to the
  // newest checkpoint in the store (HostedInstance::Recover).
  Status Start();
  // Closes every instance (open sessions are aborted). Idempotent.
  void Shutdown() EXCLUDES(mu_);

  static bool Handles(MessageType type);
  // From the server's unclaimed-frame handler (on the connection's strand).
  std::shared_ptr<net::StreamListener> OnUnclaimed(const std::shared_ptr<net::Connection>& conn,
                                                   const FrameHeader& h, std::shared_ptr<std::string> payload);

  std::vector<InstanceMetrics> Metrics();
  // For retention (store/retention.h): nullopt if the instance is not hosted
  // here; else the oldest checkpoint it may need, 0 (keep all) if it has no
  // complete checkpoint or is busy right now (a commit holds it).
  std::optional<uint64_t> RetentionFloor(const std::string& op, uint32_t instance);

 private:
  using Key = std::pair<std::string, uint32_t>;

  void HandleInstanceReq(const std::shared_ptr<net::Connection>& conn, uint32_t stream_id, const InstanceReq& req,
                         std::chrono::steady_clock::time_point queued);
  Status DoInstanceReq(const InstanceReq& req, std::string* result);
  // One handler per InstanceAction (protocol §7.1; service/instance_actions.cc):
  // each decodes its typed arguments (net/service_messages.h) and writes
  // its JSON answer to *result.
#define RHINO_ACTION_HANDLER(e, code, name, handler, access) Status handler(const InstanceReq& req, std::string* result);
  RHINO_INSTANCE_ACTIONS(RHINO_ACTION_HANDLER)
#undef RHINO_ACTION_HANDLER

  std::shared_ptr<HostedInstance> Find(const std::string& op, uint32_t instance) EXCLUDES(mu_);
  // Find, or UnknownInstance naming this worker.
  Status FindHosted(const std::string& op, uint32_t instance, std::shared_ptr<HostedInstance>* out);
  void Host(const std::shared_ptr<HostedInstance>& inst) EXCLUDES(mu_);
  void Unhost(const std::string& op, uint32_t instance) EXCLUDES(mu_);
  // OK if op/instance is hosted here already or one more fits max_instances;
  // else ResourceExhausted naming the bound (and a log line).
  Status RoomToHost(const std::string& op, uint32_t instance) EXCLUDES(mu_);
  // The newest checkpoint of the instance in this worker's store, or `wanted`
  // if the store holds it; NotFound otherwise.
  Status PickCheckpoint(const std::string& op, uint32_t instance, std::optional<uint64_t> wanted, uint64_t* out);
  Status CheckEpoch(const std::string& op, uint32_t instance, uint64_t epoch);
  Status RaiseEpoch(const std::string& op, uint32_t instance, uint64_t epoch);
  Status DiscardOnChain(const InstanceConfig& config, std::optional<uint64_t> after);
  void Reject(const std::shared_ptr<net::Connection>& conn, const FrameHeader& h, const Status& why);
  // A SessionOpenReq with read_checkpoint: a reader of a committed checkpoint (§7.9).
  std::shared_ptr<net::StreamListener> OpenReader(const std::shared_ptr<net::Connection>& conn, const FrameHeader& h,
                                                  const SessionOpenReq& req);
  void SweepIdleSessions();  // the sweeper thread

  ReplicaStore* const store_;
  net::ConnectionCounters* const counters_;
  const StateServiceOptions options_;
  InstanceEnv env_;
  SessionEnv sessions_;
  ReaderEnv reader_env_;
  const std::shared_ptr<ReaderTable> readers_ = std::make_shared<ReaderTable>();
  FenceTable epochs_;
  asio::thread_pool pool_;
  asio::strand<asio::thread_pool::executor_type> admin_;
  std::atomic<uint64_t> next_token_{1};  // one per session: a late frame of an ended session is refused

  std::thread sweeper_;
  CondVar sweep_cv_;  // with mu_: wakes the sweeper at Shutdown
  std::unique_ptr<BaseCopier> base_copier_;  // the bases of vnodes taken on one, copied and merged
  CheckpointHolds holds_;                    // checkpoints other workers read as a base: kept by retention

  Mutex mu_;
  bool stopped_ GUARDED_BY(mu_) = false;
  std::map<Key, std::shared_ptr<HostedInstance>> instances_ GUARDED_BY(mu_);
};

}  // namespace rhino
