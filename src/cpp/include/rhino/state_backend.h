// StateBackend: one operator instance's keyed state (docs/design.md §1, Rhino §3.2).
//
// One RocksDB per instance, one column family per vnode ("vnode-00042"), so a
// vnode can be exported and imported as a unit. All column families share one
// WriteBufferManager, so memory does not grow with the number of vnodes.
// The default column family holds Rhino's metadata: the partitioner, the
// instance identity, the state version and the last checkpoint id.
//
// Keys are bytes; an int64 key is its 8 little-endian bytes (see partitioner.h).
// Every key is routed to its vnode (by its routing part); a key whose vnode
// this instance does not hold is rejected with UnknownVnode before anything
// of its batch is written.
//
// TTL clock: every vnode column family has a compaction filter that drops
// the routed keys with flag TTL whose expiry (their value's first 8 bytes) is
// <= the clock (state/ttl_filter.h). The clock is part of the state, stored
// with the metadata: set by a write with a batch time (in the same atomic
// write as its version) or by SetTtlClock, and loaded on every open, so a
// restored checkpoint comes back with the clock it was taken at.
//
// Thread-safety: reads and writes are thread-safe (RocksDB's guarantees);
// Checkpoint, ExportVnodes, ImportVnodes and DropVnodes serialize on an
// internal mutex.
//
// The API only: what a StateBackend is made of (the RocksDB instance, its
// options, the locks) is state/state_backend_impl.h's, as LevelDB's DB and
// DBImpl.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rhino/manifest.h"
#include "rhino/partitioner.h"
#include "rhino/replica_store.h"
#include "rhino/state_options.h"
#include "rhino/status.h"

namespace rhino {

// What a committed version was built on, where that is not the version before
// it (issue 47: an operator started at batch b > 0 builds b on no version;
// one resumed after a gap builds b on the batch before the gap). A commit
// records it with the version (SessionBatch::Commit), so a checkpoint, and
// every restore and takeover of it, knows what a rerun of that batch rolls
// back to, without being told (StateBackend::BaseOf).
struct VersionBase {
  std::optional<uint64_t> version;  // nullopt: built on no version
};

// A vnode hosted before its state has arrived (issue 48; the early hand-over
// of Del Monte's proposal, §4.1). Its column family holds only what this
// instance wrote since the move; the rest is its base, the source instance's
// committed checkpoint at the move's barrier. A session reads a key it does not
// find here through to the base (state/vnode_base.h, BaseReader), unless this
// instance deleted it since; when the base has landed, MergeBase puts it under
// this instance's writes. The record is kept in the state's metadata, so every
// checkpoint, restore and takeover of this instance knows the base it reads.
struct VnodeBase {
  std::string operator_id;         // the source's operator (the same one for a rescale)
  uint32_t instance = 0;           // the source instance
  uint64_t checkpoint = 0;         // its committed checkpoint at the barrier
  std::vector<std::string> hosts;  // workers that held it then (its primary, its chain)
};

// What MergeBase did.
struct MergeBaseStats {
  uint64_t files = 0;          // SST files put under the vnode
  uint64_t bytes = 0;          // their size
  uint64_t deletes_again = 0;  // deletes since the move, applied again over the base
};

class StateBackendImpl;  // state/state_backend_impl.h

// Per-vnode statistics (RocksDB estimates, cheap).
struct VnodeStats {
  uint32_t vnode = 0;
  uint64_t estimated_keys = 0;
  uint64_t sst_bytes = 0;
};

// A batch of puts and deletes applied atomically by StateBackend::Write.
class WriteBatch {
 public:
  WriteBatch();
  ~WriteBatch();
  WriteBatch(WriteBatch&&) noexcept;
  WriteBatch& operator=(WriteBatch&&) noexcept;

  size_t count() const;
  void Clear();

 private:
  friend class StateBackendImpl;
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

// The result of StateBackend::MultiGet: for each key, whether it was found and
// a view of its value. Views are valid while this object lives.
class MultiGetResult {
 public:
  MultiGetResult();
  ~MultiGetResult();
  MultiGetResult(const MultiGetResult&) = delete;
  MultiGetResult& operator=(const MultiGetResult&) = delete;

  size_t size() const;
  bool found(size_t i) const;
  std::string_view value(size_t i) const;  // REQUIRES: found(i)

