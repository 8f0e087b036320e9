// The chain client's credit accounting (docs/protocol.md §4 step 3), against
// real in-process Workers on 127.0.0.1 (ephemeral ports).
//
// The contract checked: the primary never has more chunks in flight than the
// credits it was granted (min(window, the member's max_window)), so
// credits + in_flight never exceeds that; a transfer with a window of 1 or 2
// still completes; and every member's store then holds the checkpoint's
// bytes, compared byte for byte with what the test wrote. Fences (§5) are
// checked through the fence file the protocol says a member persists.
#include "client/chain_client.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rhino/replica_store.h"
#include "testing/test_util.h"
#include "worker/worker.h"

// These tests run under ASan's default options, alloc_dealloc_mismatch on:
// they found that the core's files disagreed on how Asio allocates (fixed by
// ASIO_HAS_STD_ALIGNED_ALLOC in CMakeLists.txt; docs/testing.md).

namespace rhino {
namespace {

constexpr char kSecret[] = "chain-credit-test-secret";
// The primary's own role down the chain (protocol §2, "Roles").
const Credential kWorkerCredential = Credential::FromRoot(kSecret, PeerRole::kWorker, "primary");

using testing::RandomBytes;
using testing::Slurp;

using Files = std::map<std::string, std::string>;  // name -> bytes

struct Observed {
  uint32_t max_in_flight = 0;
  uint32_t max_held = 0;  // credits + in_flight
  uint64_t polls = 0;
  uint32_t final_credits = 0;  // after the end: every credit back once w1 committed
  uint32_t final_in_flight = 0;
};

class ChainCreditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(ReplicaStore::Open(dir_.Sub("primary"), &store_));
    files_ = {{"000007.sst", RandomBytes(150000, 1)},
              {"000008.sst", RandomBytes(60001, 2)},
              {"000009.blob", ""},  // an empty file: no chunks (§4 step 2)
              {"MANIFEST-000006", RandomBytes(3000, 3)},
              {"CURRENT", "MANIFEST-000006\n"}};
    for (const auto& [name, bytes] : files_) {
      if (bytes.empty()) continue;
      total_bytes_ += bytes.size();
    }
  }

  void TearDown() override {
    for (auto& w : workers_) w->Stop();
    workers_.clear();
  }

  // Starts a worker with its own store; returns its "host:port".
  std::string StartWorker(const std::string& name, uint32_t max_window = 64) {
    WorkerOptions o;
    o.id = name;
    o.store_dir = dir_.Sub(name);
    o.secret = kSecret;
    o.listen_host = "127.0.0.1";
    o.listen_port = 0;
    o.heartbeat_ms = 200;
    o.peer_timeout_ms = 3000;
    o.max_window = max_window;
    o.keep_checkpoints = 0;  // no retention pass during the test
    o.disk_threads = 1;
    auto w = std::make_unique<Worker>();
    Status s = w->Start(o);
    EXPECT_OK(s);
    if (!s.ok()) return "";
    std::string address = "127.0.0.1:" + std::to_string(w->port());
    workers_.push_back(std::move(w));
    return address;
  }

  // Pools files_ into the primary's store as checkpoint `id` of op/0.
  void CommitCheckpoint(uint64_t id) {
    Manifest m;
    m.operator_id = "op";
    m.checkpoint_id = id;
    ASSERT_OK(testing::PoolFiles(store_.get(), dir_.Sub("src-" + std::to_string(id)), files_, &m.files));
    ASSERT_OK(store_->CommitManifest(m));
  }

  ReplicateOptions Options(uint32_t window) const {
    ReplicateOptions o;
    o.chunk_bytes = 1024;  // many chunks: many chances to see the accounting
    o.window = window;
    o.timeout_ms = 8000;
    o.heartbeat_ms = 200;
    o.peer_timeout_ms = 3000;
    o.client_id = "primary-test";
    return o;
  }

