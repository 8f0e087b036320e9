// Retention: which committed checkpoints a worker's replica store keeps, and
// the garbage collection that frees the pooled files of the others.
//
// Every commit adds an incremental checkpoint, and compaction rewrites files
// that older checkpoints still reference, so a store that keeps every
// checkpoint grows without bound (a Q8 run with 2.8 GiB of live state left
// ~20 GiB per worker). What must stay (docs/design.md §5, "Retention"):
//   - the newest `keep` checkpoints of every instance: a re-executed batch b
//     rolls back to b-1, and a handover's redo steps need checkpoint b until
//     b+2 is complete, so keep >= 2 is required and 3 is the default;
//   - for an instance hosted here, everything from its last complete
//     checkpoint on: it is what a takeover restores and what an asynchronous
//     commit's queued replications still have to send;
//   - on a replica, replication is sequential per instance (the next
//     checkpoint starts only once the chain acked the previous one), so a
//     member that holds checkpoint c already holds the complete one before it
//     among its newest two.
// GC runs only when it gets the store's lock at once: a stream or a restore
// holds the shared lock while it relies on pooled files, and a pass that
// waited for them would hold up the next stream behind its exclusive request.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "rhino/replica_store.h"
#include "rhino/status.h"

namespace rhino {

struct RetentionStats {
  uint64_t checkpoints_removed = 0;  // manifests uncommitted by this pass
  uint64_t files_removed = 0;        // pooled files freed
  uint64_t bytes_removed = 0;
  bool gc_deferred = false;          // the store was busy: GC waits for the next pass
  bool gc_ran = false;               // GC ran: the pool figures below are this pass's
  uint64_t pool_files = 0;           // the pool after GC
  uint64_t pool_bytes = 0;
  uint64_t pins = 0;                 // live pins GC honoured (replica streams under way)
};

// For an instance hosted on this worker: the oldest checkpoint it may still
// need (its last complete one; 0 while it has none, which keeps everything).
// nullopt: not hosted here (a replica), the newest-`keep` rule alone applies.
using RetentionFloor = std::function<std::optional<uint64_t>(const std::string& operator_id, uint32_t instance)>;

// One pass over every instance of the store; `keep` must be >= 2.
Status ApplyRetention(ReplicaStore* store, uint32_t keep, const RetentionFloor& floor_of, RetentionStats* stats);

}  // namespace rhino
