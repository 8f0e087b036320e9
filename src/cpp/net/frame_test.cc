// Frames (docs/protocol.md §1) and the payload codec (§3): the header layout,
// both checksums, the receive-side validation steps and the Encoder/Decoder
// primitives. Expected bytes are built by hand from the protocol's tables.
#include "net/frame.h"

#include <xxhash.h>

#include <cstring>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace rhino {
namespace {

using testing::IsCorruption;
using testing::U16;
using testing::U32;
using testing::U64;

uint32_t Low32Xxh3(std::string_view s) {
  return static_cast<uint32_t>(XXH3_64bits(s.data(), s.size()) & 0xffffffffu);
}

// A 32-byte header written field by field from §1's table; the header
// checksum is computed over bytes [0, 28) unless `reseal` is false.
struct RawHeader {
  uint32_t magic = 0x314E4852;
  uint8_t version = 1;
  uint8_t type = 16;
  uint16_t flags = 0;
  uint32_t stream_id = 0;
  uint32_t length = 0;
  uint64_t chain_version = 0;
  uint32_t payload_checksum = 0;
  std::string Build() const {
    std::string h = U32(magic);
    h.push_back(static_cast<char>(version));
    h.push_back(static_cast<char>(type));
    h += U16(flags) + U32(stream_id) + U32(length) + U64(chain_version) + U32(payload_checksum);
    h += U32(Low32Xxh3(h));
    return h;
  }
};

::testing::AssertionResult IsOk(const Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << s.ToString();
}

Status DecodeRaw(const std::string& header, uint32_t max = kDefaultMaxFrameBytes, FrameHeader* out = nullptr,
                 bool* intact = nullptr) {
  FrameHeader h;
  return DecodeFrameHeader(header.data(), max, out != nullptr ? out : &h, intact);
}

TEST(FrameTest, EncodedHeaderMatchesTheDocumentedLayout) {
  const std::string payload = "some payload bytes";
  std::string frame = EncodeFrame(MessageType::kChunkReq, 0x01020304u, 0x1122334455667788ull, payload);

  std::string want = std::string("RHN1") + '\x01' + '\x07' + U16(0) + U32(0x01020304u) +
                     U32(static_cast<uint32_t>(payload.size())) + U64(0x1122334455667788ull) +
                     U32(Low32Xxh3(payload));
  want += U32(Low32Xxh3(want));
  want += payload;
  ASSERT_EQ(frame.size(), 32 + payload.size());
  EXPECT_EQ(frame, want);
  EXPECT_EQ(std::string_view(frame).substr(0, 4), "RHN1");  // the magic in memory order

  // EncodeFrameHeader writes the same 32 bytes into a caller's buffer.
  char buf[kFrameHeaderBytes];
  EncodeFrameHeader(MessageType::kChunkReq, 0x01020304u, 0x1122334455667788ull, payload, buf);
  EXPECT_EQ(std::string(buf, kFrameHeaderBytes), want.substr(0, 32));

  // FrameChecksum, which both checksums use, is the low 32 bits of XXH3_64.
  for (std::string s : {std::string(), std::string("a"), std::string(1000, 'z'), std::string("\0\xff", 2)}) {
    EXPECT_EQ(FrameChecksum(s.data(), s.size()), Low32Xxh3(s)) << s.size();
  }
}

TEST(FrameTest, DecodesAHandBuiltHeader) {
  RawHeader raw;
  raw.type = static_cast<uint8_t>(MessageType::kCommitRsp);
  raw.stream_id = 0xdeadbeef;
  raw.length = 1234;
  raw.chain_version = 0xfedcba9876543210ull;
  raw.payload_checksum = 0xcafef00d;
  FrameHeader h;
  bool intact = false;
  ASSERT_OK(DecodeRaw(raw.Build(), kDefaultMaxFrameBytes, &h, &intact));
  EXPECT_TRUE(intact);
  EXPECT_EQ(h.type, MessageType::kCommitRsp);
  EXPECT_EQ(h.stream_id, 0xdeadbeefu);
  EXPECT_EQ(h.length, 1234u);
  EXPECT_EQ(h.chain_version, 0xfedcba9876543210ull);
  EXPECT_EQ(h.payload_checksum, 0xcafef00du);
}

TEST(FrameTest, RoundTripsEveryKnownTypeWithEdgeFieldValues) {
  const std::vector<std::string> payloads = {std::string(), std::string(1, '\0'), std::string(70000, '\xab')};
  for (uint8_t t = 1; t <= static_cast<uint8_t>(kLastMessageType); ++t) {
    for (uint32_t stream : {0u, 1u, UINT32_MAX}) {
      for (uint64_t chain : {uint64_t{0}, uint64_t{1}, UINT64_MAX}) {
        for (const auto& p : payloads) {
          std::string f = EncodeFrame(static_cast<MessageType>(t), stream, chain, p);
          FrameHeader h;
          std::string_view got;
          ASSERT_OK(DecodeFrame(f, kDefaultMaxFrameBytes, &h, &got));
          EXPECT_EQ(static_cast<uint8_t>(h.type), t);
          EXPECT_EQ(h.stream_id, stream);
          EXPECT_EQ(h.chain_version, chain);
          EXPECT_EQ(h.length, p.size());
          EXPECT_EQ(got, p);
          EXPECT_EQ(got.data(), f.data() + kFrameHeaderBytes);  // a view into the frame
        }
      }
    }
  }
}

TEST(FrameTest, AnyCorruptedHeaderByteFailsTheHeaderChecksum) {
  RawHeader raw;
  raw.stream_id = 7;
  raw.length = 10;
  const std::string good = raw.Build();
  ASSERT_OK(DecodeRaw(good));
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      bool intact = true;
      EXPECT_TRUE(IsCorruption(DecodeRaw(bad, kDefaultMaxFrameBytes, nullptr, &intact))) << i << ":" << bit;
      EXPECT_FALSE(intact) << "byte " << i << " bit " << bit;
    }
  }
}

