// ChainShipper: ships a hosted instance's committed checkpoints down its
// chain (Rhino paper §4.2.2), one at a time and in the order they were
// committed (protocol §7.2 step 3), and keeps what became of each recent one
// for status queries and the instance's metrics. A rollback or a close
// cancels what is queued (Cancel): a re-executed batch's checkpoints replace
// them. Before the first checkpoint after a rollback or takeover it asks the
// chain to drop what it holds of the abandoned history (§7.3).
//
// It is split out of HostedInstance so that the queue's rules (order,
// discard, cancellation) can be unit-tested without a chain of workers:
// everything it needs of its instance goes through one interface, Host.
//
// Thread-safety: every method must be called with the instance's mutex held
// (HostedInstance::mu(), which Host::Lock takes); the shipper has no lock of
// its own. Host::Discard, a peer call, is made without it, on the instance's
// strand.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "client/chain_client.h"
#include "net/service_messages.h"
#include "rhino/status.h"
#include "service/instance_dir.h"  // InstanceConfig

namespace rhino {

class ChainShipper {
 public:
  using CommitReply = std::function<void(const SessionCommitRsp&)>;

  // What the shipper does now.
  enum class State {
    kIdle,        // nothing queued, or the queue waits for nothing
    kDiscarding,  // asking the chain to drop a re-executed history (§7.3); shipping waits
    kShipping,    // one checkpoint on its way down the chain
  };

  // The instance whose checkpoints are shipped: HostedInstance, or a unit
  // test's fake. All calls but Discard are made with the instance's mutex held.
  class Host {
   public:
    virtual ~Host() = default;
    // The instance's placement now (its chain, chain version, epoch, and the
    // discard it owes the chain: discard_pending, discard_after).
    virtual const InstanceConfig& placement() const = 0;
    // Whether the chain must first drop checkpoints a rollback or takeover
    // abandoned (discard_pending, and a way to ask the members).
    virtual bool discard_pending() const = 0;
    // Starts sending checkpoint `id` down placement()'s chain and returns at
    // once; `done` is then called once, on any thread (cancelling *handle
    // makes it fail). Errors found before any I/O are returned.
    virtual Status Send(uint64_t id, std::function<void(const ReplicationResult&)> done,
                        std::unique_ptr<ReplicationHandle>* handle) = 0;
    // Asks each member of `asked.chain` to drop the instance's checkpoints
    // after asked.discard_after (§7.3). Called WITHOUT the mutex.
    virtual Status Discard(const InstanceConfig& asked) = 0;
    // The chain dropped them: record it durably (discard_pending = false).
    virtual Status Discarded() = 0;
    // Checkpoint `id` is complete on the whole chain (a redo may retire).
    virtual void Complete(uint64_t id) = 0;
    // Runs `fn` later on the instance's strand, in order with its sessions'
    // frames, unless the instance is gone by then (the mutex is not held).
    virtual void Post(std::function<void()> fn) = 0;
    // The instance's mutex, for the work Post runs.
    virtual void Lock() = 0;
    virtual void Unlock() = 0;
  };

  // `host` must outlive the shipper (HostedInstance owns it).
  explicit ChainShipper(Host* host) : host_(host) {}
  ChainShipper(const ChainShipper&) = delete;
  ChainShipper& operator=(const ChainShipper&) = delete;

  // Queues committed checkpoint `id` behind those queued before it. `rsp` is
  // the commit's answer; `waiter`, if set (a barrier commit), gets it once
  // the chain holds the checkpoint (with the replication's figures added to
  // its stats) or with the error that stopped it.
  void Ship(uint64_t id, const SessionCommitRsp& rsp, CommitReply waiter);
  // Checkpoint `id` of an instance without a chain is complete as it is.
  void CompleteWithoutChain(uint64_t id);
  // A takeover's instance starts from checkpoint `id`, which the chain holds.
  void StartFrom(uint64_t id);
  // Cancels the checkpoint being shipped and all queued ones (they become
  // "failed" with `why`; their waiters get Aborted). A discard under way is
  // ignored when it ends.
  void Cancel(const std::string& why);
  // The live state went back to `version` (empty: to nothing): no checkpoint
  // after it counts as complete any more.
  void RolledBackTo(std::optional<uint64_t> version);

  State state() const { return state_; }
  // "complete", "pending", "failed" (with *message) or "unknown".
  std::string StateOf(uint64_t id, std::string* message) const;
  // The newest checkpoint the whole chain holds, if any (store/retention.h).
  std::optional<uint64_t> last_complete() const { return last_complete_; }
  // Checkpoints queued or under way.
  uint32_t pending() const { return static_cast<uint32_t>(queue_.size() + (state_ == State::kIdle ? 0 : 1)); }
  uint64_t bytes_shipped() const { return bytes_shipped_; }
  double ship_seconds() const { return ship_seconds_; }

 private:
  enum class Outcome { kPending, kComplete, kFailed };
  struct Record {
    Outcome outcome = Outcome::kPending;
    std::string message;
    CommitReply waiter;    // a barrier commit waiting for the chain
    SessionCommitRsp rsp;  // the answer the waiter gets on success
    double started = 0;
  };

  // Starts the next queued checkpoint if nothing is under way.
  void StartNext();
  // Asks the chain to drop an abandoned history (§7.3) off the lock, then ships `id`.
  void StartDiscard(uint64_t id);
  void OnDiscardDone(uint64_t id, uint64_t generation, const InstanceConfig& asked, const Status& s);
  Status StartSend(uint64_t id);
  void Fail(uint64_t id, const Status& why);
  void OnShipped(uint64_t id, const ReplicationResult& result);

  Host* const host_;
  State state_ = State::kIdle;
  std::deque<uint64_t> queue_;  // committed checkpoints not yet sent down the chain
  uint64_t active_id_ = 0;      // the checkpoint being discarded for or shipped (0: none)
  std::unique_ptr<ReplicationHandle> active_;
  uint64_t generation_ = 0;     // bumped by Cancel: a discard or send of an older one is ignored
  std::map<uint64_t, Record> records_;  // recent checkpoints, for StateOf
  std::optional<uint64_t> last_complete_;
  uint64_t bytes_shipped_ = 0;
  double ship_seconds_ = 0;
};

}  // namespace rhino
