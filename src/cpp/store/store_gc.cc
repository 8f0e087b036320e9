// Dropping a store's checkpoints (retention, a rollback's discard, a floor)
// and collecting the pooled files no manifest or pin references any more.
// Which checkpoints to keep is store/retention.h's.
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

Status ReplicaStore::Retain(const std::string& operator_id, uint32_t instance, uint32_t keep_last,
                            std::vector<uint64_t>* removed) {
  removed->clear();
  std::vector<uint64_t> ids;
  RHINO_RETURN_IF_ERROR(ListCheckpoints(operator_id, instance, &ids));
  if (ids.size() <= keep_last) return Status::OK();
  const uint64_t floor = keep_last == 0 ? UINT64_MAX : ids[ids.size() - keep_last];
  return DiscardBefore(operator_id, instance, floor, removed);
}

Status ReplicaStore::DiscardBefore(const std::string& operator_id, uint32_t instance, uint64_t floor,
                                   std::vector<uint64_t>* removed) {
  removed->clear();
  std::string inst_dir;
  RHINO_RETURN_IF_ERROR(InstanceDir(operator_id, instance, &inst_dir));
  std::vector<uint64_t> ids;
  RHINO_RETURN_IF_ERROR(ListCheckpoints(operator_id, instance, &ids));
  for (uint64_t id : ids) {
    if (id >= floor) break;
    std::string p = fs::Join(inst_dir, ManifestName(id));
    if (::unlink(p.c_str()) != 0 && errno != ENOENT) return Status::FromErrno(errno, "unlink " + p);
    removed->push_back(id);
  }
  if (removed->empty()) return Status::OK();
  return fs::FsyncPath(inst_dir);
}

Status ReplicaStore::DiscardAfter(const std::string& operator_id, uint32_t instance, std::optional<uint64_t> after,
                                  std::vector<uint64_t>* removed) {
  removed->clear();
  std::string inst_dir;
  RHINO_RETURN_IF_ERROR(InstanceDir(operator_id, instance, &inst_dir));
  std::vector<uint64_t> ids;
  RHINO_RETURN_IF_ERROR(ListCheckpoints(operator_id, instance, &ids));
  // Newest first: a crash part-way leaves a prefix of the history, never a gap.
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {
    if (after && *it <= *after) break;
    std::string p = fs::Join(inst_dir, ManifestName(*it));
    if (::unlink(p.c_str()) != 0 && errno != ENOENT) return Status::FromErrno(errno, "unlink " + p);
    removed->push_back(*it);
  }
  if (removed->empty()) return Status::OK();
  return fs::FsyncPath(inst_dir);
}

Status ReplicaStore::GarbageCollect(GcStats* stats, bool wait) {
  *stats = GcStats();
  std::unique_ptr<Lock> lock;
  RHINO_RETURN_IF_ERROR(AcquireLock(true, &lock, wait));
  std::set<std::string> referenced;
  std::vector<InstanceRef> instances;
  RHINO_RETURN_IF_ERROR(ListInstances(&instances));
  for (const auto& inst : instances) {
    std::vector<uint64_t> ids;
    RHINO_RETURN_IF_ERROR(ListCheckpoints(inst.operator_id, inst.instance, &ids));
    for (uint64_t id : ids) {
      Manifest m;
      Status s = ReadManifest(inst.operator_id, inst.instance, id, &m);
      // Never delete on uncertainty: an unreadable manifest stops GC.
      if (!s.ok()) return Status::Corruption("garbage collection stopped: " + s.message());
      for (const auto& f : m.files) referenced.insert(f.identity);
    }
    // Manifest temporaries of dead committers.
    std::string inst_dir;
    RHINO_RETURN_IF_ERROR(InstanceDir(inst.operator_id, inst.instance, &inst_dir));
    std::vector<std::string> names;
    RHINO_RETURN_IF_ERROR(fs::ListDir(inst_dir, &names));
    for (const auto& n : names) {
      auto pos = n.find(".manifest.tmp-");
      if (pos != std::string::npos && StagingOwnerDead(n, n.substr(0, pos) + ".manifest.tmp-")) {
        fs::RemoveAll(fs::Join(inst_dir, n));
      }
    }
  }
  DropStaleStandbys(stats);
  RHINO_RETURN_IF_ERROR(PinnedIdentities(&referenced, &stats->pins));
  std::string pool = fs::Join(dir_, "pool");
  std::vector<std::string> names;
  RHINO_RETURN_IF_ERROR(fs::ListDir(pool, &names));
  for (const auto& n : names) {
    std::string p = fs::Join(pool, n);
    uint64_t size = 0;
    fs::FileSize(p, &size);
    if (referenced.count(n)) {
      ++stats->pool_files;
      stats->pool_bytes += size;
      continue;
    }
    if (::unlink(p.c_str()) != 0 && errno != ENOENT) return Status::FromErrno(errno, "unlink " + p);
    ++stats->files_removed;
    stats->bytes_removed += size;
  }
  RHINO_RETURN_IF_ERROR(fs::FsyncPath(pool));
  std::string tmp = fs::Join(dir_, "tmp");
  RHINO_RETURN_IF_ERROR(fs::ListDir(tmp, &names));
  for (const auto& n : names) {
    auto dash = n.find('-');
    if (dash != std::string::npos && StagingOwnerDead(n, n.substr(0, dash + 1))) {
      RHINO_RETURN_IF_ERROR(fs::RemoveAll(fs::Join(tmp, n)));
      ++stats->staging_removed;
    }
  }
  return Status::OK();
}

}  // namespace rhino
