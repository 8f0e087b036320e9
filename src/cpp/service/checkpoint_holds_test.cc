// CheckpointHolds (service/checkpoint_holds.h): what a worker keeps for the
// bases other workers read, across a restart.
#include "service/checkpoint_holds.h"

#include <string>

#include "testing/test_util.h"
#include "util/fs.h"

namespace rhino {
namespace {

TEST(CheckpointHoldsTest, TheOldestHeldCheckpointOfAnInstanceSurvivesARestart) {
  testing::TempDir dir;
  const std::string holds = dir.Sub("holds");
  {
    CheckpointHolds h(holds);
    ASSERT_OK(h.Load());
    EXPECT_EQ(h.Oldest("op", 0), std::nullopt);
    ASSERT_OK(h.Hold("op", 0, 7));
    ASSERT_OK(h.Hold("op", 0, 5));
    ASSERT_OK(h.Hold("op", 1, 9));
    ASSERT_OK(h.Hold("op.b", 0, 2));  // another operator whose id shares a prefix
    EXPECT_EQ(h.Oldest("op", 0), std::optional<uint64_t>(5));
    EXPECT_EQ(h.Oldest("op", 1), std::optional<uint64_t>(9));
    EXPECT_EQ(h.Oldest("op", 2), std::nullopt);
  }
  ASSERT_OK(fs::WriteFileAtomic(fs::Join(holds, "garbage"), "x"));  // not a hold: removed at load
  ASSERT_OK(fs::WriteFileAtomic(fs::Join(holds, "op~3~4"), "10"));  // expired long ago: dropped when looked at
  CheckpointHolds again(holds);
  ASSERT_OK(again.Load());
  EXPECT_EQ(again.Oldest("op", 0), std::optional<uint64_t>(5));
  EXPECT_EQ(again.Oldest("op.b", 0), std::optional<uint64_t>(2));
  EXPECT_EQ(again.Oldest("op", 3), std::nullopt);
  EXPECT_FALSE(fs::Exists(fs::Join(holds, "op~3~4")));
  EXPECT_FALSE(fs::Exists(fs::Join(holds, "garbage")));
}

}  // namespace
}  // namespace rhino
