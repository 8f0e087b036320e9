// The data-plane messages (docs/protocol.md §3): each payload's byte layout
// against a hand-built string from §3's table, round trips over edge values,
// the field limits of §1 step 6, and every truncation / trailing byte rejected.
#include "net/messages.h"

#include <string>
#include <vector>

#include "testing/test_util.h"

namespace rhino {
namespace {

using testing::ExpectExactAndCanonical;
using testing::IsCorruption;
using testing::MustDecode;
using testing::Str;
using testing::U32;
using testing::U64;
using testing::U8;

const std::string kNonce = "0123456789abcdef";                  // 16 bytes
const std::string kMac = "0123456789abcdef0123456789ABCDEF";    // 32 bytes

TEST(MessagesTest, HelloReqMatchesTheDocumentedLayout) {
  HelloReq m;
  m.worker_id = "w1";
  m.client_nonce = kNonce;
  EXPECT_EQ(m.proto, 1u);  // the default is the protocol version
  EXPECT_EQ(m.Encode(), U32(1) + Str("w1") + Str(kNonce));
  HelloReq back = MustDecode<HelloReq>(U32(7) + Str("worker-9") + Str(kNonce));
  EXPECT_EQ(back.proto, 7u);
  EXPECT_EQ(back.worker_id, "worker-9");
  EXPECT_EQ(back.client_nonce, kNonce);
}

TEST(MessagesTest, HelloReqCarriesARoleAndScopeAppended) {
  // Issue 46: the role and scope follow the nonce; a frame without them is the
  // first handshake's (decoded as no role), so the layout stays canonical.
  HelloReq m;
  m.worker_id = "w1";
  m.client_nonce = kNonce;
  m.has_role = true;
  m.role = "task";
  m.scope = "jobA";
  EXPECT_EQ(m.Encode(), U32(1) + Str("w1") + Str(kNonce) + Str("task") + Str("jobA"));
  HelloReq back = MustDecode<HelloReq>(m.Encode());
  EXPECT_TRUE(back.has_role);
  EXPECT_EQ(back.role, "task");
  EXPECT_EQ(back.scope, "jobA");
  EXPECT_FALSE(MustDecode<HelloReq>(U32(1) + Str("w1") + Str(kNonce)).has_role);
  // Every cut inside the appended block is Corruption (a cut right before it is a HelloReq without a role).
  const std::string full = m.Encode();
  const size_t base = (U32(1) + Str("w1") + Str(kNonce)).size();
  for (size_t n = base + 1; n < full.size(); ++n) {
    HelloReq cut;
    EXPECT_TRUE(IsCorruption(HelloReq::Decode(std::string_view(full).substr(0, n), &cut))) << "prefix of " << n;
  }
  HelloReq r;
  EXPECT_TRUE(IsCorruption(HelloReq::Decode(U32(1) + Str("w1") + Str(kNonce) + Str(std::string(17, 'r')) + Str(""),
                                            &r)));
  EXPECT_TRUE(IsCorruption(HelloReq::Decode(U32(1) + Str("w1") + Str(kNonce) + Str("task"), &r)));  // no scope
}

TEST(MessagesTest, HandshakeMessagesRoundTripAtTheirFieldLimits) {
  HelloRsp rsp;
  rsp.worker_id = std::string(kMaxWorkerIdBytes, 'w');
  rsp.server_nonce = kNonce;
  rsp.server_mac = kMac;
  EXPECT_EQ(rsp.Encode(), Str(rsp.worker_id) + Str(kNonce) + Str(kMac));
  HelloRsp back = MustDecode<HelloRsp>(rsp.Encode());
  EXPECT_EQ(back.worker_id, rsp.worker_id);
  EXPECT_EQ(back.server_nonce, kNonce);
  EXPECT_EQ(back.server_mac, kMac);

  AuthReq a;
  a.client_mac = kMac;
  EXPECT_EQ(a.Encode(), Str(kMac));
  EXPECT_EQ(MustDecode<AuthReq>(a.Encode()).client_mac, kMac);

  HelloReq req;
  req.proto = UINT32_MAX;
  req.worker_id = "";
  req.client_nonce = "";
  HelloReq rb = MustDecode<HelloReq>(req.Encode());
  EXPECT_EQ(rb.proto, UINT32_MAX);
  EXPECT_TRUE(rb.worker_id.empty());
}

TEST(MessagesTest, HandshakeFieldsOverTheirLimitsAreCorruption) {
  HelloReq r;
  EXPECT_TRUE(IsCorruption(HelloReq::Decode(U32(1) + Str(std::string(257, 'w')) + Str(kNonce), &r)));
  EXPECT_TRUE(IsCorruption(HelloReq::Decode(U32(1) + Str("w") + Str(kNonce + "x"), &r)));
  HelloRsp h;
  EXPECT_TRUE(IsCorruption(HelloRsp::Decode(Str("w") + Str(kNonce + "x") + Str(kMac), &h)));
  EXPECT_TRUE(IsCorruption(HelloRsp::Decode(Str("w") + Str(kNonce) + Str(kMac + "x"), &h)));
  AuthReq a;
  EXPECT_TRUE(IsCorruption(AuthReq::Decode(Str(kMac + "x"), &a)));
  StoreQueryReq q;
  EXPECT_OK(StoreQueryReq::Decode(Str(std::string(256, 'o')) + U32(1), &q));
  EXPECT_TRUE(IsCorruption(StoreQueryReq::Decode(Str(std::string(257, 'o')) + U32(1), &q)));
}

TEST(MessagesTest, AuthRspOkIsAStrictBoolean) {
  AuthRsp yes;
  yes.ok = true;
  EXPECT_EQ(yes.Encode(), U8(1));
  EXPECT_EQ(AuthRsp().Encode(), U8(0));
  EXPECT_TRUE(MustDecode<AuthRsp>(U8(1)).ok);
  EXPECT_FALSE(MustDecode<AuthRsp>(U8(0)).ok);
  for (int v : {2, 0x80, 0xff}) {
    AuthRsp m;
    EXPECT_TRUE(IsCorruption(AuthRsp::Decode(U8(static_cast<uint8_t>(v)), &m))) << v;
  }
  AuthRsp m;
  EXPECT_TRUE(IsCorruption(AuthRsp::Decode("", &m)));
  EXPECT_TRUE(IsCorruption(AuthRsp::Decode(U8(1) + U8(0), &m)));
}

TEST(MessagesTest, OpenStreamReqMatchesTheDocumentedLayoutAndRoundTrips) {
  OpenStreamReq m;
  m.operator_id = "op.a";
  m.instance = 3;
  m.checkpoint_id = 0x0102030405060708ull;
  m.chunk_bytes = 1 << 20;
  m.window = 8;
  m.downstream = {"10.0.0.2:7000", "10.0.0.3:7000"};
  m.manifest = std::string("{\"files\":[]}\nxxh3:00\0tail", 25);
  EXPECT_EQ(m.Encode(), Str("op.a") + U32(3) + U64(0x0102030405060708ull) + U32(1 << 20) + U32(8) + U32(2) +
                            Str("10.0.0.2:7000") + Str("10.0.0.3:7000") + Str(m.manifest));
  OpenStreamReq b = MustDecode<OpenStreamReq>(m.Encode());
  EXPECT_EQ(b.operator_id, m.operator_id);
  EXPECT_EQ(b.instance, 3u);
  EXPECT_EQ(b.checkpoint_id, m.checkpoint_id);
  EXPECT_EQ(b.chunk_bytes, m.chunk_bytes);
  EXPECT_EQ(b.window, 8u);
  EXPECT_EQ(b.downstream, m.downstream);
  EXPECT_EQ(b.manifest, m.manifest);

  // Edge values: all-ones integers, an empty chain, a large manifest.
  OpenStreamReq e;
  e.instance = UINT32_MAX;
  e.checkpoint_id = UINT64_MAX;
  e.chunk_bytes = UINT32_MAX;
  e.window = UINT32_MAX;
  e.manifest = std::string(300000, 'm');
  OpenStreamReq eb = MustDecode<OpenStreamReq>(e.Encode());
  EXPECT_EQ(eb.instance, UINT32_MAX);
  EXPECT_EQ(eb.checkpoint_id, UINT64_MAX);
  EXPECT_EQ(eb.chunk_bytes, UINT32_MAX);
  EXPECT_EQ(eb.window, UINT32_MAX);
  EXPECT_TRUE(eb.downstream.empty());
  EXPECT_EQ(eb.manifest, e.manifest);
}

TEST(MessagesTest, OpenStreamReqChainAndAddressLimits) {
  OpenStreamReq m;
  m.operator_id = "op";
  m.downstream.assign(kMaxChainLength, std::string(kMaxAddressBytes, 'a'));
  OpenStreamReq b;
  ASSERT_OK(OpenStreamReq::Decode(m.Encode(), &b));
  EXPECT_EQ(b.downstream.size(), 16u);

  m.downstream.assign(kMaxChainLength + 1, "h:1");  // 17 members
  EXPECT_TRUE(IsCorruption(OpenStreamReq::Decode(m.Encode(), &b)));
  m.downstream = {std::string(kMaxAddressBytes + 1, 'a')};
  EXPECT_TRUE(IsCorruption(OpenStreamReq::Decode(m.Encode(), &b)));
  m.downstream = {};
  m.operator_id = std::string(kMaxWorkerIdBytes + 1, 'o');
  EXPECT_TRUE(IsCorruption(OpenStreamReq::Decode(m.Encode(), &b)));
}

TEST(MessagesTest, OpenStreamRspMatchesTheLayoutAndBoundsItsChainLists) {
  OpenStreamRsp m;
  m.code = 100;
  m.message = "stale";
  m.needed = {0, 5, UINT32_MAX};
  m.credits = 4;
  m.member_needed_files = {3, 0};
  m.member_needed_bytes = {UINT64_MAX, 0};
  EXPECT_EQ(m.Encode(), U32(100) + Str("stale") + U32(3) + U32(0) + U32(5) + U32(UINT32_MAX) + U32(4) + U32(2) +
                            U32(3) + U32(0) + U32(2) + U64(UINT64_MAX) + U64(0));
  OpenStreamRsp b = MustDecode<OpenStreamRsp>(m.Encode());
  EXPECT_EQ(b.code, 100u);
  EXPECT_EQ(b.message, "stale");
  EXPECT_EQ(b.needed, m.needed);
  EXPECT_EQ(b.credits, 4u);
  EXPECT_EQ(b.member_needed_files, m.member_needed_files);
  EXPECT_EQ(b.member_needed_bytes, m.member_needed_bytes);

  m.member_needed_files.assign(kMaxChainLength, 1);
  m.member_needed_bytes.assign(kMaxChainLength, 1);
  EXPECT_OK(OpenStreamRsp::Decode(m.Encode(), &b));
  m.member_needed_files.assign(kMaxChainLength + 1, 1);
  EXPECT_TRUE(IsCorruption(OpenStreamRsp::Decode(m.Encode(), &b)));
  m.member_needed_files.assign(1, 1);
  m.member_needed_bytes.assign(kMaxChainLength + 1, 1);
  EXPECT_TRUE(IsCorruption(OpenStreamRsp::Decode(m.Encode(), &b)));
}

TEST(MessagesTest, ChunkPrefixMatchesTheLayoutAndDataViewsThePayload) {
  std::string payload;
  ChunkReq::AppendPrefix(&payload, 0xa1b2c3d4u, 0x0000000100000002ull, 5);
  EXPECT_EQ(payload.size(), ChunkReq::kPrefixBytes);
  EXPECT_EQ(payload, U32(0xa1b2c3d4u) + U64(0x0000000100000002ull) + U32(5));
  payload += "hello";
  ChunkReq c;
  ASSERT_OK(ChunkReq::Decode(payload, &c));
  EXPECT_EQ(c.file_index, 0xa1b2c3d4u);
  EXPECT_EQ(c.offset, 0x0000000100000002ull);
  EXPECT_EQ(c.data, "hello");
  EXPECT_EQ(c.data.data(), payload.data() + ChunkReq::kPrefixBytes);  // no copy

  // AppendPrefix appends: what was in the buffer stays.
  std::string buf = "keep";
  ChunkReq::AppendPrefix(&buf, 0, UINT64_MAX, 0);
  EXPECT_EQ(buf, "keep" + U32(0) + U64(UINT64_MAX) + U32(0));
  ASSERT_OK(ChunkReq::Decode(std::string_view(buf).substr(4), &c));
  EXPECT_EQ(c.offset, UINT64_MAX);
  EXPECT_TRUE(c.data.empty());
  // A length promising more than the payload holds.
  std::string lying;
  ChunkReq::AppendPrefix(&lying, 1, 0, 6);
  lying += "hello";
  EXPECT_TRUE(IsCorruption(ChunkReq::Decode(lying, &c)));
}

TEST(MessagesTest, SmallMessagesMatchTheLayoutAndRoundTripEdgeValues) {
  for (uint32_t v : {0u, 1u, UINT32_MAX}) {
    CreditRsp c;
    c.credits = v;
    EXPECT_EQ(c.Encode(), U32(v));
    EXPECT_EQ(MustDecode<CreditRsp>(U32(v)).credits, v);
  }
  for (uint64_t v : {uint64_t{0}, uint64_t{0x8000000000000001ull}, UINT64_MAX}) {
    HeartbeatReq q;
    q.nonce = v;
    HeartbeatRsp r;
    r.nonce = v;
    EXPECT_EQ(q.Encode(), U64(v));
    EXPECT_EQ(r.Encode(), U64(v));
    EXPECT_EQ(MustDecode<HeartbeatReq>(U64(v)).nonce, v);
    EXPECT_EQ(MustDecode<HeartbeatRsp>(U64(v)).nonce, v);
  }
  EXPECT_EQ(CommitReq().Encode(), "");
  CommitReq cr;
  EXPECT_OK(CommitReq::Decode("", &cr));
  EXPECT_TRUE(IsCorruption(CommitReq::Decode(U8(0), &cr)));

  StoreQueryRsp s;
  s.code = 1;
  s.message = "no such instance";
  s.checkpoints = {1, 2, UINT64_MAX};
  EXPECT_EQ(s.Encode(), U32(1) + Str("no such instance") + U32(3) + U64(1) + U64(2) + U64(UINT64_MAX));
  EXPECT_EQ(MustDecode<StoreQueryRsp>(s.Encode()).checkpoints, s.checkpoints);

  ErrorRsp e = ErrorRsp::From(Status::StaleChainVersion("chain 3 < 4"));
  EXPECT_EQ(e.code, 100u);  // §3: kStaleChainVersion
  EXPECT_EQ(e.Encode(), U32(100) + Str("chain 3 < 4"));
  EXPECT_EQ(ErrorRsp::From(Status::AuthFailed("x")).code, 101u);
  EXPECT_EQ(ErrorRsp::From(Status::Corruption("x")).code, 2u);
}

TEST(MessagesTest, LongMessagesAreCutToTheLimitAndStillDecode) {
  const std::string huge(kMaxMessageBytes + 1000, 'e');
  ErrorRsp e{13, huge};
  ErrorRsp eb = MustDecode<ErrorRsp>(e.Encode());
  EXPECT_EQ(eb.message, huge.substr(0, kMaxMessageBytes));
  CommitRsp c{4, huge};
  EXPECT_EQ(MustDecode<CommitRsp>(c.Encode()).message.size(), kMaxMessageBytes);
  AbortReq a{huge};
  EXPECT_EQ(MustDecode<AbortReq>(a.Encode()).reason.size(), kMaxMessageBytes);
  OpenStreamRsp o;
  o.message = huge;
  EXPECT_EQ(MustDecode<OpenStreamRsp>(o.Encode()).message.size(), kMaxMessageBytes);
  StoreQueryRsp s;
  s.message = huge;
  EXPECT_EQ(MustDecode<StoreQueryRsp>(s.Encode()).message.size(), kMaxMessageBytes);

  // A peer that sends one byte more than the limit is Corruption.
  ErrorRsp bad;
  EXPECT_TRUE(IsCorruption(ErrorRsp::Decode(U32(2) + Str(std::string(kMaxMessageBytes + 1, 'e')), &bad)));
  AbortReq ab;
  EXPECT_TRUE(IsCorruption(AbortReq::Decode(Str(std::string(kMaxMessageBytes + 1, 'e')), &ab)));
}

TEST(MessagesTest, EveryTruncationAndTrailingByteIsCorruption) {
  HelloReq hq;
  hq.worker_id = "w1";
  hq.client_nonce = kNonce;
  ExpectExactAndCanonical<HelloReq>(hq.Encode(), "HelloReq");
  HelloRsp hr{"w2", kNonce, kMac};
  ExpectExactAndCanonical<HelloRsp>(hr.Encode(), "HelloRsp");
  ExpectExactAndCanonical<AuthReq>(AuthReq{kMac}.Encode(), "AuthReq");
  ExpectExactAndCanonical<AuthReq>(AuthReq{""}.Encode(), "AuthReq empty");
  ExpectExactAndCanonical<AuthRsp>(AuthRsp{true}.Encode(), "AuthRsp");
  OpenStreamReq oq;
  oq.operator_id = "op";
  oq.instance = 1;
  oq.downstream = {"a:1", "b:2"};
  oq.manifest = "mf";
  ExpectExactAndCanonical<OpenStreamReq>(oq.Encode(), "OpenStreamReq");
  OpenStreamRsp orr;
  orr.message = "m";
  orr.needed = {1, 2};
  orr.member_needed_files = {2};
  orr.member_needed_bytes = {99};
  ExpectExactAndCanonical<OpenStreamRsp>(orr.Encode(), "OpenStreamRsp");
  ExpectExactAndCanonical<CreditRsp>(CreditRsp{9}.Encode(), "CreditRsp");
  ExpectExactAndCanonical<CommitRsp>(CommitRsp{0, "ok"}.Encode(), "CommitRsp");
  ExpectExactAndCanonical<AbortReq>(AbortReq{"cancelled"}.Encode(), "AbortReq");
  ExpectExactAndCanonical<HeartbeatReq>(HeartbeatReq{42}.Encode(), "HeartbeatReq");
  ExpectExactAndCanonical<HeartbeatRsp>(HeartbeatRsp{42}.Encode(), "HeartbeatRsp");
  ExpectExactAndCanonical<StoreQueryReq>(StoreQueryReq{"op", 7}.Encode(), "StoreQueryReq");
  StoreQueryRsp sr;
  sr.checkpoints = {5};
  ExpectExactAndCanonical<StoreQueryRsp>(sr.Encode(), "StoreQueryRsp");
  ExpectExactAndCanonical<ErrorRsp>(ErrorRsp{2, "bad"}.Encode(), "ErrorRsp");

  std::string chunk;
  ChunkReq::AppendPrefix(&chunk, 1, 2, 3);
  chunk += "abc";
  for (size_t n = 0; n < chunk.size(); ++n) {
    ChunkReq c;
    EXPECT_TRUE(IsCorruption(ChunkReq::Decode(std::string_view(chunk).substr(0, n), &c))) << n;
  }
  ChunkReq c;
  EXPECT_TRUE(IsCorruption(ChunkReq::Decode(chunk + 'x', &c)));
}

}  // namespace
}  // namespace rhino
