// Status: codes, messages and the errno mapping (a full disk is NoSpace).
#include "rhino/status.h"

#include <cerrno>

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

TEST(StatusTest, WireCodesRoundTrip) {
  for (auto code : {Status::Code::kStaleChainVersion, Status::Code::kAuthFailed, Status::Code::kStaleEpoch,
                    Status::Code::kNotFound, Status::Code::kCorruption}) {
    Status s = Status::FromCode(static_cast<uint32_t>(code), "m");
    EXPECT_EQ(s.code(), code);
    EXPECT_EQ(s.message(), "m");
  }
}

TEST(StatusTest, UnknownWireCodeIsIOErrorNamingTheNumber) {
  Status s = Status::FromCode(4242, "m");
  EXPECT_EQ(s.code(), Status::Code::kIOError);
  EXPECT_NE(s.message().find("4242"), std::string::npos) << s.message();
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
