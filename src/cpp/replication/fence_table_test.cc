// FenceTable: the highest chain version seen per instance (docs/protocol.md §5).
// The on-disk layout, fences/<operator>/<instance> holding the decimal version,
// is the oracle: files are read back and written by hand here.
#include "replication/fence_table.h"

#include <sys/stat.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace rhino {
namespace {

using testing::Exists;
using testing::List;
using testing::Slurp;
using testing::WriteBytes;

TEST(FenceTableTest, NothingSeenIsZeroAndEveryVersionPasses) {
  testing::TempDir dir;
  FenceTable t(dir.path());
  EXPECT_EQ(t.Highest("op", 0), 0u);
  EXPECT_OK(t.Check("op", 0, 0));
  EXPECT_OK(t.Check("op", 0, 1));
  bool raised = true;
  EXPECT_OK(t.Observe("op", 0, 0, &raised));
  EXPECT_FALSE(raised);                      // 0 is "none seen": nothing new to fence off
  EXPECT_FALSE(Exists(dir.Sub("fences")));  // and nothing is written
}

TEST(FenceTableTest, ObserveOfAHigherVersionRaisesAndPersistsIt) {
  testing::TempDir dir;
  FenceTable t(dir.path());
  bool raised = false;
  ASSERT_OK(t.Observe("op", 3, 7, &raised));
  EXPECT_TRUE(raised);
  EXPECT_EQ(t.Highest("op", 3), 7u);
  // protocol §5: fences/<operator_id>/<instance>, the version in decimal.
  EXPECT_EQ(Slurp(dir.Sub("fences/op/3")), "7\n");
  // Written atomically: no temporary is left beside it.
  EXPECT_EQ(List(dir.Sub("fences/op")), std::vector<std::string>{"3"});
}

TEST(FenceTableTest, ObserveOfALowerVersionIsStaleAndChangesNothing) {
  testing::TempDir dir;
  FenceTable t(dir.path());
  bool raised = false;
  ASSERT_OK(t.Observe("op", 1, 9, &raised));
  raised = true;
  EXPECT_CODE(t.Observe("op", 1, 8, &raised), kStaleChainVersion);
  EXPECT_FALSE(raised);
  EXPECT_EQ(t.Highest("op", 1), 9u);
  EXPECT_EQ(Slurp(dir.Sub("fences/op/1")), "9\n");
}

TEST(FenceTableTest, RaisedOnlyForEachStrictIncrease) {
  testing::TempDir dir;
  FenceTable t(dir.path());
  const struct {
    uint64_t version;
    bool ok;
    bool raised;
  } steps[] = {{2, true, true}, {5, true, true}, {5, true, false}, {3, false, false}, {6, true, true}, {1, false, false}};
  for (const auto& s : steps) {
    bool raised = !s.raised;
    Status st = t.Observe("op", 0, s.version, &raised);
    EXPECT_EQ(st.ok(), s.ok) << "version " << s.version << ": " << st.ToString();
    EXPECT_EQ(raised, s.raised) << "version " << s.version;
  }
  EXPECT_EQ(t.Highest("op", 0), 6u);
}

TEST(FenceTableTest, CheckRefusesOnlyVersionsBelowTheHighest) {
  testing::TempDir dir;
  FenceTable t(dir.path());
  bool raised = false;
  ASSERT_OK(t.Observe("op", 0, 10, &raised));
  EXPECT_CODE(t.Check("op", 0, 9), kStaleChainVersion);
  EXPECT_CODE(t.Check("op", 0, 0), kStaleChainVersion);
  EXPECT_OK(t.Check("op", 0, 10));
  EXPECT_OK(t.Check("op", 0, 11));
  // Check records nothing: a higher version checked is not a higher version seen.
  EXPECT_EQ(t.Highest("op", 0), 10u);
  EXPECT_EQ(Slurp(dir.Sub("fences/op/0")), "10\n");
}

TEST(FenceTableTest, ANewTableOnTheSameStoreStaysFenced) {
  testing::TempDir dir;
  const uint64_t top = std::numeric_limits<uint64_t>::max();
  {
    FenceTable t(dir.path());
    bool raised = false;
    ASSERT_OK(t.Observe("op", 2, 12, &raised));
    ASSERT_OK(t.Observe("op", 3, top, &raised));
  }
  EXPECT_EQ(Slurp(dir.Sub("fences/op/3")), "18446744073709551615\n");
  // A fence file written by hand, in the documented format, counts too.
  WriteBytes(dir.Sub("fences/op/5"), "42\n");
  FenceTable restarted(dir.path());
  EXPECT_EQ(restarted.Highest("op", 3), top);
  EXPECT_CODE(restarted.Check("op", 3, top - 1), kStaleChainVersion);
  EXPECT_EQ(restarted.Highest("op", 5), 42u);
  EXPECT_CODE(restarted.Check("op", 5, 41), kStaleChainVersion);
  EXPECT_EQ(restarted.Highest("op", 2), 12u);
  EXPECT_CODE(restarted.Check("op", 2, 11), kStaleChainVersion);
  bool raised = true;
  EXPECT_CODE(restarted.Observe("op", 2, 11, &raised), kStaleChainVersion);
  EXPECT_FALSE(raised);
  EXPECT_OK(restarted.Observe("op", 2, 12, &raised));
  EXPECT_FALSE(raised);
}

TEST(FenceTableTest, InstancesAndOperatorsAreFencedIndependently) {
  testing::TempDir dir;
  FenceTable t(dir.path());
  bool raised = false;
  ASSERT_OK(t.Observe("a", 0, 50, &raised));
  EXPECT_EQ(t.Highest("a", 1), 0u);
  EXPECT_EQ(t.Highest("b", 0), 0u);
  EXPECT_OK(t.Check("a", 1, 1));
  EXPECT_OK(t.Check("b", 0, 1));
  ASSERT_OK(t.Observe("a", 1, 2, &raised));
  EXPECT_TRUE(raised);  // instance 1 has its own history
  ASSERT_OK(t.Observe("b", 0, 3, &raised));
  EXPECT_TRUE(raised);
  EXPECT_EQ(t.Highest("a", 0), 50u);
  EXPECT_EQ(Slurp(dir.Sub("fences/a/0")), "50\n");
  EXPECT_EQ(Slurp(dir.Sub("fences/a/1")), "2\n");
  EXPECT_EQ(Slurp(dir.Sub("fences/b/0")), "3\n");
}

TEST(FenceTableTest, MessagesNameTheNounTheInstanceAndBothVersions) {
  testing::TempDir dir;
  FenceTable chains(dir.Sub("chains"));
  bool raised = false;
  ASSERT_OK(chains.Observe("op", 7, 5, &raised));
  Status s = chains.Observe("op", 7, 3, &raised);
  EXPECT_CODE(s, kStaleChainVersion);
  EXPECT_NE(s.message().find("chain version 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("chain version 5"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("op/7"), std::string::npos) << s.message();

  FenceTable epochs(dir.Sub("epochs"), "epoch");
  ASSERT_OK(epochs.Observe("op", 7, 5, &raised));
  s = epochs.Check("op", 7, 3);
  EXPECT_CODE(s, kStaleChainVersion);
  EXPECT_NE(s.message().find("epoch 3"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("epoch 5"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("chain version"), std::string::npos) << s.message();
}

TEST(FenceTableTest, AnOperatorIdThatEscapesTheStoreIsRefused) {
  testing::TempDir dir;
  // A file where "../x" would lead: fences/../x/0 = <store>/x/0.
  ASSERT_EQ(::mkdir(dir.Sub("x").c_str(), 0755), 0);
  WriteBytes(dir.Sub("x/0"), "99\n");
  FenceTable t(dir.path());
  bool raised = true;
  EXPECT_CODE(t.Observe("../x", 0, 100, &raised), kPathOutsideStore);
  EXPECT_FALSE(raised);
  EXPECT_EQ(Slurp(dir.Sub("x/0")), "99\n");  // not overwritten
  EXPECT_EQ(t.Highest("../x", 0), 0u);       // and never read
  EXPECT_CODE(t.Observe("", 0, 1, &raised), kPathOutsideStore);
  EXPECT_FALSE(Exists(dir.Sub("fences")));
}

// Issue 46: an unreadable or garbled fence must not read as "never fenced".
TEST(FenceTableTest, AGarbledFenceFileRefusesTheInstanceUntilItIsFencedAgain) {
  for (const std::string& bytes : {std::string(""), std::string("\n"), std::string("garbage\n"),
                                   std::string("-1\n"), std::string(" 7\n"), std::string("7x\n"),
                                   std::string("18446744073709551616\n"), std::string("42\n\n")}) {
    SCOPED_TRACE("fence file holds '" + bytes + "'");
    testing::TempDir dir;
    ASSERT_EQ(::mkdir(dir.Sub("fences").c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(dir.Sub("fences/op").c_str(), 0755), 0);
    WriteBytes(dir.Sub("fences/op/4"), bytes);
    FenceTable t(dir.path(), "epoch");
    Status s = t.Check("op", 4, 1);
    EXPECT_CODE(s, kCorruption);
    EXPECT_NE(s.message().find("epoch fence of op/4 cannot be read"), std::string::npos) << s.message();
    EXPECT_CODE(t.Check("op", 4, std::numeric_limits<uint64_t>::max()), kCorruption);  // every epoch
    EXPECT_CODE(t.Check("op", 4, 0), kCorruption);
    EXPECT_EQ(t.Highest("op", 4), 0u);
    EXPECT_CODE(t.Check("op", 4, 1), kCorruption);  // still, after Highest
    EXPECT_OK(t.Check("op", 5, 1));                 // other instances are not affected
    bool raised = true;
    EXPECT_CODE(t.Observe("op", 4, 0, &raised), kCorruption);  // 0 is no fence
    EXPECT_FALSE(raised);
    EXPECT_EQ(Slurp(dir.Sub("fences/op/4")), bytes);  // left as found
    // The re-fence: any real epoch, even one below what the file may have held.
    ASSERT_OK(t.Observe("op", 4, 3, &raised));
    EXPECT_TRUE(raised);
    EXPECT_EQ(Slurp(dir.Sub("fences/op/4")), "3\n");
    EXPECT_OK(t.Check("op", 4, 3));
    EXPECT_CODE(t.Check("op", 4, 2), kStaleChainVersion);
    EXPECT_EQ(t.Highest("op", 4), 3u);
    FenceTable restarted(dir.path(), "epoch");
    EXPECT_EQ(restarted.Highest("op", 4), 3u);
  }
}

TEST(FenceTableTest, AFenceFileThatCannotBeReadRefusesTheInstance) {
  testing::TempDir dir;
  // A directory where the file should be: open() works, read() fails (EISDIR),
  // even as root, unlike a chmod 000 file.
  ASSERT_EQ(::mkdir(dir.Sub("fences").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(dir.Sub("fences/op").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(dir.Sub("fences/op/2").c_str(), 0755), 0);
  FenceTable t(dir.path());
  EXPECT_CODE(t.Check("op", 2, 9), kCorruption);
  bool raised = false;
  // The re-fence cannot replace a directory: it fails, and the instance stays refused.
  EXPECT_FALSE(t.Observe("op", 2, 9, &raised).ok());
  EXPECT_FALSE(raised);
  EXPECT_CODE(t.Check("op", 2, 9), kCorruption);
}

TEST(FenceTableTest, AWellFormedFileWithoutItsNewlineStillCounts) {
  testing::TempDir dir;
  ASSERT_EQ(::mkdir(dir.Sub("fences").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(dir.Sub("fences/op").c_str(), 0755), 0);
  WriteBytes(dir.Sub("fences/op/1"), "17");
  FenceTable t(dir.path());
  EXPECT_EQ(t.Highest("op", 1), 17u);
  EXPECT_CODE(t.Check("op", 1, 16), kStaleChainVersion);
  EXPECT_OK(t.Check("op", 1, 17));
}

}  // namespace
}  // namespace rhino
