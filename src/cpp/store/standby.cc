// Standby directories: a replica keeps, for each instance it holds, the RocksDB
// directory of the newest checkpoint ready to open, so that a takeover's
// restore is one rename (design §4 step 3, "restore by hard links", taken off
// the critical path).
//
// Why: building the directory at takeover time is one link(2) per SST plus a
// few small copies, each a metadata operation in the file system's journal.
// On a disk shared with compactions and writeback those waited up to a second
// at 4 GiB (bench/results/spark_recovery.md, build_s). Kept up to date after
// each commit, the standby pays the same operations, by the difference from
// the previous checkpoint, while nobody waits.
//
// Safety: a standby is only an optimisation. It is used only when its marker
// names exactly the checkpoint asked for and every file matches the manifest
// (names, sizes, and for linked files the pooled inode itself); anything else
// removes it and the restore builds the directory as before. The marker is
// removed before the directory changes and written after, so a crash mid-way
// leaves a standby that is never used, and the next refresh rebuilds it.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <map>
#include <set>

#include "rhino/replica_store.h"
#include "util/fs.h"

namespace rhino {
namespace {

constexpr char kStandbyDb[] = "db";
constexpr char kStandbyMarker[] = "checkpoint";

// The marker is a hint, re-checked on use, so it is not synced.
Status WriteMarker(const std::string& path, uint64_t checkpoint_id) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "we");
  if (f == nullptr) return Status::FromErrno(errno, "create " + tmp);
  const bool ok = std::fprintf(f, "%llu\n", static_cast<unsigned long long>(checkpoint_id)) > 0;
  if (std::fclose(f) != 0 || !ok) {
    ::unlink(tmp.c_str());
    return Status::IOError("write " + tmp);
  }
  return fs::Rename(tmp, path);
}

bool ReadMarker(const std::string& path, uint64_t* checkpoint_id) {
  std::string text;
  if (!fs::ReadFile(path, &text).ok() || text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || (*end != '\n' && *end != '\0')) return false;
  *checkpoint_id = v;
  return true;
}

bool SameInode(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

}  // namespace

std::string ReplicaStore::StandbyDir(const std::string& operator_id, uint32_t instance) const {
  return fs::Join(fs::Join(fs::Join(dir_, "standby"), operator_id), std::to_string(instance));
}

std::shared_ptr<std::mutex> ReplicaStore::StandbyMutex(const std::string& operator_id, uint32_t instance) const {
  std::lock_guard<std::mutex> l(standby_mu_);
  auto& mu = standby_locks_[operator_id + "/" + std::to_string(instance)];
  if (!mu) mu = std::make_shared<std::mutex>();
  return mu;
}

Status ReplicaStore::RefreshStandby(const std::string& operator_id, uint32_t instance, bool* refreshed) {
  if (refreshed != nullptr) *refreshed = false;
  std::string inst_dir;
  RHINO_RETURN_IF_ERROR(InstanceDir(operator_id, instance, &inst_dir));  // validates the operator id
  // The store's lock before the instance's mutex, as Restore and GarbageCollect
  // take them: GC holds the exclusive lock while it takes instance mutexes.
  std::unique_ptr<Lock> lock;
  RHINO_RETURN_IF_ERROR(AcquireLock(false, &lock));  // GC must not reclaim what we link
  auto mu = StandbyMutex(operator_id, instance);
  std::lock_guard<std::mutex> guard(*mu);
  const std::string root = StandbyDir(operator_id, instance);
  const std::string db = fs::Join(root, kStandbyDb);
  const std::string marker = fs::Join(root, kStandbyMarker);
  std::vector<uint64_t> ids;
  RHINO_RETURN_IF_ERROR(ListCheckpoints(operator_id, instance, &ids));
  if (ids.empty()) return fs::RemoveAll(root);
  uint64_t held = 0;
  if (ReadMarker(marker, &held) && held == ids.back() && fs::IsDir(db)) return Status::OK();
  Manifest m;
  RHINO_RETURN_IF_ERROR(ReadManifest(operator_id, instance, ids.back(), &m));

  if (::unlink(marker.c_str()) != 0 && errno != ENOENT) return Status::FromErrno(errno, "unlink " + marker);
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(db));
  std::map<std::string, const FileEntry*> wanted;
  for (const auto& f : m.files) wanted[f.name] = &f;
  std::vector<std::string> present;
  RHINO_RETURN_IF_ERROR(fs::ListDir(db, &present));
  std::set<std::string> kept;
  for (const auto& name : present) {
    const std::string p = fs::Join(db, name);
    auto it = wanted.find(name);
    std::string pooled;
    // An immutable file stays if it is the pooled file itself; a mutable one
    // (MANIFEST, WAL, ...) is copied afresh: the new checkpoint's differs.
    if (it != wanted.end() && IsImmutableDbFile(name) && PoolPath(it->second->identity, &pooled).ok() &&
        SameInode(p, pooled)) {
      kept.insert(name);
      continue;
    }
    RHINO_RETURN_IF_ERROR(fs::RemoveAll(p));
  }
  for (const auto& f : m.files) {
    if (kept.count(f.name)) continue;
    std::string pooled;
    RHINO_RETURN_IF_ERROR(PoolPath(f.identity, &pooled));
    const std::string dst = fs::Join(db, f.name);
    if (IsImmutableDbFile(f.name)) {
      bool cross_device = false;
      // Across file systems a standby buys nothing (a takeover would copy).
      RHINO_RETURN_IF_ERROR(fs::Link(pooled, dst, &cross_device));
    } else {
      RHINO_RETURN_IF_ERROR(fs::CopyFile(pooled, dst, /*sync=*/false));
      ::chmod(dst.c_str(), 0600);  // owner-only, as a restore's copies
    }
  }
  RHINO_RETURN_IF_ERROR(WriteMarker(marker, m.checkpoint_id));
  if (refreshed != nullptr) *refreshed = true;
  return Status::OK();
}

