// InstanceMetrics: what a worker's state service reports per hosted instance
// (rhino worker --metrics-listen; docs/protocol.md §7.7).
#pragma once

#include <cstdint>
#include <string>

namespace rhino {

// Per-instance counters (docs/protocol.md §7.7, rhino worker --metrics-listen).
struct InstanceMetrics {
  std::string operator_id;
  uint32_t instance = 0;
  uint64_t epoch = 0;
  bool has_version = false;
  uint64_t version = 0;
  bool session_open = false;
  uint64_t sessions_opened = 0;
  uint64_t sessions_aborted = 0;
  uint64_t sessions_expired = 0;   // aborted by --session-idle-timeout (counted in sessions_aborted too)
  uint64_t commits = 0;
  uint64_t commit_failures = 0;
  uint64_t rollbacks = 0;
  uint64_t keys_written = 0;       // puts and deletes committed
  uint64_t bytes_written = 0;      // key and value bytes committed
  uint64_t bytes_replicated = 0;   // checkpoint bytes sent down the chain
  double write_seconds = 0;        // commit latency, split (sums)
  double checkpoint_seconds = 0;
  double replicate_seconds = 0;
  bool has_complete = false;       // newest checkpoint the whole chain holds
  uint64_t last_complete = 0;
  uint32_t replications_pending = 0;
  uint32_t vnodes = 0;
};

}  // namespace rhino
