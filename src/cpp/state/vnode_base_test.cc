// A vnode on a base (state/vnode_base.h; the early hand-over, issue 48) over a
// real StateBackend. The base is a model: a std::map read by a BaseReader that
// answers from it (the service's reader asks a worker; that is tested on real
// workers). The oracle of every read is a second model, the base overlaid with
// the writes and deletes made since the move.
#include "state/vnode_base.h"

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rhino/replica_store.h"
#include "rhino/state_backend.h"
#include "state/session_batch.h"
#include "testing/test_util.h"

namespace rhino {
namespace {

using Sv = std::string_view;
using Model = std::map<std::string, std::string>;

constexpr uint32_t kVnodes = 4;
constexpr uint32_t kMoved = 1;  // the vnode taken on a base

StateOptions Options(std::vector<uint32_t> vnodes) {
  StateOptions o;
  o.operator_id = "op";
  o.partitioner.num_key_groups = 64;
  o.partitioner.num_vnodes = kVnodes;
  o.partitioner.seed = 7;
  o.vnodes = std::move(vnodes);
  o.write_buffer_budget = 8ull << 20;
  o.block_cache_bytes = 1ull << 20;
  return o;
}

// A base read from a model, counting the calls (a task pays a constant number
// of them per batch, whatever the keys).
class ModelReader : public BaseReader {
 public:
  explicit ModelReader(const Model* base) : base_(base) {}
  Status Get(const std::vector<uint32_t>& vnodes, const std::vector<Sv>& keys, std::vector<uint8_t>* found,
             std::vector<std::string>* values) override {
    ++gets;
    found->assign(keys.size(), 0);
    values->assign(keys.size(), "");
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_EQ(vnodes[i], kMoved);
      auto it = base_->find(std::string(keys[i]));
      if (it != base_->end()) {
        (*found)[i] = 1;
        (*values)[i] = it->second;
      }
    }
    return Status::OK();
  }
  Status Scan(uint32_t vnode, Sv prefix, std::optional<Sv> after, size_t max_entries,
              std::vector<std::pair<std::string, std::string>>* out, bool* more) override {
    ++scans;
    EXPECT_EQ(vnode, kMoved);
    out->clear();
    auto it = after ? base_->upper_bound(std::string(*after)) : base_->lower_bound(std::string(prefix));
    for (; it != base_->end() && Sv(it->first).substr(0, prefix.size()) == prefix; ++it) {
      if (out->size() == max_entries) {
        *more = true;
        return Status::OK();
      }
      out->emplace_back(it->first, it->second);
    }
    *more = false;
    return Status::OK();
  }
  int gets = 0;
  int scans = 0;

 private:
  const Model* base_;
};

class VnodeBaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK(StateBackend::Open(dir_.Sub("db"), Options({0}), &db_));
    ASSERT_TRUE(db_->takes_bases());
    // Keys of each vnode, made by routing: the base holds some, the target writes others.
    for (int i = 0; keys_.size() < 400; ++i) {
      std::string k = "key-" + std::to_string(i);
      if (db_->partitioner().VnodeOfBytes(k) == kMoved) keys_.push_back(k);
    }
    // Values of 200 bytes: the base spans several SST blocks, and so several small files.
  for (size_t i = 0; i < 300; ++i) base_[keys_[i]] = "base-" + keys_[i] + std::string(200, 'x');
  }

  VnodeBase Base() const { return VnodeBase{"op", 2, 17, {"w1", "w2"}}; }

  // Every key through a session with the model reader: what the session sees.
  Model ReadAll(const SessionBatch& s) {
    std::vector<Sv> views(keys_.begin(), keys_.end());
    Model out;
    EXPECT_OK(s.MultiGet(views, 0, [&](size_t i, bool found, Sv v) {
      if (found) out[keys_[i]] = std::string(v);
      return true;
    }));
    return out;
  }
  Model ScanAll(const SessionBatch& s, Sv prefix = "") {
    Model out;
    EXPECT_OK(s.Scan(kMoved, prefix, std::nullopt, std::nullopt, [&](uint32_t, Sv k, Sv v) {
      EXPECT_TRUE(out.emplace(std::string(k), std::string(v)).second) << "scanned twice: " << k;
      return true;
    }));
    return out;
  }
  // What the DB itself holds of the vnode, no reader: after the merge, everything.
  Model Local() {
    Model out;
    EXPECT_OK(db_->Scan(kMoved, [&](Sv k, Sv v) {
      out[std::string(k)] = std::string(v);
      return true;
    }));
    return out;
  }

  testing::TempDir dir_;
  std::unique_ptr<StateBackend> db_;
  std::vector<std::string> keys_;
  Model base_;
};

