// StateBackend::Checkpoint: incremental checkpoints into a replica store.
#include <rocksdb/db.h>
#include <rocksdb/metadata.h>
#include <rocksdb/options.h>
#include <rocksdb/utilities/checkpoint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <unordered_map>

#include "rhino/state_backend.h"
#include "state/state_internal.h"
#include "util/crash_point.h"
#include "util/fs.h"

namespace rhino {
using namespace state_internal;

// ---------------------------------------------------------------- checkpoints

Status StateBackend::Checkpoint(ReplicaStore* store, uint64_t checkpoint_id, uint64_t epoch, Manifest* out) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard admin(admin_mu_);
  const std::optional<uint64_t> last = last_checkpoint();
  std::vector<uint64_t> committed;
  RHINO_RETURN_IF_ERROR(store->ListCheckpoints(operator_id_, instance_, &committed));
  const bool last_committed =
      last && std::binary_search(committed.begin(), committed.end(), *last);
  // Ids must increase. The one exception is a retry of the last id after a
  // crash between writing it into the state and committing its manifest: the
  // state then names a checkpoint that no store holds, and that is newer than
  // every committed one (an older uncommitted id was committed once and since
  // removed by retention, so it is no retry).
  const bool newer_than_committed = committed.empty() || checkpoint_id > committed.back();
  if (last && (checkpoint_id < *last || (checkpoint_id == *last && (last_committed || !newer_than_committed)))) {
    return Status::InvalidArgument("checkpoint ids must increase: this state was last checkpointed as " +
                                   std::to_string(*last) + ", got " + std::to_string(checkpoint_id));
  }
  if (std::binary_search(committed.begin(), committed.end(), checkpoint_id)) {
    return Status::AlreadyExists("checkpoint " + std::to_string(checkpoint_id) + " of '" + operator_id_ +
                                   "' instance " + std::to_string(instance_) + " is already committed");
  }
  std::unique_ptr<ReplicaStore::Lock> lock;
  RHINO_RETURN_IF_ERROR(store->AcquireLock(false, &lock));

  // The checkpoint id goes into the state itself, so a DB restored from it
  // knows its parent for the next incremental checkpoint.
  rocksdb::WriteOptions wo;
  RHINO_RETURN_IF_ERROR(WriteResult(db_->Put(wo, default_cf_, kCheckpointKey, EncodeU64(checkpoint_id)),
                                    "checkpoint " + std::to_string(checkpoint_id) + ": recording its id in the state"));
  auto undo_meta = [&] {
    if (last) {
      db_->Put(wo, default_cf_, kCheckpointKey, EncodeU64(*last));
    } else {
      db_->Delete(wo, default_cf_, kCheckpointKey);
    }
  };

  std::string staging;
  Status s = store->NewStagingDir("ckpt", &staging);
  if (!s.ok()) {
    undo_meta();
    return s;
  }
  auto fail = [&](Status st) {
    fs::RemoveAll(staging);
    undo_meta();
    return st;
  };

  // Rhino §4.2.2 phase 2, step 1: a RocksDB checkpoint (flushes memtables,
  // hard-links the immutable SST files, copies the small mutable ones). The
  // memtables are flushed first, side by side: the checkpoint's own flush
  // takes the column families one at a time, and then finds them flushed
  // (or flushes only what a concurrent writer added since).
  const std::string db_dir = fs::Join(staging, "db");
  s = FlushColumnFamilies();
  if (!s.ok()) return fail(s);
  {
    rocksdb::Checkpoint* raw = nullptr;
    rocksdb::Status rs = rocksdb::Checkpoint::Create(db_.get(), &raw);
    std::unique_ptr<rocksdb::Checkpoint> cp(raw);
    if (rs.ok()) rs = cp->CreateCheckpoint(db_dir, /*log_size_for_flush=*/0);
    if (!rs.ok()) return fail(WriteResult(rs, "creating RocksDB checkpoint"));
  }
  CrashPoint("checkpoint.after_rocksdb_checkpoint");

  // The parent is the checkpoint the delta is computed against: the last one
  // this state took or was restored from, or else (after a crash lost that
  // one) the newest committed checkpoint before this id. Any committed
  // checkpoint is a safe reference, since a file is reused only when it is the
  // same inode as the pooled copy, and pooled files never change.
  std::optional<uint64_t> parent_id;
  if (last_committed && *last < checkpoint_id) {
    parent_id = *last;
  } else {
    for (uint64_t id : committed)
      if (id < checkpoint_id) parent_id = id;
  }
  Manifest parent;
  bool has_parent = parent_id && store->ReadManifest(operator_id_, instance_, *parent_id, &parent).ok();
  std::unordered_map<std::string, const FileEntry*> parent_by_name;
  std::set<std::string> parent_identities;
  if (has_parent) {
    for (const auto& f : parent.files) {
      parent_by_name[f.name] = &f;
      parent_identities.insert(f.identity);
    }
  }

  Manifest m;
  m.operator_id = operator_id_;
  m.instance = instance_;
  m.checkpoint_id = checkpoint_id;
  m.has_parent = has_parent;
  m.parent_id = has_parent ? *parent_id : 0;
  m.epoch = epoch;
  m.version = version().value_or(0);
  m.partitioner.num_key_groups = partitioner_.num_key_groups();
  m.partitioner.num_vnodes = partitioner_.num_vnodes();
  m.partitioner.seed = partitioner_.seed();
  m.vnodes = vnodes();
  m.created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  std::vector<std::string> names;
  s = fs::ListDir(db_dir, &names);
  if (!s.ok()) return fail(s);
  for (size_t i = 0; i < names.size(); ++i) {
    FileEntry e;
    e.name = names[i];
    auto it = parent_by_name.find(e.name);
    s = store->PoolFile(fs::Join(db_dir, e.name), it == parent_by_name.end() ? nullptr : it->second, &e);
    if (!s.ok()) return fail(s);
    e.in_delta = parent_identities.count(e.identity) == 0;
    m.files.push_back(std::move(e));
    if (i == names.size() / 2) CrashPoint("checkpoint.mid_pool");
  }
  s = store->CommitManifest(m);
  if (!s.ok()) return fail(s);
  fs::RemoveAll(staging);
  *out = std::move(m);
  return Status::OK();
}

}  // namespace rhino
