// The coordinator's messages (docs/protocol.md §8.1): CoordReq's layout and
// method alphabet, the size limits of args and result, CoordRsp's layout,
// and the decoder's refusals (Corruption, §1 step 6). `args` and `result` are
// opaque bytes to these decoders: whether they are JSON is not checked here.
#include "net/coord_messages.h"

#include <string>

#include "net/messages.h"
#include "testing/test_util.h"

namespace rhino {
namespace {

using testing::IsCorruption;
using testing::Str;
using testing::U32;

TEST(CoordMessagesTest, RequestAndAnswerMatchTheDocumentedLayout) {
  CoordReq q;
  q.method = "commit_batch";
  q.args = "ARGS";
  EXPECT_EQ(q.Encode(), Str("commit_batch") + Str("ARGS"));
  CoordReq qb;
  ASSERT_OK(CoordReq::Decode(Str("begin_batch") + Str(""), &qb));
  EXPECT_EQ(qb.method, "begin_batch");
  EXPECT_TRUE(qb.args.empty());

  CoordRsp r;
  r.code = 14;  // UnknownInstance
  r.message = "unknown operator";
  r.result = "";
  EXPECT_EQ(r.Encode(), U32(14) + Str("unknown operator") + Str(""));
  CoordRsp rb;
  ASSERT_OK(CoordRsp::Decode(U32(UINT32_MAX) + Str("m") + Str("RESULT"), &rb));
  EXPECT_EQ(rb.code, UINT32_MAX);
  EXPECT_EQ(rb.message, "m");
  EXPECT_EQ(rb.result, "RESULT");
  // The re-encoding is the same bytes (the codec is canonical).
  EXPECT_EQ(rb.Encode(), U32(UINT32_MAX) + Str("m") + Str("RESULT"));
}

TEST(CoordMessagesTest, MethodMustBeOneTo64BytesOfLowercaseAndUnderscore) {
  for (std::string ok : {std::string("a"), std::string("_"), std::string("register_worker"),
                         std::string(kMaxCoordMethodBytes, 'z')}) {
    EXPECT_TRUE(IsValidCoordMethod(ok)) << ok;
    CoordReq q;
    EXPECT_OK(CoordReq::Decode(Str(ok) + Str("{}"), &q));
    EXPECT_EQ(q.method, ok);
  }
  for (std::string bad : {std::string(""), std::string("Begin"), std::string("begin-batch"),
                          std::string("a b"), std::string("batch2"), std::string("a\nb"),
                          std::string("a\0b", 3), std::string("\xc3\xa9"), std::string("{"),
                          std::string(kMaxCoordMethodBytes + 1, 'z')}) {
    EXPECT_FALSE(IsValidCoordMethod(bad)) << bad;
    CoordReq q;
    EXPECT_TRUE(IsCorruption(CoordReq::Decode(Str(bad) + Str("{}"), &q))) << bad;
  }
}

TEST(CoordMessagesTest, ArgsResultAndMessageLimits) {
  CoordReq q;
  EXPECT_EQ(kMaxCoordArgsBytes, size_t{1} << 20);         // §8.1: at most 1 MiB
  EXPECT_EQ(kMaxCoordResultBytes, size_t{16} << 20);      // and 16 MiB
  ASSERT_OK(CoordReq::Decode(Str("m") + Str(std::string(kMaxCoordArgsBytes, 'a')), &q));
  EXPECT_EQ(q.args.size(), kMaxCoordArgsBytes);
  EXPECT_TRUE(IsCorruption(CoordReq::Decode(Str("m") + Str(std::string(kMaxCoordArgsBytes + 1, 'a')), &q)));

  CoordRsp r;
  const std::string at_limit(kMaxCoordResultBytes, 'r');
  ASSERT_OK(CoordRsp::Decode(U32(0) + Str("") + Str(at_limit), &r));
  EXPECT_EQ(r.result.size(), kMaxCoordResultBytes);
  EXPECT_TRUE(IsCorruption(CoordRsp::Decode(U32(0) + Str("") + Str(at_limit + "r"), &r)));
  EXPECT_TRUE(IsCorruption(CoordRsp::Decode(U32(0) + Str(std::string(kMaxMessageBytes + 1, 'm')) + Str(""), &r)));

  // Encode cuts an overlong message so that the answer still decodes.
  CoordRsp longmsg;
  longmsg.code = 3;
  longmsg.message = std::string(kMaxMessageBytes + 100, 'm');
  longmsg.result = "x";
  CoordRsp back;
  ASSERT_OK(CoordRsp::Decode(longmsg.Encode(), &back));
  EXPECT_EQ(back.message, longmsg.message.substr(0, kMaxMessageBytes));
  EXPECT_EQ(back.result, "x");
}

TEST(CoordMessagesTest, EveryTruncationAndTrailingByteIsCorruption) {
  CoordReq q;
  q.method = "heartbeat";
  q.args = "{\"worker_id\": \"w1\"}";
  const std::string qp = q.Encode();
  CoordRsp r;
  r.code = 0;
  r.message = "ok";
  r.result = "{}";
  const std::string rp = r.Encode();
  for (size_t n = 0; n < qp.size(); ++n) {
    CoordReq t;
    EXPECT_TRUE(IsCorruption(CoordReq::Decode(std::string_view(qp).substr(0, n), &t))) << n;
  }
  for (size_t n = 0; n < rp.size(); ++n) {
    CoordRsp t;
    EXPECT_TRUE(IsCorruption(CoordRsp::Decode(std::string_view(rp).substr(0, n), &t))) << n;
  }
  CoordReq tq;
  EXPECT_TRUE(IsCorruption(CoordReq::Decode(qp + '\0', &tq)));
  CoordRsp tr;
  EXPECT_TRUE(IsCorruption(CoordRsp::Decode(rp + '\0', &tr)));
  // The fuzz target's path: both types decode and re-encode through DecodeServiceMessage.
  std::string again;
  ASSERT_OK(DecodeServiceMessage(MessageType::kCoordReq, qp, &again));
  EXPECT_EQ(again, qp);
  ASSERT_OK(DecodeServiceMessage(MessageType::kCoordRsp, rp, &again));
  EXPECT_EQ(again, rp);
  EXPECT_TRUE(IsCorruption(DecodeServiceMessage(MessageType::kCoordReq, Str("BAD") + Str(""), &again)));
}

}  // namespace
}  // namespace rhino