  // Runs one replication to the end, polling its progress all along.
  ReplicationResult Run(uint64_t id, const std::vector<std::string>& chain, uint64_t version, uint32_t window,
                        Observed* seen) {
    std::unique_ptr<ReplicationHandle> h;
    ReplicationResult r;
    Status s = ReplicateCheckpoint(store_.get(), "op", 0, id, chain, version, kWorkerCredential, Options(window), &h);
    EXPECT_OK(s);
    if (!s.ok()) {
      r.status = s;
      return r;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!h->Done() && std::chrono::steady_clock::now() < deadline) {
      ReplicationProgress p = h->Progress();
      seen->max_in_flight = std::max(seen->max_in_flight, p.in_flight);
      seen->max_held = std::max(seen->max_held, p.credits + p.in_flight);
      ++seen->polls;
      std::this_thread::yield();
    }
    EXPECT_TRUE(h->Wait(2000, &r)) << "the replication did not end";
    ReplicationProgress p = h->Progress();
    seen->max_in_flight = std::max(seen->max_in_flight, p.in_flight);
    seen->max_held = std::max(seen->max_held, p.credits + p.in_flight);
    seen->final_credits = p.credits;
    seen->final_in_flight = p.in_flight;
    return r;
  }

  // The member's store holds checkpoint `id` with exactly files_'s bytes.
  void ExpectHeld(const std::string& worker, uint64_t id) {
    std::unique_ptr<ReplicaStore> member;
    ASSERT_OK(ReplicaStore::Open(dir_.Sub(worker), &member));
    Manifest m;
    ASSERT_OK(member->ReadManifest("op", 0, id, &m));
    ASSERT_EQ(m.files.size(), files_.size());
    for (const auto& f : m.files) {
      ASSERT_TRUE(files_.count(f.name)) << f.name;
      std::string pooled;
      ASSERT_OK(member->PoolPath(f.identity, &pooled));
      EXPECT_EQ(Slurp(pooled), files_.at(f.name)) << worker << ": " << f.name;
    }
  }

  testing::TempDir dir_;
  std::unique_ptr<ReplicaStore> store_;
  Files files_;
  uint64_t total_bytes_ = 0;
  std::vector<std::unique_ptr<Worker>> workers_;
};

TEST_F(ChainCreditTest, AWindowOfOneCompletesWithOneChunkInFlightAtMost) {
  CommitCheckpoint(1);
  const std::string w1 = StartWorker("w1");
  ASSERT_FALSE(w1.empty());
  Observed seen;
  ReplicationResult r = Run(1, {w1}, 1, 1, &seen);
  ASSERT_OK(r.status);
  EXPECT_EQ(seen.max_in_flight, 1u);  // ~210 chunks, one at a time
  EXPECT_EQ(seen.max_held, 1u);
  EXPECT_EQ(seen.final_in_flight, 0u);
  EXPECT_EQ(seen.final_credits, 1u);
  EXPECT_EQ(r.bytes_sent, total_bytes_);
  EXPECT_EQ(r.files_sent, files_.size());
  ASSERT_EQ(r.member_needed_files.size(), 1u);
  EXPECT_EQ(r.member_needed_files[0], files_.size());
  EXPECT_EQ(r.member_needed_bytes[0], total_bytes_);
  ExpectHeld("w1", 1);
}

TEST_F(ChainCreditTest, AWindowOfTwoDownAChainOfTwoReachesBothMembers) {
  CommitCheckpoint(1);
  const std::string w1 = StartWorker("w1"), w2 = StartWorker("w2");
  ASSERT_FALSE(w1.empty());
  ASSERT_FALSE(w2.empty());
  Observed seen;
  ReplicationResult r = Run(1, {w1, w2}, 1, 2, &seen);
  ASSERT_OK(r.status);
  EXPECT_LE(seen.max_in_flight, 2u);
  EXPECT_EQ(seen.max_held, 2u);
  EXPECT_EQ(seen.final_in_flight, 0u);
  EXPECT_EQ(seen.final_credits, 2u);
  EXPECT_EQ(r.bytes_sent, total_bytes_);
  ASSERT_EQ(r.member_needed_bytes.size(), 2u);
  EXPECT_EQ(r.member_needed_bytes[1], total_bytes_);
  ExpectHeld("w1", 1);
  ExpectHeld("w2", 1);
}

