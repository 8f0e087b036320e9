// ReplicaStore: the content-addressed pool, manifests, restore by hard links,
// verification and retention/GC (rhino/replica_store.h).
//
// Oracles: XXH3-128 called directly for identities, stat() for inodes and
// modes, files read back byte for byte, and the layout of replica_store.h
// (pool/<identity>, checkpoints/<op>/<instance>/<id:020>.manifest). One test
// takes a real RocksDB checkpoint with StateBackend and reads the values back.
#include "rhino/replica_store.h"

#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "rhino/state_backend.h"
#include "testing/test_util.h"

namespace rhino {
namespace {

using testing::List;
using testing::RandomBytes;
using testing::Slurp;
using testing::WriteBytes;

// The identity replica_store.h promises: XXH3-128 as 32 hex digits, "-", size.
std::string IdentityOf(const std::string& bytes) {
  XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return std::string(hex) + "-" + std::to_string(bytes.size());
}

struct Stat {
  bool ok = false;
  ino_t ino = 0;
  dev_t dev = 0;
  mode_t mode = 0;
  nlink_t nlink = 0;
};
Stat StatOf(const std::string& path) {
  struct stat st;
  Stat r;
  if (::stat(path.c_str(), &st) != 0) return r;
  r.ok = true;
  r.ino = st.st_ino;
  r.dev = st.st_dev;
  r.mode = st.st_mode & 07777;
  r.nlink = st.st_nlink;
  return r;
}
bool SameInode(const std::string& a, const std::string& b) {
  Stat x = StatOf(a), y = StatOf(b);
  return x.ok && y.ok && x.ino == y.ino && x.dev == y.dev;
}

// A hand-built "checkpoint": files with known bytes, pooled and committed.
class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_OK(ReplicaStore::Open(dir_.Sub("store"), &store_)); }

  // Writes name -> bytes into a fresh source directory, pools every file and
  // commits checkpoint `id` of op/0.
  Manifest Commit(uint64_t id, const std::map<std::string, std::string>& files) {
    Manifest m;
    m.operator_id = "op";
    m.instance = 0;
    m.checkpoint_id = id;
    m.version = id;
    EXPECT_OK(testing::PoolFiles(store_.get(), dir_.Sub("src-" + std::to_string(id)), files, &m.files));
    for (FileEntry& e : m.files) e.in_delta = true;
    EXPECT_OK(store_->CommitManifest(m));
    return m;
  }

  std::string Pool(const std::string& bytes) const { return dir_.Sub("store/pool/" + IdentityOf(bytes)); }

  testing::TempDir dir_;
  std::unique_ptr<ReplicaStore> store_;
};

TEST_F(StoreTest, PoolFileKeysTheFileByItsContentIdentity) {
  const std::string bytes = RandomBytes(100000, 1);
  WriteBytes(dir_.Sub("000012.sst"), bytes);
  FileEntry e;
  ASSERT_OK(store_->PoolFile(dir_.Sub("000012.sst"), nullptr, &e));
  EXPECT_EQ(e.identity, IdentityOf(bytes));
  EXPECT_EQ(e.checksum, IdentityOf(bytes).substr(0, 32));
  EXPECT_EQ(e.size, bytes.size());
  const std::string pooled = Pool(bytes);
  EXPECT_EQ(Slurp(pooled), bytes);
  EXPECT_EQ(StatOf(pooled).mode, 0400u);                     // immutable, owner-only (issue 46)
  EXPECT_TRUE(SameInode(pooled, dir_.Sub("000012.sst")));   // pooled by link(2), not copied
  std::string path;
  ASSERT_OK(store_->PoolPath(e.identity, &path));
  EXPECT_EQ(path, pooled);
  // The same bytes under another name: the same identity, pooled once.
  WriteBytes(dir_.Sub("000777.sst"), bytes);
  FileEntry again;
  ASSERT_OK(store_->PoolFile(dir_.Sub("000777.sst"), nullptr, &again));
  EXPECT_EQ(again.identity, e.identity);
  EXPECT_EQ(List(dir_.Sub("store/pool")), std::vector<std::string>{IdentityOf(bytes)});
  // What is not of the identity form never becomes a path.
  EXPECT_CODE(store_->PoolPath("../../etc/passwd", &path), kPathOutsideStore);
  EXPECT_CODE(store_->PoolPath(std::string(32, 'A') + "-1", &path), kPathOutsideStore);  // upper-case hex
  EXPECT_CODE(store_->PoolPath(std::string(32, 'a') + "-", &path), kPathOutsideStore);
}

