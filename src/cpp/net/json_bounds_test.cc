// The JSON a peer sends is bounded in depth before any DOM is built, and a
// reconfigure's steps are decoded from the parsed node (no text round trip):
// a 100,000-level `ops` once crashed a worker with a stack overflow.
#include "net/json_bounds.h"

#include <string>

#include "net/service_messages.h"
#include "testing/test_util.h"

namespace rhino {
namespace {

std::string Nested(int levels, const std::string& open = "[", const std::string& close = "]") {
  std::string s;
  for (int i = 0; i < levels; ++i) s += open;
  for (int i = 0; i < levels; ++i) s += close;
  return s;
}

bool Mentions(const Status& s, const std::string& what) { return s.message().find(what) != std::string::npos; }

TEST(JsonBoundsTest, ScalarsAndFlatDocumentsPass) {
  EXPECT_OK(CheckJson("1", 0, "x"));
  EXPECT_OK(CheckJson("\"a\"", 0, "x"));
  EXPECT_OK(CheckJson("{}", 1, "x"));
  EXPECT_OK(CheckJson("{\"a\": [1, 2, 3]}", 2, "x"));
}

TEST(JsonBoundsTest, DepthExactlyAtTheBoundPassesOneMoreIsRefused) {
  EXPECT_OK(CheckJson(Nested(8), 8, "x"));
  Status s = CheckJson(Nested(9), 8, "the request's arguments");
  EXPECT_CODE(s, kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "nested deeper than 8 levels")) << s.ToString();
  EXPECT_TRUE(Mentions(s, "the request's arguments")) << s.ToString();
}

TEST(JsonBoundsTest, ObjectsCountLikeArrays) {
  std::string doc = "{\"a\":{\"a\":{\"a\":{}}}}";  // 4 levels
  EXPECT_OK(CheckJson(doc, 4, "x"));
  EXPECT_CODE(CheckJson(doc, 3, "x"), kInvalidArgument);
}

TEST(JsonBoundsTest, BracketsInsideStringsAreNotNesting) {
  EXPECT_OK(CheckJson("{\"a\": \"[[[[[[[[[[[[[[[[{{{{{{{{\"}", 1, "x"));
}

TEST(JsonBoundsTest, AHundredThousandLevelsAreRefusedWithoutACrash) {
  EXPECT_CODE(CheckJson(Nested(100000), kMaxCoordArgsDepth, "x"), kInvalidArgument);
  EXPECT_CODE(CheckJson(Nested(100000, "{\"a\":", "}"), kMaxCoordArgsDepth, "x"), kInvalidArgument);
}

TEST(JsonBoundsTest, NotJsonNamesTheOffset) {
  Status s = CheckJson("{\"a\": [1, 2,, 3]}", 8, "the args of status");
  EXPECT_CODE(s, kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "not a JSON document (at byte")) << s.ToString();
  EXPECT_TRUE(Mentions(s, "the args of status")) << s.ToString();
  EXPECT_CODE(CheckJson("", 8, "x"), kInvalidArgument);
  EXPECT_CODE(CheckJson("{} {}", 8, "x"), kInvalidArgument);  // one document, not two
  EXPECT_CODE(CheckJson("\"\xff\xfe\"", 8, "x"), kInvalidArgument);  // not UTF-8
}

TEST(JsonBoundsTest, ParseJsonBoundedGivesTheDocument) {
  nlohmann::json j;
  ASSERT_OK(ParseJsonBounded("{\"a\": [1, {\"b\": null}]}", 3, "x", &j));
  EXPECT_EQ(j["a"][0].get<int>(), 1);
  EXPECT_TRUE(j["a"][1]["b"].is_null());
  EXPECT_CODE(ParseJsonBounded("[[[[1]]]]", 3, "x", &j), kInvalidArgument);
}

// ---- the instance arguments (protocol §7.1) --------------------------------

TEST(InstanceArgsTest, ReconfigureDecodesItsSteps) {
  ReconfigureArgs a;
  ASSERT_OK(DecodeInstanceArgs(
      R"({"version": 7, "timeout_s": 3.5, "ops": [{"op": "drop", "vnodes": [1, 2]},
          {"op": "import", "from_operator": "q8", "from_instance": 2, "checkpoint": 6, "vnodes": [9]}]})",
      &a));
  EXPECT_EQ(a.version, 7u);
  EXPECT_DOUBLE_EQ(a.timeout_s, 3.5);
  ASSERT_EQ(a.ops.size(), 2u);
  EXPECT_EQ(a.ops[0].kind, ReconfigOp::Kind::kDrop);
  EXPECT_EQ(a.ops[0].vnodes, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(a.ops[1].kind, ReconfigOp::Kind::kImport);
  EXPECT_EQ(a.ops[1].from_operator, "q8");
  EXPECT_EQ(a.ops[1].from_instance, 2u);
  EXPECT_EQ(a.ops[1].checkpoint, 6u);
  EXPECT_EQ(a.ops[1].vnodes, (std::vector<uint32_t>{9}));
}