TEST_F(ChainCreditTest, AMemberGrantingFewerCreditsThanAskedBoundsTheWindow) {
  CommitCheckpoint(1);
  const std::string w1 = StartWorker("w1", /*max_window=*/2);
  ASSERT_FALSE(w1.empty());
  Observed seen;
  ReplicationResult r = Run(1, {w1}, 1, 16, &seen);
  ASSERT_OK(r.status);
  EXPECT_LE(seen.max_in_flight, 2u);
  EXPECT_EQ(seen.max_held, 2u);  // granted min(16, max_window = 2)
  EXPECT_EQ(seen.final_in_flight, 0u);
  EXPECT_EQ(seen.final_credits, 2u);
  ExpectHeld("w1", 1);
}

TEST_F(ChainCreditTest, AReplicationOfACheckpointTheMemberHoldsSendsNothing) {
  CommitCheckpoint(1);
  const std::string w1 = StartWorker("w1");
  ASSERT_FALSE(w1.empty());
  Observed seen;
  ASSERT_OK(Run(1, {w1}, 1, 4, &seen).status);
  Observed again;
  ReplicationResult r = Run(1, {w1}, 1, 4, &again);  // a retry whose ack was lost (§4 step 1)
  ASSERT_OK(r.status);
  EXPECT_EQ(r.bytes_sent, 0u);
  EXPECT_EQ(r.files_sent, 0u);
  EXPECT_EQ(again.max_in_flight, 0u);
  ExpectHeld("w1", 1);
}

TEST_F(ChainCreditTest, AStaleChainVersionIsRefusedAndTheFenceIsPersisted) {
  CommitCheckpoint(1);
  CommitCheckpoint(2);
  const std::string w1 = StartWorker("w1");
  ASSERT_FALSE(w1.empty());
  Observed seen;
  ASSERT_OK(Run(1, {w1}, 5, 2, &seen).status);
  EXPECT_EQ(Slurp(dir_.Sub("w1/fences/op/0")), "5\n");  // protocol §5
  ReplicationResult r = Run(2, {w1}, 4, 2, &seen);
  EXPECT_CODE(r.status, kStaleChainVersion);
  std::unique_ptr<ReplicaStore> member;
  ASSERT_OK(ReplicaStore::Open(dir_.Sub("w1"), &member));
  std::vector<uint64_t> ids;
  ASSERT_OK(member->ListCheckpoints("op", 0, &ids));
  EXPECT_EQ(ids, std::vector<uint64_t>{1});
}

TEST_F(ChainCreditTest, BadArgumentsAndAMissingCheckpointFailCleanly) {
  std::unique_ptr<ReplicationHandle> h;
  EXPECT_CODE(ReplicateCheckpoint(store_.get(), "op", 0, 1, {"127.0.0.1:1"}, 1, kWorkerCredential, Options(0), &h),
              kInvalidArgument);
  EXPECT_CODE(ReplicateCheckpoint(store_.get(), "op", 0, 1, {}, 1, kWorkerCredential, Options(1), &h), kInvalidArgument);
  EXPECT_CODE(ReplicateCheckpoint(nullptr, "op", 0, 1, {"127.0.0.1:1"}, 1, kWorkerCredential, Options(1), &h),
              kInvalidArgument);
  EXPECT_EQ(h, nullptr);
  // Checkpoint 9 is not in the store: NotFound, before any connection is made.
  ASSERT_OK(ReplicateCheckpoint(store_.get(), "op", 0, 9, {"127.0.0.1:1"}, 1, kWorkerCredential, Options(1), &h));
  ReplicationResult r;
  ASSERT_TRUE(h->Wait(5000, &r));
  EXPECT_CODE(r.status, kNotFound);
  EXPECT_EQ(h->Progress().state, ReplicationState::kFailed);
}

}  // namespace
}  // namespace rhino
