#include "service/chain_shipper.h"

#include <nlohmann/json.hpp>

#include <chrono>

namespace rhino {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Recent checkpoints whose replication state is kept for status queries.
constexpr size_t kKeptRecords = 256;

// Host::Lock/Unlock as a scope.
class HostLock {
 public:
  explicit HostLock(ChainShipper::Host* h) : h_(h) { h_->Lock(); }
  ~HostLock() { h_->Unlock(); }
  HostLock(const HostLock&) = delete;
  HostLock& operator=(const HostLock&) = delete;

 private:
  ChainShipper::Host* h_;
};

}  // namespace

void ChainShipper::Ship(uint64_t id, const SessionCommitRsp& rsp, CommitReply waiter) {
  Record& r = records_[id];
  r = Record();
  r.started = Now();
  r.rsp = rsp;
  r.waiter = std::move(waiter);
  while (records_.size() > kKeptRecords) records_.erase(records_.begin());
  queue_.push_back(id);
  StartNext();
}

void ChainShipper::CompleteWithoutChain(uint64_t id) {
  records_[id].outcome = Outcome::kComplete;
  last_complete_ = id;
}

void ChainShipper::StartFrom(uint64_t id) { last_complete_ = id; }

void ChainShipper::Cancel(const std::string& why) {
  ++generation_;  // a discard under way (StartDiscard) is ignored when it ends
  if (active_) {
    active_->Cancel();
    active_.reset();  // waits for its runner; its done callback only posts
  }
  auto fail = [&](uint64_t id) {
    auto it = records_.find(id);
    if (it == records_.end()) return;
    it->second.outcome = Outcome::kFailed;
    it->second.message = why;
    if (it->second.waiter) {
      SessionCommitRsp rsp = it->second.rsp;
      rsp.code = WireCode(Status::Aborted(why));
      rsp.message = "checkpoint " + std::to_string(id) + " of " + Describe(host_->placement()) + " was not replicated: " + why;
      auto w = std::move(it->second.waiter);
      it->second.waiter = nullptr;
      w(rsp);
    }
  };
  if (active_id_ != 0) fail(active_id_);
  for (uint64_t id : queue_) fail(id);
  queue_.clear();
  active_id_ = 0;
  state_ = State::kIdle;
}

void ChainShipper::RolledBackTo(std::optional<uint64_t> version) {
  if (!version) {
    last_complete_.reset();
  } else if (last_complete_ && *last_complete_ > *version) {
    last_complete_ = version;
  }
}

void ChainShipper::StartNext() {
  while (state_ == State::kIdle && !queue_.empty()) {
    const uint64_t id = queue_.front();
    queue_.pop_front();
    // Set before anything can fail: OnShipped ignores results of any other
    // id, and a waiter whose failure is ignored waits forever.
    active_id_ = id;
    if (host_->discard_pending()) {
      // A rollback dropped checkpoints here that the chain may hold: the
      // re-executed batch's checkpoint replaces them there too (§7.3). That
      // asks each chain member, so it runs off the lock, and the
      // replication starts when it is done.
      return StartDiscard(id);
    }
    state_ = State::kShipping;
    Status s = StartSend(id);
    if (!s.ok()) Fail(id, s);
  }
}

void ChainShipper::StartDiscard(uint64_t id) {
  state_ = State::kDiscarding;
  const uint64_t generation = generation_;
  // A copy: the placement may change while the members are asked (a new
  // chain, a rollback), and OnDiscardDone compares.
  InstanceConfig asked = host_->placement();
  // On the instance's strand, in order with its sessions' frames, but
  // without the mutex: no peer call is made while the instance's mutex is
  // held, so status, list, metrics and retention never wait for a peer.
  // Post runs this only while the instance, and so this shipper, exists.
  host_->Post([this, id, generation, asked]() {
    {
      HostLock l(host_);
      if (generation != generation_) return;  // closed or rolled back meanwhile
    }
    Status s = host_->Discard(asked);
    HostLock l(host_);
    OnDiscardDone(id, generation, asked, s);
  });
}

void ChainShipper::OnDiscardDone(uint64_t id, uint64_t generation, const InstanceConfig& asked, const Status& s) {
  // Cancelled meanwhile (a close, a rollback): whoever ships next discards
  // again if it must.
  if (generation != generation_ || state_ != State::kDiscarding || active_id_ != id) return;
  state_ = State::kIdle;
  const InstanceConfig& now = host_->placement();
  if (asked.chain != now.chain || asked.chain_version != now.chain_version || asked.epoch != now.epoch ||
      asked.discard_after != now.discard_after) {
    // The chain, the epoch or the point to discard after changed while the
    // members were asked: ask again, as they are now.
    queue_.push_front(id);
    return StartNext();
  }
  state_ = State::kShipping;
  Status r = s;
  if (r.ok()) r = host_->Discarded();
  if (r.ok()) r = StartSend(id);
  if (!r.ok()) return Fail(id, r);
  StartNext();
}

Status ChainShipper::StartSend(uint64_t id) {
  const uint64_t generation = generation_;
  // The callback runs on the replication's own thread: hand over to the
  // instance's strand and mutex. A result of a cancelled send is ignored
  // (the same id may be shipped again after a rollback).
  return host_->Send(
      id,
      [this, id, generation](const ReplicationResult& result) {
        host_->Post([this, id, generation, result]() {
          HostLock l(host_);
          if (generation == generation_) OnShipped(id, result);
        });
      },
      &active_);
}

void ChainShipper::Fail(uint64_t id, const Status& why) {
  ReplicationResult r;
  r.status = why;
  r.checkpoint_id = id;
  active_.reset();
  OnShipped(id, r);
}

void ChainShipper::OnShipped(uint64_t id, const ReplicationResult& result) {
  if (state_ != State::kShipping || active_id_ != id) return;  // cancelled meanwhile
  active_.reset();
  active_id_ = 0;
  state_ = State::kIdle;
  auto it = records_.find(id);
  if (it != records_.end()) {
    Record& r = it->second;
    const double secs = Now() - r.started;
    ship_seconds_ += secs;
    bytes_shipped_ += result.bytes_sent;
    r.outcome = result.status.ok() ? Outcome::kComplete : Outcome::kFailed;
    r.message = result.status.message();
    if (result.status.ok() && (!last_complete_ || id > *last_complete_)) last_complete_ = id;
    if (result.status.ok()) host_->Complete(id);
    if (r.waiter) {
      SessionCommitRsp rsp = r.rsp;
      if (!result.status.ok()) {
        rsp.code = WireCode(result.status);
        rsp.message = "checkpoint " + std::to_string(id) + " of " + Describe(host_->placement()) +
                      " is committed here but not on its chain: " + result.status.message();
      } else {
        nlohmann::json stats = nlohmann::json::parse(rsp.stats);
        stats["replicate_s"] = secs;
        stats["bytes_replicated"] = result.bytes_sent;
        rsp.stats = stats.dump();
      }
      auto w = std::move(r.waiter);
      r.waiter = nullptr;
      w(rsp);
    }
  }
  StartNext();
}

std::string ChainShipper::StateOf(uint64_t id, std::string* message) const {
  auto it = records_.find(id);
  if (it == records_.end()) {
    if (last_complete_ && id <= *last_complete_) return "complete";
    return "unknown";
  }
  *message = it->second.message;
  switch (it->second.outcome) {
    case Outcome::kPending: return "pending";
    case Outcome::kComplete: return "complete";
    case Outcome::kFailed: return "failed";
  }
  return "unknown";
}

}  // namespace rhino
