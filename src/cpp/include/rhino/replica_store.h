// ReplicaStore: a worker's store of checkpoint files and committed manifests
// (docs/design.md §1 "replica store"). This is its local half: the file pool, atomic
// manifest commits, retention, garbage collection, verification and local
// restore by hard links. The network half (chain replication) feeds the same
// primitives.
//
// Layout under `dir`:
//   pool/<identity>                         immutable files (mode 0400), keyed by content
//   checkpoints/<operator_id>/<instance>/<checkpoint_id:020>.manifest
//   tmp/<kind>-<pid>-<nonce>/               staging; never read by anybody else
//   standby/<operator_id>/<instance>/db/    the newest checkpoint's RocksDB directory, ready
//   standby/<operator_id>/<instance>/checkpoint  ... for that checkpoint id (absent while it changes)
//   LOCK                                    flock: shared while pooling/committing/restoring,
//                                           exclusive while garbage-collecting
//
// Thread-safety: a ReplicaStore may be used from several threads and several
// processes at once. Pool insertion is link(2), which is atomic; manifest
// commit is rename(2); GC holds the exclusive lock, so it never removes a file
// that a checkpoint has pooled but not yet committed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "rhino/manifest.h"
#include "rhino/status.h"

namespace rhino {

// How restore places a pooled file into the new DB directory (STYLE: "pass the
// strategy in", so tests can force each path).
enum class PlaceMode {
  kLink = 0,  // hard link; falls back to copy across filesystems (EXDEV)
  kCopy = 1,  // always copy bytes (the baseline a DFS-style restore pays)
};

enum class VerifyLevel {
  kSize = 0,  // presence and size of every file: O(files)
  kFull = 1,  // also re-hash every byte: O(bytes)
};

// How far a restore has come, given to RestoreOptions::keep_going after each
// file. A restore first checks every file (kCheck: presence and size, and
// with VerifyLevel::kFull its checksum), then places them (kPlace: a link or
// a copy each). bytes_* count the files' sizes, whether or not they were read.
struct RestoreProgress {
  enum class Stage { kCheck, kPlace };
  Stage stage = Stage::kCheck;
  uint64_t files_done = 0;
  uint64_t files_total = 0;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
};

struct RestoreOptions {
  PlaceMode mode = PlaceMode::kLink;
  VerifyLevel verify = VerifyLevel::kSize;
  // Called after each file, while they are checked and while they are placed;
  // returning false stops the restore with Aborted and leaves no target
  // directory. A full verify or a copy of a large checkpoint runs for
  // minutes; this is how a caller shows progress and lets its user interrupt.
  std::function<bool(const RestoreProgress&)> keep_going;
  // false: build the directory without fsyncing its copied files, itself or
  // its parent. For a takeover or a rollback, whose checkpoint stays durable
  // in the store: under write load each fsync waits for the file system's
  // journal (10-50 ms apiece here), which put ~60 ms on the critical path of
  // a failover. The caller makes the directory durable afterwards
  // (fs::FsyncDirTree), and a worker that restarts with a damaged directory
  // rebuilds it from the store (HostedInstance::Rebuild).
  bool durable = true;
  // Take the instance's standby directory (RefreshStandby) when it holds
  // exactly `checkpoint_id`: the restore is then one rename, whatever the
  // number of files. Otherwise the directory is built as usual.
  bool take_standby = false;
  // A batch waits on this restore (a takeover, a rollback): StateBackend's
  // Restore runs it, open included, under the normal scheduling policy even
  // when the calling thread is a SCHED_BATCH one, as a worker daemon's are
  // (util/sched.h). Off for background restores (a state reader, a rebuild).
  bool latency_critical = false;
};

struct RestoreStats {
  uint64_t files = 0;
  uint64_t linked_files = 0;
  uint64_t copied_files = 0;  // mutable RocksDB files are always copied (small)
  uint64_t copied_bytes = 0;
  uint64_t total_bytes = 0;
  bool fell_back_to_copy = false;  // a link failed with EXDEV and we copied instead
  bool from_standby = false;       // the standby directory was renamed into place
  double lock_wait_seconds = 0;     // waiting for the store's lock (held by a GC pass)
  double build_seconds = 0;         // building the directory (link/copy + fsync + rename)
  double open_seconds = 0;          // opening RocksDB on it (filled in by StateBackend)
  // Of open_seconds, on the opening thread (/proc/thread-self/schedstat): the
  // CPU it ran, and the time it was runnable but waiting for a CPU. The rest is
  // I/O. Zeros where the kernel keeps no such figures.
  double open_cpu_seconds = 0;
  double open_wait_seconds = 0;
};

struct VerifyProblem {
  std::string operator_id;
  uint32_t instance = 0;
  uint64_t checkpoint_id = 0;
  std::string file;    // file name, or "" for the manifest itself
  std::string detail;  // e.g. "checksum mismatch", "missing", "truncated: 10 < 20"
};

struct VerifyReport {
  uint64_t checkpoints = 0;
  uint64_t files_checked = 0;  // file references checked, one per file of every checkpoint
  // Bytes read and re-hashed (kFull). A pooled file that several checkpoints
  // share is hashed once per Verify, and its result holds for all of them.
  uint64_t bytes_checked = 0;
  std::vector<VerifyProblem> problems;
  bool ok() const { return problems.empty(); }
};

struct GcStats {
  uint64_t files_removed = 0;
  uint64_t bytes_removed = 0;
  uint64_t staging_removed = 0;
  uint64_t standbys_removed = 0;
  uint64_t pins = 0;          // live pins honoured (ReplicaStore::Pin)
  uint64_t pool_files = 0;    // the pool after the pass
  uint64_t pool_bytes = 0;
};

struct InstanceRef {
  std::string operator_id;
  uint32_t instance = 0;
};

class ReplicaStore {
 public:
  // Opens (creating if needed) the store at `dir`, and removes staging
  // directories left by processes that no longer run.
  static Status Open(const std::string& dir, std::unique_ptr<ReplicaStore>* out);
  ReplicaStore(const ReplicaStore&) = delete;
  ReplicaStore& operator=(const ReplicaStore&) = delete;

