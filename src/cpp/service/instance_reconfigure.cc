// HostedInstance's reconfiguration (design §4): vnodes moved between the
// instances of a worker, imported from another instance's checkpoint, and a
// handover's steps at a barrier, kept as the redo of their version until no
// rollback can go back before them. The rest of the class is in
// hosted_instance.cc.
#include "service/hosted_instance.h"

#include <algorithm>

#include "util/fs.h"

namespace rhino {
namespace {

std::vector<uint32_t> Present(const StateBackend& db, const std::vector<uint32_t>& vnodes) {
  const std::vector<uint32_t> held = db.vnodes();
  std::vector<uint32_t> out;
  for (uint32_t v : vnodes) {
    if (std::binary_search(held.begin(), held.end(), v) && std::find(out.begin(), out.end(), v) == out.end()) {
      out.push_back(v);
    }
  }
  return out;
}

}  // namespace

Status HostedInstance::ImportFromCheckpoint(const std::string& from_operator, uint32_t from_instance,
                                            uint64_t checkpoint_id, const std::vector<uint32_t>& vnodes,
                                            std::vector<uint32_t>* imported) {
  if (!db_) return Status::UnknownInstance(Describe(config_) + " is closed");
  if (session_) return Status::SessionBusy(Describe(config_) + " has an open session: import between batches");
  const std::string work = dir_.WorkDir("import");
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(work));
  Status s;
  {
    // The origin's checkpoint, restored by hard links, exports the vnodes
    // (design §4 step 4: CreateColumnFamilyWithImport over linked SSTs).
    Manifest m;
    s = env_.store->ReadManifest(from_operator, from_instance, checkpoint_id, &m);
    std::unique_ptr<StateBackend> origin;
    if (s.ok()) {
      StateOptions o;
      o.partitioner = m.partitioner;
      o.operator_id = from_operator;
      o.instance = from_instance;
      o.error_if_missing = true;
      o.sync_open = false;  // a scratch copy, removed below
      RestoreStats stats;
      s = StateBackend::Restore(*env_.store, from_operator, from_instance, checkpoint_id, fs::Join(work, "origin"),
                                UnsyncedRestore(), o, &origin, &stats);
    }
    if (s.ok()) s = origin->ExportVnodes(vnodes, fs::Join(work, "export"));
  }
  if (s.ok()) s = db_->ImportVnodes(fs::Join(work, "export"), imported);
  fs::RemoveAll(work);
  if (!s.ok()) return s;
  config_.vnodes = db_->vnodes();
  return dir_.SaveConfig(config_);
}

Status HostedInstance::MoveVnodesTo(HostedInstance* target, const std::vector<uint32_t>& vnodes,
                                    std::vector<uint32_t>* moved) {
  if (!db_ || !target->db_) return Status::UnknownInstance("an instance of the move is closed");
  if (session_ || target->session_) return Status::SessionBusy("an instance of the move has an open session");
  const std::string work = dir_.WorkDir("move");
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(fs::Parent(work)));
  RHINO_RETURN_IF_ERROR(db_->ExportVnodes(vnodes, work));
  Status s = target->db_->ImportVnodes(work, moved);
  fs::RemoveAll(work);
  if (!s.ok()) return s;
  RHINO_RETURN_IF_ERROR(db_->DropVnodes(vnodes));
  config_.vnodes = db_->vnodes();
  target->config_.vnodes = target->db_->vnodes();
  RHINO_RETURN_IF_ERROR(dir_.SaveConfig(config_));
  return target->dir_.SaveConfig(target->config_);
}

Status HostedInstance::ApplyOps(const std::vector<ReconfigOp>& ops) {
  for (const auto& op : ops) {
    // Idempotent: a vnode already dropped stays dropped, and an import
    // replaces whatever column family the vnode has here.
    std::vector<uint32_t> present = Present(*db_, op.vnodes);
    if (!present.empty()) RHINO_RETURN_IF_ERROR(db_->DropVnodes(present));
    if (op.kind == ReconfigOp::Kind::kImport) {
      std::vector<uint32_t> imported;
      RHINO_RETURN_IF_ERROR(ImportFromCheckpoint(op.from_operator, op.from_instance, op.checkpoint, op.vnodes, &imported));
    } else if (op.kind == ReconfigOp::Kind::kImportOnBase) {
      // Nothing is copied: the vnodes start empty on their base (design §4.1).
      const VnodeBase base{op.from_operator, op.from_instance, op.checkpoint, op.hosts};
      for (uint32_t v : op.vnodes) RHINO_RETURN_IF_ERROR(db_->AddVnodeOnBase(v, base));
    }
  }
  config_.vnodes = db_->vnodes();
  return Status::OK();
}

