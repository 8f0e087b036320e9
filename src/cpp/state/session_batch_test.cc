// SessionBatch: a session's uncommitted writes over a real StateBackend
// (state/session_batch.h). The oracle is a std::map model of what the session
// wrote over what the DB held, and the DB read back through StateBackend::Get.
#include "state/session_batch.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rhino/partitioner.h"
#include "rhino/state_backend.h"
#include "testing/test_util.h"

namespace rhino {
namespace {

using Sv = std::string_view;

StateOptions SmallOptions(uint32_t num_vnodes, std::vector<uint32_t> vnodes = {}) {
  StateOptions o;
  o.partitioner.num_key_groups = 64;
  o.partitioner.num_vnodes = num_vnodes;
  o.partitioner.seed = 3;
  o.vnodes = std::move(vnodes);
  o.write_buffer_budget = 8ull << 20;
  o.block_cache_bytes = 1ull << 20;
  return o;
}

// Looks keys up through the session: key -> value, absent if not found.
std::map<std::string, std::string> Lookup(const SessionBatch& s, const std::vector<std::string>& keys) {
  std::vector<Sv> views(keys.begin(), keys.end());
  std::map<std::string, std::string> out;
  Status st = s.MultiGet(views, 0, [&](size_t i, bool found, Sv v) {
    if (found) out[keys[i]] = std::string(v);
    return true;
  });
  EXPECT_OK(st);
  return out;
}

using Entry = std::pair<std::string, std::string>;

std::vector<Entry> ScanAll(const SessionBatch& s, Sv prefix, std::optional<uint32_t> after_vnode = std::nullopt,
                           std::optional<Sv> after_key = std::nullopt, size_t limit = SIZE_MAX) {
  std::vector<Entry> out;
  EXPECT_OK(s.Scan(std::nullopt, prefix, after_vnode, after_key, [&](uint32_t, Sv k, Sv v) {
    out.emplace_back(std::string(k), std::string(v));
    return out.size() < limit;
  }));
  return out;
}

class SessionBatchTest : public ::testing::Test {
 protected:
  void Open(const StateOptions& o) { ASSERT_OK(StateBackend::Open(dir_.Sub("db"), o, &db_)); }
  void SetUp() override { Open(SmallOptions(1)); }  // one vnode: every key in one sorted column family

