// ApplyRetention: which checkpoints a replica store keeps, then GC of the
// pooled files nobody references (store/retention.h, docs/design.md §5
// "Retention"): the newest `keep` of every instance; for a hosted instance
// also everything from its last complete checkpoint on.
#include "store/retention.h"

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace rhino {
namespace {

using Ids = std::vector<uint64_t>;

class RetentionTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_OK(ReplicaStore::Open(tmp_.Sub("store"), &store_)); }

  // Commits checkpoint `id` of op/inst: a file of `unique_bytes` bytes that
  // only it has, and "shared.sst" (6 bytes) that every checkpoint has.
  void Commit(const std::string& op, uint32_t inst, uint64_t id, size_t unique_bytes = 16) {
    Manifest m;
    m.operator_id = op;
    m.instance = inst;
    m.checkpoint_id = id;
    m.vnodes = {0};
    std::string unique = op + "/" + std::to_string(inst) + "/" + std::to_string(id) + "#";
    ASSERT_LE(unique.size(), unique_bytes);
    unique.resize(unique_bytes, 'u');
    for (const auto& [name, bytes] : {std::pair<std::string, std::string>{"unique.sst", unique},
                                      std::pair<std::string, std::string>{"shared.sst", "SHARED"}}) {
      const std::string path = tmp_.Sub("src-" + std::to_string(next_++));
      testing::WriteBytes(path, bytes);
      FileEntry e;
      e.name = name;
      ASSERT_OK(store_->PoolFile(path, nullptr, &e));
      m.files.push_back(e);
    }
    ASSERT_OK(store_->CommitManifest(m));
  }
  void CommitMany(const std::string& op, uint32_t inst, const Ids& ids) {
    for (uint64_t id : ids) Commit(op, inst, id);
  }

  Ids IdsOf(const std::string& op, uint32_t inst) {
    Ids ids;
    EXPECT_OK(store_->ListCheckpoints(op, inst, &ids));
    return ids;
  }

  // The pool's file names, read with opendir (not through the store).
  std::set<std::string> Pool() {
    const std::string pool = tmp_.Sub("store/pool");
    EXPECT_TRUE(testing::Exists(pool)) << pool;
    const std::vector<std::string> names = testing::List(pool);
    return {names.begin(), names.end()};
  }

  testing::TempDir tmp_;
  std::unique_ptr<ReplicaStore> store_;
  int next_ = 0;
};

const RetentionFloor kReplica = [](const std::string&, uint32_t) { return std::optional<uint64_t>(); };

