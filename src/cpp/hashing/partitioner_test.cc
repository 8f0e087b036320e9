// Partitioner: key -> key group -> vnode (docs/design.md §1, docs/protocol.md
// §7.8). Expected values come from XXH3 called here directly and from the
// documented formulas (kg = top log2(K) bits, vnode = floor(kg * V / K)).
#include "rhino/partitioner.h"

#include <xxhash.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace rhino {
namespace {

// ---- the oracle: the documented contract, written out independently ----

unsigned Log2(uint32_t k) {
  unsigned b = 0;
  while ((uint64_t{1} << b) < k) ++b;
  return b;
}

uint32_t ModelKeyGroup(const void* data, size_t n, uint64_t seed, uint32_t k) {
  const uint64_t h = XXH3_64bits_withSeed(data, n, seed);
  const unsigned bits = Log2(k);
  return bits == 0 ? 0u : static_cast<uint32_t>(h >> (64 - bits));
}
uint32_t ModelKeyGroup(const std::string& s, uint64_t seed, uint32_t k) {
  return ModelKeyGroup(s.data(), s.size(), seed, k);
}
uint32_t ModelVnode(uint32_t kg, uint32_t v, uint32_t k) {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(kg) * v) / k);
}
// The 8 little-endian bytes of an int64, built byte by byte.
std::string LittleEndian(int64_t key) { return testing::U64(static_cast<uint64_t>(key)); }
using testing::RoutedKey;

Partitioner Make(uint32_t k, uint32_t v, uint64_t seed = 0) {
  PartitionerOptions o;
  o.num_key_groups = k;
  o.num_vnodes = v;
  o.seed = seed;
  Partitioner p;
  Status s = Partitioner::Create(o, &p);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return p;
}

Status CreateWith(uint32_t k, uint32_t v) {
  PartitionerOptions o;
  o.num_key_groups = k;
  o.num_vnodes = v;
  Partitioner p;
  return Partitioner::Create(o, &p);
}

// ---- options ----

TEST(PartitionerTest, RejectsKeyGroupsNotAPowerOfTwoInOneToTwoToThe30) {
  for (uint32_t k : {0u, 3u, 6u, 1000u, (1u << 15) + 1, 0xFFFFFFFFu, 1u << 31}) {
    SCOPED_TRACE("K=" + std::to_string(k));
    EXPECT_CODE(CreateWith(k, 1), kInvalidArgument);
  }
  EXPECT_OK(CreateWith(1u << 30, 1));
  EXPECT_OK(CreateWith(1, 1));
}

TEST(PartitionerTest, RejectsVnodesOutsideOneToK) {
  EXPECT_CODE(CreateWith(16, 0), kInvalidArgument);
  EXPECT_CODE(CreateWith(16, 17), kInvalidArgument);
  EXPECT_OK(CreateWith(16, 16));
  EXPECT_OK(CreateWith(16, 1));
  EXPECT_OK(CreateWith(1, 1));
}

// ---- key groups ----

TEST(PartitionerTest, EmptyKeyMatchesTheXxh3ReferenceVector) {
  // XXH3_64bits("") with seed 0 is 0x2D06800538D394C2 (xxHash's sanity test);
  // its top 15 bits are 0x2D06 >> 1 = 0x1683.
  Partitioner p = Make(1u << 15, 256);
  EXPECT_EQ(p.HashBytes(""), 0x2D06800538D394C2ull);
  EXPECT_EQ(p.KeyGroupOfBytes(""), 0x1683u);
  EXPECT_EQ(p.VnodeOfBytes(""), 0x1683u * 256 / 32768);
}

TEST(PartitionerTest, KeyGroupIsTopBitsOfSeededXxh3) {
  std::mt19937_64 rng(7);
  for (uint32_t k : {2u, 16u, 1u << 15, 1u << 30}) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0xDEADBEEFCAFEF00Dull}}) {
      Partitioner p = Make(k, 1, seed);
      for (int i = 0; i < 300; ++i) {
        std::string key(rng() % 40, '\0');
        for (auto& c : key) c = static_cast<char>(rng());
        if (!key.empty() && static_cast<unsigned char>(key.back()) == 0xF5) key.back() = 'x';  // stay plain
        EXPECT_EQ(p.HashBytes(key), XXH3_64bits_withSeed(key.data(), key.size(), seed));
        EXPECT_EQ(p.KeyGroupOfBytes(key), ModelKeyGroup(key, seed, k)) << "K=" << k << " seed=" << seed;
      }
    }
  }
}

TEST(PartitionerTest, SingleKeyGroupMapsEveryKeyToZero) {
  Partitioner p = Make(1, 1);
  for (int64_t key : {int64_t{0}, int64_t{-1}, int64_t{42}, INT64_MIN, INT64_MAX}) {
    EXPECT_EQ(p.KeyGroupOfInt64(key), 0u);
    EXPECT_EQ(p.VnodeOfInt64(key), 0u);
  }
  EXPECT_EQ(p.KeyGroupOfBytes("anything"), 0u);
  EXPECT_EQ(p.KeyGroupOfHash(~uint64_t{0}), 0u);
}

