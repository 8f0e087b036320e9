// ChainShipper: the order checkpoints go down a chain in, what a rollback
// discards, and the shipper's states. Its one collaborator, the instance
// (ChainShipper::Host), is faked: sends and discards are recorded and end
// when the test says, and the work the shipper posts to the instance's
// strand runs when the test drains it, as the strand would, one at a time.
#include "service/chain_shipper.h"

#include <nlohmann/json.hpp>

#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace rhino {
namespace {

using State = ChainShipper::State;

class FakeHost : public ChainShipper::Host {
 public:
  FakeHost() {
    config.operator_id = "agg";
    config.instance = 2;
    config.chain = {"w1:7000", "w2:7000"};
    config.chain_version = 3;
    config.epoch = 5;
  }

  const InstanceConfig& placement() const override { return config; }
  bool discard_pending() const override { return config.discard_pending; }
  Status Send(uint64_t id, std::function<void(const ReplicationResult&)> done,
              std::unique_ptr<ReplicationHandle>* handle) override {
    sent.push_back(id);
    if (!send_error.ok()) return send_error;
    dones.push_back(std::move(done));
    return Status::OK();
  }
  Status Discard(const InstanceConfig& asked) override {
    discards.push_back(asked);
    if (during_discard) during_discard();
    return discard_error;
  }
  Status Discarded() override {
    config.discard_pending = false;
    return Status::OK();
  }
  void Complete(uint64_t id) override { completed.push_back(id); }
  void Post(std::function<void()> fn) override { posted.push_back(std::move(fn)); }
  void Lock() override { mu.lock(); }
  void Unlock() override { mu.unlock(); }

  // Ends the n-th send (in the order they started), as the replication's
  // thread would: the callback only posts.
  void Finish(size_t n, Status s = Status::OK(), uint64_t bytes = 0) {
    ReplicationResult r;
    r.status = s;
    r.checkpoint_id = sent.at(n);
    r.bytes_sent = bytes;
    dones.at(n)(r);
  }
  // Runs what was posted, and what that posts, in order.
  void Drain() {
    while (!posted.empty()) {
      auto fn = std::move(posted.front());
      posted.pop_front();
      fn();
    }
  }