// The request that crashed a worker: a reconfigure whose `ops` nest 100,000
// levels deep (about 200 KB). It is refused as InvalidArgument, and the
// process is still here to say so.
TEST(InstanceArgsTest, DeeplyNestedReconfigureOpsAreRefused) {
  const std::string text = "{\"version\": 1, \"ops\": " + Nested(100000) + "}";
  ASSERT_GT(text.size(), 200000u);
  ReconfigureArgs a;
  Status s = DecodeInstanceArgs(text, &a);
  EXPECT_CODE(s, kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "nested deeper than")) << s.ToString();
  EXPECT_CODE(DecodeInstanceArgsOf(InstanceAction::kReconfigure, text), kInvalidArgument);
}

TEST(InstanceArgsTest, DeeplyNestedTakeoverRedoIsRefused) {
  const std::string text = "{\"redo_version\": 3, \"redo\": " + Nested(100000) + "}";
  TakeoverArgs a;
  EXPECT_CODE(DecodeInstanceArgs(text, &a), kInvalidArgument);
}

TEST(InstanceArgsTest, EveryActionRefusesDeepArguments) {
  const std::string text = "{\"x\": " + Nested(50000, "{\"y\":", "}") + "}";
  for (int a = 1; a <= 12; ++a) {
    const Status s = DecodeInstanceArgsOf(static_cast<InstanceAction>(a), text);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << "action " << a << ": " << s.ToString();
  }
}

TEST(InstanceArgsTest, StepsThatAreNotObjectsAreRefused) {
  ReconfigureArgs a;
  EXPECT_CODE(DecodeInstanceArgs(R"({"version": 1, "ops": [[{"op": "drop", "vnodes": [1]}]]})", &a),
              kInvalidArgument);
  EXPECT_CODE(DecodeInstanceArgs(R"({"version": 1, "ops": {"op": "drop"}})", &a), kInvalidArgument);
  EXPECT_CODE(DecodeInstanceArgs(R"({"version": 1, "ops": [{"op": "rename", "vnodes": [1]}]})", &a),
              kInvalidArgument);
  EXPECT_CODE(DecodeInstanceArgs(R"({"version": 1})", &a), kInvalidArgument);
}

TEST(InstanceArgsTest, ImportStepsCheckTheOperatorId) {
  ReconfigureArgs a;
  Status s = DecodeInstanceArgs(
      R"({"version": 1, "ops": [{"op": "import", "from_operator": "../etc", "from_instance": 0,
          "checkpoint": 1, "vnodes": [0]}]})",
      &a);
  EXPECT_CODE(s, kInvalidArgument);
  EXPECT_TRUE(Mentions(s, "invalid operator id")) << s.ToString();
}

TEST(InstanceArgsTest, TextStepsRoundTripThroughTheirJson) {
  std::vector<ReconfigOp> ops(2);
  ops[0].kind = ReconfigOp::Kind::kDrop;
  ops[0].vnodes = {0, 4294967295u};
  ops[1].kind = ReconfigOp::Kind::kImport;
  ops[1].from_operator = "clicks";
  ops[1].from_instance = 3;
  ops[1].checkpoint = 18446744073709551615ull;
  ops[1].vnodes = {5};
  std::vector<ReconfigOp> back;
  ASSERT_OK(ParseReconfigOps(std::string_view(ReconfigOpsJson(ops)), &back));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].vnodes, ops[0].vnodes);
  EXPECT_EQ(back[1].from_operator, "clicks");
  EXPECT_EQ(back[1].checkpoint, ops[1].checkpoint);
  EXPECT_CODE(ParseReconfigOps(std::string_view(Nested(100000)), &back), kInvalidArgument);
  EXPECT_TRUE(back.empty());
}

TEST(InstanceArgsTest, ArgumentsMustBeAnObject) {
  NoArgs n;
  EXPECT_OK(DecodeInstanceArgs("", &n));
  EXPECT_OK(DecodeInstanceArgs("{}", &n));
  EXPECT_CODE(DecodeInstanceArgs("[]", &n), kInvalidArgument);
  EXPECT_CODE(DecodeInstanceArgs("{", &n), kInvalidArgument);
}

}  // namespace
}  // namespace rhino