TEST(PartitionerTest, Int64KeyIsHashedAsItsLittleEndianBytes) {
  Partitioner p = Make(1u << 15, 256, 99);
  std::mt19937_64 rng(1);
  std::vector<int64_t> keys = {0, 1, -1, 255, 256, INT64_MIN, INT64_MAX};
  for (int i = 0; i < 500; ++i) keys.push_back(static_cast<int64_t>(rng()) & 0x00FFFFFFFFFFFFFFll);
  for (int64_t key : keys) {
    const std::string le = LittleEndian(key);
    EXPECT_EQ(p.HashInt64(key), XXH3_64bits_withSeed(le.data(), 8, 99)) << key;
    EXPECT_EQ(p.KeyGroupOfInt64(key), ModelKeyGroup(le, 99, 1u << 15)) << key;
    EXPECT_EQ(p.KeyGroupOfInt64(key), p.KeyGroupOfBytes(le)) << key;
    char buf[8];
    EncodeInt64Key(key, buf);
    EXPECT_EQ(std::string(buf, 8), le);
  }
}

// ---- vnodes ----

TEST(PartitionerTest, VnodeRangesAreContiguousAndCoverEveryKeyGroupOnce) {
  for (auto [k, v] : std::vector<std::pair<uint32_t, uint32_t>>{
           {1, 1}, {2, 1}, {16, 3}, {16, 5}, {16, 16}, {64, 63}, {1024, 7}, {1u << 15, 256}, {1u << 15, 1000}}) {
    Partitioner p = Make(k, v);
    std::vector<int> owner_count(k, 0);
    uint32_t expected_first = 0;
    for (uint32_t vn = 0; vn < v; ++vn) {
      uint32_t first = 0, last = 0;
      p.KeyGroupRange(vn, &first, &last);
      ASSERT_EQ(first, expected_first) << "K=" << k << " V=" << v << " vnode " << vn;
      ASSERT_LT(first, last) << "an empty vnode: K=" << k << " V=" << v << " vnode " << vn;
      for (uint32_t kg = first; kg < last; ++kg) {
        ++owner_count[kg];
        ASSERT_EQ(ModelVnode(kg, v, k), vn) << "K=" << k << " V=" << v << " kg=" << kg;
      }
      expected_first = last;
    }
    EXPECT_EQ(expected_first, k) << "K=" << k << " V=" << v;
    for (uint32_t kg = 0; kg < k; ++kg) ASSERT_EQ(owner_count[kg], 1) << kg;
  }
}

TEST(PartitionerTest, VnodeRangeBoundariesHoldAtTwoToThe30) {
  const uint32_t k = 1u << 30;
  for (uint32_t v : {1u, 3u, 1000u, k}) {
    Partitioner p = Make(k, v);
    for (uint32_t vn : {0u, 1u % v, v / 2, v - 1}) {
      uint32_t first = 0, last = 0;
      p.KeyGroupRange(vn, &first, &last);
      ASSERT_LT(first, last);
      EXPECT_EQ(ModelVnode(first, v, k), vn);
      EXPECT_EQ(ModelVnode(last - 1, v, k), vn);
      if (first > 0) { EXPECT_EQ(ModelVnode(first - 1, v, k), vn - 1); }
      if (last < k) { EXPECT_EQ(ModelVnode(last, v, k), vn + 1); }
      if (vn == v - 1) { EXPECT_EQ(last, k); }
      if (vn == 0) { EXPECT_EQ(first, 0u); }
    }
  }
}

// ---- routed keys ----

TEST(PartitionerTest, RoutedKeyIsHashedByItsRoutingPart) {
  Partitioner p = Make(1u << 15, 256, 3);
  for (const std::string& routing : {std::string("user-42"), std::string(""), std::string("\0\xF5", 2)}) {
    for (const std::string& head : {std::string(""), std::string("L")}) {
      for (uint8_t flags : {uint8_t{0}, uint8_t{1}}) {
        const std::string key = RoutedKey(head, routing, "tail-bytes", flags);
        EXPECT_EQ(p.KeyGroupOfBytes(key), ModelKeyGroup(routing, 3, 1u << 15));
        EXPECT_EQ(p.VnodeOfBytes(key), ModelVnode(ModelKeyGroup(routing, 3, 1u << 15), 256, 1u << 15));
      }
    }
  }
}

TEST(PartitionerTest, KeyEndingInMarkerWithLengthsThatDoNotFitIsPlain) {
  Partitioner p = Make(1u << 15, 256);
  // len(head) = 1, len(routing) = 2: 1 + 2 + 6 = 9 > 8 bytes.
  const std::string key("\x01\x02\x00\x01\x00\x02\x00\xF5", 8);
  EXPECT_EQ(p.KeyGroupOfBytes(key), ModelKeyGroup(key, 0, 1u << 15));
  // Fewer than 6 bytes can never be routed.
  const std::string tiny("\x00\x00\xF5", 3);
  EXPECT_EQ(p.KeyGroupOfBytes(tiny), ModelKeyGroup(tiny, 0, 1u << 15));
  RoutedKeyParts parts;
  EXPECT_FALSE(SplitRoutedKey(key, &parts));
  EXPECT_FALSE(SplitRoutedKey(tiny, &parts));
}