TEST(FrameTest, RejectsWrongMagicVersionOrFlagsBehindAValidChecksum) {
  auto expect_rejected = [](RawHeader raw, const char* what) {
    raw.stream_id = 42;
    raw.chain_version = 9;
    FrameHeader h;
    bool intact = false;
    EXPECT_TRUE(IsCorruption(DecodeRaw(raw.Build(), kDefaultMaxFrameBytes, &h, &intact))) << what;
    // The header checksum held, so the receiver may answer on the frame's stream.
    EXPECT_TRUE(intact) << what;
    EXPECT_EQ(h.stream_id, 42u) << what;
    EXPECT_EQ(h.chain_version, 9u) << what;
  };
  RawHeader r;
  r.magic = 0x324E4852;  // "RHN2"
  expect_rejected(r, "magic RHN2");
  r = RawHeader();
  r.magic = 0x52484E31;  // "RHN1" in the wrong byte order
  expect_rejected(r, "byte-swapped magic");
  for (uint8_t v : {0, 2, 255}) {
    r = RawHeader();
    r.version = v;
    expect_rejected(r, "version");
  }
  for (uint16_t f : {1, 0x100, 0xffff}) {
    r = RawHeader();
    r.flags = f;
    expect_rejected(r, "flags");
  }
}

TEST(FrameTest, RejectsAPayloadLongerThanTheMaximum) {
  for (uint32_t max : {65536u, kDefaultMaxFrameBytes, kMaxFrameBytesLimit}) {
    RawHeader r;
    r.length = max;
    EXPECT_TRUE(IsOk(DecodeRaw(r.Build(), max))) << max;
    r.length = max + 1;
    bool intact = false;
    EXPECT_TRUE(IsCorruption(DecodeRaw(r.Build(), max, nullptr, &intact))) << max;
    EXPECT_TRUE(intact);
  }
  RawHeader r;
  r.length = UINT32_MAX;
  EXPECT_CODE(DecodeRaw(r.Build(), kMaxFrameBytesLimit), kCorruption);
  EXPECT_EQ(kDefaultMaxFrameBytes, 4u * 1024 * 1024 + 4 * 1024);
  // A whole frame over the limit fails too, before its payload checksum.
  std::string big = EncodeFrame(MessageType::kChunkReq, 1, 0, std::string(1001, 'x'));
  FrameHeader h;
  std::string_view p;
  EXPECT_CODE(DecodeFrame(big, 1000, &h, &p), kCorruption);
  EXPECT_OK(DecodeFrame(big, 1001, &h, &p));
}

TEST(FrameTest, RejectsUnknownMessageTypes) {
  for (int t = 0; t < 256; ++t) {
    RawHeader r;
    r.type = static_cast<uint8_t>(t);
    bool known = t >= 1 && t <= 31;  // §3's table
    EXPECT_EQ(IsKnownMessageType(static_cast<uint8_t>(t)), known) << t;
    if (known) {
      FrameHeader h;
      EXPECT_TRUE(IsOk(DecodeRaw(r.Build(), kDefaultMaxFrameBytes, &h))) << t;
      EXPECT_EQ(static_cast<int>(h.type), t);
      EXPECT_STRNE(MessageTypeName(h.type), "Unknown") << t;
    } else {
      EXPECT_TRUE(IsCorruption(DecodeRaw(r.Build()))) << t;
    }
  }
}