  testing::TempDir dir_;
  std::unique_ptr<StateBackend> db_;
};

TEST_F(SessionBatchTest, WritesStayInvisibleUntilCommitAppliesThemWithTheVersion) {
  ASSERT_OK(db_->Put("gone", "old"));
  SessionBatch s(db_.get());
  ASSERT_OK(s.Put({"a", "b"}, {"1", "22"}));
  ASSERT_OK(s.Delete({"gone"}));
  std::string v;
  EXPECT_CODE(db_->Get("a", &v), kNotFound);
  ASSERT_OK(db_->Get("gone", &v));
  EXPECT_EQ(v, "old");
  EXPECT_EQ(db_->version(), std::nullopt);

  ASSERT_OK(s.Commit(41));
  EXPECT_EQ(db_->version(), std::optional<uint64_t>(41));
  ASSERT_OK(db_->Get("a", &v));
  EXPECT_EQ(v, "1");
  ASSERT_OK(db_->Get("b", &v));
  EXPECT_EQ(v, "22");
  EXPECT_CODE(db_->Get("gone", &v), kNotFound);
  EXPECT_EQ(s.count(), 0u);  // empty afterwards
  EXPECT_EQ(s.bytes(), 0u);
  ASSERT_OK(s.Commit(42));  // an empty commit still moves the version
  EXPECT_EQ(db_->version(), std::optional<uint64_t>(42));
  ASSERT_OK(db_->Get("a", &v));
}

TEST_F(SessionBatchTest, LookupsSeeTheSessionsLastWriteOverTheDbInInputOrder) {
  ASSERT_OK(db_->Put("k1", "db1"));
  ASSERT_OK(db_->Put("k2", "db2"));
  ASSERT_OK(db_->Put("k3", "db3"));
  SessionBatch s(db_.get());
  // Before any write the session reads the DB.
  EXPECT_EQ(Lookup(s, {"k1", "k4"}), (std::map<std::string, std::string>{{"k1", "db1"}}));
  ASSERT_OK(s.Put({"k1", "k4"}, {"s1", "s4"}));
  ASSERT_OK(s.Put({"k1"}, {"s1-again"}));
  ASSERT_OK(s.Delete({"k2", "k5"}));
  ASSERT_OK(s.Put({"k5"}, {"s5"}));  // a delete then a put: the put wins
  EXPECT_EQ(Lookup(s, {"k1", "k2", "k3", "k4", "k5", "k6"}),
            (std::map<std::string, std::string>{{"k1", "s1-again"}, {"k3", "db3"}, {"k4", "s4"}, {"k5", "s5"}}));
  EXPECT_EQ(s.count(), 6u);
  EXPECT_EQ(s.bytes(), (2 + 2) + (2 + 2) + (2 + 8) + 2 + 2 + (2 + 2));
  // From an offset, in input order, repeats included; stopping when asked.
  std::vector<Sv> keys = {"skip", "k4", "nope", "k3", "k4"};
  std::vector<std::pair<size_t, std::string>> seen;
  ASSERT_OK(s.MultiGet(keys, 1, [&](size_t i, bool found, Sv v) {
    seen.emplace_back(i, found ? std::string(v) : "<none>");
    return true;
  }));
  EXPECT_EQ(seen, (std::vector<std::pair<size_t, std::string>>{{1, "s4"}, {2, "<none>"}, {3, "db3"}, {4, "s4"}}));
  seen.clear();
  ASSERT_OK(s.MultiGet(keys, 1, [&](size_t i, bool found, Sv v) {
    seen.emplace_back(i, std::string(v));
    return i < 2;  // stop after index 2
  }));
  EXPECT_EQ(seen.size(), 2u);
  std::vector<uint8_t> found_all;
  std::vector<std::string> values_all;
  ASSERT_OK(s.MultiGetAll(keys, 2, [&](const std::vector<uint8_t>& f, const std::vector<Sv>& v) {
    found_all = f;
    for (size_t j = 0; j < v.size(); ++j) values_all.push_back(f[j] ? std::string(v[j]) : "");
  }));
  EXPECT_EQ(found_all, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(values_all, (std::vector<std::string>{"", "db3", "s4"}));
}

TEST_F(SessionBatchTest, ScanMergesTheSessionsWritesIntoTheDbsKeyOrder) {
  for (const char* k : {"a1", "a3", "a5", "b1"}) ASSERT_OK(db_->Put(k, std::string("db-") + k));
  ASSERT_OK(db_->Put("a", "db-a"));
  SessionBatch s(db_.get());
  ASSERT_OK(s.Put({"a0", "a3", "a4", "c9"}, {"s-a0", "s-a3", "s-a4", "s-c9"}));
  ASSERT_OK(s.Delete({"a1", "a9"}));  // one over a DB key, one over nothing
  const std::vector<Entry> want = {{"a", "db-a"}, {"a0", "s-a0"}, {"a3", "s-a3"}, {"a4", "s-a4"}, {"a5", "db-a5"}};
  EXPECT_EQ(ScanAll(s, "a"), want);
  // Resuming strictly after a key, whether the DB or the session holds it.
  EXPECT_EQ(ScanAll(s, "a", 0, Sv("a3")), (std::vector<Entry>(want.begin() + 3, want.end())));
  EXPECT_EQ(ScanAll(s, "a", 0, Sv("a0")), (std::vector<Entry>(want.begin() + 2, want.end())));
  EXPECT_EQ(ScanAll(s, "a", 0, Sv("a1")), (std::vector<Entry>(want.begin() + 2, want.end())));  // deleted
  EXPECT_EQ(ScanAll(s, "a", std::nullopt, std::nullopt, 2), (std::vector<Entry>(want.begin(), want.begin() + 2)));
  EXPECT_EQ(ScanAll(s, ""),
            (std::vector<Entry>{{"a", "db-a"}, {"a0", "s-a0"}, {"a3", "s-a3"}, {"a4", "s-a4"}, {"a5", "db-a5"},
                                {"b1", "db-b1"}, {"c9", "s-c9"}}));
}

TEST_F(SessionBatchTest, ACommitWithABadClockIsRefusedAndKeepsTheWrites) {
  SessionBatch s(db_.get());
  ASSERT_OK(s.Put({"k"}, {"v"}));
  EXPECT_CODE(s.Commit(1, std::numeric_limits<int64_t>::min()), kInvalidArgument);
  EXPECT_EQ(s.count(), 1u);
  std::string v;
  EXPECT_CODE(db_->Get("k", &v), kNotFound);
  EXPECT_EQ(db_->version(), std::nullopt);
  ASSERT_OK(s.Commit(2, 1700000000123));
  EXPECT_EQ(db_->ttl_clock(), std::optional<int64_t>(1700000000123));
  EXPECT_EQ(db_->version(), std::optional<uint64_t>(2));
  ASSERT_OK(db_->Get("k", &v));
  EXPECT_EQ(v, "v");
  ASSERT_OK(s.Commit(3));  // no batch time: the clock stays
  EXPECT_EQ(db_->ttl_clock(), std::optional<int64_t>(1700000000123));
}

TEST_F(SessionBatchTest, ACommitRecordsWhatItsVersionWasBuiltOnWhereThatIsNotTheVersionBefore) {
  SessionBatch s(db_.get());
  ASSERT_OK(s.Commit(5, std::nullopt, VersionBase{std::nullopt}));  // a first batch 5, on no version
  ASSERT_TRUE(db_->BaseOf(5).has_value());
  EXPECT_EQ(db_->BaseOf(5)->version, std::nullopt);
  EXPECT_FALSE(db_->BaseOf(4).has_value());  // not the state's version
  ASSERT_OK(s.Commit(6));  // the version before it: nothing recorded, the old record is stale
  EXPECT_FALSE(db_->BaseOf(6).has_value());
  EXPECT_FALSE(db_->BaseOf(5).has_value());
  ASSERT_OK(s.Commit(10, std::nullopt, VersionBase{6}));  // after a gap, on 6
  EXPECT_EQ(db_->BaseOf(10)->version, std::optional<uint64_t>(6));
  // a checkpoint and its restore keep it
  testing::TempDir store_dir;
  std::unique_ptr<ReplicaStore> store;
  ASSERT_OK(ReplicaStore::Open(store_dir.Sub("store"), &store));
  Manifest m;
  ASSERT_OK(db_->Checkpoint(store.get(), 10, 1, &m));
  std::unique_ptr<StateBackend> back;
  RestoreStats st;
  ASSERT_OK(StateBackend::Restore(*store, "op", 0, 10, store_dir.Sub("back"), RestoreOptions(), SmallOptions(1),
                                  &back, &st));
  EXPECT_EQ(back->BaseOf(10)->version, std::optional<uint64_t>(6));
}

// Four vnodes, of which the instance holds 0 and 2.
class SessionBatchVnodesTest : public SessionBatchTest {
 protected:
  void SetUp() override {
    Open(SmallOptions(4, {0, 2}));
    PartitionerOptions po = SmallOptions(4).partitioner;
    ASSERT_OK(Partitioner::Create(po, &p_));
    for (int i = 0; keys_[0].empty() || keys_[1].empty() || keys_[2].size() < 3; ++i) {
      std::string k = "key-" + std::to_string(i);
      keys_[p_.VnodeOfBytes(k)].push_back(k);
    }
  }
  Partitioner p_;
  std::map<uint32_t, std::vector<std::string>> keys_;  // vnode -> keys routed there
};

TEST_F(SessionBatchVnodesTest, ABatchWithAKeyNotHeldOrTooFewValuesAddsNothing) {
  SessionBatch s(db_.get());
  const std::string held = keys_[0][0], foreign = keys_[1][0];
  EXPECT_CODE(s.Put({held, keys_[2][0]}, {"1"}), kInvalidArgument);
  EXPECT_CODE(s.Put({held, foreign}, {"1", "2"}), kUnknownVnode);
  EXPECT_CODE(s.Delete({held, foreign}), kUnknownVnode);
  EXPECT_EQ(s.count(), 0u);
  EXPECT_EQ(s.bytes(), 0u);
  EXPECT_TRUE(Lookup(s, {held, keys_[2][0]}).empty());
  ASSERT_OK(s.Commit(1));
  std::string v;
  EXPECT_CODE(db_->Get(held, &v), kNotFound);
  EXPECT_CODE(s.Scan(1u, "", std::nullopt, std::nullopt, [](uint32_t, Sv, Sv) { return true; }), kUnknownVnode);
}

TEST_F(SessionBatchVnodesTest, ScanGoesVnodeByVnodeAndCanBeLimitedToOne) {
  const std::string a = keys_[0][0], b = keys_[2][0], c = keys_[2][1], d = keys_[2][2];
  ASSERT_OK(db_->Put(c, "db-c"));
  SessionBatch s(db_.get());
  ASSERT_OK(s.Put({d, a, b}, {"s-d", "s-a", "s-b"}));
  std::vector<std::pair<uint32_t, std::string>> seen;
  auto collect = [&](uint32_t vn, Sv k, Sv) {
    seen.emplace_back(vn, std::string(k));
    return true;
  };
  ASSERT_OK(s.Scan(std::nullopt, "", std::nullopt, std::nullopt, collect));
  // Vnode 0 first, then vnode 2's keys in bytewise order.
  std::vector<std::string> two = {b, c, d};
  std::sort(two.begin(), two.end());
  std::vector<std::pair<uint32_t, std::string>> want = {{0, a}};
  for (const auto& k : two) want.emplace_back(2, k);
  EXPECT_EQ(seen, want);
  seen.clear();
  ASSERT_OK(s.Scan(2u, "", std::nullopt, std::nullopt, collect));
  EXPECT_EQ(seen, (std::vector<std::pair<uint32_t, std::string>>(want.begin() + 1, want.end())));
  seen.clear();
  ASSERT_OK(s.Scan(std::nullopt, "", 2u, Sv(two[0]), collect));  // resume inside vnode 2
  EXPECT_EQ(seen, (std::vector<std::pair<uint32_t, std::string>>(want.begin() + 2, want.end())));
}

}  // namespace
}  // namespace rhino
