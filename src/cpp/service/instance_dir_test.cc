// InstanceDir: the on-disk layout of the instances a worker hosts. The
// oracle is the layout instance_dir.h and docs/protocol.md §7.1 describe
// (<state_dir>/instances/<operator_id>/<instance>/{instance.json,
// placement.json, CLOSED, db-<hex>/}, <state_dir>/tmp/): files are read back
// with Slurp and written by hand with WriteBytes, never through InstanceDir.
#include "service/instance_dir.h"

#include <asio.hpp>
#include <nlohmann/json.hpp>

#include <cctype>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "service/hosted_instance.h"
#include "testing/test_util.h"

namespace rhino {
namespace {

using json = nlohmann::json;
using testing::Exists;
using testing::List;
using testing::Slurp;

// WriteBytes, creating the parent directories first.
void Put(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  testing::WriteBytes(path, bytes);
}

bool IsHex(const std::string& s) {
  for (unsigned char c : s)
    if (!std::isxdigit(c) || std::isupper(c)) return false;
  return !s.empty();
}

InstanceConfig SampleConfig() {
  InstanceConfig c;
  c.operator_id = "agg.v2";
  c.instance = 3;
  c.epoch = 9;
  c.partitioner.num_key_groups = 1024;
  c.partitioner.num_vnodes = 16;
  c.partitioner.seed = 77;
  c.vnodes = {1, 4, 5};
  c.chain = {"10.0.0.2:7000", "10.0.0.3:7000"};
  c.chain_version = 4;
  c.db_name = "db-0123456789ab";
  c.discard_pending = true;
  c.discard_after = 12;
  return c;
}

// An instance.json by hand: the fields InstanceConfig names, in JSON.
std::string ConfigText(const std::string& op, uint32_t instance, uint64_t epoch, const std::string& db_name) {
  return json{{"format", 1},
              {"operator_id", op},
              {"instance", instance},
              {"epoch", epoch},
              {"partitioner", {{"num_key_groups", 64}, {"num_vnodes", 8}, {"seed", 1}}},
              {"vnodes", {0, 1}},
              {"chain", json::array()},
              {"chain_version", 2},
              {"db_name", db_name}}
      .dump();
}

void WriteConfig(const testing::TempDir& state, const std::string& op, const std::string& id, const std::string& text) {
  Put(state.Sub("instances/" + op + "/" + id + "/instance.json"), text);
}

std::vector<std::string> NamesOf(const std::vector<InstanceConfig>& cs) {
  std::vector<std::string> out;
  for (const auto& c : cs) out.push_back(c.operator_id + "/" + std::to_string(c.instance));
  return out;
}

struct Listed {
  std::vector<InstanceConfig> configs;
  std::vector<std::pair<std::string, Status>> bad;
};

Listed ListAll(const std::string& state_dir) {
  Listed l;
  EXPECT_OK(InstanceDir::ListHostable(state_dir, &l.configs,
                                      [&](const std::string& what, const Status& s) { l.bad.emplace_back(what, s); }));
  return l;
}

TEST(InstanceDirTest, LayoutPaths) {
  testing::TempDir state;
  InstanceDir d(state.path(), "op", 7);
  EXPECT_EQ(d.path(), state.Sub("instances/op/7"));
  EXPECT_EQ(d.ConfigPath(), state.Sub("instances/op/7/instance.json"));
  EXPECT_EQ(d.DbDir("db-00ff00ff00ff"), state.Sub("instances/op/7/db-00ff00ff00ff"));
  EXPECT_EQ(InstanceDir::TmpDir(state.path()), state.Sub("tmp"));

  // db-<hex>, fresh each time.
  const std::string db = InstanceDir::NewDbName();
  ASSERT_EQ(db.substr(0, 3), "db-");
  EXPECT_TRUE(IsHex(db.substr(3))) << db;
  EXPECT_NE(InstanceDir::NewDbName(), db);

  // <state_dir>/tmp/<kind>-<hex>, fresh each time, not created.
  const std::string work = d.WorkDir("import");
  const std::string prefix = state.Sub("tmp/import-");
  ASSERT_EQ(work.substr(0, prefix.size()), prefix);
  EXPECT_TRUE(IsHex(work.substr(prefix.size()))) << work;
  EXPECT_NE(d.WorkDir("import"), work);
  EXPECT_FALSE(Exists(work));
  EXPECT_FALSE(Exists(d.path()));

  ASSERT_OK(d.Create());
  EXPECT_TRUE(Exists(state.Sub("instances/op/7")));
}

TEST(InstanceDirTest, SaveConfigWritesInstanceJsonThatReadsBack) {
  testing::TempDir state;
  InstanceConfig c = SampleConfig();
  c.redo_version = 11;
  c.redo.push_back(ReconfigOp{});
  c.redo[0].kind = ReconfigOp::Kind::kDrop;
  c.redo[0].vnodes = {2};
  InstanceDir d(state.path(), c.operator_id, c.instance);
  ASSERT_OK(d.SaveConfig(c));  // creates the directory too

  const std::string text = Slurp(state.Sub("instances/agg.v2/3/instance.json"));
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  // Atomic: nothing but the file is left beside it.
  EXPECT_EQ(List(state.Sub("instances/agg.v2/3")), std::vector<std::string>{"instance.json"});
  json j = json::parse(text);
  EXPECT_EQ(j["operator_id"], "agg.v2");
  EXPECT_EQ(j["instance"], 3);
  EXPECT_EQ(j["epoch"], 9);
  EXPECT_EQ(j["partitioner"], (json{{"num_key_groups", 1024}, {"num_vnodes", 16}, {"seed", 77}}));
  EXPECT_EQ(j["vnodes"], (json{1, 4, 5}));
  EXPECT_EQ(j["chain"], (json{"10.0.0.2:7000", "10.0.0.3:7000"}));
  EXPECT_EQ(j["chain_version"], 4);
  EXPECT_EQ(j["db_name"], "db-0123456789ab");
  EXPECT_EQ(j["discard_pending"], true);
  EXPECT_EQ(j["discard_after"], 12);
  EXPECT_EQ(j["redo_version"], 11);
  EXPECT_EQ(j["redo"], json::parse(R"([{"op": "drop", "vnodes": [2]}])"));  // protocol §7.4's steps

  InstanceConfig back;
  ASSERT_OK(InstanceDir::ReadSavedConfig(state.path(), "agg.v2", 3, &back));
  EXPECT_EQ(back.operator_id, c.operator_id);
  EXPECT_EQ(back.instance, c.instance);
  EXPECT_EQ(back.epoch, c.epoch);
  EXPECT_EQ(back.partitioner.num_key_groups, 1024u);
  EXPECT_EQ(back.partitioner.num_vnodes, 16u);
  EXPECT_EQ(back.partitioner.seed, 77u);
  EXPECT_EQ(back.vnodes, c.vnodes);
  EXPECT_EQ(back.chain, c.chain);
  EXPECT_EQ(back.chain_version, c.chain_version);
  EXPECT_EQ(back.db_name, c.db_name);
  EXPECT_TRUE(back.discard_pending);
  EXPECT_EQ(back.discard_after, std::optional<uint64_t>(12));
  EXPECT_EQ(back.redo_version, std::optional<uint64_t>(11));
  ASSERT_EQ(back.redo.size(), 1u);
  EXPECT_EQ(back.redo[0].kind, ReconfigOp::Kind::kDrop);
  EXPECT_EQ(back.redo[0].vnodes, std::vector<uint32_t>{2});

  // An unsynced save is as atomic, and reads the same.
  c.epoch = 10;
  ASSERT_OK(d.SaveConfig(c, /*sync=*/false));
  EXPECT_EQ(json::parse(Slurp(d.ConfigPath()))["epoch"], 10);
  EXPECT_EQ(List(state.Sub("instances/agg.v2/3")), std::vector<std::string>{"instance.json"});
}

TEST(InstanceDirTest, AHandWrittenInstanceJsonParses) {
  testing::TempDir state;
  WriteConfig(state, "op", "5", ConfigText("op", 5, 3, "db-aa"));
  InstanceConfig c;
  ASSERT_OK(InstanceDir::ReadSavedConfig(state.path(), "op", 5, &c));
  EXPECT_EQ(c.operator_id, "op");
  EXPECT_EQ(c.instance, 5u);
  EXPECT_EQ(c.epoch, 3u);
  EXPECT_EQ(c.partitioner.num_vnodes, 8u);
  EXPECT_EQ(c.vnodes, (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(c.chain_version, 2u);
  EXPECT_EQ(c.db_name, "db-aa");
  // Fields an older worker did not write take their defaults.
  EXPECT_FALSE(c.discard_pending);
  EXPECT_FALSE(c.discard_after.has_value());
  EXPECT_FALSE(c.redo_version.has_value());
  EXPECT_TRUE(c.redo.empty());
}

TEST(InstanceDirTest, ADamagedInstanceJsonIsCorruptionAndListHostableNamesIt) {
  testing::TempDir state;
  ASSERT_OK(InstanceDir::PrepareStateDir(state.path()));
  WriteConfig(state, "op", "0", ConfigText("op", 0, 1, "db-00"));
  WriteConfig(state, "op", "1", "{\"operator_id\": \"op\", \"instance\": ");  // torn
  WriteConfig(state, "other", "2", json{{"operator_id", "other"}}.dump());  // fields missing

  InstanceConfig c;
  Status s = InstanceDir::ReadSavedConfig(state.path(), "op", 1, &c);
  EXPECT_CODE(s, kCorruption);
  EXPECT_NE(s.message().find("malformed instance.json"), std::string::npos) << s.ToString();
  EXPECT_CODE(InstanceDir::ReadSavedConfig(state.path(), "other", 2, &c), kCorruption);

  Listed l = ListAll(state.path());
  EXPECT_EQ(NamesOf(l.configs), std::vector<std::string>{"op/0"});
  ASSERT_EQ(l.bad.size(), 2u);
  EXPECT_EQ(l.bad[0].first, "op/1");
  EXPECT_TRUE(testing::IsCorruption(l.bad[0].second));
  EXPECT_EQ(l.bad[1].first, "other/2");
  EXPECT_TRUE(testing::IsCorruption(l.bad[1].second));
}

TEST(InstanceDirTest, NamesThatWouldLeaveTheStateDirAreCorruption) {
  // The names in instance.json become paths (the operator's directory, the
  // live DB's): ParseInstanceConfig refuses any that is not a plain name.
  // (An operator id from a request is checked by the state service first,
  // and an instance is a number.)
  testing::TempDir state;
  ASSERT_OK(InstanceDir::PrepareStateDir(state.path()));
  WriteConfig(state, "op", "0", ConfigText("../../evil", 0, 1, "db-00"));
  WriteConfig(state, "op", "1", ConfigText("op", 1, 1, "../../../etc"));
  WriteConfig(state, "op", "2", ConfigText("a/b", 2, 1, "db-00"));
  WriteConfig(state, "op", "3", ConfigText("op", 3, 1, ".."));
  InstanceConfig c;
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(testing::IsCorruption(InstanceDir::ReadSavedConfig(state.path(), "op", i, &c))) << i;
  }
  EXPECT_CODE(ParseInstanceConfig(ConfigText("", 0, 1, ""), &c), kCorruption);
  // An empty db_name is a fresh instance (Open creates one), not a path.
  EXPECT_OK(ParseInstanceConfig(ConfigText("op", 0, 1, ""), &c));

  Listed l = ListAll(state.path());
  EXPECT_TRUE(l.configs.empty());
  ASSERT_EQ(l.bad.size(), 4u);
  for (uint32_t i = 0; i < 4; ++i) EXPECT_EQ(l.bad[i].first, "op/" + std::to_string(i));
}

TEST(InstanceDirTest, ReadSavedConfigOfANeverHostedInstanceIsNotFound) {
  testing::TempDir state;
  ASSERT_OK(InstanceDir::PrepareStateDir(state.path()));
  InstanceConfig c;
  Status s = InstanceDir::ReadSavedConfig(state.path(), "op", 3, &c);
  EXPECT_CODE(s, kNotFound);
  EXPECT_EQ(s.message(), "op/3 was never hosted here");
  // A directory without instance.json was never hosted either.
  ASSERT_OK(InstanceDir(state.path(), "op", 4).Create());
  EXPECT_CODE(InstanceDir::ReadSavedConfig(state.path(), "op", 4, &c), kNotFound);
}

TEST(InstanceDirTest, PrepareStateDirEmptiesTmpAndKeepsInstances) {
  testing::TempDir state;
  Put(state.Sub("tmp/import-0011/export/x.sst"), "left by a killed worker");
  WriteConfig(state, "op", "0", ConfigText("op", 0, 1, "db-00"));
  ASSERT_OK(InstanceDir::PrepareStateDir(state.path()));
  EXPECT_FALSE(Exists(state.Sub("tmp")));
  EXPECT_EQ(Slurp(state.Sub("instances/op/0/instance.json")), ConfigText("op", 0, 1, "db-00"));

  // On a fresh state directory it creates instances/.
  testing::TempDir fresh;
  ASSERT_OK(InstanceDir::PrepareStateDir(fresh.path()));
  EXPECT_EQ(List(fresh.path()), std::vector<std::string>{"instances"});
  EXPECT_TRUE(List(fresh.Sub("instances")).empty());
}

TEST(InstanceDirTest, ListHostableSkipsDirectoriesWithoutAConfig) {
  testing::TempDir state;
  ASSERT_OK(InstanceDir::PrepareStateDir(state.path()));
  WriteConfig(state, "op", "1", ConfigText("op", 1, 1, "db-00"));
  Put(state.Sub("instances/op/2/db-00/CURRENT"), "x");  // a directory an Open left before its save
  Put(state.Sub("instances/stray-file"), "x");
  Listed l = ListAll(state.path());
  EXPECT_EQ(NamesOf(l.configs), std::vector<std::string>{"op/1"});
  EXPECT_TRUE(l.bad.empty());
}

TEST(InstanceDirTest, TheClosedMarkerHidesAnInstanceFromListHostable) {
  testing::TempDir state;
  ASSERT_OK(InstanceDir::PrepareStateDir(state.path()));
  WriteConfig(state, "op", "0", ConfigText("op", 0, 1, "db-00"));
  WriteConfig(state, "op", "1", ConfigText("op", 1, 1, "db-01"));
  InstanceDir d(state.path(), "op", 1);
  ASSERT_OK(d.MarkClosed());
  EXPECT_EQ(Slurp(state.Sub("instances/op/1/CLOSED")), "closed\n");
  EXPECT_EQ(NamesOf(ListAll(state.path()).configs), std::vector<std::string>{"op/0"});
  // Closed, it was still hosted here: its config stays readable (a reopen uses it).
  InstanceConfig c;
  EXPECT_OK(InstanceDir::ReadSavedConfig(state.path(), "op", 1, &c));
  // A damaged instance.json behind the marker is not reported either.
  Put(state.Sub("instances/op/1/instance.json"), "{");
  EXPECT_TRUE(ListAll(state.path()).bad.empty());

  d.ClearClosed();
  EXPECT_FALSE(Exists(state.Sub("instances/op/1/CLOSED")));
  d.ClearClosed();  // absent: nothing to do
}

TEST(InstanceDirTest, HostedInstanceOpenClearsTheClosedMarker) {
  testing::TempDir state;
  ASSERT_OK(InstanceDir::PrepareStateDir(state.path()));
  asio::thread_pool pool(1);
  InstanceEnv env;
  env.worker_id = "w";
  env.state_dir = state.path();
  InstanceConfig c;
  c.operator_id = "op";
  c.instance = 2;
  c.epoch = 1;
  c.partitioner.num_key_groups = 64;
  c.partitioner.num_vnodes = 4;
  c.vnodes = {0, 1, 2, 3};
  {
    std::shared_ptr<HostedInstance> h;
    ASSERT_OK(HostedInstance::Open(env, c, pool, &h));
    // A new instance: a db-<hex> directory beside its instance.json, which names it.
    const json j = json::parse(Slurp(state.Sub("instances/op/2/instance.json")));
    const std::string db = j["db_name"];
    EXPECT_EQ(db.substr(0, 3), "db-");
    EXPECT_TRUE(Exists(state.Sub("instances/op/2/" + db + "/CURRENT")));
    std::lock_guard<InstanceMutex> l(h->mu());
    ASSERT_OK(h->CloseAndMark());
  }
  EXPECT_EQ(Slurp(state.Sub("instances/op/2/CLOSED")), "closed\n");
  EXPECT_TRUE(ListAll(state.path()).configs.empty());

  InstanceConfig saved;
  ASSERT_OK(InstanceDir::ReadSavedConfig(state.path(), "op", 2, &saved));
  std::shared_ptr<HostedInstance> h;
  ASSERT_OK(HostedInstance::Open(env, saved, pool, &h));
  EXPECT_FALSE(Exists(state.Sub("instances/op/2/CLOSED")));
  EXPECT_EQ(NamesOf(ListAll(state.path()).configs), std::vector<std::string>{"op/2"});
  std::lock_guard<InstanceMutex> l(h->mu());
  h->Close();
}

TEST(InstanceDirTest, ANewerPlacementIsReadOverInstanceJson) {
  testing::TempDir state;
  ASSERT_OK(InstanceDir::PrepareStateDir(state.path()));
  WriteConfig(state, "op", "0", ConfigText("op", 0, 5, "db-00"));  // epoch 5, chain version 2
  InstanceDir d(state.path(), "op", 0);
  ASSERT_OK(d.SavePlacement(6, {"h:1"}, 3));
  EXPECT_EQ(json::parse(Slurp(state.Sub("instances/op/0/placement.json"))),
            (json{{"epoch", 6}, {"chain", {"h:1"}}, {"chain_version", 3}}));
  EXPECT_EQ(Slurp(state.Sub("instances/op/0/placement.json")).back(), '\n');
  InstanceConfig c;
  ASSERT_OK(InstanceDir::ReadSavedConfig(state.path(), "op", 0, &c));
  EXPECT_EQ(c.epoch, 6u);
  EXPECT_EQ(c.chain, std::vector<std::string>{"h:1"});
  EXPECT_EQ(c.chain_version, 3u);
  Listed l = ListAll(state.path());
  ASSERT_EQ(l.configs.size(), 1u);
  EXPECT_EQ(l.configs[0].epoch, 6u);

  // Older than instance.json (saved again since): ignored.
  Put(state.Sub("instances/op/0/placement.json"), R"({"epoch": 4, "chain": ["old:1"], "chain_version": 9})");
  ASSERT_OK(InstanceDir::ReadSavedConfig(state.path(), "op", 0, &c));
  EXPECT_EQ(c.epoch, 5u);
  EXPECT_TRUE(c.chain.empty());
  EXPECT_EQ(c.chain_version, 2u);

  // Damaged: the instance's saved state cannot be trusted.
  Put(state.Sub("instances/op/0/placement.json"), R"({"epoch": 7)");
  Status s = InstanceDir::ReadSavedConfig(state.path(), "op", 0, &c);
  EXPECT_CODE(s, kCorruption);
  EXPECT_NE(s.message().find("malformed placement.json"), std::string::npos) << s.ToString();
  l = ListAll(state.path());
  EXPECT_TRUE(l.configs.empty());
  ASSERT_EQ(l.bad.size(), 1u);
  EXPECT_EQ(l.bad[0].first, "op/0");
}

}  // namespace
}  // namespace rhino