TEST_F(StoreTest, ACommittedManifestIsListedReadBackAndNeverReplaced) {
  Commit(7, {{"000010.sst", RandomBytes(3000, 3)}, {"CURRENT", "MANIFEST-000005\n"}});
  Manifest m3 = Commit(3, {{"000009.sst", RandomBytes(2000, 4)}});
  // replica_store.h's layout: the id zero-padded to 20 digits.
  EXPECT_EQ(List(dir_.Sub("store/checkpoints/op/0")),
            (std::vector<std::string>{"00000000000000000003.manifest", "00000000000000000007.manifest"}));
  std::vector<uint64_t> ids;
  ASSERT_OK(store_->ListCheckpoints("op", 0, &ids));
  EXPECT_EQ(ids, (std::vector<uint64_t>{3, 7}));
  Manifest back;
  ASSERT_OK(store_->ReadManifest("op", 0, 7, &back));
  ASSERT_EQ(back.files.size(), 2u);
  EXPECT_EQ(back.files[0].name, "000010.sst");
  EXPECT_EQ(back.files[0].identity, IdentityOf(RandomBytes(3000, 3)));
  EXPECT_EQ(back.files[1].name, "CURRENT");
  EXPECT_EQ(back.files[1].size, 16u);
  // A second commit of checkpoint 3 (other files) must not replace the first.
  Manifest other = m3;
  other.files.clear();
  EXPECT_CODE(store_->CommitManifest(other), kAlreadyExists);
  ASSERT_OK(store_->ReadManifest("op", 0, 3, &back));
  EXPECT_EQ(back.files.size(), 1u);
}

TEST_F(StoreTest, AMissingFileOrCheckpointIsNotFound) {
  Commit(1, {{"000001.sst", "abc"}});
  Manifest unpooled;
  unpooled.operator_id = "op";
  unpooled.checkpoint_id = 2;
  FileEntry f;
  f.name = "000002.sst";
  f.size = 10;
  f.checksum = std::string(32, '0');
  f.identity = f.checksum + "-10";
  unpooled.files.push_back(f);
  EXPECT_CODE(store_->CommitManifest(unpooled), kNotFound);  // every file must be pooled first
  std::vector<uint64_t> ids;
  ASSERT_OK(store_->ListCheckpoints("op", 0, &ids));
  EXPECT_EQ(ids, std::vector<uint64_t>{1});
  Manifest m;
  EXPECT_CODE(store_->ReadManifest("op", 0, 2, &m), kNotFound);
  EXPECT_CODE(store_->ReadManifest("op", 1, 1, &m), kNotFound);
  RestoreStats st;
  EXPECT_CODE(store_->Restore("op", 0, 2, dir_.Sub("out"), RestoreOptions(), &st), kNotFound);
  EXPECT_FALSE(StatOf(dir_.Sub("out")).ok);
  EXPECT_CODE(store_->Restore("../op", 0, 1, dir_.Sub("out"), RestoreOptions(), &st), kPathOutsideStore);
}