TEST(FrameTest, DetectsACorruptedPayload) {
  const std::string payload = "0123456789abcdef";
  const std::string good = EncodeFrame(MessageType::kHeartbeatReq, 3, 0, payload);
  for (size_t i = kFrameHeaderBytes; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x20);
    FrameHeader h;
    std::string_view p;
    EXPECT_TRUE(IsCorruption(DecodeFrame(bad, kDefaultMaxFrameBytes, &h, &p))) << i;
  }
  FrameHeader h;
  ASSERT_OK(DecodeFrameHeader(good.data(), kDefaultMaxFrameBytes, &h));
  EXPECT_OK(CheckFramePayload(h, payload));
  EXPECT_CODE(CheckFramePayload(h, payload.substr(1)), kCorruption);     // length differs
  EXPECT_CODE(CheckFramePayload(h, payload + "x"), kCorruption);
  EXPECT_CODE(CheckFramePayload(h, "0123456789abcdeF"), kCorruption);    // same length, other bytes
}

TEST(FrameTest, RejectsTruncatedFramesAndTrailingBytes) {
  const std::string good = EncodeFrame(MessageType::kAbortReq, 5, 6, std::string(40, 'r'));
  for (size_t n = 0; n < good.size(); ++n) {
    FrameHeader h;
    std::string_view p;
    EXPECT_TRUE(IsCorruption(DecodeFrame(std::string_view(good).substr(0, n), kDefaultMaxFrameBytes, &h, &p))) << n;
  }
  FrameHeader h;
  std::string_view p;
  EXPECT_CODE(DecodeFrame(good + '\0', kDefaultMaxFrameBytes, &h, &p), kCorruption);
  EXPECT_CODE(DecodeFrame(good + good, kDefaultMaxFrameBytes, &h, &p), kCorruption);
}

// ---- payload codec (§3) ----

TEST(CodecTest, EncoderWritesTheDocumentedLittleEndianLayout) {
  Encoder e;
  e.PutU8(0xab);
  e.PutU32(0x01020304u);
  e.PutU64(0x0102030405060708ull);
  e.PutBytes("hi");
  e.PutBytes("");
  e.PutU32List({1, UINT32_MAX});
  e.PutU64List({UINT64_MAX});
  e.PutStrList({"a", ""});
  e.PutBytesList({"xyz"});
  std::string want = std::string("\xab", 1) + "\x04\x03\x02\x01" + "\x08\x07\x06\x05\x04\x03\x02\x01" +
                     U32(2) + "hi" + U32(0) + U32(2) + U32(1) + U32(UINT32_MAX) + U32(1) + U64(UINT64_MAX) +
                     U32(2) + U32(1) + "a" + U32(0) + U32(1) + U32(3) + "xyz";
  EXPECT_EQ(e.Finish(), want);
}

TEST(CodecTest, DecoderRoundTripsEdgeValuesAndConsumesExactly) {
  const std::string big(100000, '\x5a');
  const std::string binary("\0\x01\xff\0", 4);
  Encoder e;
  for (uint8_t v : {0, 1, 255}) e.PutU8(v);
  for (uint32_t v : {0u, 1u, 0x80000000u, UINT32_MAX}) e.PutU32(v);
  for (uint64_t v : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 63, UINT64_MAX}) e.PutU64(v);
  e.PutBytes("");
  e.PutBytes(binary);
  e.PutBytes(big);
  e.PutU32List({});
  e.PutU32List({0, UINT32_MAX, 7});
  e.PutU64List({UINT64_MAX, 0});
  e.PutStrList({"", binary, big});
  e.PutBytesList({binary, ""});
  const std::string buf = e.Finish();

  Decoder d(buf);
  for (uint8_t want : {0, 1, 255}) {
    uint8_t v = 9;
    ASSERT_OK(d.GetU8(&v));
    EXPECT_EQ(v, want);
  }
  for (uint32_t want : {0u, 1u, 0x80000000u, UINT32_MAX}) {
    uint32_t v = 9;
    ASSERT_OK(d.GetU32(&v));
    EXPECT_EQ(v, want);
  }
  for (uint64_t want : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 63, UINT64_MAX}) {
    uint64_t v = 9;
    ASSERT_OK(d.GetU64(&v));
    EXPECT_EQ(v, want);
  }
  std::string s = "junk";
  ASSERT_OK(d.GetBytes(&s));
  EXPECT_EQ(s, "");
  std::string_view sv;
  ASSERT_OK(d.GetBytesView(&sv));
  EXPECT_EQ(sv, binary);
  EXPECT_TRUE(sv.data() >= buf.data() && sv.data() < buf.data() + buf.size());  // views the input
  ASSERT_OK(d.GetBytes(&s, big.size()));
  EXPECT_EQ(s, big);
  std::vector<uint32_t> l32 = {5};
  ASSERT_OK(d.GetU32List(&l32));
  EXPECT_TRUE(l32.empty());
  ASSERT_OK(d.GetU32List(&l32, 3));
  EXPECT_EQ(l32, (std::vector<uint32_t>{0, UINT32_MAX, 7}));
  std::vector<uint64_t> l64;
  ASSERT_OK(d.GetU64List(&l64));
  EXPECT_EQ(l64, (std::vector<uint64_t>{UINT64_MAX, 0}));
  std::vector<std::string> ls;
  ASSERT_OK(d.GetStrList(&ls, 3, big.size()));
  EXPECT_EQ(ls, (std::vector<std::string>{"", binary, big}));
  std::vector<std::string_view> lv;
  ASSERT_OK(d.GetBytesViewList(&lv, 2, 4));
  ASSERT_EQ(lv.size(), 2u);
  EXPECT_EQ(lv[0], binary);
  EXPECT_EQ(lv[1], "");
  EXPECT_EQ(d.remaining(), 0u);
  EXPECT_OK(d.Done());
}

