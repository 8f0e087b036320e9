// The binary messages of the state service (docs/protocol.md §7, table of §3):
// the InstanceReq/Rsp envelope, sessions (open, get, write, scan, commit,
// abort), checkpoint readers' appended fields (§7.9), the response builders
// and error payloads. InstanceReq.args is treated as opaque bytes here: its
// JSON decoding has its own tests.
#include "net/service_messages.h"

#include <set>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace rhino {
namespace {

using testing::IsCorruption;
using testing::MustDecode;
using testing::Str;
using testing::U32;
using testing::U64;
using testing::U8;

// testing::ExpectExactAndCanonical with three trailing bytes tried, not one.
template <typename M>
void ExpectExactAndCanonical(const std::string& payload, const char* what,
                             const std::set<size_t>& valid_prefixes = {}) {
  testing::ExpectExactAndCanonical<M>(payload, what, valid_prefixes, std::string("\0\1\xff", 3));
}

TEST(ServiceMessagesTest, InstanceEnvelopeMatchesTheDocumentedLayout) {
  InstanceReq q;
  q.action = static_cast<uint8_t>(InstanceAction::kTakeover);
  q.operator_id = "agg.count";
  q.instance = UINT32_MAX;
  q.epoch = UINT64_MAX;
  q.args = std::string("opaque\0bytes", 12);
  EXPECT_EQ(q.Encode(), U8(3) + Str("agg.count") + U32(UINT32_MAX) + U64(UINT64_MAX) + Str(q.args));
  InstanceReq qb = MustDecode<InstanceReq>(q.Encode());
  EXPECT_EQ(qb.action, 3);
  EXPECT_EQ(qb.operator_id, "agg.count");
  EXPECT_EQ(qb.instance, UINT32_MAX);
  EXPECT_EQ(qb.epoch, UINT64_MAX);
  EXPECT_EQ(qb.args, q.args);

  InstanceRsp r;
  r.code = 102;  // kStaleEpoch
  r.message = "epoch 4 < 5";
  r.result = "R";
  EXPECT_EQ(r.Encode(), U32(102) + Str("epoch 4 < 5") + Str("R"));
  InstanceRsp rb = MustDecode<InstanceRsp>(r.Encode());
  EXPECT_EQ(rb.code, 102u);
  EXPECT_EQ(rb.message, r.message);
  EXPECT_EQ(rb.result, "R");
}

TEST(ServiceMessagesTest, InstanceReqBoundsItsOperatorIdAndArgs) {
  InstanceReq q;
  q.operator_id = std::string(kMaxOperatorIdBytes, 'o');
  q.args = std::string(kMaxJsonBytes, 'a');
  InstanceReq b;
  ASSERT_OK(InstanceReq::Decode(q.Encode(), &b));
  EXPECT_EQ(b.args.size(), kMaxJsonBytes);
  q.operator_id.push_back('o');  // 129 bytes
  EXPECT_TRUE(IsCorruption(InstanceReq::Decode(q.Encode(), &b)));
  q.operator_id = "op";
  q.args.push_back('a');  // 1 MiB + 1
  EXPECT_TRUE(IsCorruption(InstanceReq::Decode(q.Encode(), &b)));
}

TEST(ServiceMessagesTest, SessionOpenReqAppendsReaderFieldsOnlyForAReader) {
  SessionOpenReq s;
  s.operator_id = "op";
  s.instance = 2;
  s.batch = 10;
  s.epoch = 3;
  s.has_checkpoint = true;  // ignored: not a reader
  s.checkpoint = 77;
  const std::string session = Str("op") + U32(2) + U64(10) + U64(3);
  EXPECT_EQ(s.Encode(), session);
  SessionOpenReq sb = MustDecode<SessionOpenReq>(session);
  EXPECT_FALSE(sb.read_checkpoint);
  EXPECT_EQ(sb.batch, 10u);
  EXPECT_EQ(sb.epoch, 3u);

  s.read_checkpoint = true;
  EXPECT_EQ(s.Encode(), session + U8(1) + U8(1) + U64(77));
  SessionOpenReq rb = MustDecode<SessionOpenReq>(s.Encode());
  EXPECT_TRUE(rb.read_checkpoint);
  EXPECT_TRUE(rb.has_checkpoint);
  EXPECT_EQ(rb.checkpoint, 77u);
  s.has_checkpoint = false;
  s.checkpoint = UINT64_MAX;
  rb = MustDecode<SessionOpenReq>(s.Encode());
  EXPECT_TRUE(rb.read_checkpoint);
  EXPECT_FALSE(rb.has_checkpoint);
  EXPECT_EQ(rb.checkpoint, UINT64_MAX);

  // Malformed reader fields.
  SessionOpenReq bad;
  EXPECT_TRUE(IsCorruption(SessionOpenReq::Decode(session + U8(0) + U8(0) + U64(0), &bad)));  // read = 0
  EXPECT_TRUE(IsCorruption(SessionOpenReq::Decode(session + U8(2) + U8(0) + U64(0), &bad)));  // read = 2
  EXPECT_TRUE(IsCorruption(SessionOpenReq::Decode(session + U8(1) + U8(2) + U64(0), &bad)));  // has = 2
  EXPECT_TRUE(IsCorruption(
      SessionOpenReq::Decode(Str(std::string(kMaxOperatorIdBytes + 1, 'o')) + U32(0) + U64(0) + U64(0), &bad)));
}

TEST(ServiceMessagesTest, SessionOpenReqAppendsTheAttemptFenceOnlyWhenSet) {
  SessionOpenReq s;
  s.operator_id = "op";
  s.instance = 2;
  s.batch = 10;
  s.epoch = 3;
  s.has_attempt = true;
  s.attempt = 41;
  const std::string session = Str("op") + U32(2) + U64(10) + U64(3);
  // the reader's fields as 0, 0, 0, then the fence
  EXPECT_EQ(s.Encode(), session + U8(0) + U8(0) + U64(0) + U64(41) + U8(0) + U64(0));
  SessionOpenReq b = MustDecode<SessionOpenReq>(s.Encode());
  EXPECT_FALSE(b.read_checkpoint);
  EXPECT_TRUE(b.has_attempt);
  EXPECT_EQ(b.attempt, 41u);
  EXPECT_FALSE(b.has_committed);
  s.has_committed = true;
  s.committed = 9;
  b = MustDecode<SessionOpenReq>(s.Encode());
  EXPECT_TRUE(b.has_committed);
  EXPECT_EQ(b.committed, 9u);
  EXPECT_EQ(b.Encode(), s.Encode());

  SessionOpenReq bad;
  // a reader and a fenced session at once
  EXPECT_TRUE(IsCorruption(
      SessionOpenReq::Decode(session + U8(1) + U8(0) + U64(0) + U64(41) + U8(0) + U64(0), &bad)));
  // a fenced session with a checkpoint
  EXPECT_TRUE(IsCorruption(
      SessionOpenReq::Decode(session + U8(0) + U8(1) + U64(5) + U64(41) + U8(0) + U64(0), &bad)));
  // a committed batch without has_committed, a bad bool, a short fence
  EXPECT_TRUE(IsCorruption(
      SessionOpenReq::Decode(session + U8(0) + U8(0) + U64(0) + U64(41) + U8(0) + U64(7), &bad)));
  EXPECT_TRUE(IsCorruption(
      SessionOpenReq::Decode(session + U8(0) + U8(0) + U64(0) + U64(41) + U8(2) + U64(0), &bad)));
  EXPECT_TRUE(IsCorruption(SessionOpenReq::Decode(session + U8(0) + U8(0) + U64(0) + U64(41), &bad)));
}

TEST(ServiceMessagesTest, SessionOpenRspAppendsTheCheckpointOnlyForAReader) {
  SessionOpenRsp r;
  r.code = 0;
  r.has_version = true;
  r.version = 9;
  r.rolled_back = true;
  r.checkpoint = 5;   // ignored: not a reader's answer
  r.vnodes = {1};
  const std::string session = U32(0) + Str("") + U8(1) + U64(9) + U8(1);
  EXPECT_EQ(r.Encode(), session);
  SessionOpenRsp sb = MustDecode<SessionOpenRsp>(session);
  EXPECT_FALSE(sb.reading);
  EXPECT_TRUE(sb.has_version);
  EXPECT_EQ(sb.version, 9u);
  EXPECT_TRUE(sb.rolled_back);
  EXPECT_TRUE(sb.vnodes.empty());

  r.reading = true;
  r.rolled_back = false;
  r.vnodes = {0, 3, UINT32_MAX};
  EXPECT_EQ(r.Encode(), U32(0) + Str("") + U8(1) + U64(9) + U8(0) + U64(5) + U32(3) + U32(0) + U32(3) +
                            U32(UINT32_MAX));
  SessionOpenRsp rb = MustDecode<SessionOpenRsp>(r.Encode());
  EXPECT_TRUE(rb.reading);
  EXPECT_FALSE(rb.rolled_back);
  EXPECT_EQ(rb.checkpoint, 5u);
  EXPECT_EQ(rb.vnodes, r.vnodes);
  r.vnodes.clear();  // a reader of a checkpoint without vnodes is still a reader
  EXPECT_TRUE(MustDecode<SessionOpenRsp>(r.Encode()).reading);

  SessionOpenRsp bad;
  EXPECT_TRUE(IsCorruption(SessionOpenRsp::Decode(U32(0) + Str("") + U8(2) + U64(9) + U8(0), &bad)));
  EXPECT_TRUE(IsCorruption(SessionOpenRsp::Decode(U32(0) + Str("") + U8(0) + U64(9) + U8(7), &bad)));
}

TEST(ServiceMessagesTest, GetAndWriteRequestsMatchTheLayoutAndViewThePayload) {
  const std::string big(200000, 'k');
  const std::string binary("\0\xff\0", 3);
  GetReq g;
  g.keys = {"", binary, big};
  const std::string gp = g.Encode();
  EXPECT_EQ(gp, U32(3) + Str("") + Str(binary) + Str(big));
  GetReq gb = MustDecode<GetReq>(gp);
  ASSERT_EQ(gb.keys.size(), 3u);
  EXPECT_EQ(gb.keys[0], "");
  EXPECT_EQ(gb.keys[1], binary);
  EXPECT_EQ(gb.keys[2], big);
  EXPECT_EQ(gb.keys[1].data(), gp.data() + 4 + 4 + 4);  // a view into the payload
  EXPECT_TRUE(MustDecode<GetReq>(GetReq().Encode()).keys.empty());

  WriteReq put;
  put.op = static_cast<uint8_t>(WriteOp::kPut);
  put.keys = {"k1", "k2"};
  put.values = {"v1", ""};
  EXPECT_EQ(put.Encode(), U8(1) + U32(2) + Str("k1") + Str("k2") + U32(2) + Str("v1") + Str(""));
  const std::string put_payload = put.Encode();  // the decoded views point into it
  WriteReq pb = MustDecode<WriteReq>(put_payload);
  EXPECT_EQ(pb.op, 1);
  EXPECT_EQ(pb.keys, put.keys);
  EXPECT_EQ(pb.values, put.values);
  WriteReq del;
  del.op = static_cast<uint8_t>(WriteOp::kDelete);
  del.keys = {binary};
  EXPECT_EQ(del.Encode(), U8(2) + U32(1) + Str(binary) + U32(0));
  const std::string del_payload = del.Encode();
  WriteReq db = MustDecode<WriteReq>(del_payload);
  EXPECT_EQ(db.op, 2);
  EXPECT_TRUE(db.values.empty());
  // A forged key count is rejected, not allocated.
  GetReq forged;
  EXPECT_TRUE(IsCorruption(GetReq::Decode(U32(UINT32_MAX) + Str("k"), &forged)));
}

TEST(ServiceMessagesTest, GetRspFoundFlagsMustAgreeWithTheValues) {
  GetRsp r;
  r.found = std::string("\1\0\1", 3);
  r.values = {"a", ""};
  const std::string p = r.Encode();
  EXPECT_EQ(p, U32(0) + Str("") + Str(std::string("\1\0\1", 3)) + U32(2) + Str("a") + Str(""));
  GetRsp b = MustDecode<GetRsp>(p);
  EXPECT_EQ(b.found, r.found);
  EXPECT_EQ(b.values, r.values);

  GetRsp bad;
  // A found byte other than 0/1.
  EXPECT_TRUE(IsCorruption(GetRsp::Decode(U32(0) + Str("") + Str("\2") + U32(1) + Str("a"), &bad)));
  // Two found keys, one value; one found key, two values.
  EXPECT_TRUE(IsCorruption(GetRsp::Decode(U32(0) + Str("") + Str("\1\1") + U32(1) + Str("a"), &bad)));
  EXPECT_TRUE(
      IsCorruption(GetRsp::Decode(U32(0) + Str("") + Str(std::string("\1\0", 2)) + U32(2) + Str("a") + Str("b"), &bad)));
  // Nothing found, no values: fine.
  EXPECT_OK(GetRsp::Decode(U32(0) + Str("") + Str(std::string(3, '\0')) + U32(0), &bad));
}

TEST(ServiceMessagesTest, GetRspBuildersAgreeAndPredictTheirSizeExactly) {
  const std::string big(5000, 'v');
  const std::vector<uint8_t> found = {1, 0, 1, 1};
  const std::vector<std::string_view> values = {"v1", "unused", big, ""};

  GetRsp want;
  want.found = std::string("\1\0\1\1", 4);
  want.values = {"v1", big, ""};
  GetRspBuilder builder(4);
  for (size_t i = 0; i < found.size(); ++i) {
    // SizeWith(len) is the payload size after adding one found value of len.
    size_t predicted = builder.SizeWith(values[i].size());
    builder.Add(found[i] != 0, values[i]);
    if (found[i]) {
      GetRspBuilder again(4);
      for (size_t j = 0; j <= i; ++j) again.Add(found[j] != 0, values[j]);
      EXPECT_EQ(again.Finish().size(), predicted) << i;
    }
  }
  const std::string built = builder.Finish();
  EXPECT_EQ(built, want.Encode());
  EXPECT_EQ(EncodeGetRsp(found, values, found.size()), want.Encode());
  GetRsp back = MustDecode<GetRsp>(built);
  EXPECT_EQ(back.values, want.values);

  // EncodeGetRsp answers a prefix of the keys.
  GetRsp prefix;
  prefix.found = std::string("\1\0", 2);
  prefix.values = {"v1"};
  EXPECT_EQ(EncodeGetRsp(found, values, 2), prefix.Encode());
  EXPECT_EQ(EncodeGetRsp(found, values, 0), U32(0) + Str("") + Str("") + U32(0));
  EXPECT_EQ(GetRspBuilder(0).Finish(), U32(0) + Str("") + Str("") + U32(0));
}

TEST(ServiceMessagesTest, ScanMessagesMatchTheDocumentedLayout) {
  ScanReq q;
  q.has_vnode = true;
  q.vnode = 0x01020304;
  q.prefix = std::string("p\0", 2);
  q.has_after = true;
  q.after_vnode = UINT32_MAX;
  q.after_key = "last";
  q.max_items = 100;
  EXPECT_EQ(q.Encode(), U8(1) + U32(0x01020304) + Str(std::string("p\0", 2)) + U8(1) + U32(UINT32_MAX) +
                            Str("last") + U32(100));
  ScanReq b = MustDecode<ScanReq>(q.Encode());
  EXPECT_TRUE(b.has_vnode);
  EXPECT_EQ(b.vnode, q.vnode);
  EXPECT_EQ(b.prefix, q.prefix);
  EXPECT_TRUE(b.has_after);
  EXPECT_EQ(b.after_vnode, UINT32_MAX);
  EXPECT_EQ(b.after_key, "last");
  EXPECT_EQ(b.max_items, 100u);
  EXPECT_EQ(ScanReq().Encode(), U8(0) + U32(0) + Str("") + U8(0) + U32(0) + Str("") + U32(0));
  ScanReq bad;
  EXPECT_TRUE(IsCorruption(ScanReq::Decode(U8(2) + U32(0) + Str("") + U8(0) + U32(0) + Str("") + U32(0), &bad)));
  EXPECT_TRUE(IsCorruption(ScanReq::Decode(U8(0) + U32(0) + Str("") + U8(3) + U32(0) + Str("") + U32(0), &bad)));

  ScanRsp r;
  r.done = true;
  r.last_vnode = 7;
  r.keys = {"a", "b"};
  r.values = {"1", ""};
  EXPECT_EQ(r.Encode(), U32(0) + Str("") + U8(1) + U32(7) + U32(2) + Str("a") + Str("b") + U32(2) + Str("1") + Str(""));
  const std::string scan_payload = r.Encode();
  ScanRsp rb = MustDecode<ScanRsp>(scan_payload);
  EXPECT_TRUE(rb.done);
  EXPECT_EQ(rb.last_vnode, 7u);
  EXPECT_EQ(rb.keys, r.keys);
  EXPECT_EQ(rb.values, r.values);
  ScanRsp uneven;
  EXPECT_TRUE(IsCorruption(ScanRsp::Decode(U32(0) + Str("") + U8(0) + U32(0) + U32(1) + Str("a") + U32(0), &uneven)));
  EXPECT_TRUE(IsCorruption(ScanRsp::Decode(U32(0) + Str("") + U8(5) + U32(0) + U32(0) + U32(0), &uneven)));
}

TEST(ServiceMessagesTest, ScanRspBuilderMatchesTheEncodingAndPredictsItsSize) {
  const std::vector<std::pair<std::string, std::string>> items = {
      {"k1", "v1"}, {"", ""}, {std::string(3000, 'k'), std::string(9000, 'v')}, {"k4", "x"}};
  ScanRspBuilder builder;
  EXPECT_EQ(builder.count(), 0u);
  for (size_t i = 0; i < items.size(); ++i) {
    size_t predicted = builder.SizeWith(items[i].first.size(), items[i].second.size());
    builder.Add(items[i].first, items[i].second);
    ScanRspBuilder again;
    for (size_t j = 0; j <= i; ++j) again.Add(items[j].first, items[j].second);
    EXPECT_EQ(again.Finish(false, 0).size(), predicted) << i;
  }
  EXPECT_EQ(builder.count(), items.size());
  ScanRsp want;
  want.done = false;
  want.last_vnode = 0xabcdef;
  for (const auto& [k, v] : items) {
    want.keys.push_back(k);
    want.values.push_back(v);
  }
  const std::string built = builder.Finish(false, 0xabcdef);
  EXPECT_EQ(built, want.Encode());
  ScanRsp back = MustDecode<ScanRsp>(built);
  EXPECT_FALSE(back.done);
  EXPECT_EQ(back.last_vnode, 0xabcdefu);
  EXPECT_EQ(back.keys, want.keys);
  EXPECT_EQ(back.values, want.values);
  EXPECT_EQ(ScanRspBuilder().Finish(true, 3), U32(0) + Str("") + U8(1) + U32(3) + U32(0) + U32(0));
}

TEST(ServiceMessagesTest, SessionCommitReqBatchTimeIsAnOptionalTrailingField) {
  SessionCommitReq c;
  c.mode = static_cast<uint8_t>(CommitMode::kAsync);
  EXPECT_EQ(c.Encode(), U8(1));
  SessionCommitReq b = MustDecode<SessionCommitReq>(U8(1));
  EXPECT_EQ(b.mode, 1);
  EXPECT_FALSE(b.batch_time_ms.has_value());

  for (int64_t t : {int64_t{0}, int64_t{1700000000000}, int64_t{-1}, INT64_MIN, INT64_MAX}) {
    c.batch_time_ms = t;
    EXPECT_EQ(c.Encode(), U8(1) + U64(static_cast<uint64_t>(t))) << t;  // i64 as its two's complement
    SessionCommitReq tb = MustDecode<SessionCommitReq>(c.Encode());
    ASSERT_TRUE(tb.batch_time_ms.has_value());
    EXPECT_EQ(*tb.batch_time_ms, t);
  }
  // Decoding into a struct that held a time clears it when the field is absent.
  SessionCommitReq reused;
  reused.batch_time_ms = 5;
  ASSERT_OK(SessionCommitReq::Decode(U8(0), &reused));
  EXPECT_FALSE(reused.batch_time_ms.has_value());
  // 2..8 bytes (a cut time) and 10 bytes are Corruption; so is nothing at all.
  const std::string full = U8(0) + U64(UINT64_MAX);
  for (size_t n : {0, 2, 3, 4, 5, 6, 7, 8}) {
    SessionCommitReq t;
    EXPECT_TRUE(IsCorruption(SessionCommitReq::Decode(full.substr(0, n), &t))) << n;
  }
  SessionCommitReq t;
  EXPECT_TRUE(IsCorruption(SessionCommitReq::Decode(full + '\0', &t)));
}

TEST(ServiceMessagesTest, SessionAnswersAndAbortMatchTheLayout) {
  SessionCommitRsp c;
  c.code = 4;
  c.message = "replication failed";
  c.version = UINT64_MAX;
  c.stats = "S";
  EXPECT_EQ(c.Encode(), U32(4) + Str("replication failed") + U64(UINT64_MAX) + Str("S"));
  SessionCommitRsp cb = MustDecode<SessionCommitRsp>(c.Encode());
  EXPECT_EQ(cb.code, 4u);
  EXPECT_EQ(cb.version, UINT64_MAX);
  EXPECT_EQ(cb.stats, "S");
  SessionCommitRsp big;
  EXPECT_TRUE(IsCorruption(
      SessionCommitRsp::Decode(U32(0) + Str("") + U64(0) + Str(std::string(kMaxJsonBytes + 1, 's')), &big)));

  SessionRsp s;
  s.code = 15;
  s.message = "busy";
  s.count = 12345678901234ull;
  EXPECT_EQ(s.Encode(), U32(15) + Str("busy") + U64(12345678901234ull));
  EXPECT_EQ(MustDecode<SessionRsp>(s.Encode()).count, 12345678901234ull);

  SessionAbortReq a;
  a.reason = std::string(kMaxMessageBytes + 10, 'r');  // cut to the limit by Encode
  SessionAbortReq ab = MustDecode<SessionAbortReq>(a.Encode());
  EXPECT_EQ(ab.reason, a.reason.substr(0, kMaxMessageBytes));
  EXPECT_EQ(SessionAbortReq{"task failed"}.Encode(), Str("task failed"));
  EXPECT_TRUE(IsCorruption(SessionAbortReq::Decode(Str(std::string(kMaxMessageBytes + 1, 'r')), &ab)));
}

TEST(ServiceMessagesTest, ErrorPayloadsDecodeAsEachResponseType) {
  const Status err = Status::Aborted("no open session on stream 9");
  const uint32_t code = 13;  // §3: Aborted
  {
    InstanceRsp m = MustDecode<InstanceRsp>(ServiceErrorPayload(MessageType::kInstanceRsp, err));
    EXPECT_EQ(m.code, code);
    EXPECT_EQ(m.message, err.message());
    EXPECT_TRUE(m.result.empty());
  }
  {
    SessionOpenRsp m = MustDecode<SessionOpenRsp>(ServiceErrorPayload(MessageType::kSessionOpenRsp, err));
    EXPECT_EQ(m.code, code);
    EXPECT_EQ(m.message, err.message());
    EXPECT_FALSE(m.has_version);
    EXPECT_FALSE(m.rolled_back);
    EXPECT_FALSE(m.reading);
  }
  {
    const std::string payload = ServiceErrorPayload(MessageType::kGetRsp, err);
    GetRsp m = MustDecode<GetRsp>(payload);
    EXPECT_EQ(m.code, code);
    EXPECT_EQ(m.message, err.message());
    EXPECT_TRUE(m.found.empty());
    EXPECT_TRUE(m.values.empty());
  }
  {
    SessionRsp m = MustDecode<SessionRsp>(ServiceErrorPayload(MessageType::kSessionRsp, err));
    EXPECT_EQ(m.code, code);
    EXPECT_EQ(m.message, err.message());
    EXPECT_EQ(m.count, 0u);
  }
  {
    const std::string payload = ServiceErrorPayload(MessageType::kScanRsp, err);
    ScanRsp m = MustDecode<ScanRsp>(payload);
    EXPECT_EQ(m.code, code);
    EXPECT_EQ(m.message, err.message());
    EXPECT_TRUE(m.done);  // nothing follows an error
    EXPECT_TRUE(m.keys.empty());
  }
  {
    SessionCommitRsp m = MustDecode<SessionCommitRsp>(ServiceErrorPayload(MessageType::kSessionCommitRsp, err));
    EXPECT_EQ(m.code, code);
    EXPECT_EQ(m.message, err.message());
    EXPECT_EQ(m.version, 0u);
    EXPECT_TRUE(m.stats.empty());
  }
  // A wire code of §3's second range and a message over the limit.
  SessionRsp m = MustDecode<SessionRsp>(
      ServiceErrorPayload(MessageType::kSessionRsp, Status::StaleEpoch(std::string(kMaxMessageBytes + 5, 'x'))));
  EXPECT_EQ(m.code, 102u);
  EXPECT_EQ(m.message.size(), kMaxMessageBytes);
}

TEST(ServiceMessagesTest, EveryTruncationAndTrailingByteIsCorruption) {
  InstanceReq iq;
  iq.action = 1;
  iq.operator_id = "op";
  iq.args = "A";
  ExpectExactAndCanonical<InstanceReq>(iq.Encode(), "InstanceReq");
  ExpectExactAndCanonical<InstanceRsp>(InstanceRsp{3, "m", "r"}.Encode(), "InstanceRsp");

  SessionOpenReq oq;
  oq.operator_id = "op";
  oq.batch = 4;
  const size_t session_open = oq.Encode().size();
  ExpectExactAndCanonical<SessionOpenReq>(oq.Encode(), "SessionOpenReq");
  oq.read_checkpoint = true;
  oq.has_checkpoint = true;
  oq.checkpoint = 3;
  ExpectExactAndCanonical<SessionOpenReq>(oq.Encode(), "SessionOpenReq reader", {session_open});

  SessionOpenRsp orr;
  orr.message = "m";
  orr.has_version = true;
  const size_t session_rsp = orr.Encode().size();
  ExpectExactAndCanonical<SessionOpenRsp>(orr.Encode(), "SessionOpenRsp");
  orr.reading = true;
  orr.vnodes = {1, 2};
  ExpectExactAndCanonical<SessionOpenRsp>(orr.Encode(), "SessionOpenRsp reader", {session_rsp});

  GetReq gq;
  gq.keys = {"a", "bc"};
  ExpectExactAndCanonical<GetReq>(gq.Encode(), "GetReq");
  GetRsp gr;
  gr.found = std::string("\1\0", 2);
  gr.values = {"v"};
  ExpectExactAndCanonical<GetRsp>(gr.Encode(), "GetRsp");
  WriteReq wq;
  wq.op = 1;
  wq.keys = {"k"};
  wq.values = {"v"};
  ExpectExactAndCanonical<WriteReq>(wq.Encode(), "WriteReq");
  ExpectExactAndCanonical<SessionRsp>(SessionRsp{0, "", 2}.Encode(), "SessionRsp");
  ScanReq sq;
  sq.prefix = "p";
  sq.after_key = "k";
  ExpectExactAndCanonical<ScanReq>(sq.Encode(), "ScanReq");
  ScanRsp sr;
  sr.keys = {"k"};
  sr.values = {"v"};
  ExpectExactAndCanonical<ScanRsp>(sr.Encode(), "ScanRsp");
  SessionCommitReq cq;
  cq.batch_time_ms = -5;
  ExpectExactAndCanonical<SessionCommitReq>(cq.Encode(), "SessionCommitReq", {1});
  ExpectExactAndCanonical<SessionCommitRsp>(SessionCommitRsp{0, "", 9, "s"}.Encode(), "SessionCommitRsp");
  ExpectExactAndCanonical<SessionAbortReq>(SessionAbortReq{"why"}.Encode(), "SessionAbortReq");
}

TEST(ServiceMessagesTest, DecodeServiceMessageReencodesOnlyServiceTypes) {
  GetReq g;
  g.keys = {"x", "y"};
  const std::string p = g.Encode();
  std::string again = "stale";
  ASSERT_OK(DecodeServiceMessage(MessageType::kGetReq, p, &again));
  EXPECT_EQ(again, p);
  // A malformed payload is Corruption; a data-plane type is none of these: OK, empty.
  EXPECT_TRUE(IsCorruption(DecodeServiceMessage(MessageType::kGetReq, p + "z", &again)));
  again = "stale";
  ASSERT_OK(DecodeServiceMessage(MessageType::kHelloReq, "anything", &again));
  EXPECT_TRUE(again.empty());
  ASSERT_OK(DecodeServiceMessage(MessageType::kSessionCommitReq, U8(0), &again));
  EXPECT_EQ(again, U8(0));
}

// The instance actions are one list (RHINO_INSTANCE_ACTIONS): the names are the
// ones §7.1 documents and the Python client sends, each parses back to its own
// action, and no name or wire code is used twice.
TEST(ServiceMessagesTest, InstanceActionsAreOneListOfUniqueNamesAndCodes) {
  const std::vector<std::string> documented = {"open",   "close",         "takeover",    "fence",     "import",
                                               "move_vnodes", "list",   "status",      "discard_after",
                                               "reconfigure", "replicate", "compact", "drop"};
  std::set<std::string> names;
  std::set<int> codes;
  for (const std::string& name : documented) {
    InstanceAction a{};
    ASSERT_TRUE(ParseInstanceAction(name, &a).ok()) << name;
    EXPECT_EQ(InstanceActionName(a), name);
    EXPECT_TRUE(names.insert(name).second) << name;
    EXPECT_TRUE(codes.insert(static_cast<int>(a)).second) << name;
  }
#define RHINO_COUNT_ACTION(e, code, name, handler, access) +1
  constexpr int kRows = 0 RHINO_INSTANCE_ACTIONS(RHINO_COUNT_ACTION);
#undef RHINO_COUNT_ACTION
  EXPECT_EQ(kRows, static_cast<int>(documented.size())) << "an action is missing from this test or from §7.1";
  InstanceAction a{};
  EXPECT_CODE(ParseInstanceAction("Open", &a), kInvalidArgument);
  EXPECT_STREQ(InstanceActionName(static_cast<InstanceAction>(200)), "unknown");
  EXPECT_EQ(InstanceActionAccess(InstanceAction::kStatus), ActionAccess::kTaskOwnNamespace);
  EXPECT_EQ(InstanceActionAccess(InstanceAction::kDiscardAfter), ActionAccess::kWorkers);
  EXPECT_EQ(InstanceActionAccess(InstanceAction::kDrop), ActionAccess::kInfrastructure);
}

}  // namespace
}  // namespace rhino