TEST_F(StoreTest, RestoreHardLinksSstAndBlobFilesAndCopiesTheRest) {
  const std::string sst = RandomBytes(40000, 5), blob = RandomBytes(7000, 6);
  const std::string manifest = RandomBytes(900, 7), current = "MANIFEST-000004\n";
  Commit(4, {{"000020.sst", sst}, {"000021.blob", blob}, {"MANIFEST-000004", manifest}, {"CURRENT", current}});
  const std::string out = dir_.Sub("restored/db");
  RestoreStats st;
  ASSERT_OK(store_->Restore("op", 0, 4, out, RestoreOptions(), &st));
  EXPECT_EQ(List(out), (std::vector<std::string>{"000020.sst", "000021.blob", "CURRENT", "MANIFEST-000004"}));
  EXPECT_TRUE(SameInode(out + "/000020.sst", Pool(sst)));
  EXPECT_TRUE(SameInode(out + "/000021.blob", Pool(blob)));
  EXPECT_FALSE(SameInode(out + "/MANIFEST-000004", Pool(manifest)));
  EXPECT_FALSE(SameInode(out + "/CURRENT", Pool(current)));
  EXPECT_EQ(StatOf(out + "/CURRENT").mode, 0600u);  // RocksDB may rewrite it; owner-only (issue 46)
  EXPECT_EQ(StatOf(out + "/MANIFEST-000004").mode, 0600u);
  EXPECT_EQ(StatOf(out + "/000020.sst").mode, 0400u);  // a link: the pool file's inode and mode
  EXPECT_EQ(StatOf(out + "/000021.blob").mode, 0400u);
  for (const auto& [name, bytes] : std::map<std::string, std::string>{
           {"000020.sst", sst}, {"000021.blob", blob}, {"MANIFEST-000004", manifest}, {"CURRENT", current}}) {
    EXPECT_EQ(Slurp(out + "/" + name), bytes) << name;
  }
  EXPECT_EQ(st.files, 4u);
  EXPECT_EQ(st.linked_files, 2u);
  EXPECT_EQ(st.copied_files, 2u);
  EXPECT_EQ(st.copied_bytes, manifest.size() + current.size());
  EXPECT_EQ(st.total_bytes, sst.size() + blob.size() + manifest.size() + current.size());
  // Staged beside the target and renamed: nothing else is left in its parent.
  EXPECT_EQ(List(dir_.Sub("restored")), std::vector<std::string>{"db"});
  // A second restore to the same target never overwrites it.
  ASSERT_EQ(::unlink((out + "/CURRENT").c_str()), 0);
  EXPECT_CODE(store_->Restore("op", 0, 4, out, RestoreOptions(), &st), kAlreadyExists);
  EXPECT_EQ(List(out), (std::vector<std::string>{"000020.sst", "000021.blob", "MANIFEST-000004"}));
}

TEST_F(StoreTest, CopyModeRestoresTheSameBytesWithoutSharingAnInode) {
  const std::string sst = RandomBytes(20000, 8);
  Commit(1, {{"000005.sst", sst}});
  RestoreOptions o;
  o.mode = PlaceMode::kCopy;
  RestoreStats st;
  ASSERT_OK(store_->Restore("op", 0, 1, dir_.Sub("copy"), o, &st));
  EXPECT_FALSE(SameInode(dir_.Sub("copy/000005.sst"), Pool(sst)));
  EXPECT_EQ(Slurp(dir_.Sub("copy/000005.sst")), sst);
  EXPECT_EQ(st.linked_files, 0u);
  EXPECT_EQ(st.copied_bytes, sst.size());
  EXPECT_EQ(StatOf(Pool(sst)).nlink, 2u);  // the pool file and the source it was linked from
}

