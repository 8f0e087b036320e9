// FenceTable: the highest replica-chain version seen per instance
// (docs/protocol.md §5; 3FS-style fencing, docs/design.md §3 "failure model").
//
// A repaired chain always gets a higher version, so once a worker has seen
// version v for an instance it refuses any frame of that instance with a lower
// version: a stale primary or member can no longer commit into a chain that
// has moved on. Versions are persisted under <store>/fences/<operator>/<instance>
// (written atomically, fsynced with any directory it creates), so a restarted
// worker stays fenced. A fence file that cannot be read, or does not hold a
// decimal version, fails closed: Check refuses the instance with Corruption
// until an Observe of a version above 0 writes a new fence (the re-fence).
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "rhino/status.h"
#include "rhino/thread_annotations.h"

namespace rhino {

class FenceTable {
 public:
  // `noun` names what is fenced in messages: "chain version" for replica
  // chains, "epoch" for the state service's configuration epochs (protocol §7.5).
  explicit FenceTable(std::string store_dir, std::string noun = "chain version")
      : dir_(std::move(store_dir)), noun_(std::move(noun)) {}

  // Records that a stream of `version` opened for the instance.
  // StaleChainVersion if a higher version was seen before; *raised is set if
  // `version` is new and higher (older streams of the instance must go). On
  // an unreadable fence any version above 0 is written and raises.
  Status Observe(const std::string& operator_id, uint32_t instance, uint64_t version, bool* raised) EXCLUDES(mu_);
  // StaleChainVersion if a version above `version` has been seen; Corruption
  // while the instance's fence file is unreadable or garbled.
  Status Check(const std::string& operator_id, uint32_t instance, uint64_t version) EXCLUDES(mu_);
  // The highest version seen (0: none, or an unreadable fence).
  uint64_t Highest(const std::string& operator_id, uint32_t instance) EXCLUDES(mu_);

 private:
  // *out = the highest version; Corruption (and *out = 0) if its file is unreadable.
  Status LoadLocked(const std::string& operator_id, uint32_t instance, uint64_t* out) REQUIRES(mu_);
  Status Unreadable(const std::string& operator_id, uint32_t instance, const std::string& why) const;
  std::string PathOf(const std::string& operator_id, uint32_t instance) const;

  const std::string dir_;
  const std::string noun_;
  Mutex mu_;
  std::map<std::pair<std::string, uint32_t>, uint64_t> highest_ GUARDED_BY(mu_);
  // Instances whose fence file could not be read, and why: refused until re-fenced.
  std::map<std::pair<std::string, uint32_t>, std::string> unreadable_ GUARDED_BY(mu_);
};

}  // namespace rhino
