// RoutingTable: vnode -> instance, versioned by an epoch (docs/design.md §1,
// rhino/routing_table.h). The ring's contract is checked as invariants:
// balance (floor/ceil of V/p), minimal movement from p to p+1 instances,
// determinism; the explicit table and handovers against hand-built tables.
#include "rhino/routing_table.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "testing/test_util.h"

namespace rhino {
namespace {

RoutingTable Ring(uint32_t v, uint32_t p, uint64_t seed = 0, uint32_t tokens = 64, uint64_t epoch = 1) {
  RingOptions o;
  o.num_vnodes = v;
  o.num_instances = p;
  o.tokens_per_instance = tokens;
  o.seed = seed;
  RoutingTable t;
  Status s = RoutingTable::FromRing(o, epoch, &t);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return t;
}

Status RingStatus(uint32_t v, uint32_t p, uint32_t tokens) {
  RingOptions o;
  o.num_vnodes = v;
  o.num_instances = p;
  o.tokens_per_instance = tokens;
  RoutingTable t;
  return RoutingTable::FromRing(o, 0, &t);
}

TEST(RoutingTableTest, FromRingRejectsEmptyOrOverfullShapes) {
  EXPECT_CODE(RingStatus(0, 1, 64), kInvalidArgument);
  EXPECT_CODE(RingStatus(16, 0, 64), kInvalidArgument);
  EXPECT_CODE(RingStatus(16, 17, 64), kInvalidArgument);  // an instance would hold nothing
  EXPECT_CODE(RingStatus(16, 2, 0), kInvalidArgument);
  EXPECT_OK(RingStatus(16, 16, 1));
  EXPECT_OK(RingStatus(1, 1, 1));
}

TEST(RoutingTableTest, FromRingGivesEveryInstanceFloorOrCeilOfVOverP) {
  for (uint32_t v : {1u, 7u, 64u, 256u, 1000u}) {
    for (uint32_t p : {1u, 2u, 3u, 5u, 17u, 64u}) {
      if (p > v) continue;
      for (uint32_t tokens : {1u, 64u}) {
        RoutingTable t = Ring(v, p, /*seed=*/v * 31 + p, tokens, /*epoch=*/9);
        ASSERT_EQ(t.num_vnodes(), v);
        ASSERT_EQ(t.num_instances(), p);
        EXPECT_EQ(t.epoch(), 9u);
        std::vector<uint32_t> load(p, 0);
        for (uint32_t vn = 0; vn < v; ++vn) {
          const int32_t i = t.InstanceOf(vn);
          ASSERT_GE(i, 0);
          ASSERT_LT(static_cast<uint32_t>(i), p);
          ++load[i];
        }
        const uint32_t lo = v / p, hi = (v + p - 1) / p;
        for (uint32_t i = 0; i < p; ++i) {
          EXPECT_TRUE(load[i] == lo || load[i] == hi)
              << "V=" << v << " p=" << p << " tokens=" << tokens << " instance " << i << " holds " << load[i];
        }
      }
    }
  }
}

TEST(RoutingTableTest, FromRingAddingAnInstanceMovesVnodesOnlyToTheNewOne) {
  for (uint32_t v : {10u, 256u, 1000u}) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{12345}}) {
      RoutingTable prev = Ring(v, 1, seed);
      for (uint32_t p = 2; p <= 20 && p <= v; ++p) {
        RoutingTable next = Ring(v, p, seed);
        uint32_t moved = 0;
        for (uint32_t vn = 0; vn < v; ++vn) {
          if (next.InstanceOf(vn) == prev.InstanceOf(vn)) continue;
          ++moved;
          ASSERT_EQ(next.InstanceOf(vn), static_cast<int32_t>(p - 1))
              << "V=" << v << " p=" << p << ": vnode " << vn << " moved between two old instances";
        }
        EXPECT_LE(moved, (v + p - 1) / p) << "V=" << v << " p=" << p;
        EXPECT_EQ(moved, next.VnodesOf(static_cast<int32_t>(p - 1)).size());
        prev = next;
      }
    }
  }
}

TEST(RoutingTableTest, FromRingIsDeterministicPerSeed) {
  const RoutingTable a = Ring(256, 5, 77), b = Ring(256, 5, 77);
  EXPECT_EQ(a.assignment(), b.assignment());
  // Another seed places vnodes elsewhere: with 256 vnodes over 5 instances,
  // two independent placements agreeing everywhere would be a broken seed.
  const RoutingTable c = Ring(256, 5, 78);
  EXPECT_NE(a.assignment(), c.assignment());
  // One instance holds everything, whatever the seed.
  EXPECT_EQ(Ring(256, 1, 3).VnodesOf(0).size(), 256u);
}

