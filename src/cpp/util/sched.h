// Scheduling of the calling thread: a latency-critical section, and the
// thread's own CPU and run-queue figures.
//
// The worker daemon runs every thread under SCHED_BATCH (rhino/daemon/worker.py,
// --sched): replication is throughput work, and a batch thread's wake-up never
// preempts a running executor thread. A takeover's restore is the opposite: the
// recovered batch waits on it (Rhino §3.5, failover). Under batch, each time the
// restoring thread wakes (after a read, a link, an fsync) it waits for whichever
// executor thread runs to end its slice, and on a busy host that made a 10 ms
// RocksDB open take 50-160 ms. LatencyCritical runs the section under the
// normal policy, which keeps the same CPU share (nice value) but lets the
// thread's wake-ups preempt, and then restores the thread's policy. Where the
// worker may (CAP_SYS_NICE, RLIMIT_NICE), it also lowers the thread's nice
// value by kNiceBoost for the section: the executors' Python workers of an
// attempt being cancelled spin on every core until they are killed, and with
// the same weight the open waited 3-10x its own CPU time for a core.
#pragma once

#include <cstdint>

namespace rhino {

class LatencyCritical {
 public:
  static constexpr int kNiceBoost = 10;  // CFS weight 1024 -> 9548 at nice 0

  LatencyCritical();  // switches a SCHED_BATCH or SCHED_IDLE thread to SCHED_OTHER
  ~LatencyCritical();  // and back
  LatencyCritical(const LatencyCritical&) = delete;
  LatencyCritical& operator=(const LatencyCritical&) = delete;

 private:
  int saved_policy_ = -1;  // -1: nothing was changed
  int saved_nice_ = 0;
  bool boosted_ = false;  // the nice value was lowered, saved_nice_ restores it
};

// The calling thread's CPU time (its CPU-time clock) and the time it has spent
// runnable but waiting for a CPU (/proc/thread-self/schedstat). Zeros where
// the kernel does not provide them (no CONFIG_SCHED_INFO, not Linux).
struct ThreadSchedStat {
  uint64_t cpu_ns = 0;
  uint64_t wait_ns = 0;
};
ThreadSchedStat ReadThreadSchedStat();

}  // namespace rhino