// Random batches of puts and deletes (of base keys and new ones) on the vnode
// while it is on its base, each checked through a session against the model;
// then the base lands and merges under the writes, after compactions that
// dropped the deletes, and the DB alone holds exactly the model.
TEST_F(VnodeBaseTest, ReadsThroughUntilTheBaseMergesUnderTheWritesSinceTheMove) {
  ASSERT_OK(db_->AddVnodeOnBase(kMoved, Base()));
  auto bases = db_->VnodeBases();
  ASSERT_EQ(bases.size(), 1u);
  EXPECT_EQ(bases[kMoved].checkpoint, 17u);
  EXPECT_EQ(bases[kMoved].hosts, (std::vector<std::string>{"w1", "w2"}));
  ModelReader reader(&base_);
  Model model = base_;
  std::mt19937 rng(4242);
  for (uint64_t batch = 1; batch <= 12; ++batch) {
    SessionBatch s(db_.get());
    s.SetBaseReader(&reader);
    for (int op = 0; op < 40; ++op) {
      const std::string& k = keys_[rng() % keys_.size()];
      if (rng() % 3 == 0) {
        ASSERT_OK(s.Delete({k}));
        model.erase(k);
      } else {
        const std::string v = "b" + std::to_string(batch) + "-" + std::to_string(op);
        ASSERT_OK(s.Put({k}, {v}));
        model[k] = v;
      }
    }
    EXPECT_EQ(ReadAll(s), model) << "uncommitted, batch " << batch;  // the session's own writes over both
    EXPECT_EQ(ScanAll(s), model) << "uncommitted scan, batch " << batch;
    ASSERT_OK(s.Commit(batch));
    if (batch % 4 == 0) {  // deletes with nothing below them are dropped by compaction
      uint64_t before = 0, after = 0;
      ASSERT_OK(db_->CompactVnodes(&before, &after));
    }
    SessionBatch r(db_.get());
    r.SetBaseReader(&reader);
    const int gets = reader.gets;
    EXPECT_EQ(ReadAll(r), model) << "batch " << batch;
    EXPECT_LE(reader.gets - gets, 1) << "one read of the base per lookup call, whatever the keys";
    EXPECT_EQ(ScanAll(r), model) << "batch " << batch;
    Model with_prefix;
    for (const auto& [k, v] : model)
      if (k.rfind("key-1", 0) == 0) with_prefix[k] = v;
    EXPECT_EQ(ScanAll(r, "key-1"), with_prefix) << "batch " << batch;
  }
  // The base lands: written into files by BaseFileWriter, in key order.
  BaseFileWriter w(*db_, dir_.path(), /*file_bytes=*/2048);  // small files: several of them
  for (const auto& [k, v] : base_) ASSERT_OK(w.Add(k, v));
  std::vector<std::string> files;
  ASSERT_OK(w.Finish(&files));
  ASSERT_GT(files.size(), 1u);
  MergeBaseStats stats;
  ASSERT_OK(db_->MergeBase(kMoved, files, &stats));
  EXPECT_EQ(stats.files, files.size());
  EXPECT_GT(stats.deletes_again, 0u);
  EXPECT_TRUE(db_->VnodeBases().empty());
  EXPECT_EQ(Local(), model) << "the DB alone, after the merge";
  uint64_t before = 0, after = 0;
  ASSERT_OK(db_->CompactVnodes(&before, &after));
  EXPECT_EQ(Local(), model) << "after a compaction of the merged vnode";
  SessionBatch plain(db_.get());  // no reader needed any more
  EXPECT_EQ(ReadAll(plain), model);
  EXPECT_EQ(ScanAll(plain), model);
  // And writes after the merge are ordinary ones.
  ASSERT_OK(plain.Delete({keys_[0]}));
  ASSERT_OK(plain.Commit(13));
  model.erase(keys_[0]);
  EXPECT_EQ(Local(), model);
}

