// BaseCopier: the background half of the early hand-over (design §4.1; the
// PhD proposal §4.1, steps 3-4). For each vnode a hosted instance holds on a
// base, it reads the base's entries from a worker that holds the checkpoint
// (a checkpoint reader's scan pages, RemoteBaseReader), writes them into SST
// files with the state's own options (BaseFileWriter), and merges them under
// the instance's writes between two batches (StateBackend::MergeBase). From
// then on the vnode's reads are local.
//
// One vnode at a time for the whole worker, at most `bytes_per_s` of entries
// read, so the copy never takes more of the disk and the network than its
// share while batches run. A copy whose vnode leaves its base meanwhile (a
// rollback to before the move and a drop, or another merge) is dropped, and
// a vnode back on its base after a rollback is copied again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "client/state_client.h"
#include "rhino/state_backend.h"
#include "rhino/thread_annotations.h"

namespace rhino {

class HostedInstance;

class BaseCopier {
 public:
  using Instances = std::function<std::vector<std::shared_ptr<HostedInstance>>()>;
  BaseCopier(Instances instances, StateClientOptions peers, uint64_t bytes_per_s);
  ~BaseCopier();
  BaseCopier(const BaseCopier&) = delete;
  BaseCopier& operator=(const BaseCopier&) = delete;

  void Start();
  void Stop();  // idempotent; a copy under way is dropped

  // Bases merged, their bytes, and the copies that failed (each logged).
  uint64_t merged() const { return merged_.load(); }
  uint64_t merged_bytes() const { return merged_bytes_.load(); }
  uint64_t failures() const { return failures_.load(); }

 private:
  void Run();
  // Copies and merges the first vnode on a base of any instance; false if there was none.
  bool CopyOne();
  Status CopyAndMerge(const std::shared_ptr<HostedInstance>& inst, uint32_t vnode, const VnodeBase& base);
  // Sleeps up to `ms`, less if stopped, renewing the holds on the way; false once stopped.
  bool Pause(int ms);
  // At once for a base not held yet, and every 30 s: a checkpoint reader
  // opened and closed on each worker of each base not merged yet, which holds
  // that checkpoint there for two minutes (service/checkpoint_holds.h), so
  // every worker that held the base at the move keeps it until the merge.
  void MaybeRenewHolds();

  const Instances instances_;
  const StateClientOptions peers_;
  const uint64_t bytes_per_s_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> merged_{0}, merged_bytes_{0}, failures_{0};
  Mutex mu_;
  CondVar cv_;  // with mu_: Stop wakes a pause
  std::thread thread_;
  // The copier's thread only: when the holds were last renewed, and of which bases and workers.
  std::chrono::steady_clock::time_point renewed_{};
  std::set<std::tuple<std::string, uint32_t, uint64_t, std::string>> held_;
};

}  // namespace rhino