std::map<uint32_t, VnodeBase> HostedInstance::Bases() const {
  return db_ ? db_->VnodeBases() : std::map<uint32_t, VnodeBase>{};
}

std::unique_ptr<BaseFileWriter> HostedInstance::NewBaseFileWriter(const std::string& dir) const {
  return db_ ? std::make_unique<BaseFileWriter>(*db_, dir) : nullptr;
}

Status HostedInstance::MergeBase(uint32_t vnode, const VnodeBase& base, const std::vector<std::string>& files,
                                 MergeBaseStats* stats) {
  if (!db_) return Status::UnknownInstance(Describe(config_) + " is closed");
  if (session_) return Status::SessionBusy(Describe(config_) + " has an open session: merge between batches");
  const std::map<uint32_t, VnodeBase> now = db_->VnodeBases();
  auto it = now.find(vnode);
  if (it == now.end() || it->second.operator_id != base.operator_id || it->second.instance != base.instance ||
      it->second.checkpoint != base.checkpoint) {
    return Status::Aborted("vnode " + std::to_string(vnode) + " of " + Describe(config_) +
                           " is no longer on the base that was copied");
  }
  return db_->MergeBase(vnode, files, stats);
}

void HostedInstance::MaybeClearRedo(uint64_t complete_id) {
  // Batch b+1 may run again (and roll back to b) until batch b+2 starts: the
  // driver starts b+2 only once b+1 is done everywhere. So checkpoint b+2
  // complete here is what retires the redo of version b.
  if (!config_.redo_version || complete_id < *config_.redo_version + 2) return;
  config_.redo_version.reset();
  config_.redo.clear();
  dir_.SaveConfig(config_);  // best effort: a stale redo is only ever applied at its own version
}

Status HostedInstance::Reconfigure(uint64_t version, const std::vector<ReconfigOp>& ops, bool* replicating,
                                   CommitReply reply) {
  *replicating = false;
  if (!db_) return Status::UnknownInstance(Describe(config_) + " is closed");
  if (session_) return Status::SessionBusy(Describe(config_) + " has an open session: reconfigure between batches");
  std::vector<uint64_t> ids;
  RHINO_RETURN_IF_ERROR(env_.store->ListCheckpoints(config_.operator_id, config_.instance, &ids));
  const std::optional<uint64_t> live = db_->version();
  const bool fresh = !live && ids.empty();
  if (!fresh && live != version) {
    return Status::InvalidArgument("reconfiguring " + Describe(config_) + " at the barrier after batch " +
                                   std::to_string(version) + ", but its state is at " +
                                   (live ? "version " + std::to_string(*live) : "no version"));
  }
  RHINO_RETURN_IF_ERROR(ApplyOps(ops));
  if (!fresh) {
    if (config_.redo_version != version) {
      config_.redo.clear();
      config_.redo_version = version;
    }
    config_.redo.insert(config_.redo.end(), ops.begin(), ops.end());
    return dir_.SaveConfig(config_);
  }
  // A new instance: its first checkpoint is `version`, imports included (a
  // rollback or takeover at `version` then needs no redo).
  SessionBatch empty(db_.get());
  RHINO_RETURN_IF_ERROR(empty.Commit(version));
  Manifest m;
  Status s = db_->Checkpoint(env_.store, version, config_.epoch, &m);
  if (!s.ok()) {
    Status r = RollbackTo(std::nullopt);
    return r.ok() ? s : Status::FromCode(WireCode(s), s.message() + "; undoing failed too: " + r.message());
  }
  RHINO_RETURN_IF_ERROR(dir_.SaveConfig(config_));
  SessionCommitRsp rsp;
  rsp.version = version;
  rsp.stats = "{}";  // the shipper adds the replication's figures to it
  if (config_.chain.empty()) {
    shipper_.CompleteWithoutChain(version);
    return Status::OK();
  }
  *replicating = true;
  shipper_.Ship(version, rsp, std::move(reply));
  return Status::OK();
}

}  // namespace rhino
