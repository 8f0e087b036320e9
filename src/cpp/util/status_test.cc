// Status: codes, messages, the wire numbers of status_codes.h and the errno
// mapping (a full disk is NoSpace).
#include "rhino/status.h"

#include <cerrno>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace rhino {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kOk);
  EXPECT_TRUE(s.message().empty());
}

TEST(StatusTest, ErrorKeepsCodeAndMessage) {
  Status s = Status::InvalidArgument("K must be a power of two");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message(), "K must be a power of two");
  EXPECT_NE(s.ToString().find("K must be a power of two"), std::string::npos);
}

TEST(StatusTest, FullDiskErrnosAreNoSpace) {
  for (int err : {ENOSPC, EDQUOT, EFBIG}) {
    EXPECT_EQ(Status::FromErrno(err, "write").code(), Status::Code::kNoSpace) << err;
  }
  EXPECT_EQ(Status::FromErrno(EACCES, "open").code(), Status::Code::kIOError);
}

// Every row of status_codes.h: FromCode rebuilds it from its number (as a
// peer's answer is decoded), and ToString names it.
TEST(StatusTest, EveryCodeRoundTripsThroughItsNumberAndIsNamed) {
  for (const StatusCodeInfo& row : kStatusCodes) {
    Status s = Status::FromCode(static_cast<uint32_t>(row.code), "m");
    EXPECT_EQ(s.code(), row.code) << row.name;
    EXPECT_EQ(s.message(), "m") << row.name;
    EXPECT_EQ(s.ToString(), std::string(row.name) + ": m");
  }
  EXPECT_EQ(Status::FromCode(0, "m").ToString(), "OK");
}

// FromCode accepts exactly the list: any other number, in the gap before the
// wire codes included, is an IOError that keeps the number.
TEST(StatusTest, UnknownWireCodeIsIOErrorNamingTheNumber) {
  std::set<uint32_t> known = {0};
  for (const StatusCodeInfo& row : kStatusCodes) known.insert(static_cast<uint32_t>(row.code));
  std::vector<uint32_t> unknown = {4242, UINT32_MAX};
  for (uint32_t n = 0; n <= *known.rbegin() + 1; ++n)
    if (!known.count(n)) unknown.push_back(n);
  for (uint32_t n : unknown) {
    Status s = Status::FromCode(n, "m");
    EXPECT_EQ(s.code(), Status::Code::kIOError) << n;
    EXPECT_NE(s.message().find(std::to_string(n)), std::string::npos) << s.message();
  }
}

Status FailsAt(int step, int* reached) {
  for (int i = 0; i < 3; ++i) {
    *reached = i;
    RHINO_RETURN_IF_ERROR(i == step ? Status::Busy("step") : Status::OK());
  }
  return Status::OK();
}

TEST(StatusTest, ReturnIfErrorStopsAtTheFirstError) {
  int reached = -1;
  EXPECT_CODE(FailsAt(1, &reached), kBusy);
  EXPECT_EQ(reached, 1);
  EXPECT_OK(FailsAt(5, &reached));
  EXPECT_EQ(reached, 2);
}

}  // namespace
}  // namespace rhino
