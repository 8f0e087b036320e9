// Helpers the C++ unit tests share (docs/testing.md). Test-only: never linked
// into the extension.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "rhino/status.h"

namespace rhino::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it
// when the object goes out of scope.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path()/name
  std::string Sub(const std::string& name) const;

 private:
  std::string path_;
};

}  // namespace rhino::testing

// EXPECT_OK(status) / ASSERT_OK(status): the message is printed on failure.
#define EXPECT_OK(expr)                                    \
  do {                                                     \
    const ::rhino::Status _s = (expr);                     \
    EXPECT_TRUE(_s.ok()) << _s.ToString();                 \
  } while (0)
#define ASSERT_OK(expr)                                    \
  do {                                                     \
    const ::rhino::Status _s = (expr);                     \
    ASSERT_TRUE(_s.ok()) << _s.ToString();                 \
  } while (0)
// The status is an error of the given Status::Code (kInvalidArgument, ...).
#define EXPECT_CODE(expr, code_name)                                 \
  do {                                                               \
    const ::rhino::Status _s = (expr);                               \
    EXPECT_EQ(_s.code(), ::rhino::Status::Code::code_name) << _s.ToString(); \
  } while (0)