  const std::string& dir() const { return dir_; }

  // An flock on LOCK, released when the object is destroyed. Hold a shared lock
  // from the first PoolFile of a checkpoint until its CommitManifest.
  class Lock {
   public:
    explicit Lock(int fd) : fd_(fd) {}
    ~Lock();
    Lock(const Lock&) = delete;
    Lock& operator=(const Lock&) = delete;

   private:
    int fd_;
  };
  // With wait = false, Busy if another holder conflicts (LOCK_NB).
  Status AcquireLock(bool exclusive, std::unique_ptr<Lock>* out, bool wait = true) const;

  // A pin keeps the pooled files of a manifest from GarbageCollect for as long
  // as it lives, without holding the store's lock that long (issue 46: a
  // replica stream used to hold the shared lock for its whole life, so on a
  // replica that always had a stream open GC never ran and the pool grew
  // until the disk filled). It is a file pins/<pid>-<random> listing the
  // identities, removed when the Pin is destroyed; GC honours the pins of
  // processes that run and removes those of processes that do not.
  class Pin {
   public:
    explicit Pin(std::string path) : path_(std::move(path)) {}
    ~Pin();
    Pin(const Pin&) = delete;
    Pin& operator=(const Pin&) = delete;

   private:
    std::string path_;
  };
  // Pins every file of `m`. Call it with the shared lock held, before looking
  // at the pool: a GC pass (under the exclusive lock) then either ended
  // before, and what it removed is seen missing, or starts after and sees the
  // pin. The lock may be released once the pool has been looked at.
  Status PinManifest(const Manifest& m, std::unique_ptr<Pin>* out);

  // A fresh staging directory under tmp/; the caller removes it (RemoveAll).
  Status NewStagingDir(const std::string& kind, std::string* path);

  // Adds the file at `path` to the pool, filling entry->{size,checksum,identity}.
  // If `known` is non-null and names a pooled file with the same inode as
  // `path`, the content is already known and the file is not re-read: this is
  // what makes an incremental checkpoint cost O(new bytes).
  Status PoolFile(const std::string& path, const FileEntry* known, FileEntry* entry);

  // Adds the file at `path` to the pool as `entry.identity` without reading
  // it: the caller has already checked that its bytes hash to entry.checksum
  // and that it has entry.size bytes (chain replication hashes each file while
  // receiving it, docs/protocol.md §4 step 2, so re-reading would double the
  // disk traffic of a replica). OK if that identity is pooled already.
  Status AdoptVerifiedFile(const std::string& path, const FileEntry& entry);

  // Atomically commits `m` (write tmp, fsync, rename, fsync dir). Every file of
  // `m` must already be pooled. AlreadyExists if that checkpoint is committed.
  Status CommitManifest(const Manifest& m);

  Status ReadManifest(const std::string& operator_id, uint32_t instance, uint64_t checkpoint_id,
                      Manifest* out) const;
  // Committed checkpoint ids of one instance, ascending.
  Status ListCheckpoints(const std::string& operator_id, uint32_t instance,
                         std::vector<uint64_t>* out) const;
  Status ListInstances(std::vector<InstanceRef>* out) const;

