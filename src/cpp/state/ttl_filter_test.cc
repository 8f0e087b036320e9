// TtlCompactionFilter (state/ttl_filter.h, docs/protocol.md §7.8): drops a
// routed key flagged TTL whose value's first 8 bytes, a big-endian signed
// expiry, are <= the TTL clock; keeps everything else, and everything
// without a clock. Keys and values are built byte by byte here.
#include "state/ttl_filter.h"

#include <cstdint>
#include <limits>
#include <string>

#include "testing/test_util.h"

namespace rhino {
namespace {

constexpr uint8_t kTtlFlag = 0x01;  // flags bit 0, docs/protocol.md §7.8
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// head | routing | tail | u16be len(head) | u16be len(routing) | flags | 0xF5
std::string RoutedKey(uint8_t flags, const std::string& head = "h", const std::string& routing = "user-1",
                      const std::string& tail = "t") {
  return testing::RoutedKey(head, routing, tail, flags);
}
// An 8-byte big-endian expiry followed by the payload.
std::string Value(int64_t expiry, const std::string& payload = "payload") {
  std::string v;
  const uint64_t u = static_cast<uint64_t>(expiry);
  for (int shift = 56; shift >= 0; shift -= 8) v.push_back(static_cast<char>(u >> shift));
  return v + payload;
}

bool Drops(const TtlCompactionFilter& f, const std::string& key, const std::string& value) {
  std::string new_value = "unchanged";
  bool changed = false;
  const bool drop = f.Filter(/*level=*/1, rocksdb::Slice(key), rocksdb::Slice(value), &new_value, &changed);
  EXPECT_FALSE(changed) << "the filter never rewrites a value";
  EXPECT_EQ(new_value, "unchanged");
  return drop;
}

TEST(TtlFilterTest, WithoutAClockNothingIsDropped) {
  TtlCompactionFilter f;
  EXPECT_EQ(f.clock(), std::nullopt);
  EXPECT_FALSE(Drops(f, RoutedKey(kTtlFlag), Value(kMin)));
  EXPECT_FALSE(Drops(f, RoutedKey(kTtlFlag), Value(0)));
  // Setting, then clearing, the clock.
  f.set_clock(100);
  EXPECT_EQ(f.clock(), std::optional<int64_t>(100));
  EXPECT_TRUE(Drops(f, RoutedKey(kTtlFlag), Value(0)));
  f.set_clock(std::nullopt);
  EXPECT_EQ(f.clock(), std::nullopt);
  EXPECT_FALSE(Drops(f, RoutedKey(kTtlFlag), Value(0)));
  EXPECT_STREQ(f.Name(), "rhino.TtlCompactionFilter");
}

TEST(TtlFilterTest, DropsAnEntryWhoseExpiryIsAtOrBeforeTheClock) {
  TtlCompactionFilter f;
  f.set_clock(1700000000000);
  const std::string key = RoutedKey(kTtlFlag);
  EXPECT_TRUE(Drops(f, key, Value(1700000000000)));      // == clock: expired
  EXPECT_TRUE(Drops(f, key, Value(1699999999999)));
  EXPECT_TRUE(Drops(f, key, Value(kMin)));
  EXPECT_FALSE(Drops(f, key, Value(1700000000001)));     // one ms later: alive
  EXPECT_FALSE(Drops(f, key, Value(kMax)));
  EXPECT_TRUE(Drops(f, key, Value(5, "")));              // exactly 8 bytes
  // Extremes of the clock itself.
  f.set_clock(kMax);
  EXPECT_TRUE(Drops(f, key, Value(kMax)));
  f.set_clock(kMin + 1);
  EXPECT_TRUE(Drops(f, key, Value(kMin)));
  EXPECT_FALSE(Drops(f, key, Value(kMin + 2)));
}

TEST(TtlFilterTest, ExpiryIsReadAsBigEndianSigned) {
  TtlCompactionFilter f;
  f.set_clock(0);
  const std::string key = RoutedKey(kTtlFlag);
  // 00..01 is 1 big-endian (alive at clock 0); little-endian it would be 2^56.
  EXPECT_FALSE(Drops(f, key, std::string("\x00\x00\x00\x00\x00\x00\x00\x01", 8)));
  // 01 00..00 is 2^56 big-endian (alive); little-endian it would be 1.
  f.set_clock(1);
  EXPECT_FALSE(Drops(f, key, std::string("\x01\x00\x00\x00\x00\x00\x00\x00", 8)));
  EXPECT_TRUE(Drops(f, key, std::string("\x00\x00\x00\x00\x00\x00\x00\x01", 8)));
  // FF..FF is -1 signed (expired at clock 0); unsigned it would be 2^64 - 1.
  f.set_clock(0);
  EXPECT_TRUE(Drops(f, key, std::string(8, '\xFF') + "tail"));
  // 80 00..00 is INT64_MIN.
  f.set_clock(kMin + 1);
  EXPECT_TRUE(Drops(f, key, std::string("\x80\x00\x00\x00\x00\x00\x00\x00", 8)));
}

TEST(TtlFilterTest, KeepsKeysWithoutTheTtlFlagAndPlainKeys) {
  TtlCompactionFilter f;
  f.set_clock(kMax);
  const std::string expired = Value(0);
  EXPECT_FALSE(Drops(f, RoutedKey(0x00), expired));
  EXPECT_FALSE(Drops(f, RoutedKey(0x02), expired));  // another (reserved) bit, not TTL
  EXPECT_TRUE(Drops(f, RoutedKey(0x03), expired));   // TTL among other bits
  EXPECT_TRUE(Drops(f, RoutedKey(0xFF), expired));
  EXPECT_TRUE(Drops(f, RoutedKey(kTtlFlag, "", "", ""), expired));  // empty parts
  // Plain keys: ordinary bytes, an int64 key, and keys that merely end in
  // 0xF5 with a TTL-looking flag byte but lengths that do not fit.
  EXPECT_FALSE(Drops(f, "plain-key", expired));
  EXPECT_FALSE(Drops(f, std::string("\x2a\x00\x00\x00\x00\x00\x00\x00", 8), expired));
  EXPECT_FALSE(Drops(f, std::string("\x00\x01\x00\x00\x01\xF5", 6), expired));  // head 1 + 6 > 6
  EXPECT_FALSE(Drops(f, std::string("\x01\xF5", 2), expired));                  // shorter than a trailer
  EXPECT_FALSE(Drops(f, "", expired));
}

TEST(TtlFilterTest, KeepsAValueShorterThanItsExpiry) {
  TtlCompactionFilter f;
  f.set_clock(kMax);
  const std::string key = RoutedKey(kTtlFlag);
  for (size_t n = 0; n < 8; ++n) {
    EXPECT_FALSE(Drops(f, key, std::string(n, '\0'))) << n << " bytes";
  }
  EXPECT_TRUE(Drops(f, key, std::string(8, '\0')));
  // The static predicate agrees, clock passed explicitly.
  EXPECT_FALSE(TtlCompactionFilter::Expired(key, std::string(7, '\0'), kMax));
  EXPECT_TRUE(TtlCompactionFilter::Expired(key, Value(10), 10));
  EXPECT_FALSE(TtlCompactionFilter::Expired(key, Value(11), 10));
  EXPECT_FALSE(TtlCompactionFilter::Expired("plain", Value(0), kMax));
}

}  // namespace
}  // namespace rhino