TEST(PartitionerTest, Int64KeyWhoseBytesParseAsRoutedUsesTheRoutingPart) {
  Partitioner p = Make(1u << 15, 256);
  // Bytes "ab" | 00 00 | 00 02 | 00 | F5: head "", routing "ab", 0 + 2 + 6 = 8.
  const std::string bytes("ab\x00\x00\x00\x02\x00\xF5", 8);
  int64_t key = 0;
  uint64_t u = 0;
  for (int i = 7; i >= 0; --i) u = (u << 8) | static_cast<unsigned char>(bytes[i]);
  std::memcpy(&key, &u, 8);
  EXPECT_EQ(p.KeyGroupOfInt64(key), ModelKeyGroup("ab", 0, 1u << 15));
  EXPECT_EQ(p.KeyGroupOfInt64(key), p.KeyGroupOfBytes(bytes));
  // Top byte 0xF5 but lengths 0xFFFF: plain, the whole 8 bytes are hashed.
  const int64_t plain = static_cast<int64_t>(0xF500FFFFFFFF0000ull);
  EXPECT_EQ(p.KeyGroupOfInt64(plain), ModelKeyGroup(LittleEndian(plain), 0, 1u << 15));
}

TEST(PartitionerTest, MakeRoutedKeyLaysOutHeadRoutingTailAndTrailer) {
  std::string out = "garbage";
  ASSERT_OK(MakeRoutedKey("H", "RR", "TTT", kRoutedFlagTtl, &out));
  EXPECT_EQ(out, std::string("HRRTTT\x00\x01\x00\x02\x01\xF5", 12));
  RoutedKeyParts parts;
  ASSERT_TRUE(SplitRoutedKey(out, &parts));
  EXPECT_EQ(parts.head, "H");
  EXPECT_EQ(parts.routing, "RR");
  EXPECT_EQ(parts.tail, "TTT");
  EXPECT_EQ(parts.flags, kRoutedFlagTtl);
}

TEST(PartitionerTest, MakeRoutedKeyRejectsPartsLongerThan65535) {
  std::string out;
  const std::string max(65535, 'a'), over(65536, 'a');
  EXPECT_CODE(MakeRoutedKey(over, "r", "", 0, &out), kInvalidArgument);
  EXPECT_CODE(MakeRoutedKey("h", over, "", 0, &out), kInvalidArgument);
  ASSERT_OK(MakeRoutedKey(max, max, over, 0, &out));  // the tail has no limit
  ASSERT_EQ(out.size(), 65535u * 2 + 65536 + 6);
  EXPECT_EQ(out.substr(out.size() - 6), std::string("\xFF\xFF\xFF\xFF\x00\xF5", 6));
  EXPECT_EQ(RoutingPart(out), max);
}

// ---- vectorized forms ----

TEST(PartitionerTest, VectorizedFormsMatchTheModelKeyByKey) {
  const uint32_t k = 1u << 12, v = 37;
  Partitioner p = Make(k, v, 11);
  std::vector<int64_t> ikeys;
  for (int64_t i = -100; i < 100; ++i) ikeys.push_back(i * 7919);
  std::vector<std::string> skeys;
  for (int i = 0; i < 200; ++i) skeys.push_back("key-" + std::to_string(i));
  skeys.push_back(RoutedKey("h", "key-3", "t", 0));
  std::vector<std::string_view> views(skeys.begin(), skeys.end());

  std::vector<int32_t> kgs(ikeys.size(), -1), vns(ikeys.size(), -1);
  p.KeyGroupsInt64(ikeys.data(), ikeys.size(), kgs.data());
  p.VnodesInt64(ikeys.data(), ikeys.size(), vns.data());
  for (size_t i = 0; i < ikeys.size(); ++i) {
    const uint32_t kg = ModelKeyGroup(LittleEndian(ikeys[i]), 11, k);
    EXPECT_EQ(kgs[i], static_cast<int32_t>(kg));
    EXPECT_EQ(vns[i], static_cast<int32_t>(ModelVnode(kg, v, k)));
  }
  std::vector<int32_t> bkgs(views.size(), -1), bvns(views.size(), -1);
  p.KeyGroupsBytes(views.data(), views.size(), bkgs.data());
  p.VnodesBytes(views.data(), views.size(), bvns.data());
  for (size_t i = 0; i < views.size(); ++i) {
    const std::string routing = i + 1 == views.size() ? "key-3" : skeys[i];
    const uint32_t kg = ModelKeyGroup(routing, 11, k);
    EXPECT_EQ(bkgs[i], static_cast<int32_t>(kg)) << i;
    EXPECT_EQ(bvns[i], static_cast<int32_t>(ModelVnode(kg, v, k))) << i;
  }
  EXPECT_EQ(bkgs.back(), bkgs[3]);  // a routed key lives with its plain routing part
}

}  // namespace
}  // namespace rhino