TEST(RoutingTableTest, FromAssignmentRejectsEmptyOrOutOfRangeOwners) {
  RoutingTable t;
  EXPECT_CODE(RoutingTable::FromAssignment({}, 1, 0, &t), kInvalidArgument);
  EXPECT_CODE(RoutingTable::FromAssignment({0, 1, 2}, 2, 0, &t), kInvalidArgument);
  EXPECT_CODE(RoutingTable::FromAssignment({0, -1}, 2, 0, &t), kInvalidArgument);
  EXPECT_CODE(RoutingTable::FromAssignment({0}, 0, 0, &t), kInvalidArgument);
  ASSERT_OK(RoutingTable::FromAssignment({1, 0, 1, 1}, 2, 4, &t));
  EXPECT_EQ(t.epoch(), 4u);
  EXPECT_EQ(t.num_vnodes(), 4u);
  EXPECT_EQ(t.num_instances(), 2u);
  EXPECT_EQ(t.VnodesOf(1), (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(t.VnodesOf(0), (std::vector<int32_t>{1}));
  EXPECT_TRUE(t.VnodesOf(5).empty());
}

TEST(RoutingTableTest, InstancesOfMapsVnodesAndRejectsUnknownOnesWithoutWriting) {
  RoutingTable t;
  ASSERT_OK(RoutingTable::FromAssignment({2, 0, 1, 2}, 3, 0, &t));
  const std::vector<int32_t> vnodes = {3, 0, 1, 1, 2};
  std::vector<int32_t> out(vnodes.size(), -7);
  ASSERT_OK(t.InstancesOf(vnodes.data(), vnodes.size(), out.data()));
  EXPECT_EQ(out, (std::vector<int32_t>{2, 2, 0, 0, 1}));

  for (int32_t bad : {4, -1, 1 << 30}) {
    const std::vector<int32_t> with_bad = {0, 1, bad};
    std::vector<int32_t> untouched(3, -7);
    EXPECT_CODE(t.InstancesOf(with_bad.data(), with_bad.size(), untouched.data()), kUnknownVnode);
    EXPECT_EQ(untouched, (std::vector<int32_t>(3, -7))) << "wrote before failing on " << bad;
  }
}

TEST(RoutingTableTest, ReassignMovesOnlyTheListedVnodesAndBumpsTheEpoch) {
  RoutingTable t;
  ASSERT_OK(RoutingTable::FromAssignment({0, 0, 1, 1, 2, 2}, 3, 7, &t));
  RoutingTable moved;
  ASSERT_OK(t.Reassign({1, 4}, 1, &moved));
  EXPECT_EQ(moved.assignment(), (std::vector<int32_t>{0, 1, 1, 1, 1, 2}));
  EXPECT_EQ(moved.epoch(), 8u);
  EXPECT_EQ(moved.num_instances(), 3u);
  // The original table is immutable.
  EXPECT_EQ(t.assignment(), (std::vector<int32_t>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(t.epoch(), 7u);
}

TEST(RoutingTableTest, ReassignToTheNextNewInstanceAddsIt) {
  RoutingTable t;
  ASSERT_OK(RoutingTable::FromAssignment({0, 1, 0, 1}, 2, 0, &t));
  RoutingTable grown;
  ASSERT_OK(t.Reassign({3}, 2, &grown));
  EXPECT_EQ(grown.num_instances(), 3u);
  EXPECT_EQ(grown.assignment(), (std::vector<int32_t>{0, 1, 0, 2}));
  EXPECT_EQ(grown.epoch(), 1u);
}

TEST(RoutingTableTest, ReassignRejectsABadTargetOrAnUnknownVnode) {
  RoutingTable t;
  ASSERT_OK(RoutingTable::FromAssignment({0, 1, 0, 1}, 2, 5, &t));
  RoutingTable out;
  ASSERT_OK(RoutingTable::FromAssignment({0}, 1, 99, &out));
  EXPECT_CODE(t.Reassign({0}, 3, &out), kInvalidArgument);   // skips instance 2
  EXPECT_CODE(t.Reassign({0}, -1, &out), kInvalidArgument);
  EXPECT_CODE(t.Reassign({0, 4}, 1, &out), kUnknownVnode);
  EXPECT_CODE(t.Reassign({-1}, 1, &out), kUnknownVnode);
  EXPECT_EQ(out.epoch(), 99u) << "a failed Reassign replaced its output";
}

}  // namespace
}  // namespace rhino
