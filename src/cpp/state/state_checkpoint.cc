// StateBackendImpl::Checkpoint: incremental checkpoints into a replica store.
#include <rocksdb/db.h>
#include <rocksdb/metadata.h>
#include <rocksdb/transaction_log.h>
#include <rocksdb/options.h>
#include <rocksdb/utilities/checkpoint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <set>
#include <unordered_map>

#include "state/state_backend_impl.h"
#include "state/state_internal.h"
#include "util/crash_point.h"
#include "util/fs.h"

namespace rhino {
using namespace state_internal;

// ---------------------------------------------------------------- checkpoints

namespace {

// Ids must increase. The one exception is a retry of the last id after a
// crash between writing it into the state and committing its manifest: the
// state then names a checkpoint that no store holds, and that is newer than
// every committed one (an older uncommitted id was committed once and since
// removed by retention, so it is no retry).
Status CheckCheckpointId(uint64_t checkpoint_id, std::optional<uint64_t> last, bool last_committed,
                         const std::vector<uint64_t>& committed, const std::string& what) {
  const bool newer_than_committed = committed.empty() || checkpoint_id > committed.back();
  if (last && (checkpoint_id < *last || (checkpoint_id == *last && (last_committed || !newer_than_committed)))) {
    return Status::InvalidArgument("checkpoint ids must increase: this state was last checkpointed as " +
                                   std::to_string(*last) + ", got " + std::to_string(checkpoint_id));
  }
  if (std::binary_search(committed.begin(), committed.end(), checkpoint_id)) {
    return Status::AlreadyExists("checkpoint " + std::to_string(checkpoint_id) + " of " + what +
                                 " is already committed");
  }
  return Status::OK();
}

// The parent is the checkpoint the delta is computed against: the last one
// this state took or was restored from, or else (after a crash lost that
// one) the newest committed checkpoint before this id. Any committed
// checkpoint is a safe reference, since a file is reused only when it is the
// same inode as the pooled copy, and pooled files never change.
std::optional<uint64_t> ParentOf(uint64_t checkpoint_id, std::optional<uint64_t> last, bool last_committed,
                                 const std::vector<uint64_t>& committed) {
  if (last_committed && *last < checkpoint_id) return last;
  std::optional<uint64_t> parent;
  for (uint64_t id : committed)
    if (id < checkpoint_id) parent = id;
  return parent;
}

}  // namespace

Status StateBackendImpl::Checkpoint(ReplicaStore* store, uint64_t checkpoint_id, uint64_t epoch, Manifest* out) {
  RHINO_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard admin(admin_mu_);
  // Every checkpoint holds an OPTIONS file, also the first after an open that
  // left it to a background thread (open_without_sync.h).
  RHINO_RETURN_IF_ERROR(WriteDeferredOptionsFile());
  const std::optional<uint64_t> last = last_checkpoint();
  std::vector<uint64_t> committed;
  RHINO_RETURN_IF_ERROR(store->ListCheckpoints(operator_id_, instance_, &committed));
  const bool last_committed = last && std::binary_search(committed.begin(), committed.end(), *last);
  RHINO_RETURN_IF_ERROR(CheckCheckpointId(checkpoint_id, last, last_committed, committed,
                                          "'" + operator_id_ + "' instance " + std::to_string(instance_)));
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
  const std::string db_dir = fs::Join(staging, "db");
  s = CreateRocksCheckpoint(db_dir);
  Manifest m;
  if (s.ok()) {
    s = PoolCheckpoint(store, db_dir, checkpoint_id, epoch, ParentOf(checkpoint_id, last, last_committed, committed),
                       &m);
  }
  if (s.ok()) s = store->CommitManifest(m);
  fs::RemoveAll(staging);
  if (!s.ok()) {
    undo_meta();
    return s;
  }
  *out = std::move(m);
  return Status::OK();
}

Status StateBackendImpl::CreateRocksCheckpoint(const std::string& db_dir) {
  // Rhino §4.2.2 phase 2, step 1: a RocksDB checkpoint (hard-links the
  // immutable SST files, copies the small mutable ones). What is not yet in
  // an SST is in the write-ahead log. While that log is small
  // (checkpoint_wal_bytes), the checkpoint copies it instead of flushing: a
  // flush writes one SST per vnode column family the batch touched, each
  // with its own fsync and MANIFEST write, a fixed cost of ~1 ms per vnode
  // that a small micro-batch cannot amortize. A restore replays the copied
  // log. Once the log is larger, every memtable is flushed first, side by
  // side (the checkpoint's own flush takes the column families one at a
  // time, and then finds them flushed).
  uint64_t wal_bytes = 0;
  if (checkpoint_wal_bytes_ != 0) RHINO_RETURN_IF_ERROR(LiveWalBytes(&wal_bytes));
  const bool flush = checkpoint_wal_bytes_ == 0 || wal_bytes >= checkpoint_wal_bytes_;
  if (flush) RHINO_RETURN_IF_ERROR(FlushColumnFamilies());
  {
    rocksdb::Checkpoint* raw = nullptr;
    rocksdb::Status rs = rocksdb::Checkpoint::Create(db_.get(), &raw);
    std::unique_ptr<rocksdb::Checkpoint> cp(raw);
    // log_size_for_flush: 0 flushes whatever a concurrent writer added since
    // ours; the maximum never flushes (and copies the live WAL files whole).
    const uint64_t log_size_for_flush = flush ? 0 : std::numeric_limits<uint64_t>::max();
    if (rs.ok()) rs = cp->CreateCheckpoint(db_dir, log_size_for_flush);
    if (!rs.ok()) return WriteResult(rs, "creating RocksDB checkpoint");
  }
  CrashPoint("checkpoint.after_rocksdb_checkpoint");
  return Status::OK();
}

Status StateBackendImpl::LiveWalBytes(uint64_t* bytes) {
  rocksdb::VectorLogPtr wals;
  rocksdb::Status rs = db_->GetSortedWalFiles(wals);
  if (!rs.ok()) return WriteResult(rs, "listing the write-ahead log");
  *bytes = 0;
  for (const auto& w : wals)
    if (w->Type() == rocksdb::kAliveLogFile) *bytes += w->SizeFileBytes();
  return Status::OK();
}

Status StateBackendImpl::PoolCheckpoint(ReplicaStore* store, const std::string& db_dir, uint64_t checkpoint_id,
                                    uint64_t epoch, std::optional<uint64_t> parent_id, Manifest* m) {
  Manifest parent;
  const bool has_parent = parent_id && store->ReadManifest(operator_id_, instance_, *parent_id, &parent).ok();
  std::unordered_map<std::string, const FileEntry*> parent_by_name;
  std::set<std::string> parent_identities;
  if (has_parent) {
    for (const auto& f : parent.files) {
      parent_by_name[f.name] = &f;
      parent_identities.insert(f.identity);
    }
  }
  m->operator_id = operator_id_;
  m->instance = instance_;
  m->checkpoint_id = checkpoint_id;
  m->has_parent = has_parent;
  m->parent_id = has_parent ? *parent_id : 0;
  m->epoch = epoch;
  m->version = version().value_or(0);
  m->partitioner.num_key_groups = partitioner_.num_key_groups();
  m->partitioner.num_vnodes = partitioner_.num_vnodes();
  m->partitioner.seed = partitioner_.seed();
  m->vnodes = vnodes();
  m->created_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  // Every file into the pool by content identity; the delta is what the
  // parent does not hold (§4.2.2 step 1).
  std::vector<std::string> names;
  RHINO_RETURN_IF_ERROR(fs::ListDir(db_dir, &names));
  for (size_t i = 0; i < names.size(); ++i) {
    FileEntry e;
    e.name = names[i];
    auto it = parent_by_name.find(e.name);
    RHINO_RETURN_IF_ERROR(
        store->PoolFile(fs::Join(db_dir, e.name), it == parent_by_name.end() ? nullptr : it->second, &e));
    e.in_delta = parent_identities.count(e.identity) == 0;
    m->files.push_back(std::move(e));
    if (i == names.size() / 2) CrashPoint("checkpoint.mid_pool");
  }
  return Status::OK();
}

}  // namespace rhino
