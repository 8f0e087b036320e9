#include "service/checkpoint_holds.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "util/fs.h"

namespace rhino {

namespace {

int64_t NowSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

// <operator>~<instance>~<checkpoint>: operator ids have no '~' (IsValidOperatorId).
std::string CheckpointHolds::PathOf(const Key& k) const {
  return fs::Join(dir_, std::get<0>(k) + "~" + std::to_string(std::get<1>(k)) + "~" + std::to_string(std::get<2>(k)));
}

Status CheckpointHolds::Load() {
  RHINO_RETURN_IF_ERROR(fs::MakeDirs(dir_));
  std::vector<std::string> names;
  RHINO_RETURN_IF_ERROR(fs::ListDir(dir_, &names));
  MutexLock l(&mu_);
  for (const auto& name : names) {
    const size_t a = name.find('~'), b = name.rfind('~');
    std::string text;
    unsigned long inst = 0;
    unsigned long long ckpt = 0;
    long long until = 0;
    if (a == std::string::npos || a == b || std::sscanf(name.c_str() + a + 1, "%lu~%llu", &inst, &ckpt) != 2 ||
        !fs::ReadFile(fs::Join(dir_, name), &text).ok() || std::sscanf(text.c_str(), "%lld", &until) != 1) {
      ::unlink(fs::Join(dir_, name).c_str());  // not a hold (a crash mid-write leaves none: writes are atomic)
      continue;
    }
    expiry_[Key{name.substr(0, a), static_cast<uint32_t>(inst), ckpt}] = until;
  }
  return Status::OK();
}

Status CheckpointHolds::Hold(const std::string& operator_id, uint32_t instance, uint64_t checkpoint) {
  const Key k{operator_id, instance, checkpoint};
  const int64_t until = NowSeconds() + kLeaseSeconds;
  MutexLock l(&mu_);
  RHINO_RETURN_IF_ERROR(fs::WriteFileAtomic(PathOf(k), std::to_string(until), /*sync=*/true));
  expiry_[k] = until;
  return Status::OK();
}

std::optional<uint64_t> CheckpointHolds::Oldest(const std::string& operator_id, uint32_t instance) {
  const int64_t now = NowSeconds();
  std::optional<uint64_t> oldest;
  MutexLock l(&mu_);
  for (auto it = expiry_.lower_bound(Key{operator_id, instance, 0}); it != expiry_.end();) {
    if (std::get<0>(it->first) != operator_id || std::get<1>(it->first) != instance) break;
    if (it->second < now) {
      ::unlink(PathOf(it->first).c_str());
      it = expiry_.erase(it);
      continue;
    }
    if (!oldest || std::get<2>(it->first) < *oldest) oldest = std::get<2>(it->first);
    ++it;
  }
  return oldest;
}

}  // namespace rhino
