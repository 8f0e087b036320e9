#include "replication/fence_table.h"

#include <cstdlib>

#include "rhino/manifest.h"
#include "util/fs.h"

namespace rhino {

std::string FenceTable::PathOf(const std::string& operator_id, uint32_t instance) const {
  return fs::Join(fs::Join(fs::Join(dir_, "fences"), operator_id), std::to_string(instance));
}

uint64_t FenceTable::LoadLocked(const std::string& operator_id, uint32_t instance) {
  auto key = std::make_pair(operator_id, instance);
  auto it = highest_.find(key);
  if (it != highest_.end()) return it->second;
  uint64_t v = 0;
  std::string data;
  if (IsValidOperatorId(operator_id) && fs::ReadFile(PathOf(operator_id, instance), &data).ok()) {
    v = std::strtoull(data.c_str(), nullptr, 10);
  }
  highest_[key] = v;
  return v;
}

Status FenceTable::Observe(const std::string& operator_id, uint32_t instance, uint64_t version, bool* raised) {
  *raised = false;
  if (!IsValidOperatorId(operator_id)) {
    return Status::PathOutsideStore("operator id '" + operator_id + "' is not [A-Za-z0-9_.-]{1,128}");
  }
  MutexLock l(&mu_);
  uint64_t highest = LoadLocked(operator_id, instance);
  if (version < highest) {
    return Status::StaleChainVersion(noun_ + " " + std::to_string(version) + " of " + operator_id + "/" +
                                     std::to_string(instance) + " is stale: " + noun_ + " " +
                                     std::to_string(highest) + " has been seen");
  }
  if (version == highest) return Status::OK();
  // Durable before anybody acts on it: a restart must not un-fence.
  std::string path = PathOf(operator_id, instance);
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(fs::Parent(path)));
  RHINO_RETURN_IF_ERROR(fs::WriteFileAtomic(path, std::to_string(version) + "\n"));
  highest_[std::make_pair(operator_id, instance)] = version;
  *raised = true;
  return Status::OK();
}

Status FenceTable::Check(const std::string& operator_id, uint32_t instance, uint64_t version) {
  MutexLock l(&mu_);
  uint64_t highest = LoadLocked(operator_id, instance);
  if (version < highest) {
    return Status::StaleChainVersion(noun_ + " " + std::to_string(version) + " of " + operator_id + "/" +
                                     std::to_string(instance) + " was fenced off by " + noun_ + " " +
                                     std::to_string(highest));
  }
  return Status::OK();
}

uint64_t FenceTable::Highest(const std::string& operator_id, uint32_t instance) {
  MutexLock l(&mu_);
  return LoadLocked(operator_id, instance);
}

}  // namespace rhino