TEST_F(RetentionTest, KeepBelowTwoIsInvalidArgumentAndRemovesNothing) {
  CommitMany("op", 0, {1, 2, 3, 4});
  RetentionStats stats;
  for (uint32_t keep : {0u, 1u}) {
    EXPECT_CODE(ApplyRetention(store_.get(), keep, kReplica, &stats), kInvalidArgument);
  }
  EXPECT_EQ(IdsOf("op", 0), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(Pool().size(), 5u);  // four unique files + the shared one
}

TEST_F(RetentionTest, ReplicaKeepsTheNewestKeepOfEveryInstance) {
  CommitMany("op", 0, {1, 2, 3, 4, 5});
  CommitMany("op", 1, {10, 20});        // no more than `keep`: untouched
  CommitMany("other", 0, {3, 7, 8, 30});  // ids with gaps: by rank, not by value
  RetentionStats stats;
  ASSERT_OK(ApplyRetention(store_.get(), 3, kReplica, &stats));
  EXPECT_EQ(IdsOf("op", 0), (Ids{3, 4, 5}));
  EXPECT_EQ(IdsOf("op", 1), (Ids{10, 20}));
  EXPECT_EQ(IdsOf("other", 0), (Ids{7, 8, 30}));
  EXPECT_EQ(stats.checkpoints_removed, 3u);
  EXPECT_FALSE(stats.gc_deferred);
  // A second pass has nothing left to do.
  ASSERT_OK(ApplyRetention(store_.get(), 3, nullptr, &stats));
  EXPECT_EQ(stats.checkpoints_removed, 0u);
  EXPECT_EQ(stats.files_removed, 0u);
}

TEST_F(RetentionTest, HostedInstanceKeepsEverythingFromItsLastCompleteCheckpoint) {
  CommitMany("op", 0, {1, 2, 3, 4, 5, 6});
  CommitMany("op", 1, {1, 2, 3, 4, 5, 6});
  CommitMany("op", 2, {1, 2, 3, 4, 5, 6});
  CommitMany("op", 3, {1, 2, 3, 4, 5, 6});
  // Instance 0: last complete 2, older than the newest 2. Instance 1: no
  // complete checkpoint yet (0) keeps everything. Instance 2: last complete
  // 6, newer than the keep rule's floor: the keep rule still holds. Instance
  // 3: not hosted here.
  const RetentionFloor floor = [](const std::string& op, uint32_t inst) -> std::optional<uint64_t> {
    EXPECT_EQ(op, "op");
    if (inst == 0) return 2;
    if (inst == 1) return 0;
    if (inst == 2) return 6;
    return std::nullopt;
  };
  RetentionStats stats;
  ASSERT_OK(ApplyRetention(store_.get(), 2, floor, &stats));
  EXPECT_EQ(IdsOf("op", 0), (Ids{2, 3, 4, 5, 6}));
  EXPECT_EQ(IdsOf("op", 1), (Ids{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(IdsOf("op", 2), (Ids{5, 6}));
  EXPECT_EQ(IdsOf("op", 3), (Ids{5, 6}));
  EXPECT_EQ(stats.checkpoints_removed, 1u + 0 + 4 + 4);
}

TEST_F(RetentionTest, GcFreesExactlyTheFilesOnlyRemovedCheckpointsReferenced) {
  Commit("op", 0, 1, 100);
  Commit("op", 0, 2, 200);
  Commit("op", 0, 3, 300);
  Commit("op", 0, 4, 400);
  const std::set<std::string> before = Pool();
  ASSERT_EQ(before.size(), 5u);
  RetentionStats stats;
  ASSERT_OK(ApplyRetention(store_.get(), 2, kReplica, &stats));
  EXPECT_EQ(stats.checkpoints_removed, 2u);
  EXPECT_EQ(stats.files_removed, 2u);
  EXPECT_EQ(stats.bytes_removed, 100u + 200u);
  // What is left is exactly what the kept manifests name.
  std::set<std::string> referenced;
  for (uint64_t id : IdsOf("op", 0)) {
    Manifest m;
    ASSERT_OK(store_->ReadManifest("op", 0, id, &m));
    for (const auto& f : m.files) referenced.insert(f.identity);
  }
  EXPECT_EQ(referenced.size(), 3u);  // two unique files + the shared one
  EXPECT_EQ(Pool(), referenced);
  // And the kept checkpoints are still whole.
  VerifyReport report;
  ASSERT_OK(store_->Verify("", 0, VerifyLevel::kFull, &report));
  EXPECT_TRUE(report.ok());
  EXPECT_EQ(report.checkpoints, 2u);
}

TEST_F(RetentionTest, BusyStoreDefersGcButStillRetiresCheckpoints) {
  CommitMany("op", 0, {1, 2, 3, 4});
  RetentionStats stats;
  {
    // A stream or a restore holds the shared lock.
    std::unique_ptr<ReplicaStore::Lock> lock;
    ASSERT_OK(store_->AcquireLock(/*exclusive=*/false, &lock));
    ASSERT_OK(ApplyRetention(store_.get(), 2, kReplica, &stats));
    EXPECT_TRUE(stats.gc_deferred);
    EXPECT_EQ(stats.checkpoints_removed, 2u);
    EXPECT_EQ(stats.files_removed, 0u);
    EXPECT_EQ(IdsOf("op", 0), (Ids{3, 4}));
    EXPECT_EQ(Pool().size(), 5u);  // nothing freed under the lock
  }
  // The next pass, with the store free, frees what the retired ones held.
  ASSERT_OK(ApplyRetention(store_.get(), 2, kReplica, &stats));
  EXPECT_FALSE(stats.gc_deferred);
  EXPECT_EQ(stats.checkpoints_removed, 0u);
  EXPECT_EQ(stats.files_removed, 2u);
  EXPECT_EQ(Pool().size(), 3u);
}

TEST_F(RetentionTest, APinKeepsItsFilesThroughGcWithoutHoldingTheLock) {
  // Issue 46: a replica stream pins its manifest's files instead of holding the
  // store's shared lock for its whole life, so GC runs while it is under way.
  CommitMany("op", 0, {1, 2, 3, 4});
  Manifest old_one;
  ASSERT_OK(store_->ReadManifest("op", 0, 1, &old_one));  // what a stream counting on checkpoint 1's files pins
  std::unique_ptr<ReplicaStore::Pin> pin;
  {
    std::unique_ptr<ReplicaStore::Lock> lock;
    ASSERT_OK(store_->AcquireLock(/*exclusive=*/false, &lock));
    ASSERT_OK(store_->PinManifest(old_one, &pin));
  }  // the lock goes; the pin stays
  RetentionStats stats;
  ASSERT_OK(ApplyRetention(store_.get(), 2, kReplica, &stats));
  EXPECT_FALSE(stats.gc_deferred);
  EXPECT_TRUE(stats.gc_ran);
  EXPECT_EQ(stats.pins, 1u);
  EXPECT_EQ(stats.checkpoints_removed, 2u);
  EXPECT_EQ(stats.files_removed, 1u);  // checkpoint 2's own file; checkpoint 1's is pinned
  for (const auto& f : old_one.files) EXPECT_EQ(Pool().count(f.identity), 1u) << f.name;
  EXPECT_EQ(stats.pool_files, Pool().size());
  EXPECT_EQ(stats.pool_files, 4u);  // 3's and 4's own files, the shared one, and 1's pinned one
  pin.reset();  // the stream ended: the next pass frees what only the pin held
  ASSERT_OK(ApplyRetention(store_.get(), 2, kReplica, &stats));
  EXPECT_EQ(stats.pins, 0u);
  EXPECT_EQ(stats.files_removed, 1u);
  EXPECT_EQ(Pool().size(), 3u);
  EXPECT_TRUE(testing::List(tmp_.Sub("store/pins")).empty());
}

TEST_F(RetentionTest, ThePinOfAProcessThatNoLongerRunsIsDropped) {
  CommitMany("op", 0, {1, 2, 3});
  Manifest m;
  ASSERT_OK(store_->ReadManifest("op", 0, 1, &m));
  // A pin left by a killed process: pid 2^22+ is above Linux's pid_max default (4194304).
  testing::WriteBytes(tmp_.Sub("store/pins/4194305-deadbeef"), m.files[0].identity + "\n");
  RetentionStats stats;
  ASSERT_OK(ApplyRetention(store_.get(), 2, kReplica, &stats));
  EXPECT_EQ(stats.pins, 0u);
  EXPECT_EQ(stats.files_removed, 1u);  // checkpoint 1's own file is free after all
  EXPECT_TRUE(testing::List(tmp_.Sub("store/pins")).empty());
}

}  // namespace
}  // namespace rhino