  // The same results in the order the lookups were made (grouped by vnode,
  // sorted by key), j = 0 .. size() - 1. Values are then read in the order
  // they sit in RocksDB's blocks; reading them in key order instead is one
  // cache miss per value (the values of a 100k-key batch span megabytes).
  size_t key_index(size_t j) const;  // the input index of the j-th lookup
  bool found_at(size_t j) const;
  std::string_view value_at(size_t j) const;  // REQUIRES: found_at(j)

 private:
  friend class StateBackendImpl;
  struct Rep;
  std::unique_ptr<Rep> rep_;
};

class StateBackend {
 public:
  // Opens or creates the DB at `dir`. For an existing DB, `options.partitioner`
  // must match the stored one (InvalidArgument otherwise).
  static Status Open(const std::string& dir, const StateOptions& options,
                     std::unique_ptr<StateBackend>* out);

  // Restores checkpoint `checkpoint_id` of (operator_id, instance) from `store`
  // into `target_dir` (which must not exist), then opens it.
  static Status Restore(const ReplicaStore& store, const std::string& operator_id,
                        uint32_t instance, uint64_t checkpoint_id, const std::string& target_dir,
                        const RestoreOptions& restore_options, const StateOptions& options,
                        std::unique_ptr<StateBackend>* out, RestoreStats* stats);

  ~StateBackend();
  StateBackend(const StateBackend&) = delete;
  StateBackend& operator=(const StateBackend&) = delete;

  const std::string& dir() const;
  CompactionStyle compaction() const;
  const Partitioner& partitioner() const;
  const std::string& operator_id() const;
  uint32_t instance() const;
  std::vector<uint32_t> vnodes() const;

  // ---- single keys ----
  Status Get(std::string_view key, std::string* value) const;  // NotFound if absent
  Status Put(std::string_view key, std::string_view value);
  Status Delete(std::string_view key);

  // ---- batches ----
  // Adds to `batch`; UnknownVnode (adding nothing) if any key's vnode is not held.
  Status BatchPut(WriteBatch* batch, const std::vector<std::string_view>& keys,
                  const std::vector<std::string_view>& values) const;
  Status BatchDelete(WriteBatch* batch, const std::vector<std::string_view>& keys) const;
  // Applies `batch` atomically; if `version` is set, the state version is
  // written in the same RocksDB write batch, so state and version never
  // disagree (docs/design.md §5), and so is `batch_time_ms`, the new TTL
  // clock, if set. Clears `batch` on success.
  Status Write(WriteBatch* batch, std::optional<uint64_t> version,
               std::optional<int64_t> batch_time_ms = std::nullopt);
  // Looks up many keys on one consistent snapshot. The values stay pinned in
  // RocksDB's block cache (or memtable) until `out` is destroyed or reused, so
  // no value is copied here.
  Status MultiGet(const std::vector<std::string_view>& keys, MultiGetResult* out) const;

  // The order in which batches apply and look up `keys` (indices into keys):
  // grouped by vnode, bytewise within a vnode, repeats in input order.
  // MultiGet tells RocksDB its input is sorted, so this order must agree with
  // RocksDB's comparator; exposed so that tests can check that it does.
  Status BatchOrder(const std::vector<std::string_view>& keys, std::vector<size_t>* order) const;

  // Calls fn(key, value) for every entry of `vnode`, in key order, on a
  // consistent snapshot. Stops early if fn returns false.
  Status Scan(uint32_t vnode,
              const std::function<bool(std::string_view, std::string_view)>& fn) const;

  // The last version written with Write(..., version); nullopt if none.
  std::optional<uint64_t> version() const;
  // What version `version` was built on, if its commit recorded a base (one
  // other than version - 1); nullopt if it did not, or if the state is not at
  // `version` (a record of an older version is stale).
  std::optional<VersionBase> BaseOf(uint64_t version) const;
  // The checkpoint this DB was last checkpointed as or restored from.
  std::optional<uint64_t> last_checkpoint() const;

  // ---- TTL (see the top of this file) ----
  // The TTL clock (ms of batch time); nullopt until one is set.
  std::optional<int64_t> ttl_clock() const;
  // Sets and persists the clock; the next compactions drop what it expires.
  // InvalidArgument for INT64_MIN (which stands for "no clock").
  Status SetTtlClock(int64_t ms);
  // A full manual compaction of every vnode column family (through the TTL
  // filter); *bytes_before / *bytes_after are their live SST bytes. Aborted
  // once AbortCompaction has been called.
  Status CompactVnodes(uint64_t* bytes_before, uint64_t* bytes_after);
  // Before a close: a CompactVnodes under way returns soon (Aborted), and so
  // does every later one (even one whose call has not reached RocksDB yet).
  void AbortCompaction();