TEST_F(VnodeBaseTest, AReadWithoutAReaderIsRefusedNotAnsweredAbsent) {
  ASSERT_OK(db_->AddVnodeOnBase(kMoved, Base()));
  SessionBatch s(db_.get());
  std::vector<Sv> one{keys_[0]};
  EXPECT_CODE(s.MultiGet(one, 0, [](size_t, bool, Sv) { return true; }), kInvalidArgument);
  EXPECT_CODE(s.Scan(kMoved, "", std::nullopt, std::nullopt, [](uint32_t, Sv, Sv) { return true; }),
              kInvalidArgument);
  // A key the instance holds itself needs no reader.
  ASSERT_OK(db_->Put(keys_[0], "mine"));
  bool found = false;
  ASSERT_OK(s.MultiGet(one, 0, [&](size_t, bool f, Sv v) {
    found = f && v == "mine";
    return true;
  }));
  EXPECT_TRUE(found);
}

TEST_F(VnodeBaseTest, CheckpointsAndRestoresKeepTheBaseAndTheDeletesSinceTheMove) {
  ASSERT_OK(db_->AddVnodeOnBase(kMoved, Base()));
  ModelReader reader(&base_);
  {
    SessionBatch s(db_.get());
    s.SetBaseReader(&reader);
    ASSERT_OK(s.Delete({keys_[0]}));       // a base key, deleted here
    ASSERT_OK(s.Put({keys_[1]}, {"new"}));  // a base key, overwritten
    ASSERT_OK(s.Commit(1));
  }
  std::unique_ptr<ReplicaStore> store;
  ASSERT_OK(ReplicaStore::Open(dir_.Sub("store"), &store));
  Manifest m;
  ASSERT_OK(db_->Checkpoint(store.get(), 1, 1, &m));
  std::unique_ptr<StateBackend> restored;
  RestoreStats rs;
  ASSERT_OK(StateBackend::Restore(*store, "op", 0, 1, dir_.Sub("restored"), RestoreOptions{}, Options({0}),
                                  &restored, &rs));
  EXPECT_TRUE(restored->takes_bases());
  auto bases = restored->VnodeBases();
  ASSERT_EQ(bases.size(), 1u);
  EXPECT_EQ(bases[kMoved].operator_id, "op");
  EXPECT_EQ(bases[kMoved].instance, 2u);
  SessionBatch s(restored.get());
  s.SetBaseReader(&reader);
  std::vector<Sv> three{keys_[0], keys_[1], keys_[2]};
  Model got;
  ASSERT_OK(s.MultiGet(three, 0, [&](size_t i, bool f, Sv v) {
    if (f) got[std::string(three[i])] = std::string(v);
    return true;
  }));
  EXPECT_EQ(got, (Model{{keys_[1], "new"}, {keys_[2], base_[keys_[2]]}}));
}

TEST_F(VnodeBaseTest, AVnodeOnABaseCannotBeExportedAndIsForgottenWhenDropped) {
  ASSERT_OK(db_->AddVnodeOnBase(kMoved, Base()));
  EXPECT_CODE(db_->AddVnodeOnBase(kMoved, Base()), kAlreadyExists);
  EXPECT_CODE(db_->AddVnodeOnBase(kVnodes, Base()), kUnknownVnode);
  EXPECT_CODE(db_->ExportVnodes({kMoved}, dir_.Sub("export")), kInvalidArgument);
  ASSERT_OK(db_->Delete(keys_[0]));
  ASSERT_OK(db_->DropVnodes({kMoved}));
  EXPECT_TRUE(db_->VnodeBases().empty());
  MergeBaseStats stats;
  EXPECT_CODE(db_->MergeBase(kMoved, {}, &stats), kInvalidArgument);
  // Taken again on a new base, it starts with no gone keys of the old one.
  ASSERT_OK(db_->AddVnodeOnBase(kMoved, Base()));
  ModelReader reader(&base_);
  SessionBatch s(db_.get());
  s.SetBaseReader(&reader);
  std::vector<Sv> one{keys_[0]};
  bool found = false;
  Status st = s.MultiGet(one, 0, [&](size_t, bool f, Sv) {
    found = f;
    return true;
  });
  ASSERT_OK(st);
  EXPECT_EQ(reader.gets, 1);
  EXPECT_TRUE(found) << "the delete made on the old base must not hide the new base's key";
}

TEST_F(VnodeBaseTest, BaseFilesMustComeInKeyOrder) {
  BaseFileWriter w(*db_, dir_.path());
  ASSERT_OK(w.Add("b", "1"));
  EXPECT_CODE(w.Add("a", "2"), kInvalidArgument);
  EXPECT_CODE(w.Add("b", "2"), kInvalidArgument);
}

}  // namespace
}  // namespace rhino
