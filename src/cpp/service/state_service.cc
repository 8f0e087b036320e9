#include "service/state_service.h"

#include "net/permissions.h"

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "client/state_client.h"
#include "rhino/manifest.h"
#include "service/session_stream.h"
#include "util/fs.h"

namespace rhino {
namespace {

std::string Describe(const std::string& op, uint32_t instance) { return op + "/" + std::to_string(instance); }

}  // namespace

// ---------------------------------------------------------------- the service

StateService::StateService(ReplicaStore* store, net::ConnectionCounters* counters, const StateServiceOptions& options)
    : store_(store),
      counters_(counters),
      options_(options),
      epochs_(options.state_dir, "epoch"),
      pool_(std::max<uint32_t>(1, options.threads)),
      admin_(asio::make_strand(pool_.get_executor())),
      holds_(fs::Join(options.state_dir, "holds")) {
  env_.worker_id = options.worker_id;
  env_.state_dir = options.state_dir;
  env_.store = store;
  env_.credential = Credential::FromRoot(options.secret, PeerRole::kWorker, options.worker_id);
  env_.replicate = options.replicate;
  env_.replicate.client_id = options.worker_id;
  env_.peers.client_id = options.worker_id;
  env_.peers.credential = env_.credential;
  env_.peers.tls = options.tls;
  env_.peers.max_frame_bytes = options.max_frame_bytes;
  env_.peers.peer_timeout_ms = options.peer_timeout_ms;
  env_.peers.request_timeout_ms = 30000;
  env_.discard_on_chain = [this](const InstanceConfig& c, std::optional<uint64_t> after) {
    return DiscardOnChain(c, after);
  };
  sessions_.max_frame_bytes = options.max_frame_bytes;
  sessions_.max_session_bytes = options.max_session_bytes;
  sessions_.counters = counters;
  sessions_.check_epoch = [this](const std::string& op, uint32_t i, uint64_t epoch) { return CheckEpoch(op, i, epoch); };
  reader_env_.worker_id = options.worker_id;
  reader_env_.work_dir = InstanceDir::TmpDir(options.state_dir);  // what InstanceDir::PrepareStateDir empties
  reader_env_.store = store;
  reader_env_.max_frame_bytes = options.max_frame_bytes;
  reader_env_.counters = counters;
}

StateService::~StateService() { Shutdown(); }

bool StateService::Handles(MessageType type) {
  // Protocol §7's types, 17..29, and no others: types added after them (the
  // coordinator's, §8) are not the service's, and the replica server refuses them.
  return static_cast<uint8_t>(type) >= static_cast<uint8_t>(MessageType::kInstanceReq) &&
         static_cast<uint8_t>(type) <= static_cast<uint8_t>(MessageType::kSessionAbortReq);
}

Status StateService::Start() {
  if (options_.state_dir.empty()) return Status::InvalidArgument("the state service needs a state directory");
  RHINO_RETURN_IF_ERROR(InstanceDir::PrepareStateDir(options_.state_dir));
  auto complain = [this](const std::string& what, const Status& s) {
    // One damaged instance must not keep the worker from serving the others.
    std::fprintf(stderr, "rhino worker %s: cannot host %s again: %s\n", options_.worker_id.c_str(), what.c_str(),
                 s.ToString().c_str());
  };
  std::vector<InstanceConfig> found;
  RHINO_RETURN_IF_ERROR(InstanceDir::ListHostable(options_.state_dir, &found, complain));
  for (auto& c : found) {
    const std::string what = Describe(c.operator_id, c.instance);
    std::shared_ptr<HostedInstance> inst;
    Status s = HostedInstance::Open(env_, c, pool_, &inst);
    if (s.ok()) {
      std::lock_guard<InstanceMutex> l(inst->mu());
      s = inst->Recover();
    }
    if (!s.ok()) {
      // Its live state is damaged (a crash right after a takeover, whose
      // directory is made durable after the fact): its checkpoints are not.
      inst.reset();
      Status r = HostedInstance::Rebuild(env_, c, pool_, &inst);
      if (!r.ok()) {
        complain(what, Status::FromCode(static_cast<uint32_t>(s.code()), s.message() + "; rebuilding it from the store failed too: " +
                                                      r.message()));
        continue;
      }
      std::fprintf(stderr, "rhino worker %s: %s: its state could not be opened (%s); rebuilt from checkpoint %s of "
                   "the store\n", options_.worker_id.c_str(), what.c_str(), s.ToString().c_str(),
                   inst->version() ? std::to_string(*inst->version()).c_str() : "?");
    }
    Host(inst);
  }
  if (options_.session_idle_timeout_ms > 0) sweeper_ = std::thread([this]() { SweepIdleSessions(); });
  RHINO_RETURN_IF_ERROR(holds_.Load());
  base_copier_ = std::make_unique<BaseCopier>(
      [this] {
        std::vector<std::shared_ptr<HostedInstance>> all;
        MutexLock l(&mu_);
        for (auto& [key, inst] : instances_) all.push_back(inst);
        return all;
      },
      env_.peers, options_.base_copy_bytes_per_s);
  base_copier_->Start();
  return Status::OK();
}

void StateService::SweepIdleSessions() {
  const auto idle = std::chrono::milliseconds(options_.session_idle_timeout_ms);
  const auto tick = std::min<std::chrono::milliseconds>(idle / 4 + std::chrono::milliseconds(1),
                                                         std::chrono::milliseconds(1000));
  MutexLock l(&mu_);
  while (!stopped_) {
    sweep_cv_.WaitFor(&mu_, tick);
    if (stopped_) break;
    std::vector<std::shared_ptr<HostedInstance>> all;
    for (auto& [k, inst] : instances_) all.push_back(inst);
    l.Unlock();
    for (auto& inst : all) {
      // On the instance's strand, in order with its session's frames.
      asio::post(inst->strand(), [inst, idle]() {
        std::lock_guard<InstanceMutex> g(inst->mu());
        inst->ExpireIdleSession(idle);
      });
    }
    for (auto& r : readers_->All()) r->ExpireIfIdle(idle);
    l.Lock();
  }
}

void StateService::Shutdown() {
  std::map<Key, std::shared_ptr<HostedInstance>> all;
  {
    MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    all.swap(instances_);
  }
  sweep_cv_.SignalAll();
  if (sweeper_.joinable()) sweeper_.join();
  if (base_copier_) base_copier_->Stop();
  for (auto& r : readers_->All()) r->End("ended: worker " + options_.worker_id + " shut down");
  for (auto& [key, inst] : all) {
    std::lock_guard<InstanceMutex> l(inst->mu());
    inst->Close();
  }
  pool_.join();
}

std::shared_ptr<HostedInstance> StateService::Find(const std::string& op, uint32_t instance) {
  MutexLock l(&mu_);
  auto it = instances_.find({op, instance});
  return it == instances_.end() ? nullptr : it->second;
}

Status StateService::FindHosted(const std::string& op, uint32_t instance, std::shared_ptr<HostedInstance>* out) {
  *out = Find(op, instance);
  if (*out) return Status::OK();
  return Status::UnknownInstance("worker " + options_.worker_id + " does not host " + Describe(op, instance));
}

void StateService::Host(const std::shared_ptr<HostedInstance>& inst) {
  MutexLock l(&mu_);
  instances_[{inst->config().operator_id, inst->config().instance}] = inst;
}

Status StateService::RoomToHost(const std::string& op, uint32_t instance) {
  MutexLock l(&mu_);
  const uint32_t max = options_.max_instances;
  if (max == 0 || instances_.count({op, instance}) > 0 || instances_.size() < max) return Status::OK();
  const Status s = Status::ResourceExhausted("worker " + options_.worker_id + " hosts " + std::to_string(max) +
                                             " instances, its limit (--max-instances): not hosting " +
                                             Describe(op, instance));
  std::fprintf(stderr, "rhino worker %s: %s\n", options_.worker_id.c_str(), s.message().c_str());
  return s;
}

void StateService::Unhost(const std::string& op, uint32_t instance) {
  MutexLock l(&mu_);
  instances_.erase({op, instance});
}

Status StateService::CheckEpoch(const std::string& op, uint32_t instance, uint64_t epoch) {
  Status s = epochs_.Check(op, instance, epoch);
  if (s.IsStaleChainVersion()) {
    return Status::StaleEpoch("worker " + options_.worker_id + ": " + s.message());
  }
  return s;
}

Status StateService::RaiseEpoch(const std::string& op, uint32_t instance, uint64_t epoch) {
  bool raised = false;
  Status s = epochs_.Observe(op, instance, epoch, &raised);
  if (s.IsStaleChainVersion()) {
    return Status::StaleEpoch("worker " + options_.worker_id + ": " + s.message());
  }
  return s;
}

Status StateService::DiscardOnChain(const InstanceConfig& config, std::optional<uint64_t> after) {
  StateClientOptions o;
  o.client_id = options_.worker_id;
  o.credential = env_.credential;
  o.tls = options_.tls;
  o.max_frame_bytes = options_.max_frame_bytes;
  o.peer_timeout_ms = options_.peer_timeout_ms;
  o.request_timeout_ms = 30000;
  DiscardAfterArgs discard;
  discard.after = after;
  const std::string args = EncodeInstanceArgs(discard);
  for (const auto& member : config.chain) {
    std::shared_ptr<StateClient> c;
    std::string result;
    Status s = StateClient::Connect(member, o, &c);
    if (s.ok()) {
      s = c->Instance(InstanceAction::kDiscardAfter, config.operator_id, config.instance, config.epoch, args, &result);
    }
    if (!s.ok()) {
      return Status::FromCode(WireCode(s), "cannot drop the re-executed checkpoints of " +
                                               Describe(config.operator_id, config.instance) + " on " + member +
                                               ": " + s.message());
    }
  }
  return Status::OK();
}

void StateService::Reject(const std::shared_ptr<net::Connection>& conn, const FrameHeader& h, const Status& why) {
  if (counters_ != nullptr) counters_->frames_rejected.fetch_add(1);
  conn->CloseWithError(h.stream_id, why);
}

std::shared_ptr<net::StreamListener> StateService::OnUnclaimed(const std::shared_ptr<net::Connection>& conn,
                                                               const FrameHeader& h,
                                                               std::shared_ptr<std::string> payload) {
  switch (h.type) {
    case MessageType::kInstanceReq: {
      InstanceReq req;
      Status s = InstanceReq::Decode(*payload, &req);
      if (!s.ok()) {
        Reject(conn, h, Status::Corruption("invalid InstanceReq: " + s.message()));
        return nullptr;
      }
      s = net::PermitInstanceAction(conn->peer(), static_cast<InstanceAction>(req.action), req.operator_id,
                                    "worker " + options_.worker_id);
      if (!s.ok()) {
        net::LogRefusal(s);
        conn->Send(MessageType::kInstanceRsp, h.stream_id, 0, ServiceErrorPayload(MessageType::kInstanceRsp, s));
        return nullptr;
      }
      std::weak_ptr<net::Connection> weak = conn;
      const uint32_t sid = h.stream_id;
      const auto queued = std::chrono::steady_clock::now();
      auto handle = [this, weak, sid, req, queued]() {
        if (auto c = weak.lock()) HandleInstanceReq(c, sid, req, queued);
      };
      // `status` only reads: it runs beside the admin strand, so a failover's
      // question to a chain member never queues behind a long request there
      // (a takeover, a bulk copy, or a status that waits for a commit).
      if (static_cast<InstanceAction>(req.action) == InstanceAction::kStatus) {
        asio::post(pool_, std::move(handle));
      } else {
        asio::post(admin_, std::move(handle));
      }
      return nullptr;
    }
    case MessageType::kSessionOpenReq: {
      SessionOpenReq req;
      Status s = SessionOpenReq::Decode(*payload, &req);
      if (!s.ok()) {
        Reject(conn, h, Status::Corruption("invalid SessionOpenReq: " + s.message()));
        return nullptr;
      }
      s = net::PermitRequest(conn->peer(), h.type, req.operator_id, "worker " + options_.worker_id,
                             req.read_checkpoint);
      if (!s.ok()) {
        net::LogRefusal(s);
        conn->Send(MessageType::kSessionOpenRsp, h.stream_id, 0, ServiceErrorPayload(MessageType::kSessionOpenRsp, s));
        return nullptr;
      }
      if (req.read_checkpoint) return OpenReader(conn, h, req);
      std::shared_ptr<HostedInstance> inst = Find(req.operator_id, req.instance);
      if (!inst) {
        s = CheckEpoch(req.operator_id, req.instance, req.epoch);
        if (s.ok()) {
          s = Status::UnknownInstance("worker " + options_.worker_id + " does not host " +
                                      Describe(req.operator_id, req.instance));
        }
        conn->Send(MessageType::kSessionOpenRsp, h.stream_id, 0, ServiceErrorPayload(MessageType::kSessionOpenRsp, s));
        return nullptr;
      }
      auto stream = std::make_shared<SessionStream>(&sessions_, conn, h.stream_id, inst, next_token_.fetch_add(1));
      stream->Open(req);
      return stream;
    }
    case MessageType::kGetReq:
    case MessageType::kWriteReq:
    case MessageType::kScanReq:
    case MessageType::kSessionCommitReq:
    case MessageType::kSessionAbortReq: {
      // A frame on a stream whose session has ended (or never opened).
      MessageType rsp = h.type == MessageType::kGetReq        ? MessageType::kGetRsp
                        : h.type == MessageType::kScanReq     ? MessageType::kScanRsp
                        : h.type == MessageType::kSessionCommitReq ? MessageType::kSessionCommitRsp
                                                                   : MessageType::kSessionRsp;
      conn->Send(rsp, h.stream_id, 0,
                 ServiceErrorPayload(rsp, Status::Aborted("no open session on stream " + std::to_string(h.stream_id))));
      return nullptr;
    }
    default:
      // Answers (…Rsp) are never sent to a worker.
      Reject(conn, h, Status::Corruption(std::string("unexpected ") + MessageTypeName(h.type) + " sent to a worker"));
      return nullptr;
  }
}

std::shared_ptr<net::StreamListener> StateService::OpenReader(const std::shared_ptr<net::Connection>& conn,
                                                              const FrameHeader& h, const SessionOpenReq& req) {
  const uint64_t token = next_token_.fetch_add(1);
  auto reader = std::make_shared<ReaderStream>(&reader_env_, readers_, pool_, conn, h.stream_id, token);
  {
    // In the table before Shutdown can look, or refused: none is left open.
    MutexLock l(&mu_);
    if (stopped_) {
      conn->Send(MessageType::kSessionOpenRsp, h.stream_id, 0,
                 ServiceErrorPayload(MessageType::kSessionOpenRsp,
                                     Status::Aborted("worker " + options_.worker_id + " is shutting down")));
      return nullptr;
    }
    if (!readers_->AddIfRoom(token, reader, options_.max_checkpoint_readers)) {
      const Status s = Status::ResourceExhausted(
          "worker " + options_.worker_id + " has " + std::to_string(options_.max_checkpoint_readers) +
          " checkpoint readers open, its limit (--max-checkpoint-readers): close one first");
      std::fprintf(stderr, "rhino worker %s: refused a checkpoint reader of %.128s/%u: %s\n",
                   options_.worker_id.c_str(), req.operator_id.c_str(), req.instance, s.message().c_str());
      conn->Send(MessageType::kSessionOpenRsp, h.stream_id, 0, ServiceErrorPayload(MessageType::kSessionOpenRsp, s));
      return nullptr;
    }
  }
  // A worker reading a named checkpoint reads it as a base (design §4.1): retention keeps it a while.
  if (conn->peer().role == PeerRole::kWorker && req.has_checkpoint) {
    Status held = holds_.Hold(req.operator_id, req.instance, req.checkpoint);
    if (!held.ok()) {
      std::fprintf(stderr, "rhino worker %s: cannot hold checkpoint %llu of %.128s/%u for a base: %s\n",
                   options_.worker_id.c_str(), static_cast<unsigned long long>(req.checkpoint),
                   req.operator_id.c_str(), req.instance, held.ToString().c_str());
    }
  }
  reader->Open(req);
  return reader;
}

void StateService::HandleInstanceReq(const std::shared_ptr<net::Connection>& conn, uint32_t stream_id,
                                     const InstanceReq& req, std::chrono::steady_clock::time_point queued) {
  InstanceRsp rsp;
  // How long the request waited for the admin strand (behind other admin
  // requests, or for a free service thread): a failover's requests report it.
  const double queued_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - queued).count();
  Status s = DoInstanceReq(req, &rsp.result);
  rsp.code = WireCode(s);
  rsp.message = s.message();
  if (!s.ok()) {
    rsp.result.clear();
  } else if (!rsp.result.empty() && rsp.result.front() == '{') {
    nlohmann::json out = nlohmann::json::parse(rsp.result, nullptr, /*allow_exceptions=*/false);
    if (out.is_object()) {
      out["queued_s"] = queued_s;
      rsp.result = out.dump();
    }
  }
  if (s.code() == Status::Code::kInvalidArgument) {
    // Bad input from a peer (malformed or too deeply nested arguments, an unknown action):
    // answered with its name, and left in the log for whoever sent it.
    std::fprintf(stderr, "rhino worker %s: refused an instance request (action %u, operator '%.128s'): %.300s\n",
                 options_.worker_id.c_str(), static_cast<unsigned>(req.action), req.operator_id.c_str(),
                 s.message().c_str());
  }
  if (queued_s > 0.5) {
    std::fprintf(stderr, "rhino worker %s: an instance request (action %u) waited %.3f s to run\n",
                 options_.worker_id.c_str(), static_cast<unsigned>(req.action), queued_s);
  }
  conn->Send(MessageType::kInstanceRsp, stream_id, 0, rsp.Encode());
}

