// Checkpoint holds: checkpoints of this worker's store that retention keeps
// for a while beyond its usual rule (store/retention.h), because another
// worker reads them as the base of a vnode it took on one (the early
// hand-over, design §4.1).
//
// A worker that opens a checkpoint reader of a named checkpoint here holds
// it for `lease` (120 s) from then; the target's background copy opens one on
// each of the base's workers every 30 s until its base is merged, so a base
// stays readable from every worker that held it at the move, however many
// batches its copy takes. A hold is a file under <state_dir>/holds (its
// expiry, in Unix seconds), so a restarted worker keeps honouring it; an
// expired one is removed at the next look.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "rhino/status.h"
#include "rhino/thread_annotations.h"

namespace rhino {

class CheckpointHolds {
 public:
  static constexpr int64_t kLeaseSeconds = 120;

  explicit CheckpointHolds(std::string dir) : dir_(std::move(dir)) {}
  // Reads the holds a previous run of the worker left.
  Status Load() EXCLUDES(mu_);
  // Holds checkpoint `checkpoint` of (operator_id, instance) until now + lease.
  Status Hold(const std::string& operator_id, uint32_t instance, uint64_t checkpoint) EXCLUDES(mu_);
  // The oldest checkpoint of the instance held now, if any (retention keeps it and what follows).
  std::optional<uint64_t> Oldest(const std::string& operator_id, uint32_t instance) EXCLUDES(mu_);

 private:
  using Key = std::tuple<std::string, uint32_t, uint64_t>;
  std::string PathOf(const Key& k) const;

  const std::string dir_;
  Mutex mu_;
  std::map<Key, int64_t> expiry_ GUARDED_BY(mu_);  // Unix seconds
};

}  // namespace rhino