TEST(CodecTest, EveryReadPastTheEndIsCorruption) {
  // A u32 length that promises more bytes than follow.
  std::string s;
  std::string_view sv;
  EXPECT_CODE(Decoder(U32(5) + "abcd").GetBytes(&s), kCorruption);
  EXPECT_CODE(Decoder(U32(UINT32_MAX)).GetBytesView(&sv), kCorruption);
  // Every strict prefix of a fixed-width field.
  const std::string eight = U64(0x1122334455667788ull);
  for (size_t n = 0; n < 8; ++n) {
    uint64_t v64 = 0;
    EXPECT_TRUE(IsCorruption(Decoder(eight.substr(0, n)).GetU64(&v64))) << n;
    if (n < 4) {
      uint32_t v32 = 0;
      EXPECT_TRUE(IsCorruption(Decoder(eight.substr(0, n)).GetU32(&v32))) << n;
    }
  }
  uint8_t v8 = 0;
  EXPECT_CODE(Decoder("").GetU8(&v8), kCorruption);
  // Every truncation of a string list.
  Encoder e;
  e.PutStrList({"alpha", "", "gamma"});
  const std::string list = e.Finish();
  for (size_t n = 0; n < list.size(); ++n) {
    std::vector<std::string> out;
    EXPECT_TRUE(IsCorruption(Decoder(list.substr(0, n)).GetStrList(&out, 10, 10))) << n;
  }
  // Bytes left over after the last field.
  const std::string one_extra = U32(1) + "x";
  Decoder d(one_extra);
  uint32_t v = 0;
  ASSERT_OK(d.GetU32(&v));
  EXPECT_EQ(d.remaining(), 1u);
  EXPECT_CODE(d.Done(), kCorruption);
  EXPECT_OK(Decoder("").Done());
}

TEST(CodecTest, LimitsOnLengthsAndCountsAreEnforced) {
  std::string s;
  EXPECT_OK(Decoder(U32(3) + "abc").GetBytes(&s, 3));
  EXPECT_CODE(Decoder(U32(4) + "abcd").GetBytes(&s, 3), kCorruption);
  std::vector<uint32_t> l32;
  EXPECT_OK(Decoder(U32(2) + U32(1) + U32(2)).GetU32List(&l32, 2));
  EXPECT_CODE(Decoder(U32(3) + U32(1) + U32(2) + U32(3)).GetU32List(&l32, 2), kCorruption);
  std::vector<std::string> ls;
  EXPECT_CODE(Decoder(U32(1) + U32(4) + "abcd").GetStrList(&ls, 1, 3), kCorruption);  // an item over max_len
  // A forged count the remaining bytes cannot hold is rejected up front
  // (ASan would report a multi-GiB reservation otherwise).
  std::vector<uint64_t> l64;
  std::vector<std::string_view> lv;
  EXPECT_CODE(Decoder(U32(UINT32_MAX) + std::string(64, '\0')).GetU32List(&l32), kCorruption);
  EXPECT_CODE(Decoder(U32(UINT32_MAX) + std::string(64, '\0')).GetU64List(&l64), kCorruption);
  EXPECT_CODE(Decoder(U32(UINT32_MAX) + std::string(64, '\0')).GetStrList(&ls, UINT32_MAX, 8), kCorruption);
  EXPECT_CODE(Decoder(U32(UINT32_MAX) + std::string(64, '\0')).GetBytesViewList(&lv, UINT32_MAX, 8), kCorruption);
  // Exactly enough bytes for the count: 2 u64 need 16.
  EXPECT_CODE(Decoder(U32(2) + std::string(15, '\0')).GetU64List(&l64), kCorruption);
  EXPECT_OK(Decoder(U32(2) + std::string(16, '\0')).GetU64List(&l64));
  EXPECT_EQ(l64, (std::vector<uint64_t>{0, 0}));
}

}  // namespace
}  // namespace rhino