Status StateService::DoInstanceReq(const InstanceReq& req, std::string* result) {
  {
    MutexLock l(&mu_);
    if (stopped_) return Status::Aborted("worker " + options_.worker_id + " is shutting down");
  }
  const auto action = static_cast<InstanceAction>(req.action);
  if (action != InstanceAction::kList && !IsValidOperatorId(req.operator_id)) {
    return Status::InvalidArgument("invalid operator id '" + req.operator_id + "' (want [A-Za-z0-9_.-]{1,128})");
  }
  switch (action) {
#define RHINO_ACTION_CASE(e, code, name, handler, access) \
  case InstanceAction::e:                                \
    return handler(req, result);
    RHINO_INSTANCE_ACTIONS(RHINO_ACTION_CASE)
#undef RHINO_ACTION_CASE
  }
  return Status::InvalidArgument("unknown instance action " + std::to_string(req.action));
}

std::optional<uint64_t> StateService::RetentionFloor(const std::string& op, uint32_t instance) {
  // A checkpoint another worker reads as a base stays, and what follows it (design §4.1).
  const std::optional<uint64_t> held = holds_.Oldest(op, instance);
  std::shared_ptr<HostedInstance> inst = Find(op, instance);
  if (!inst) return held;
  // Never wait: a commit holds the instance for seconds, and retention can
  // come back next pass. Until then, it keeps everything of this instance.
  std::unique_lock<InstanceMutex> l(inst->mu(), std::try_to_lock);
  if (!l.owns_lock()) return 0;
  const uint64_t floor = inst->last_complete().value_or(0);
  return held ? std::min(floor, *held) : floor;
}

std::vector<InstanceMetrics> StateService::Metrics() {
  std::vector<std::shared_ptr<HostedInstance>> all;
  {
    MutexLock l(&mu_);
    for (auto& [k, inst] : instances_) all.push_back(inst);
  }
  std::vector<InstanceMetrics> out;
  for (auto& inst : all) {
    std::lock_guard<InstanceMutex> l(inst->mu());
    out.push_back(inst->Metrics());
  }
  return out;
}

}  // namespace rhino
