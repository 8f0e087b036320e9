#include "replication/fence_table.h"

#include <charconv>
#include <cstdio>

#include "rhino/manifest.h"
#include "util/fs.h"

namespace rhino {

namespace {

// The documented format: the version in decimal, one trailing newline.
// Anything else (empty, a sign, spaces, junk, a number past 2^64-1) is
// garbled: strtoull would read most of it as 0, i.e. "never fenced".
bool ParseFence(const std::string& data, uint64_t* v) {
  size_t end = data.size();
  if (end > 0 && data[end - 1] == '\n') --end;
  if (end == 0) return false;
  const char* first = data.data();
  auto [ptr, ec] = std::from_chars(first, first + end, *v);
  return ec == std::errc() && ptr == first + end;
}

}  // namespace

std::string FenceTable::PathOf(const std::string& operator_id, uint32_t instance) const {
  return fs::Join(fs::Join(fs::Join(dir_, "fences"), operator_id), std::to_string(instance));
}

Status FenceTable::LoadLocked(const std::string& operator_id, uint32_t instance, uint64_t* out) {
  auto key = std::make_pair(operator_id, instance);
  auto it = highest_.find(key);
  if (it != highest_.end()) {
    *out = it->second;
    auto u = unreadable_.find(key);
    return u == unreadable_.end() ? Status::OK() : Unreadable(operator_id, instance, u->second);
  }
  *out = 0;
  if (!IsValidOperatorId(operator_id)) {
    highest_[key] = 0;  // never a path: such an id is refused where it would be written
    return Status::OK();
  }
  const std::string path = PathOf(operator_id, instance);
  std::string data;
  Status r = fs::ReadFile(path, &data);
  std::string why;
  if (r.IsNotFound()) {
    // No file: never fenced here.
  } else if (!r.ok()) {
    why = r.message();
  } else if (!ParseFence(data, out)) {
    why = path + " holds " + std::to_string(data.size()) + " bytes that are not a decimal " + noun_;
  }
  highest_[key] = *out;
  if (why.empty()) return Status::OK();
  // Fail closed: an unreadable fence must not read as "never fenced". The
  // instance stays refused until Observe writes a new fence (a re-fence).
  *out = 0;
  highest_[key] = 0;
  unreadable_[key] = why;
  std::fprintf(stderr, "rhino: the %s fence of %s/%u cannot be read (%s): its requests are refused until it is fenced again\n",
               noun_.c_str(), operator_id.c_str(), instance, why.c_str());
  return Unreadable(operator_id, instance, why);
}

Status FenceTable::Unreadable(const std::string& operator_id, uint32_t instance, const std::string& why) const {
  return Status::Corruption("the " + noun_ + " fence of " + operator_id + "/" + std::to_string(instance) +
                            " cannot be read (" + why + "): refused until it is fenced again");
}

Status FenceTable::Observe(const std::string& operator_id, uint32_t instance, uint64_t version, bool* raised) {
  *raised = false;
  if (!IsValidOperatorId(operator_id)) {
    return Status::PathOutsideStore("operator id '" + operator_id + "' is not [A-Za-z0-9_.-]{1,128}");
  }
  MutexLock l(&mu_);
  uint64_t highest = 0;
  Status loaded = LoadLocked(operator_id, instance, &highest);
  const bool refence = !loaded.ok();
  // An unreadable fence is replaced by any real version (what the file held
  // is unknown; the coordinator's new fence is the truth). 0 is no fence.
  if (refence && version == 0) return loaded;
  if (!refence && version < highest) {
    return Status::StaleChainVersion(noun_ + " " + std::to_string(version) + " of " + operator_id + "/" +
                                     std::to_string(instance) + " is stale: " + noun_ + " " +
                                     std::to_string(highest) + " has been seen");
  }
  if (!refence && version == highest) return Status::OK();
  // Durable before anybody acts on it: a restart must not un-fence. New
  // directories are synced into their parents too, or a power loss could
  // drop the fence's whole directory.
  const std::string path = PathOf(operator_id, instance);
  const std::string op_dir = fs::Parent(path);
  const std::string fences_dir = fs::Parent(op_dir);
  const bool new_fences_dir = !fs::IsDir(fences_dir);
  const bool new_op_dir = !fs::IsDir(op_dir);
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(op_dir));
  if (new_fences_dir) RHINO_RETURN_IF_ERROR(fs::FsyncPath(dir_));
  if (new_op_dir) RHINO_RETURN_IF_ERROR(fs::FsyncPath(fences_dir));
  RHINO_RETURN_IF_ERROR(fs::WriteFileAtomic(path, std::to_string(version) + "\n"));
  auto key = std::make_pair(operator_id, instance);
  highest_[key] = version;
  if (refence) {
    unreadable_.erase(key);
    std::fprintf(stderr, "rhino: the %s fence of %s/%u was written again at %s %llu: its requests are served again\n",
                 noun_.c_str(), operator_id.c_str(), instance, noun_.c_str(),
                 static_cast<unsigned long long>(version));
  }
  *raised = true;
  return Status::OK();
}

Status FenceTable::Check(const std::string& operator_id, uint32_t instance, uint64_t version) {
  MutexLock l(&mu_);
  uint64_t highest = 0;
  RHINO_RETURN_IF_ERROR(LoadLocked(operator_id, instance, &highest));
  if (version < highest) {
    return Status::StaleChainVersion(noun_ + " " + std::to_string(version) + " of " + operator_id + "/" +
                                     std::to_string(instance) + " was fenced off by " + noun_ + " " +
                                     std::to_string(highest));
  }
  return Status::OK();
}

uint64_t FenceTable::Highest(const std::string& operator_id, uint32_t instance) {
  MutexLock l(&mu_);
  uint64_t highest = 0;
  (void)LoadLocked(operator_id, instance, &highest);  // unreadable: 0, and Check refuses
  return highest;
}

}  // namespace rhino
