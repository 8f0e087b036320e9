// StateBackendImpl: what a StateBackend is made of (LevelDB's DB / DBImpl
// split). rhino/state_backend.h is the API and its contract, and shows no
// member; this is the RocksDB instance, its column families, their options
// and the locks, private to the state folder (and SessionBatch, which writes
// through the same routing and column families).
//
// The implementation is split by concept:
//   state_open.cc         opening, closing and restoring the DB
//   state_keys.cc         routing keys to vnodes; reads, writes, batches, scans
//   state_maintenance.cc  the TTL clock, compactions, flushes and statistics
//   state_checkpoint.cc   incremental checkpoints into a replica store
//   vnode_transfer.cc     a vnode's export, import and drop
//   state_options.cc      the RocksDB options every DB and vnode gets
// Every public method has the contract of StateBackend's of the same name.
#pragma once

#include <rocksdb/slice.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "rhino/state_backend.h"
#include "rhino/thread_annotations.h"

namespace rocksdb {
class DB;
class Env;
struct DBOptions;
class ColumnFamilyHandle;
struct ColumnFamilyOptions;
class WriteBufferManager;
class Status;
}  // namespace rocksdb

namespace rhino {

class TtlCompactionFilter;  // state/ttl_filter.h

struct WriteBatch::Rep {
  rocksdb::WriteBatch batch;
};

struct MultiGetResult::Rep {
  static constexpr size_t kMissing = static_cast<size_t>(-1);
  std::vector<rocksdb::PinnableSlice> pinned;  // values, in the order they were looked up
  std::vector<size_t> slot;                    // key index -> index into pinned, or kMissing
  std::vector<size_t> order;                   // index into pinned -> key index
  std::vector<uint8_t> hit;                    // index into pinned -> found
};

class StateBackendImpl {
 public:
  static Status Open(const std::string& dir, const StateOptions& options, std::unique_ptr<StateBackendImpl>* out);
  static Status Restore(const ReplicaStore& store, const std::string& operator_id, uint32_t instance,
                        uint64_t checkpoint_id, const std::string& target_dir, const RestoreOptions& restore_options,
                        const StateOptions& options, std::unique_ptr<StateBackendImpl>* out, RestoreStats* stats);
  ~StateBackendImpl();
  StateBackendImpl(const StateBackendImpl&) = delete;
  StateBackendImpl& operator=(const StateBackendImpl&) = delete;

  const std::string& dir() const { return dir_; }
  CompactionStyle compaction() const { return compaction_; }
  const Partitioner& partitioner() const { return partitioner_; }
  const std::string& operator_id() const { return operator_id_; }
  uint32_t instance() const { return instance_; }
  std::vector<uint32_t> vnodes() const;

  Status Get(std::string_view key, std::string* value) const;
  Status Put(std::string_view key, std::string_view value);
  Status Delete(std::string_view key);
  Status BatchPut(WriteBatch* batch, const std::vector<std::string_view>& keys,
                  const std::vector<std::string_view>& values) const;
  Status BatchDelete(WriteBatch* batch, const std::vector<std::string_view>& keys) const;
  Status Write(WriteBatch* batch, std::optional<uint64_t> version, std::optional<int64_t> batch_time_ms);
  Status MultiGet(const std::vector<std::string_view>& keys, MultiGetResult* out) const;
  Status BatchOrder(const std::vector<std::string_view>& keys, std::vector<size_t>* order) const;
  Status Scan(uint32_t vnode, const std::function<bool(std::string_view, std::string_view)>& fn) const;

  std::optional<uint64_t> version() const;
  std::optional<VersionBase> BaseOf(uint64_t version) const;
  std::optional<uint64_t> last_checkpoint() const;

  std::optional<int64_t> ttl_clock() const;
  Status SetTtlClock(int64_t ms);
  Status CompactVnodes(uint64_t* bytes_before, uint64_t* bytes_after);
  void AbortCompaction();