TEST_F(StoreTest, AFlippedByteIsCaughtByAFullVerifyAndAFullRestore) {
  const std::string sst = RandomBytes(10000, 9), other = RandomBytes(500, 10);
  Commit(1, {{"000030.sst", sst}, {"OPTIONS-000007", other}});
  std::string bad = sst;
  bad[4321] ^= 0x01;  // same size, other bytes
  ASSERT_EQ(::chmod(Pool(sst).c_str(), 0644), 0);
  WriteBytes(Pool(sst), bad);

  VerifyReport r;
  ASSERT_OK(store_->Verify("op", 0, VerifyLevel::kSize, &r));
  EXPECT_TRUE(r.ok());  // a size check cannot see it
  EXPECT_EQ(r.files_checked, 2u);
  ASSERT_OK(store_->Verify("", 0, VerifyLevel::kFull, &r));
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0].file, "000030.sst");
  EXPECT_EQ(r.problems[0].checkpoint_id, 1u);
  EXPECT_EQ(r.problems[0].detail, "checksum mismatch");
  EXPECT_EQ(r.bytes_checked, sst.size() + other.size());

  RestoreOptions full;
  full.verify = VerifyLevel::kFull;
  RestoreStats st;
  Status s = store_->Restore("op", 0, 1, dir_.Sub("out"), full, &st);
  EXPECT_CODE(s, kCorruption);
  EXPECT_NE(s.message().find("000030.sst"), std::string::npos) << s.message();
  EXPECT_FALSE(StatOf(dir_.Sub("out")).ok);
}

TEST_F(StoreTest, ATruncatedOrMissingPoolFileIsCorruption) {
  const std::string a = RandomBytes(3000, 11), b = RandomBytes(4000, 12);
  Commit(1, {{"000001.sst", a}, {"000002.sst", b}});
  ASSERT_EQ(::truncate(Pool(a).c_str(), 1000), 0);
  ASSERT_EQ(::unlink(Pool(b).c_str()), 0);
  VerifyReport r;
  ASSERT_OK(store_->Verify("op", 0, VerifyLevel::kSize, &r));
  ASSERT_EQ(r.problems.size(), 2u);
  EXPECT_EQ(r.problems[0].file, "000001.sst");
  EXPECT_EQ(r.problems[0].detail.rfind("truncated", 0), 0u) << r.problems[0].detail;
  EXPECT_EQ(r.problems[1].file, "000002.sst");
  EXPECT_EQ(r.problems[1].detail, "missing from the pool");
  RestoreStats st;
  EXPECT_CODE(store_->Restore("op", 0, 1, dir_.Sub("out"), RestoreOptions(), &st), kCorruption);
  EXPECT_FALSE(StatOf(dir_.Sub("out")).ok);
}

TEST_F(StoreTest, RetainAndGcFreeExactlyTheFilesNoKeptManifestNames) {
  const std::string shared = RandomBytes(8000, 13), only1 = RandomBytes(1000, 14), only2 = RandomBytes(2000, 15),
                    only3 = RandomBytes(3000, 16);
  Commit(1, {{"000001.sst", shared}, {"000002.sst", only1}});
  Commit(2, {{"000001.sst", shared}, {"000003.sst", only2}});
  Commit(3, {{"000001.sst", shared}, {"000004.sst", only3}});
  std::vector<uint64_t> removed;
  ASSERT_OK(store_->Retain("op", 0, 2, &removed));
  EXPECT_EQ(removed, std::vector<uint64_t>{1});
  GcStats g;
  ASSERT_OK(store_->GarbageCollect(&g));
  EXPECT_EQ(g.files_removed, 1u);
  EXPECT_EQ(g.bytes_removed, only1.size());
  EXPECT_FALSE(StatOf(Pool(only1)).ok);
  std::set<std::string> want{IdentityOf(shared), IdentityOf(only2), IdentityOf(only3)};
  auto pool = List(dir_.Sub("store/pool"));
  EXPECT_EQ(std::set<std::string>(pool.begin(), pool.end()), want);
  // What is kept still restores, byte for byte.
  RestoreStats st;
  ASSERT_OK(store_->Restore("op", 0, 2, dir_.Sub("at2"), RestoreOptions(), &st));
  EXPECT_EQ(Slurp(dir_.Sub("at2/000001.sst")), shared);
  EXPECT_EQ(Slurp(dir_.Sub("at2/000003.sst")), only2);
  // A second pass finds nothing more.
  ASSERT_OK(store_->GarbageCollect(&g));
  EXPECT_EQ(g.files_removed, 0u);
}