Status ReplicaStore::TakeStandby(const Manifest& m, const std::string& target_dir, RestoreStats* stats,
                                 bool* taken) const {
  *taken = false;
  const auto t0 = std::chrono::steady_clock::now();
  auto mu = StandbyMutex(m.operator_id, m.instance);
  std::lock_guard<std::mutex> guard(*mu);
  const std::string root = StandbyDir(m.operator_id, m.instance);
  const std::string db = fs::Join(root, kStandbyDb);
  const std::string marker = fs::Join(root, kStandbyMarker);
  uint64_t held = 0;
  if (!ReadMarker(marker, &held) || held != m.checkpoint_id) return Status::OK();
  // File for file against the manifest: same names, same sizes, and each
  // linked file the pooled file itself. A mismatch (damage, a crash in a
  // refresh that still left a marker) discards the standby, never uses it.
  std::vector<std::string> present;
  bool match = fs::ListDir(db, &present).ok() && present.size() == m.files.size();
  RestoreStats st;
  for (size_t i = 0; match && i < m.files.size(); ++i) {
    const FileEntry& f = m.files[i];
    const std::string p = fs::Join(db, f.name);
    uint64_t size = 0;
    std::string pooled;
    match = fs::FileSize(p, &size).ok() && size == f.size;
    if (match && IsImmutableDbFile(f.name)) {
      match = PoolPath(f.identity, &pooled).ok() && SameInode(p, pooled);
      ++st.linked_files;
    } else if (match) {
      ++st.copied_files;
      st.copied_bytes += f.size;
    }
    ++st.files;
    st.total_bytes += f.size;
  }
  if (!match) {
    std::fprintf(stderr, "rhino replica store: the standby of %s/%u does not match checkpoint %llu; removed it\n",
                 m.operator_id.c_str(), m.instance, static_cast<unsigned long long>(m.checkpoint_id));
    return fs::RemoveAll(root);
  }
  if (::unlink(marker.c_str()) != 0 && errno != ENOENT) return Status::FromErrno(errno, "unlink " + marker);
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(fs::Parent(target_dir)));
  if (!fs::Rename(db, target_dir).ok()) {
    fs::RemoveAll(root);  // e.g. another file system: build as before, and stop keeping it
    return Status::OK();
  }
  st.from_standby = true;
  st.build_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  st.lock_wait_seconds = stats->lock_wait_seconds;  // the caller's (ReplicaStore::Restore)
  *stats = st;
  *taken = true;
  return Status::OK();
}

void ReplicaStore::DropStaleStandbys(GcStats* stats) {
  const std::string top = fs::Join(dir_, "standby");
  std::vector<std::string> ops;
  if (!fs::ListDir(top, &ops).ok()) return;
  for (const auto& op : ops) {
    std::vector<std::string> insts;
    if (!IsValidOperatorId(op) || !fs::ListDir(fs::Join(top, op), &insts).ok()) continue;
    for (const auto& i : insts) {
      char* end = nullptr;
      const unsigned long v = std::strtoul(i.c_str(), &end, 10);
      if (i.empty() || *end != '\0' || std::to_string(v) != i) continue;
      const uint32_t instance = static_cast<uint32_t>(v);
      std::vector<uint64_t> ids;
      uint64_t held = 0;
      const std::string root = StandbyDir(op, instance);
      // Files of older checkpoints would outlive their pool entries here.
      if (ListCheckpoints(op, instance, &ids).ok() && !ids.empty() &&
          ReadMarker(fs::Join(root, kStandbyMarker), &held) && held == ids.back()) {
        continue;
      }
      auto mu = StandbyMutex(op, instance);
      std::lock_guard<std::mutex> guard(*mu);
      if (fs::RemoveAll(root).ok()) ++stats->standbys_removed;
    }
  }
}

}  // namespace rhino