  // ---- checkpoints (docs/design.md §1, Rhino §4.2.2 phase 2 step 1) ----
  // Takes checkpoint `checkpoint_id` into `store`: a RocksDB
  // checkpoint (hard links) is staged, its files pooled by content identity,
  // and the manifest committed atomically. The delta is the set of files not
  // in the parent: the last checkpoint this state took or was restored from,
  // or else the newest committed one before `checkpoint_id`.
  // `checkpoint_id` must exceed the last id this state took, or equal it if
  // that one never committed and is newer than every committed checkpoint of
  // this instance (a retry after a crash): InvalidArgument otherwise. An id
  // the store already holds is AlreadyExists, before any work is done.
  Status Checkpoint(ReplicaStore* store, uint64_t checkpoint_id, uint64_t epoch, Manifest* out);

  // ---- vnode export / import (the primitive of a handover, Rhino §4.1) ----
  // Exports `vnodes` into `export_dir` (must not exist) as hard links.
  Status ExportVnodes(const std::vector<uint32_t>& vnodes, const std::string& export_dir);
  // Imports every vnode of an export made by ExportVnodes. The files are moved
  // (hard-linked, then unlinked from the export), so the export is consumed.
  // AlreadyExists if this instance already holds one of the vnodes.
  Status ImportVnodes(const std::string& export_dir, std::vector<uint32_t>* imported);
  // Drops the column families of `vnodes` (the origin's side of a handover).
  Status DropVnodes(const std::vector<uint32_t>& vnodes);

  // ---- vnodes on a base (the early hand-over, issue 48; VnodeBase above) ----
  // Whether this DB reserves RocksDB's last level for bases that land
  // (allow_ingest_behind, on since its creation): only such a DB takes a vnode
  // on a base. Every DB created since issue 48 does.
  bool takes_bases() const;
  // Starts holding `vnode`, with no entries of its own, on `base`. AlreadyExists
  // if it is held; InvalidArgument if !takes_bases().
  Status AddVnodeOnBase(uint32_t vnode, const VnodeBase& base);
  // The vnodes held on a base that has not been merged yet.
  std::map<uint32_t, VnodeBase> VnodeBases() const;
  // Puts the landed base of `vnode` under its own writes: `sst_files` (sorted,
  // not overlapping one another: BaseFileWriter's, state/vnode_base.h) are
  // moved into RocksDB's last level, below everything written here since the
  // move, which therefore wins; the deletes made since the move are applied
  // again (RocksDB drops a delete it compacts with nothing below it), and the
  // vnode is off its base. No session may be open (the service's rule, as for
  // imports). A merge cut short (a crash after the files went in) is finished
  // when the state opens. InvalidArgument if `vnode` is not on a base.
  Status MergeBase(uint32_t vnode, const std::vector<std::string>& sst_files, MergeBaseStats* stats);

  Status Stats(std::vector<VnodeStats>* out) const;
  Status Flush();
  // Waits up to `timeout` for RocksDB's background work (pending or running
  // flushes and compactions, over every vnode) to drain; *settled tells
  // whether it did. A checkpoint taken right after a burst of writes holds
  // the L0 files compaction has not merged yet, and a hard-link restore costs
  // one link per file, so settling first makes the next checkpoint cheaper to
  // restore (bench/README.md, "Reading the results"). A read-only DB runs no
  // background work, so it is settled at once. A compaction RocksDB reports
  // pending but does not start (universal compaction at exactly its trigger)
  // counts as settled after 100 ms with nothing running or queued; a call
  // that is inside such a quiet period at its timeout finishes it first.
  Status WaitForCompactions(std::chrono::milliseconds timeout, bool* settled) const;

 private:
  friend class SessionBatch;    // a session's writes go through the same routing and column families
  friend class BaseFileWriter;  // a base's files get the vnodes' column family options
  explicit StateBackend(std::unique_ptr<StateBackendImpl> impl);
  std::unique_ptr<StateBackendImpl> impl_;  // state/state_backend_impl.h
};

std::string VnodeColumnFamilyName(uint32_t vnode);
// Parses "vnode-00042"; false if `name` is not a vnode column family.
bool ParseVnodeColumnFamilyName(const std::string& name, uint32_t* vnode);

}  // namespace rhino