  Status Checkpoint(ReplicaStore* store, uint64_t checkpoint_id, uint64_t epoch, Manifest* out);

  Status ExportVnodes(const std::vector<uint32_t>& vnodes, const std::string& export_dir);
  Status ImportVnodes(const std::string& export_dir, std::vector<uint32_t>* imported);
  Status DropVnodes(const std::vector<uint32_t>& vnodes);

  bool takes_bases() const { return takes_bases_; }
  Status AddVnodeOnBase(uint32_t vnode, const VnodeBase& base) EXCLUDES(cf_mu_);
  std::map<uint32_t, VnodeBase> VnodeBases() const;
  Status MergeBase(uint32_t vnode, const std::vector<std::string>& sst_files, MergeBaseStats* stats) EXCLUDES(cf_mu_);

  Status Stats(std::vector<VnodeStats>* out) const;
  Status Flush();
  Status WaitForCompactions(std::chrono::milliseconds timeout, bool* settled) const;

 private:
  friend class SessionBatch;    // a session's writes go through the same routing and column families
  friend class BaseFileWriter;  // a base's files get the vnodes' column family options
  StateBackendImpl() = default;
  // The steps of Open: the DB and its column families (created in one call
  // for a new DB), Rhino's metadata (checked, or written for a new DB), and
  // the vnode -> column family map.
  Status OpenDb(const rocksdb::DBOptions& dbo, bool read_only, bool exists, const std::vector<std::string>& cf_names,
                std::vector<rocksdb::ColumnFamilyHandle*>* handles);
  Status LoadMetadata(const StateOptions& options, bool exists, rocksdb::ColumnFamilyHandle* meta_cf);
  Status MapColumnFamilies(const std::vector<std::string>& cf_names,
                           const std::vector<rocksdb::ColumnFamilyHandle*>& handles) EXCLUDES(cf_mu_);
  // The steps of Checkpoint (state_checkpoint.cc): a RocksDB checkpoint at
  // `db_dir`, then its files pooled into `store` and described in *m.
  Status CreateRocksCheckpoint(const std::string& db_dir);
  Status PoolCheckpoint(ReplicaStore* store, const std::string& db_dir, uint64_t checkpoint_id, uint64_t epoch,
                        std::optional<uint64_t> parent_id, Manifest* m);
  Status Route(std::string_view key, rocksdb::ColumnFamilyHandle** cf) const REQUIRES_SHARED(cf_mu_);
  // Refuses writes to a read-only DB, and resumes a DB that a write error
  // stopped (see WriteResult).
  Status CheckWritable() const;
  // A write's RocksDB status as a Status. An I/O error (a full disk, most
  // often) stops RocksDB's writes until DB::Resume; it is remembered so that
  // the next write first tries to resume, and succeeds once space is free.
  Status WriteResult(const rocksdb::Status& s, const std::string& context) const;
  Status AddToBatch(WriteBatch* batch, const std::vector<std::string_view>& keys,
                    const std::vector<std::string_view>* values) const EXCLUDES(cf_mu_);
  struct VnodeOrder;  // state_keys.cc
  // UnknownVnode for the first key not held.
  Status OrderKeys(const std::vector<std::string_view>& keys, VnodeOrder* out) const REQUIRES_SHARED(cf_mu_);
  std::optional<uint64_t> ReadU64Meta(const std::string& key) const;
  // ---- vnodes on a base (vnode_base.cc) ----
  // At open: the bases recorded in the metadata, a column family made for one
  // whose making a crash cut short, and a merge cut short finished.
  Status LoadVnodeBases() EXCLUDES(cf_mu_);
  bool OnBase(uint32_t vnode) const REQUIRES_SHARED(cf_mu_) {
    return vnode < on_base_.size() && on_base_[vnode] != 0;
  }
  bool AnyOnBase() const { return bases_.load(std::memory_order_acquire) > 0; }
  // Adds to `wb` what a put (or delete) of `key` in `vnode`, on a base, also
  // writes: the key is no longer (or now is) gone.
  Status NoteBaseWrite(rocksdb::WriteBatch* wb, uint32_t vnode, std::string_view key, bool put) const;
  // gone[i]: whether keys[i] of vnodes[i] was deleted here since its vnode's move.
  Status Gone(const std::vector<uint32_t>& vnodes, const std::vector<std::string_view>& keys,
              std::vector<uint8_t>* gone) const;
  // The gone keys of `vnode` that start with `prefix`, in key order.
  Status GoneWithPrefix(uint32_t vnode, std::string_view prefix, std::vector<std::string>* out) const;
  // The steps of a merge after its files went in (MergeBase, and an open that
  // finds one cut short).
  Status FinishMerge(uint32_t vnode, MergeBaseStats* stats) EXCLUDES(cf_mu_);
  // Deletes the base record and the gone keys of `vnode` (dropped on its base).
  Status ForgetBase(uint32_t vnode) REQUIRES(cf_mu_);
  // The sum of the vnode column families' live SST bytes.
  uint64_t LiveVnodeBytes() const REQUIRES_SHARED(cf_mu_);
  // Flushes every column family's memtable, the flushes running side by side
  // on the flush threads (state_maintenance.cc).
  Status FlushColumnFamilies() EXCLUDES(cf_mu_);
  // Bytes in the live write-ahead log files: what is not yet in an SST.
  Status LiveWalBytes(uint64_t* bytes);
  // Writes the OPTIONS file that an open with sync_open = false left out
  // (open_without_sync.h), once: a background thread started by Open calls it
  // right away, and Checkpoint calls it first, so that every checkpoint
  // holds an OPTIONS file.
  Status WriteDeferredOptionsFile() EXCLUDES(options_file_mu_);