  InstanceConfig config;
  std::mutex mu;
  Status send_error;
  Status discard_error;
  std::function<void()> during_discard;  // runs inside Discard (off the lock)
  std::vector<uint64_t> sent;
  std::vector<std::function<void(const ReplicationResult&)>> dones;
  std::vector<InstanceConfig> discards;
  std::vector<uint64_t> completed;
  std::deque<std::function<void()>> posted;
};

// A barrier commit's waiter: records the answers it gets.
struct Waiter {
  std::vector<SessionCommitRsp> answers;
  ChainShipper::CommitReply reply() {
    return [this](const SessionCommitRsp& r) { answers.push_back(r); };
  }
};

SessionCommitRsp Answer(uint64_t version) {
  SessionCommitRsp r;
  r.version = version;
  r.stats = "{}";
  return r;
}

std::string StateOf(const ChainShipper& s, uint64_t id) {
  std::string message;
  return s.StateOf(id, &message);
}

// The fake is declared before the shipper: the shipper must not outlive it.
struct Fixture {
  FakeHost host;
  ChainShipper shipper{&host};
  void Ship(uint64_t id, Waiter* w = nullptr) {
    std::lock_guard<std::mutex> l(host.mu);
    shipper.Ship(id, Answer(id), w ? w->reply() : nullptr);
  }
  void Cancel(const std::string& why) {
    std::lock_guard<std::mutex> l(host.mu);
    shipper.Cancel(why);
  }
};

TEST(ChainShipperTest, ShipsOneAtATimeInCommitOrder) {
  Fixture f;
  EXPECT_EQ(f.shipper.state(), State::kIdle);
  f.Ship(7);
  f.Ship(8);
  f.Ship(9);
  EXPECT_EQ(f.host.sent, (std::vector<uint64_t>{7}));
  EXPECT_EQ(f.shipper.state(), State::kShipping);
  EXPECT_EQ(f.shipper.pending(), 3u);
  EXPECT_EQ(StateOf(f.shipper, 8), "pending");

  f.host.Finish(0, Status::OK(), 100);
  EXPECT_EQ(f.host.sent.size(), 1u) << "a result is handled on the strand, not on the replication's thread";
  f.host.Drain();
  EXPECT_EQ(f.host.sent, (std::vector<uint64_t>{7, 8}));
  EXPECT_EQ(StateOf(f.shipper, 7), "complete");
  EXPECT_EQ(f.shipper.last_complete(), 7u);
  EXPECT_EQ(f.shipper.pending(), 2u);

  f.host.Finish(1, Status::OK(), 20);
  f.host.Drain();
  f.host.Finish(2, Status::OK(), 3);
  f.host.Drain();
  EXPECT_EQ(f.host.sent, (std::vector<uint64_t>{7, 8, 9}));
  EXPECT_EQ(f.host.completed, (std::vector<uint64_t>{7, 8, 9}));
  EXPECT_EQ(f.shipper.state(), State::kIdle);
  EXPECT_EQ(f.shipper.pending(), 0u);
  EXPECT_EQ(f.shipper.last_complete(), 9u);
  EXPECT_EQ(f.shipper.bytes_shipped(), 123u);
}

TEST(ChainShipperTest, BarrierWaiterGetsTheAnswerOnceTheChainHoldsIt) {
  Fixture f;
  Waiter w;
  f.Ship(4, &w);
  EXPECT_TRUE(w.answers.empty());
  f.host.Finish(0, Status::OK(), 42);
  f.host.Drain();
  ASSERT_EQ(w.answers.size(), 1u);
  EXPECT_EQ(w.answers[0].code, 0u);
  EXPECT_EQ(w.answers[0].version, 4u);
  auto stats = nlohmann::json::parse(w.answers[0].stats);
  EXPECT_EQ(stats["bytes_replicated"], 42);
  EXPECT_TRUE(stats.contains("replicate_s"));
}

TEST(ChainShipperTest, AFailedReplicationFailsItsCheckpointAndTheNextOneGoes) {
  Fixture f;
  Waiter w;
  f.Ship(1, &w);
  f.Ship(2);
  f.host.Finish(0, Status::IOError("w2 went away"));
  f.host.Drain();
  ASSERT_EQ(w.answers.size(), 1u);
  EXPECT_EQ(w.answers[0].code, WireCode(Status::IOError("")));
  EXPECT_NE(w.answers[0].message.find("not on its chain"), std::string::npos) << w.answers[0].message;
  std::string message;
  EXPECT_EQ(f.shipper.StateOf(1, &message), "failed");
  EXPECT_NE(message.find("w2 went away"), std::string::npos);
  EXPECT_EQ(f.host.sent, (std::vector<uint64_t>{1, 2}));
  EXPECT_FALSE(f.shipper.last_complete().has_value());
  EXPECT_TRUE(f.host.completed.empty());
}

TEST(ChainShipperTest, ASendThatCannotStartFailsAtOnce) {
  Fixture f;
  f.host.send_error = Status::InvalidArgument("no chain");
  Waiter w;
  f.Ship(1, &w);
  ASSERT_EQ(w.answers.size(), 1u);
  EXPECT_EQ(w.answers[0].code, WireCode(Status::InvalidArgument("")));
  EXPECT_EQ(StateOf(f.shipper, 1), "failed");
  EXPECT_EQ(f.shipper.state(), State::kIdle);
}

TEST(ChainShipperTest, ARollbackDiscardsWhatIsQueuedAndIgnoresLateResults) {
  Fixture f;
  Waiter w1, w2;
  f.Ship(1, &w1);
  f.Ship(2, &w2);
  f.Ship(3);
  f.Cancel("batch 2 is re-executed");
  EXPECT_EQ(f.shipper.state(), State::kIdle);
  EXPECT_EQ(f.shipper.pending(), 0u);
  for (Waiter* w : {&w1, &w2}) {
    ASSERT_EQ(w->answers.size(), 1u);
    EXPECT_EQ(w->answers[0].code, WireCode(Status::Aborted("")));
    EXPECT_NE(w->answers[0].message.find("batch 2 is re-executed"), std::string::npos);
  }
  for (uint64_t id : {1, 2, 3}) EXPECT_EQ(StateOf(f.shipper, id), "failed") << id;

  // The re-executed batch commits checkpoint 1 again; then the cancelled
  // send of the first checkpoint 1 ends. Its result is not the new one's.
  f.Ship(1);
  EXPECT_EQ(f.host.sent, (std::vector<uint64_t>{1, 1}));
  f.host.Finish(0, Status::OK());
  f.host.Drain();
  EXPECT_EQ(StateOf(f.shipper, 1), "pending");
  EXPECT_EQ(f.shipper.state(), State::kShipping);
  f.host.Finish(1, Status::OK());
  f.host.Drain();
  EXPECT_EQ(StateOf(f.shipper, 1), "complete");
  EXPECT_EQ(w1.answers.size(), 1u) << "a waiter is answered once";
}

TEST(ChainShipperTest, RollingBackLowersTheLastComplete) {
  Fixture f;
  f.shipper.StartFrom(10);
  EXPECT_EQ(StateOf(f.shipper, 9), "complete");
  f.shipper.RolledBackTo(12);
  EXPECT_EQ(f.shipper.last_complete(), 10u);
  f.shipper.RolledBackTo(8);
  EXPECT_EQ(f.shipper.last_complete(), 8u);
  f.shipper.RolledBackTo(std::nullopt);
  EXPECT_FALSE(f.shipper.last_complete().has_value());
  f.shipper.CompleteWithoutChain(3);
  EXPECT_EQ(StateOf(f.shipper, 3), "complete");
  EXPECT_EQ(f.shipper.last_complete(), 3u);
}

TEST(ChainShipperTest, AfterARollbackTheChainDropsTheOldHistoryFirst) {
  Fixture f;
  f.host.config.discard_pending = true;
  f.host.config.discard_after = 5;
  f.Ship(6);
  EXPECT_EQ(f.shipper.state(), State::kDiscarding);
  EXPECT_EQ(f.shipper.pending(), 1u);
  EXPECT_TRUE(f.host.sent.empty()) << "nothing is shipped before the chain has dropped batch 6's old checkpoint";
  f.Ship(7);
  f.host.Drain();
  ASSERT_EQ(f.host.discards.size(), 1u);
  EXPECT_EQ(f.host.discards[0].discard_after, 5u);
  EXPECT_FALSE(f.host.config.discard_pending);
  EXPECT_EQ(f.host.sent, (std::vector<uint64_t>{6}));
  EXPECT_EQ(f.shipper.state(), State::kShipping);
  f.host.Finish(0);
  f.host.Drain();
  EXPECT_EQ(f.host.sent, (std::vector<uint64_t>{6, 7}));
  EXPECT_EQ(f.host.discards.size(), 1u) << "one discard per rollback";
}

TEST(ChainShipperTest, ADiscardCancelledBeforeItRunsAsksNoPeer) {
  Fixture f;
  f.host.config.discard_pending = true;
  Waiter w;
  f.Ship(6, &w);
  f.Cancel("the instance was closed");
  ASSERT_EQ(w.answers.size(), 1u);
  EXPECT_EQ(f.shipper.state(), State::kIdle);
  f.host.Drain();
  EXPECT_TRUE(f.host.discards.empty());
  EXPECT_TRUE(f.host.sent.empty());
}

TEST(ChainShipperTest, APlacementChangedDuringTheDiscardIsAskedAgain) {
  Fixture f;
  f.host.config.discard_pending = true;
  f.host.config.discard_after = 5;
  // A re-open places the instance on a new chain while the members are asked.
  f.host.during_discard = [&f]() {
    std::lock_guard<std::mutex> l(f.host.mu);
    f.host.config.chain = {"w3:7000"};
    f.host.config.chain_version = 4;
    f.host.during_discard = nullptr;
  };
  f.Ship(6);
  f.host.Drain();
  ASSERT_EQ(f.host.discards.size(), 2u);
  EXPECT_EQ(f.host.discards[0].chain_version, 3u);
  EXPECT_EQ(f.host.discards[1].chain_version, 4u);
  EXPECT_EQ(f.host.sent, (std::vector<uint64_t>{6}));
}

TEST(ChainShipperTest, AFailedDiscardFailsTheCheckpointAndTheNextOneDiscardsAgain) {
  Fixture f;
  f.host.config.discard_pending = true;
  f.host.discard_error = Status::IOError("w1 is down");
  Waiter w;
  f.Ship(6, &w);
  f.Ship(7);
  f.host.Drain();
  ASSERT_EQ(w.answers.size(), 1u);
  EXPECT_EQ(w.answers[0].code, WireCode(Status::IOError("")));
  EXPECT_EQ(StateOf(f.shipper, 6), "failed");
  EXPECT_EQ(f.host.discards.size(), 2u);
  EXPECT_EQ(StateOf(f.shipper, 7), "failed");
  EXPECT_TRUE(f.host.sent.empty());
  EXPECT_TRUE(f.host.config.discard_pending);
  EXPECT_EQ(f.shipper.state(), State::kIdle);
}

}  // namespace
}  // namespace rhino