  // Builds a RocksDB directory for checkpoint `checkpoint_id` at `target_dir`,
  // which must not exist. Staged in a sibling directory and renamed into place,
  // so `target_dir` is either absent or complete. SST and blob files are hard
  // links to pooled files; small mutable files (MANIFEST, CURRENT, OPTIONS, WAL)
  // are copied, as RocksDB's own Checkpoint does.
  Status Restore(const std::string& operator_id, uint32_t instance, uint64_t checkpoint_id,
                 const std::string& target_dir, const RestoreOptions& options,
                 RestoreStats* stats) const;

  // Brings the instance's standby directory up to its newest committed
  // checkpoint, by the difference from what it holds: links for the new SST
  // and blob files, fresh copies of the small mutable ones, unlinks for the
  // files that went. A replica calls it, off its commit path, after each
  // commit, so that a takeover's restore is a rename (design §4 step 3):
  // building the directory at takeover time is one metadata operation per
  // file, and on a busy disk those wait for the journal (up to a second at
  // 4 GiB, bench/results/spark_recovery.md). The directory is never synced;
  // a takeover syncs what it takes, as for a built one. An instance with no
  // checkpoint loses its standby. *refreshed says whether anything changed.
  Status RefreshStandby(const std::string& operator_id, uint32_t instance, bool* refreshed = nullptr);

  // Called after every file Verify checks, with the report so far. Returning
  // false stops the verification: Verify then returns Aborted. A full verify
  // of a large store runs for minutes; this is how a caller shows progress
  // and lets its user interrupt it.
  using VerifyObserver = std::function<bool(const VerifyReport& so_far)>;

  // Re-checks every committed checkpoint (or one instance's, if operator_id is
  // non-empty) at `level`.
  Status Verify(const std::string& operator_id, uint32_t instance, VerifyLevel level,
                VerifyReport* report, const VerifyObserver& observer = nullptr) const;

  // Deletes the manifests of all but the newest `keep_last` checkpoints of an
  // instance. Files are reclaimed by GarbageCollect.
  Status Retain(const std::string& operator_id, uint32_t instance, uint32_t keep_last,
                std::vector<uint64_t>* removed);
  // Deletes the manifests of the instance's checkpoints older than `floor`,
  // oldest first (a crash part-way leaves a suffix of the history, never a
  // gap). Retention (store/retention.h) uses it: by id, so a checkpoint
  // committed meanwhile never shifts what goes.
  Status DiscardBefore(const std::string& operator_id, uint32_t instance, uint64_t floor,
                       std::vector<uint64_t>* removed);
  // Deletes the manifests of the instance's checkpoints newer than `after`
  // (all of them if `after` is unset), newest first. A re-executed micro-batch
  // replaces the history after the checkpoint it restarts from (design §5).
  Status DiscardAfter(const std::string& operator_id, uint32_t instance, std::optional<uint64_t> after,
                      std::vector<uint64_t>* removed);
  // Removes pooled files that no committed manifest and no live pin references,
  // and stale staging. With wait = false, returns Busy at once instead of
  // waiting for the restores and stream openings that hold the shared lock,
  // each briefly (store/retention.h).
  Status GarbageCollect(GcStats* stats, bool wait = true);

  // pool/<identity>; PathOutsideStore if `identity` is not of the identity form.
  Status PoolPath(const std::string& identity, std::string* path) const;

 private:
  explicit ReplicaStore(std::string dir) : dir_(std::move(dir)) {}
  Status InstanceDir(const std::string& operator_id, uint32_t instance, std::string* path) const;
  std::string StandbyDir(const std::string& operator_id, uint32_t instance) const;
  std::shared_ptr<std::mutex> StandbyMutex(const std::string& operator_id, uint32_t instance) const;
  // With `m` read under the store's shared lock: renames the standby directory
  // to `target_dir` if it holds exactly that checkpoint, and says so in *taken.
  // A standby that does not match `m` file for file is removed, never used.
  Status TakeStandby(const Manifest& m, const std::string& target_dir, RestoreStats* stats, bool* taken) const;
  // Under the exclusive lock (GC): removes standby directories that are not
  // of their instance's newest checkpoint.
  void DropStaleStandbys(GcStats* stats);
  Status PinnedIdentities(std::set<std::string>* pinned, uint64_t* pins);

  std::string dir_;
  mutable std::mutex standby_mu_;  // guards standby_locks_
  mutable std::map<std::string, std::shared_ptr<std::mutex>> standby_locks_;  // one per instance
};

// Computes XXH3-128 of a file's contents as 32 hex digits, and its size.
Status HashFile(const std::string& path, std::string* checksum, uint64_t* size);

// True for files RocksDB never modifies after creation (SST, blob): safe to hard-link.
bool IsImmutableDbFile(const std::string& name);

}  // namespace rhino
