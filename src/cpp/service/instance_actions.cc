// The InstanceReq actions of the state service (docs/protocol.md §7.1), one
// handler each. They run on the service's admin strand; each decodes its
// typed arguments (net/service_messages.h), checks the epoch fence (§7.5),
// and answers a JSON object.
#include <algorithm>
#include <chrono>
#include <future>

#include <nlohmann/json.hpp>

#include "client/chain_client.h"
#include "service/instance_dir.h"
#include "service/state_service.h"
#include "util/fs.h"

namespace rhino {
namespace {

using json = nlohmann::json;

std::string Describe(const std::string& op, uint32_t instance) { return op + "/" + std::to_string(instance); }

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// What `list`, `status`, `open`, `takeover` and `reconfigure` say about a
// hosted instance (REQUIRES: its mu held).
json InfoJson(HostedInstance& inst) {
  InstanceMetrics m = inst.Metrics();
  const InstanceConfig& c = inst.config();
  json j{{"operator_id", c.operator_id},
         {"instance", c.instance},
         {"epoch", c.epoch},
         {"version", m.has_version ? json(m.version) : json(nullptr)},
         {"vnodes", c.vnodes},
         {"num_key_groups", c.partitioner.num_key_groups},
         {"num_vnodes", c.partitioner.num_vnodes},
         {"seed", c.partitioner.seed},
         {"chain", c.chain},
         {"chain_version", c.chain_version},
         {"session_open", m.session_open},
         {"last_complete", m.has_complete ? json(m.last_complete) : json(nullptr)},
         {"replications_pending", m.replications_pending},
         {"db_name", c.db_name}};
  const std::optional<int64_t> clock = inst.ttl_clock();
  j["ttl_clock"] = clock ? json(*clock) : json(nullptr);
  // Vnodes on a base not merged yet (design §4.1), and the checkpoint each reads.
  json bases = json::array();
  for (const auto& [v, b] : inst.Bases()) {
    bases.push_back({{"vnode", v}, {"operator_id", b.operator_id}, {"instance", b.instance},
                     {"checkpoint", b.checkpoint}});
  }
  j["bases"] = bases;
  return j;
}

json InfoJsonLocked(HostedInstance& inst) {
  std::lock_guard<InstanceMutex> l(inst.mu());
  return InfoJson(inst);
}

json RestoreJson(const RestoreStats& rs) {
  return {{"lock_wait_s", rs.lock_wait_seconds},
          {"files", rs.files},
          {"linked_files", rs.linked_files},
          {"copied_files", rs.copied_files},
          {"copied_bytes", rs.copied_bytes},
          {"total_bytes", rs.total_bytes},
          {"build_s", rs.build_seconds},
          {"from_standby", rs.from_standby},
          {"open_s", rs.open_seconds},
          {"open_cpu_s", rs.open_cpu_seconds},
          {"open_wait_s", rs.open_wait_seconds}};
}

bool SamePartitioner(const PartitionerOptions& a, const PartitionerOptions& b) {
  return a.num_key_groups == b.num_key_groups && a.num_vnodes == b.num_vnodes && a.seed == b.seed;
}

Status Answer(const json& out, std::string* result) {
  *result = out.dump();
  return Status::OK();
}

// Removes `dir` if it is an empty directory.
Status RemoveIfEmpty(const std::string& dir) {
  std::vector<std::string> left;
  if (fs::IsDir(dir) && fs::ListDir(dir, &left).ok() && left.empty()) return fs::RemoveAll(dir);
  return Status::OK();
}

// Removes <root>/<kind>/<op>/<instance>, then <root>/<kind>/<op> if that left
// it empty (another instance of the operator may still be there). The layouts
// are those of replica_store.h (checkpoints/, standby/) and fence_table.h
// (fences/); `op` is a valid operator id, so a plain directory name.
Status RemoveInstanceTree(const std::string& root, const char* kind, const std::string& op, uint32_t instance) {
  const std::string op_dir = fs::Join(fs::Join(root, kind), op);
  RHINO_RETURN_IF_ERROR(fs::RemoveAll(fs::Join(op_dir, std::to_string(instance))));
  return RemoveIfEmpty(op_dir);
}

}  // namespace

Status StateService::PickCheckpoint(const std::string& op, uint32_t i, std::optional<uint64_t> wanted,
                                    uint64_t* out) {
  std::vector<uint64_t> ids;
  RHINO_RETURN_IF_ERROR(store_->ListCheckpoints(op, i, &ids));
  if (wanted) {
    if (!std::binary_search(ids.begin(), ids.end(), *wanted)) {
      return Status::NotFound("worker " + options_.worker_id + " holds no checkpoint " + std::to_string(*wanted) +
                              " of " + Describe(op, i));
    }
    *out = *wanted;
    return Status::OK();
  }
  if (ids.empty()) return Status::NotFound("worker " + options_.worker_id + " holds no checkpoint of " + Describe(op, i));
  *out = ids.back();
  return Status::OK();
}

// open: host the instance under the epoch, created empty or opened from the
// state it has here; an instance already hosted gets the new epoch and chain.
Status StateService::OpenInstance(const InstanceReq& req, std::string* result) {
  OpenArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  const std::string& op = req.operator_id;
  const uint32_t i = req.instance;
  const std::string what = Describe(op, i);
  Partitioner check;
  RHINO_RETURN_IF_ERROR(Partitioner::Create(a.partitioner, &check));
  for (uint32_t v : a.vnodes) {
    if (v >= a.partitioner.num_vnodes) {
      return Status::UnknownVnode("vnode " + std::to_string(v) + " is outside [0, " +
                                  std::to_string(a.partitioner.num_vnodes) + ")");
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  RHINO_RETURN_IF_ERROR(RaiseEpoch(op, i, req.epoch));
  if (auto inst = Find(op, i)) {
    // A re-open at a new epoch is a failover's fence of the surviving
    // instances: its parts are timed, as the takeover's restore is.
    const double fence_s = SecondsSince(t0);
    const auto t1 = std::chrono::steady_clock::now();
    std::unique_lock<InstanceMutex> l(inst->mu(), std::try_to_lock);
    if (!SamePartitioner(inst->config().partitioner, a.partitioner)) {  // fixed once hosted: no lock needed
      return Status::InvalidArgument(what + " is hosted here with another partitioner");
    }
    if (!l.owns_lock()) {
      // Busy: most often the cancelled attempt's commit, which holds the
      // instance for seconds on a loaded disk. The fence above is durable,
      // so that commit cannot complete at the old epoch after its last
      // check; the placement is made durable and applied before anything
      // else uses the instance (HostedInstance::DeferPlacement). The
      // failover's next batch need not wait for the doomed commit.
      RHINO_RETURN_IF_ERROR(inst->DeferPlacement(req.epoch, a.chain, a.chain_version));
      json out{{"operator_id", op},   {"instance", i},   {"epoch", req.epoch}, {"chain", a.chain},
               {"chain_version", a.chain_version}, {"deferred", true}};
      out["reopen"] = {{"fence_s", fence_s}, {"lock_wait_s", 0.0}, {"save_s", SecondsSince(t1)}, {"deferred", true}};
      return Answer(out, result);
    }
    const double lock_wait_s = SecondsSince(t1);
    const auto t2 = std::chrono::steady_clock::now();
    RHINO_RETURN_IF_ERROR(inst->SetPlacement(req.epoch, a.chain, a.chain_version));
    json out = InfoJson(*inst);
    out["reopen"] = {{"fence_s", fence_s}, {"lock_wait_s", lock_wait_s}, {"save_s", SecondsSince(t2)},
                     {"deferred", false}};
    return Answer(out, result);
  }
  RHINO_RETURN_IF_ERROR(RoomToHost(op, i));
  InstanceConfig c;
  Status saved = InstanceDir::ReadSavedConfig(options_.state_dir, op, i, &c);
  if (saved.ok()) {
    // Hosted here before, then closed: open its state.
    if (!SamePartitioner(c.partitioner, a.partitioner)) {
      return Status::InvalidArgument(what + " has state here made with another partitioner");
    }
  } else if (saved.code() == Status::Code::kNotFound) {
    c.operator_id = op;
    c.instance = i;
    c.partitioner = a.partitioner;
    c.vnodes = a.vnodes;
  } else {
    return saved;
  }
  c.epoch = req.epoch;
  c.chain = a.chain;
  c.chain_version = a.chain_version;
  std::shared_ptr<HostedInstance> inst;
  RHINO_RETURN_IF_ERROR(HostedInstance::Open(env_, c, pool_, &inst));
  json out;
  {
    std::lock_guard<InstanceMutex> l(inst->mu());
    RHINO_RETURN_IF_ERROR(inst->Recover());
    out = InfoJson(*inst);
  }
  Host(inst);
  return Answer(out, result);
}

// close: stop hosting it; its files stay, and `open` reopens them.
Status StateService::CloseInstance(const InstanceReq& req, std::string* result) {
  NoArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  RHINO_RETURN_IF_ERROR(CheckEpoch(req.operator_id, req.instance, req.epoch));
  std::shared_ptr<HostedInstance> inst;
  RHINO_RETURN_IF_ERROR(FindHosted(req.operator_id, req.instance, &inst));
  {
    std::lock_guard<InstanceMutex> l(inst->mu());
    if (inst->has_session()) {
      return Status::SessionBusy(Describe(req.operator_id, req.instance) + " has an open session");
    }
    RHINO_RETURN_IF_ERROR(inst->CloseAndMark());
  }
  Unhost(req.operator_id, req.instance);
  return Answer(json::object(), result);
}

// takeover: host the instance from a checkpoint of this worker's own replica
// store, by hard links, under the new epoch (failover, design §4).
Status StateService::TakeoverInstance(const InstanceReq& req, std::string* result) {
  TakeoverArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  const std::string& op = req.operator_id;
  const uint32_t i = req.instance;
  uint64_t checkpoint = 0;
  if (a.checkpoint) {
    checkpoint = *a.checkpoint;  // HostedInstance::Takeover says if the store lacks it
  } else {
    Status s = PickCheckpoint(op, i, std::nullopt, &checkpoint);
    if (s.code() == Status::Code::kNotFound) {
      return Status::NotFound("worker " + options_.worker_id + " holds no checkpoint of " + Describe(op, i) +
                              " to take over");
    }
    RHINO_RETURN_IF_ERROR(s);
  }
  RHINO_RETURN_IF_ERROR(RoomToHost(op, i));  // before the fence: a refused takeover changes nothing
  RHINO_RETURN_IF_ERROR(RaiseEpoch(op, i, req.epoch));
  InstanceConfig c;
  c.operator_id = op;
  c.instance = i;
  c.epoch = req.epoch;
  c.chain = a.chain;
  c.chain_version = a.chain_version;
  c.redo_version = a.redo_version;
  c.redo = a.redo;
  if (auto old = Find(op, i)) {
    // A stale hosting of the same instance here (e.g. before a restart): replaced.
    std::lock_guard<InstanceMutex> l(old->mu());
    c.db_name = old->config().db_name;
    old->Close();
    Unhost(op, i);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<HostedInstance> inst;
  TakeoverStats ts;
  RHINO_RETURN_IF_ERROR(HostedInstance::Takeover(env_, c, checkpoint, pool_, &inst, &ts));
  const double secs = SecondsSince(t0);
  json out = InfoJsonLocked(*inst);
  out["checkpoint"] = checkpoint;
  out["restore_s"] = secs;
  out["restore"] = RestoreJson(ts.restore);
  out["restore"]["discard_s"] = ts.discard_seconds;
  out["restore"]["save_s"] = ts.save_seconds;
  Host(inst);
  return Answer(out, result);
}

// fence: raise the instance's epoch here without hosting it.
Status StateService::FenceInstance(const InstanceReq& req, std::string* result) {
  NoArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  RHINO_RETURN_IF_ERROR(RaiseEpoch(req.operator_id, req.instance, req.epoch));
  return Answer(json{{"epoch", req.epoch}}, result);
}

// import: vnodes from a checkpoint in this worker's replica store into a
// hosted instance, by hard links (design §4 step 4).
Status StateService::ImportVnodes(const InstanceReq& req, std::string* result) {
  ImportArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  if (!IsValidOperatorId(a.from_operator)) {
    return Status::InvalidArgument("invalid operator id '" + a.from_operator + "'");
  }
  RHINO_RETURN_IF_ERROR(CheckEpoch(req.operator_id, req.instance, req.epoch));
  std::shared_ptr<HostedInstance> inst;
  RHINO_RETURN_IF_ERROR(FindHosted(req.operator_id, req.instance, &inst));
  std::lock_guard<InstanceMutex> l(inst->mu());
  if (inst->config().epoch != req.epoch) {
    return Status::StaleEpoch("import at epoch " + std::to_string(req.epoch) + " into " +
                              Describe(req.operator_id, req.instance) + ", hosted here at epoch " +
                              std::to_string(inst->config().epoch));
  }
  std::vector<uint32_t> imported;
  RHINO_RETURN_IF_ERROR(inst->ImportFromCheckpoint(a.from_operator, a.from_instance, a.checkpoint, a.vnodes, &imported));
  return Answer(json{{"imported", imported}}, result);
}

// move_vnodes: from one hosted instance to another on this worker.
Status StateService::MoveVnodes(const InstanceReq& req, std::string* result) {
  MoveVnodesArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  RHINO_RETURN_IF_ERROR(CheckEpoch(req.operator_id, req.instance, req.epoch));
  RHINO_RETURN_IF_ERROR(CheckEpoch(a.to_operator, a.to_instance, a.to_epoch));
  std::shared_ptr<HostedInstance> from, to;
  RHINO_RETURN_IF_ERROR(FindHosted(req.operator_id, req.instance, &from));
  RHINO_RETURN_IF_ERROR(FindHosted(a.to_operator, a.to_instance, &to));
  if (from == to) {
    return Status::InvalidArgument("cannot move vnodes of " + Describe(req.operator_id, req.instance) + " to itself");
  }
  std::scoped_lock l(from->mu(), to->mu());
  if (from->config().epoch != req.epoch || to->config().epoch != a.to_epoch) {
    return Status::StaleEpoch("a vnode move names an epoch other than the instances' own");
  }
  std::vector<uint32_t> moved;
  RHINO_RETURN_IF_ERROR(from->MoveVnodesTo(to.get(), a.vnodes, &moved));
  return Answer(json{{"moved", moved}}, result);
}

// list: the instances hosted here.
Status StateService::ListInstances(const InstanceReq& req, std::string* result) {
  NoArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  std::vector<std::shared_ptr<HostedInstance>> all;
  {
    MutexLock l(&mu_);
    for (auto& [k, inst] : instances_) all.push_back(inst);
  }
  json list = json::array();
  for (auto& inst : all) list.push_back(InfoJsonLocked(*inst));
  return Answer(json{{"instances", list}}, result);
}

// status: its checkpoints in this store and, if hosted here, its state and
// the replication state of `checkpoint`.
Status StateService::InstanceStatus(const InstanceReq& req, std::string* result) {
  StatusArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  std::vector<uint64_t> ids;
  RHINO_RETURN_IF_ERROR(store_->ListCheckpoints(req.operator_id, req.instance, &ids));
  json out{{"checkpoints", ids}, {"fence_epoch", epochs_.Highest(req.operator_id, req.instance)}};
  auto inst = Find(req.operator_id, req.instance);
  out["hosted"] = inst != nullptr;
  if (inst) {
    // Without `wait`, never wait for the instance: a commit holds it for
    // seconds, and a task polling for a new epoch has its answer in
    // fence_epoch (the fence is raised before the instance takes the epoch).
    std::unique_lock<InstanceMutex> l(inst->mu(), std::defer_lock);
    if (a.wait) {
      l.lock();
    } else if (!l.try_lock()) {
      out["busy"] = true;
      return Answer(out, result);
    }
    out["busy"] = false;
    out.update(InfoJson(*inst));
    if (a.checkpoint) {
      std::string message;
      out["replication"] = inst->ReplicationStateOf(*a.checkpoint, &message);
      out["replication_message"] = message;
    }
  }
  return Answer(out, result);
}

// discard_after: a primary drops a re-executed batch's checkpoints on its
// chain before it replicates the new ones (§7.3).
Status StateService::DiscardAfter(const InstanceReq& req, std::string* result) {
  DiscardAfterArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  RHINO_RETURN_IF_ERROR(RaiseEpoch(req.operator_id, req.instance, req.epoch));
  if (Find(req.operator_id, req.instance)) {
    return Status::InvalidArgument(Describe(req.operator_id, req.instance) +
                                   " is hosted here: its own checkpoints are not discarded by a peer");
  }
  std::vector<uint64_t> removed;
  RHINO_RETURN_IF_ERROR(store_->DiscardAfter(req.operator_id, req.instance, a.after, &removed));
  return Answer(json{{"removed", removed}}, result);
}

// reconfigure: a handover's step at the barrier after batch `version` (§7.4).
Status StateService::Reconfigure(const InstanceReq& req, std::string* result) {
  ReconfigureArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  const std::string what = Describe(req.operator_id, req.instance);
  RHINO_RETURN_IF_ERROR(CheckEpoch(req.operator_id, req.instance, req.epoch));
  std::shared_ptr<HostedInstance> inst;
  RHINO_RETURN_IF_ERROR(FindHosted(req.operator_id, req.instance, &inst));
  auto done = std::make_shared<std::promise<SessionCommitRsp>>();
  auto fut = done->get_future();
  bool replicating = false;
  json out;
  {
    std::lock_guard<InstanceMutex> l(inst->mu());
    if (inst->config().epoch != req.epoch) {
      return Status::StaleEpoch("reconfigure at epoch " + std::to_string(req.epoch) + " of " + what +
                                ", hosted here at epoch " + std::to_string(inst->config().epoch));
    }
    RHINO_RETURN_IF_ERROR(inst->Reconfigure(a.version, a.ops, &replicating,
                                            [done](const SessionCommitRsp& r) { done->set_value(r); }));
    out = InfoJson(*inst);
  }
  if (replicating) {
    // Outside the instance's lock: the chain's ack is handled on its strand.
    if (fut.wait_for(std::chrono::duration<double>(a.timeout_s)) != std::future_status::ready) {
      return Status::Timeout("the first checkpoint of " + what + " was not complete on its chain within " +
                             std::to_string(a.timeout_s) + " s");
    }
    SessionCommitRsp r = fut.get();
    if (r.code != 0) return Status::FromCode(r.code, r.message);
  }
  out["replicated"] = replicating;
  return Answer(out, result);
}

// compact: a full compaction of the hosted instance's vnode column families,
// between batches, which drops the TTL entries its clock has expired (§7.8).
// It runs without the instance's lock (HostedInstance::BeginCompaction).
Status StateService::CompactInstance(const InstanceReq& req, std::string* result) {
  NoArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  RHINO_RETURN_IF_ERROR(CheckEpoch(req.operator_id, req.instance, req.epoch));
  std::shared_ptr<HostedInstance> inst;
  RHINO_RETURN_IF_ERROR(FindHosted(req.operator_id, req.instance, &inst));
  StateBackend* db = nullptr;
  {
    std::lock_guard<InstanceMutex> l(inst->mu());
    if (inst->config().epoch != req.epoch) {
      return Status::StaleEpoch("compact at epoch " + std::to_string(req.epoch) + " of " +
                                Describe(req.operator_id, req.instance) + ", hosted here at epoch " +
                                std::to_string(inst->config().epoch));
    }
    RHINO_RETURN_IF_ERROR(inst->BeginCompaction(&db));
  }
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t before = 0, after = 0;
  Status s = db->CompactVnodes(&before, &after);
  const std::optional<int64_t> clock = db->ttl_clock();
  {
    std::lock_guard<InstanceMutex> l(inst->mu());
    inst->EndCompaction();
  }
  RHINO_RETURN_IF_ERROR(s);
  return Answer(json{{"bytes_before", before},
                     {"bytes_after", after},
                     {"ttl_clock", clock ? json(*clock) : json(nullptr)},
                     {"seconds", SecondsSince(t0)}},
                result);
}

// replicate: a bulk copy of a checkpoint of this store to other workers, as
// a chain of their own (design §3 failure model: chain repair, scale-out).
Status StateService::ReplicateTo(const InstanceReq& req, std::string* result) {
  ReplicateArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  const std::string what = Describe(req.operator_id, req.instance);
  RHINO_RETURN_IF_ERROR(CheckEpoch(req.operator_id, req.instance, req.epoch));
  if (a.to.empty()) return Status::InvalidArgument("replicate needs at least one worker in 'to'");
  uint64_t checkpoint = 0;
  RHINO_RETURN_IF_ERROR(PickCheckpoint(req.operator_id, req.instance, a.checkpoint, &checkpoint));
  // The receivers get every file they lack, under the instance's chain version.
  ReplicateOptions o = options_.replicate;
  o.client_id = options_.worker_id;
  o.on_done = nullptr;
  std::unique_ptr<ReplicationHandle> h;
  const auto t0 = std::chrono::steady_clock::now();
  RHINO_RETURN_IF_ERROR(ReplicateCheckpoint(store_, req.operator_id, req.instance, checkpoint, a.to, a.chain_version,
                                            env_.credential, o, &h));
  ReplicationResult r;
  if (!h->Wait(static_cast<int64_t>(a.timeout_s * 1000), &r)) {
    h->Cancel();
    return Status::Timeout("copying checkpoint " + std::to_string(checkpoint) + " of " + what + " took over " +
                           std::to_string(a.timeout_s) + " s");
  }
  RHINO_RETURN_IF_ERROR(r.status);
  return Answer(json{{"checkpoint", checkpoint}, {"bytes_sent", r.bytes_sent}, {"seconds", SecondsSince(t0)}},
                result);
}

// drop: every trace of the instance on this worker goes (an operator dropped,
// `rhino drop`): its live state (hosted or not), its checkpoints in the replica
// store, its standby directory and both its fences (the epoch's and the chain
// version's). Refused below the instance's epoch, and with SessionBusy while a
// session is open. The pooled files no other checkpoint references are
// reclaimed by a garbage collection at once if the store's lock is free, else
// by the next retention pass.
Status StateService::DropInstance(const InstanceReq& req, std::string* result) {
  NoArgs a;
  RHINO_RETURN_IF_ERROR(DecodeInstanceArgs(req.args, &a));
  const std::string& op = req.operator_id;
  const uint32_t i = req.instance;
  RHINO_RETURN_IF_ERROR(CheckEpoch(op, i, req.epoch));
  bool hosted = false;
  if (auto inst = Find(op, i)) {
    std::lock_guard<InstanceMutex> l(inst->mu());
    if (inst->has_session()) return Status::SessionBusy(Describe(op, i) + " has an open session: not dropped");
    if (inst->config().epoch > req.epoch) {
      return Status::StaleEpoch("drop at epoch " + std::to_string(req.epoch) + " of " + Describe(op, i) +
                                ", hosted here at epoch " + std::to_string(inst->config().epoch));
    }
    inst->Close();
    Unhost(op, i);
    hosted = true;
  }
  const std::string& state = options_.state_dir;
  const std::string& store = store_->dir();
  const InstanceDir live(state, op, i);
  RHINO_RETURN_IF_ERROR(fs::RemoveAll(live.path()));
  RHINO_RETURN_IF_ERROR(RemoveIfEmpty(fs::Parent(live.path())));
  std::vector<uint64_t> removed;
  RHINO_RETURN_IF_ERROR(store_->DiscardAfter(op, i, std::nullopt, &removed));
  RHINO_RETURN_IF_ERROR(store_->RefreshStandby(op, i));  // no checkpoint left: the standby goes
  RHINO_RETURN_IF_ERROR(RemoveInstanceTree(store, "checkpoints", op, i));
  RHINO_RETURN_IF_ERROR(RemoveInstanceTree(store, "standby", op, i));
  RHINO_RETURN_IF_ERROR(RemoveInstanceTree(store, "fences", op, i));
  RHINO_RETURN_IF_ERROR(RemoveInstanceTree(state, "fences", op, i));
  json out{{"hosted", hosted}, {"checkpoints_removed", removed}};
  GcStats gc;
  Status g = store_->GarbageCollect(&gc, /*wait=*/false);
  out["gc"] = g.ok() ? json{{"files_removed", gc.files_removed}, {"bytes_removed", gc.bytes_removed}}
                     : json(g.ToString());
  return Answer(out, result);
}

}  // namespace rhino
