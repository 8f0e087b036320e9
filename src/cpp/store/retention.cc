#include "store/retention.h"

#include <algorithm>
#include <vector>

namespace rhino {

Status ApplyRetention(ReplicaStore* store, uint32_t keep, const RetentionFloor& floor_of, RetentionStats* stats) {
  *stats = RetentionStats();
  if (keep < 2) return Status::InvalidArgument("retention must keep at least 2 checkpoints per instance");
  std::vector<InstanceRef> instances;
  RHINO_RETURN_IF_ERROR(store->ListInstances(&instances));
  for (const auto& inst : instances) {
    std::vector<uint64_t> ids;
    RHINO_RETURN_IF_ERROR(store->ListCheckpoints(inst.operator_id, inst.instance, &ids));
    if (ids.size() <= keep) continue;
    uint64_t floor = ids[ids.size() - keep];
    if (floor_of) {
      if (auto hosted = floor_of(inst.operator_id, inst.instance)) floor = std::min(floor, *hosted);
    }
    if (floor <= ids.front()) continue;
    std::vector<uint64_t> removed;
    RHINO_RETURN_IF_ERROR(store->DiscardBefore(inst.operator_id, inst.instance, floor, &removed));
    stats->checkpoints_removed += removed.size();
  }
  GcStats gc;
  Status s = store->GarbageCollect(&gc, /*wait=*/false);
  if (s.IsBusy()) {
    stats->gc_deferred = true;
    return Status::OK();
  }
  RHINO_RETURN_IF_ERROR(s);
  stats->files_removed = gc.files_removed;
  stats->bytes_removed = gc.bytes_removed;
  stats->gc_ran = true;
  stats->pool_files = gc.pool_files;
  stats->pool_bytes = gc.pool_bytes;
  stats->pins = gc.pins;
  return Status::OK();
}

}  // namespace rhino
