// Standby directories (store/standby.cc): standby/<op>/<instance>/db holds the
// newest checkpoint, SSTs as links to the pool, and standby/<op>/<instance>/checkpoint
// names it; a restore with take_standby renames it into place when, and only
// when, it matches the checkpoint asked for.
//
// Oracles: stat() for inodes, files read back byte for byte, the marker read
// as text, and hand-built checkpoints whose bytes the test knows.
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rhino/replica_store.h"
#include "testing/test_util.h"

namespace rhino {
namespace {

using testing::Exists;
using testing::List;
using testing::RandomBytes;
using testing::Slurp;
using testing::WriteBytes;

ino_t InodeOf(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

using Files = std::map<std::string, std::string>;  // name -> bytes

class StandbyTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_OK(ReplicaStore::Open(dir_.Sub("store"), &store_)); }

  Manifest Commit(uint64_t id, const Files& files) {
    Manifest m;
    m.operator_id = "op";
    m.checkpoint_id = id;
    EXPECT_OK(testing::PoolFiles(store_.get(), dir_.Sub("src-" + std::to_string(id)), files, &m.files));
    EXPECT_OK(store_->CommitManifest(m));
    return m;
  }

  std::string PoolOf(const Manifest& m, const std::string& name) const {
    for (const auto& f : m.files) {
      if (f.name == name) return dir_.Sub("store/pool/" + f.identity);
    }
    return "";
  }

  static std::vector<std::string> Names(const Files& f) {
    std::vector<std::string> n;
    for (const auto& [name, bytes] : f) n.push_back(name);
    return n;  // std::map: sorted, as List is
  }

  std::string Db() const { return dir_.Sub("store/standby/op/0/db"); }
  std::string Marker() const { return dir_.Sub("store/standby/op/0/checkpoint"); }

