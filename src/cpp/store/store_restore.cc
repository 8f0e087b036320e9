// ReplicaStore::Restore: a checkpoint rebuilt as a DB directory from the
// pool, by hard links where the files are immutable and copies where not
// (or where the filesystem refuses links), staged and renamed into place
// (RocksDB's checkpoint_impl.cc is the model), with its figures.
#include "rhino/replica_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <set>
#include <unordered_map>

#include "store/store_internal.h"
#include "util/crash_point.h"
#include "util/fs.h"

namespace rhino {
using namespace store_internal;

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// A file placed by a restore, counted in its stats.
void CountPlaced(uint64_t size, bool linked, RestoreStats* stats) {
  ++stats->files;
  stats->total_bytes += size;
  if (linked) {
    ++stats->linked_files;
  } else {
    ++stats->copied_files;
    stats->copied_bytes += size;
  }
}

}  // namespace

Status ReplicaStore::Restore(const std::string& operator_id, uint32_t instance, uint64_t checkpoint_id,
                             const std::string& target_dir, const RestoreOptions& options,
                             RestoreStats* stats) const {
  auto t0 = std::chrono::steady_clock::now();
  *stats = RestoreStats();
  if (target_dir.empty()) return Status::InvalidArgument("restore target directory is empty");
  if (fs::Exists(target_dir)) {
    return Status::AlreadyExists("restore target " + target_dir + " already exists; refusing to overwrite it");
  }
  std::unique_ptr<Lock> lock;
  const auto locking = std::chrono::steady_clock::now();
  RHINO_RETURN_IF_ERROR(AcquireLock(false, &lock));  // GC must not reclaim files under us
  stats->lock_wait_seconds = Seconds(locking);
  Manifest m;
  RHINO_RETURN_IF_ERROR(ReadManifest(operator_id, instance, checkpoint_id, &m));
  if (options.take_standby && options.mode == PlaceMode::kLink && options.verify == VerifyLevel::kSize) {
    bool taken = false;
    RHINO_RETURN_IF_ERROR(TakeStandby(m, target_dir, stats, &taken));
    if (taken) return Status::OK();
  }
  std::vector<std::string> sources;
  RestoreProgress progress;
  progress.files_total = m.files.size();
  for (const auto& f : m.files) progress.bytes_total += f.size;
  for (const auto& f : m.files) {
    if (!IsPlainFileName(f.name)) {
      return Status::PathOutsideStore("checkpoint " + std::to_string(checkpoint_id) + " names file '" + f.name +
                                      "', which is not a plain file name");
    }
    std::string pooled;
    RHINO_RETURN_IF_ERROR(PoolPath(f.identity, &pooled));
    uint64_t size = 0;
    if (!fs::FileSize(pooled, &size).ok()) {
      return Status::Corruption("checkpoint " + std::to_string(checkpoint_id) + ": file " + f.name +
                                " is missing from the pool");
    }
    if (size != f.size) {
      return Status::Corruption("checkpoint " + std::to_string(checkpoint_id) + ": file " + f.name + " is " +
                                std::to_string(size) + " bytes, manifest says " + std::to_string(f.size) +
                                (size < f.size ? " (truncated)" : ""));
    }
    if (options.verify == VerifyLevel::kFull) {
      std::string sum;
      uint64_t n;
      RHINO_RETURN_IF_ERROR(HashFile(pooled, &sum, &n));
      if (sum != f.checksum) {
        return Status::Corruption("checkpoint " + std::to_string(checkpoint_id) + ": file " + f.name +
                                  " fails its checksum");
      }
    }
    sources.push_back(std::move(pooled));
    ++progress.files_done;
    progress.bytes_done += f.size;
    if (options.keep_going && !options.keep_going(progress)) {
      return Status::Aborted("restore of checkpoint " + std::to_string(checkpoint_id) +
                             " stopped by its caller while verifying");
    }
  }

  std::string parent = fs::Parent(target_dir);
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(parent));
  // Remove staging of earlier restores to this target whose process died.
  const std::string prefix = fs::Basename(target_dir) + ".rhino-restore-";
  std::vector<std::string> siblings;
  if (fs::ListDir(parent, &siblings).ok()) {
    for (const auto& n : siblings)
      if (StagingOwnerDead(n, prefix)) fs::RemoveAll(fs::Join(parent, n));
  }
  std::string stage = fs::Join(parent, prefix + std::to_string(::getpid()) + "-" + fs::RandomHex(6));
  if (::mkdir(stage.c_str(), 0755) != 0) return Status::FromErrno(errno, "mkdir " + stage);

  Status s;
  progress.stage = RestoreProgress::Stage::kPlace;
  progress.files_done = progress.bytes_done = 0;
  for (size_t i = 0; i < m.files.size() && s.ok(); ++i) {
    const FileEntry& f = m.files[i];
    std::string dst = fs::Join(stage, f.name);
    bool linked = false;
    if (options.mode == PlaceMode::kLink && IsImmutableDbFile(f.name)) {
      bool cross_device = false;
      s = fs::Link(sources[i], dst, &cross_device);
      if (s.ok()) {
        linked = true;
      } else if (cross_device) {
        stats->fell_back_to_copy = true;
        s = Status::OK();
      }
    }
    if (s.ok() && !linked) {
      s = fs::CopyFile(sources[i], dst, options.durable);
      if (s.ok()) ::chmod(dst.c_str(), 0600);  // owner-only; RocksDB may rewrite it
    }
    if (s.ok()) CountPlaced(f.size, linked, stats);
    if (i == m.files.size() / 2) CrashPoint("restore.mid_files");
    if (s.ok()) {
      ++progress.files_done;
      progress.bytes_done += f.size;
      if (options.keep_going && !options.keep_going(progress)) {
        s = Status::Aborted("restore of checkpoint " + std::to_string(checkpoint_id) + " stopped by its caller");
      }
    }
  }
  if (s.ok() && options.durable) s = fs::FsyncPath(stage);
  if (s.ok()) CrashPoint("restore.before_rename");
  if (s.ok()) s = fs::Rename(stage, target_dir);
  if (!s.ok()) {
    fs::RemoveAll(stage);
    return s;
  }
  if (options.durable) RHINO_RETURN_IF_ERROR(fs::FsyncPath(parent));
  stats->build_seconds = Seconds(t0);
  return Status::OK();
}

}  // namespace rhino
