// Live counters of a ReplicaServer; Worker::Metrics snapshots them.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "rhino/thread_annotations.h"

namespace rhino {

// What one instance looks like from this worker's replica store.
struct InstanceReplicaState {
  std::string operator_id;
  uint32_t instance = 0;
  bool has_committed = false;
  uint64_t last_committed = 0;  // newest checkpoint committed here by replication
  uint64_t last_opened = 0;     // newest checkpoint a stream was opened for
  uint64_t chain_version = 0;   // newest chain version seen
};

struct ServerMetrics {
  // Atomics: updated by many stream strands at once, read by Snapshot.
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_written{0};
  std::atomic<int64_t> active_streams{0};
  std::atomic<int64_t> in_flight_credits{0};
  std::atomic<uint64_t> streams_opened{0};
  std::atomic<uint64_t> checkpoints_complete{0};
  std::atomic<uint64_t> checkpoints_aborted{0};
  std::atomic<uint64_t> stale_rejections{0};
  // Bytes the open streams may still write here: each stream's need (what its
  // manifest names and the pool lacks) less what it has written. A stream is
  // admitted only if its need fits the store's free space less these and a
  // margin (ReplicaStream::Reserve), so that manifests cannot promise away the
  // disk that commits need.
  std::atomic<int64_t> reserved_bytes{0};

  void NoteOpened(const std::string& op, uint32_t inst, uint64_t checkpoint_id, uint64_t chain_version) EXCLUDES(mu) {
    MutexLock l(&mu);
    InstanceReplicaState& s = Get(op, inst);
    if (checkpoint_id > s.last_opened) s.last_opened = checkpoint_id;
    if (chain_version > s.chain_version) s.chain_version = chain_version;
  }
  void NoteCommitted(const std::string& op, uint32_t inst, uint64_t checkpoint_id) EXCLUDES(mu) {
    MutexLock l(&mu);
    InstanceReplicaState& s = Get(op, inst);
    if (!s.has_committed || checkpoint_id > s.last_committed) s.last_committed = checkpoint_id;
    s.has_committed = true;
  }

  Mutex mu;
  std::map<std::pair<std::string, uint32_t>, InstanceReplicaState> instances GUARDED_BY(mu);

 private:
  InstanceReplicaState& Get(const std::string& op, uint32_t inst) REQUIRES(mu) {
    InstanceReplicaState& s = instances[std::make_pair(op, inst)];
    s.operator_id = op;
    s.instance = inst;
    return s;
  }
};

}  // namespace rhino