  testing::TempDir dir_;
  std::unique_ptr<ReplicaStore> store_;
};

const Files kCheckpoint1 = {{"000010.sst", RandomBytes(30000, 1)},
                            {"000011.sst", RandomBytes(20000, 2)},
                            {"MANIFEST-000009", RandomBytes(700, 3)},
                            {"CURRENT", "MANIFEST-000009\n"}};

TEST_F(StandbyTest, RefreshLinksSstsToThePoolAndCopiesMutableFiles) {
  Manifest m = Commit(1, kCheckpoint1);
  bool refreshed = false;
  ASSERT_OK(store_->RefreshStandby("op", 0, &refreshed));
  EXPECT_TRUE(refreshed);
  EXPECT_EQ(Slurp(Marker()), "1\n");
  EXPECT_EQ(List(Db()), Names(kCheckpoint1));
  for (const auto& [name, bytes] : kCheckpoint1) {
    EXPECT_EQ(Slurp(Db() + "/" + name), bytes) << name;
    const bool linked = InodeOf(Db() + "/" + name) == InodeOf(PoolOf(m, name));
    EXPECT_EQ(linked, name.size() > 4 && name.compare(name.size() - 4, 4, ".sst") == 0) << name;
    // Owner-only (issue 46): links share the pool file's 0400, copies are 0600.
    struct stat st {};
    ASSERT_EQ(::stat((Db() + "/" + name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 07777, linked ? 0400u : 0600u) << name;
  }
  // Already up to date: nothing changes.
  ASSERT_OK(store_->RefreshStandby("op", 0, &refreshed));
  EXPECT_FALSE(refreshed);
}

TEST_F(StandbyTest, ATakeoverRenamesTheStandbyIntoPlace) {
  Commit(1, kCheckpoint1);
  ASSERT_OK(store_->RefreshStandby("op", 0));
  std::map<std::string, ino_t> before;
  for (const auto& n : List(Db())) before[n] = InodeOf(Db() + "/" + n);
  RestoreOptions o;
  o.take_standby = true;
  RestoreStats st;
  const std::string target = dir_.Sub("takeover/db");
  ASSERT_OK(store_->Restore("op", 0, 1, target, o, &st));
  EXPECT_TRUE(st.from_standby);
  EXPECT_EQ(st.files, 4u);
  EXPECT_EQ(st.linked_files, 2u);
  EXPECT_EQ(st.copied_files, 2u);
  std::map<std::string, ino_t> after;
  for (const auto& n : List(target)) after[n] = InodeOf(target + "/" + n);
  EXPECT_EQ(after, before);  // renamed, not rebuilt: even the copies keep their inodes
  for (const auto& [name, bytes] : kCheckpoint1) EXPECT_EQ(Slurp(target + "/" + name), bytes) << name;
  EXPECT_FALSE(Exists(Db()));
  EXPECT_FALSE(Exists(Marker()));
}

TEST_F(StandbyTest, RefreshFollowsTheNewestCheckpointByItsDifference) {
  Manifest m1 = Commit(1, kCheckpoint1);
  ASSERT_OK(store_->RefreshStandby("op", 0));
  const ino_t kept = InodeOf(Db() + "/000011.sst");
  Files second = {{"000011.sst", kCheckpoint1.at("000011.sst")},  // kept
                  {"000015.sst", RandomBytes(9000, 4)},           // new
                  {"MANIFEST-000014", RandomBytes(800, 5)},
                  {"CURRENT", "MANIFEST-000014\n"}};
  Manifest m2 = Commit(2, second);
  bool refreshed = false;
  ASSERT_OK(store_->RefreshStandby("op", 0, &refreshed));
  EXPECT_TRUE(refreshed);
  EXPECT_EQ(Slurp(Marker()), "2\n");
  EXPECT_EQ(List(Db()), Names(second));  // 000010.sst and the old MANIFEST are gone
  EXPECT_EQ(InodeOf(Db() + "/000011.sst"), kept);
  EXPECT_EQ(InodeOf(Db() + "/000015.sst"), InodeOf(PoolOf(m2, "000015.sst")));
  EXPECT_EQ(InodeOf(Db() + "/000011.sst"), InodeOf(PoolOf(m1, "000011.sst")));
  EXPECT_NE(InodeOf(Db() + "/MANIFEST-000014"), InodeOf(PoolOf(m2, "MANIFEST-000014")));  // a private copy
  for (const auto& [name, bytes] : second) EXPECT_EQ(Slurp(Db() + "/" + name), bytes) << name;
}

TEST_F(StandbyTest, AStandbyOfAnotherCheckpointIsNotTaken) {
  Commit(1, kCheckpoint1);
  Files second = {{"000020.sst", RandomBytes(5000, 6)}, {"CURRENT", "MANIFEST-000019\n"}};
  Commit(2, second);
  ASSERT_OK(store_->RefreshStandby("op", 0));
  RestoreOptions o;
  o.take_standby = true;
  RestoreStats st;
  ASSERT_OK(store_->Restore("op", 0, 1, dir_.Sub("at1"), o, &st));
  EXPECT_FALSE(st.from_standby);
  EXPECT_EQ(List(dir_.Sub("at1")), Names(kCheckpoint1));
  for (const auto& [name, bytes] : kCheckpoint1) EXPECT_EQ(Slurp(dir_.Sub("at1/" + name)), bytes) << name;
  EXPECT_EQ(Slurp(Marker()), "2\n");  // kept for a takeover of checkpoint 2
  // Without take_standby it is never used, even for its own checkpoint.
  ASSERT_OK(store_->Restore("op", 0, 2, dir_.Sub("at2"), RestoreOptions(), &st));
  EXPECT_FALSE(st.from_standby);
  EXPECT_TRUE(Exists(Db()));
}

TEST_F(StandbyTest, ADamagedOrUnmarkedStandbyIsNeverTaken) {
  Manifest m = Commit(1, kCheckpoint1);
  ASSERT_OK(store_->RefreshStandby("op", 0));
  // Same bytes, but a private copy: a broken link.
  const std::string sst = Db() + "/000010.sst";
  ASSERT_EQ(::unlink(sst.c_str()), 0);
  WriteBytes(sst, kCheckpoint1.at("000010.sst"));
  RestoreOptions o;
  o.take_standby = true;
  RestoreStats st;
  ASSERT_OK(store_->Restore("op", 0, 1, dir_.Sub("out"), o, &st));
  EXPECT_FALSE(st.from_standby);
  EXPECT_EQ(InodeOf(dir_.Sub("out/000010.sst")), InodeOf(PoolOf(m, "000010.sst")));  // built from the pool
  EXPECT_FALSE(Exists(dir_.Sub("store/standby/op/0")));
  // The next refresh rebuilds it, and then it is taken.
  bool refreshed = false;
  ASSERT_OK(store_->RefreshStandby("op", 0, &refreshed));
  EXPECT_TRUE(refreshed);
  ASSERT_OK(store_->Restore("op", 0, 1, dir_.Sub("again"), o, &st));
  EXPECT_TRUE(st.from_standby);
  // A refresh that died part-way removed the marker first: never taken.
  ASSERT_OK(store_->RefreshStandby("op", 0));
  ASSERT_EQ(::unlink(Marker().c_str()), 0);
  ASSERT_OK(store_->Restore("op", 0, 1, dir_.Sub("third"), o, &st));
  EXPECT_FALSE(st.from_standby);
  EXPECT_EQ(st.files, 4u);
  EXPECT_TRUE(Exists(Db()));  // left for the next refresh to bring up to date
}

TEST_F(StandbyTest, GcDropsAStandbyThatIsNotOfTheNewestCheckpoint) {
  Manifest m1 = Commit(1, kCheckpoint1);
  ASSERT_OK(store_->RefreshStandby("op", 0));
  GcStats g;
  ASSERT_OK(store_->GarbageCollect(&g));
  EXPECT_EQ(g.standbys_removed, 0u);
  EXPECT_TRUE(Exists(Db()));
  Commit(2, {{"000030.sst", RandomBytes(4000, 7)}});  // no refresh: the standby is of checkpoint 1
  std::vector<uint64_t> removed;
  ASSERT_OK(store_->Retain("op", 0, 1, &removed));
  ASSERT_OK(store_->GarbageCollect(&g));
  EXPECT_EQ(g.standbys_removed, 1u);
  EXPECT_FALSE(Exists(dir_.Sub("store/standby/op/0")));
  EXPECT_FALSE(Exists(PoolOf(m1, "000010.sst")));  // no link outlives its pool entry
}

TEST_F(StandbyTest, AnInstanceWithoutCheckpointsLosesItsStandby) {
  Commit(1, kCheckpoint1);
  ASSERT_OK(store_->RefreshStandby("op", 0));
  std::vector<uint64_t> removed;
  ASSERT_OK(store_->Retain("op", 0, 0, &removed));
  bool refreshed = true;
  ASSERT_OK(store_->RefreshStandby("op", 0, &refreshed));
  EXPECT_FALSE(refreshed);
  EXPECT_FALSE(Exists(dir_.Sub("store/standby/op/0")));
  EXPECT_CODE(store_->RefreshStandby("../x", 0, &refreshed), kPathOutsideStore);
  EXPECT_FALSE(Exists(dir_.Sub("store/x")));
}

}  // namespace
}  // namespace rhino