TEST_F(StoreTest, GcStopsWithoutDeletingWhenAManifestIsUnreadable) {
  const std::string a = RandomBytes(1000, 30);
  Commit(1, {{"000001.sst", a}});
  // A pooled file nobody references, and a damaged manifest.
  WriteBytes(dir_.Sub("orphan"), "orphan bytes");
  FileEntry e;
  ASSERT_OK(store_->PoolFile(dir_.Sub("orphan"), nullptr, &e));
  const std::string mf = dir_.Sub("store/checkpoints/op/0/00000000000000000001.manifest");
  ASSERT_EQ(::chmod(mf.c_str(), 0644), 0);
  std::string text = Slurp(mf);
  text[text.size() / 3] ^= 0x20;
  WriteBytes(mf, text);
  Manifest m;
  EXPECT_CODE(store_->ReadManifest("op", 0, 1, &m), kCorruption);
  GcStats g;
  EXPECT_CODE(store_->GarbageCollect(&g), kCorruption);
  EXPECT_EQ(g.files_removed, 0u);
  EXPECT_TRUE(StatOf(Pool(a)).ok);
  EXPECT_TRUE(StatOf(Pool("orphan bytes")).ok);
}

TEST(ReplicaStoreStateTest, ARealCheckpointRestoresByLinksWithItsValues) {
  testing::TempDir dir;
  std::unique_ptr<ReplicaStore> store;
  ASSERT_OK(ReplicaStore::Open(dir.Sub("store"), &store));
  StateOptions so;
  so.partitioner.num_key_groups = 64;
  so.partitioner.num_vnodes = 4;
  so.operator_id = "op";
  so.instance = 2;
  so.checkpoint_wal_bytes = 0;  // flush: the checkpoint is SSTs
  so.write_buffer_budget = 8ull << 20;
  so.block_cache_bytes = 1ull << 20;
  std::map<std::string, std::string> model;
  Manifest m;
  {
    std::unique_ptr<StateBackend> db;
    ASSERT_OK(StateBackend::Open(dir.Sub("live"), so, &db));
    for (int i = 0; i < 200; ++i) {
      std::string k = "key-" + std::to_string(i), v = RandomBytes(50 + i % 7, 40 + i);
      ASSERT_OK(db->Put(k, v));
      model[k] = v;
    }
    ASSERT_OK(db->Checkpoint(store.get(), 5, 1, &m));
  }
  EXPECT_EQ(m.checkpoint_id, 5u);
  EXPECT_CODE(store->ReadManifest("op", 2, 4, &m), kNotFound);
  ASSERT_OK(store->ReadManifest("op", 2, 5, &m));
  int ssts = 0;
  for (const auto& f : m.files) {
    std::string pooled;
    ASSERT_OK(store->PoolPath(f.identity, &pooled));
    EXPECT_EQ(IdentityOf(Slurp(pooled)), f.identity) << f.name;  // the pool holds what the manifest says
    ssts += IsImmutableDbFile(f.name) ? 1 : 0;
  }
  EXPECT_GT(ssts, 0);

  std::unique_ptr<StateBackend> back;
  RestoreStats st;
  ASSERT_OK(StateBackend::Restore(*store, "op", 2, 5, dir.Sub("restored"), RestoreOptions(), so, &back, &st));
  EXPECT_EQ(st.linked_files, static_cast<uint64_t>(ssts));
  for (const auto& f : m.files) {
    if (!IsImmutableDbFile(f.name)) continue;
    std::string pooled;
    ASSERT_OK(store->PoolPath(f.identity, &pooled));
    EXPECT_TRUE(SameInode(dir.Sub("restored/" + f.name), pooled)) << f.name;
  }
  for (const auto& [k, v] : model) {
    std::string got;
    ASSERT_OK(back->Get(k, &got));
    EXPECT_EQ(got, v) << k;
  }
  std::string none;
  EXPECT_CODE(back->Get("key-200", &none), kNotFound);
  EXPECT_EQ(back->last_checkpoint(), std::optional<uint64_t>(5));
}

}  // namespace
}  // namespace rhino