  std::string dir_;
  std::string operator_id_;
  uint32_t instance_ = 0;
  bool read_only_ = false;
  uint64_t checkpoint_wal_bytes_ = 0;  // StateOptions::checkpoint_wal_bytes
  CompactionStyle compaction_ = CompactionStyle::kLevel;
  mutable std::atomic<bool> write_error_{false};  // a write failed with an I/O error; resume first
  Partitioner partitioner_;
  std::shared_ptr<rocksdb::WriteBufferManager> wbm_;
  // The TTL filter every vnode's options point to (cf_options_ holds a raw
  // pointer): declared before db_, so it outlives the DB.
  std::shared_ptr<TtlCompactionFilter> ttl_filter_;
  std::atomic<bool> compaction_aborted_{false};  // CompactRangeOptions::canceled of CompactVnodes
  std::shared_ptr<rocksdb::ColumnFamilyOptions> cf_options_;  // every vnode's (shared cache)
  // The Env of a DB opened with sync_open = false (else null: the default
  // Env); declared before db_, so it outlives the DB.
  std::unique_ptr<rocksdb::Env> env_;
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::ColumnFamilyHandle* default_cf_ = nullptr;  // Rhino metadata
  // Guards the vnode -> column family map. Reads and writes hold it shared for
  // the whole operation (a handle must not be destroyed under them); import
  // and drop hold it exclusively.
  mutable SharedMutex cf_mu_;
  std::vector<rocksdb::ColumnFamilyHandle*> cf_by_vnode_ GUARDED_BY(cf_mu_);  // null = not held
  // Vnodes on a base (1) and how many: most states have none, and their reads
  // then never look for one.
  std::vector<uint8_t> on_base_ GUARDED_BY(cf_mu_);
  std::atomic<uint32_t> bases_{0};
  bool takes_bases_ = false;  // allow_ingest_behind since the DB was created
  std::mutex admin_mu_;  // serializes Checkpoint / Export / Import / Drop
  Mutex options_file_mu_;
  bool options_file_deferred_ GUARDED_BY(options_file_mu_) = false;
  std::thread options_file_writer_;     // joined before the DB closes
};

}  // namespace rhino
