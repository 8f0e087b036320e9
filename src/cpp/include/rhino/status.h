// Status: the error value every fallible Rhino call returns (LevelDB style).
//
// A Status is either ok() or carries a Code and a human-readable message.
// The codes are listed once, in status_codes.h. Errors never cross into Python
// as raw C++ exceptions: bindings/errors.cc maps each Code to one Python
// exception class, by that list.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "rhino/status_codes.h"

namespace rhino {

class Status {
 public:
  // Stable numeric codes, one per row of RHINO_STATUS_CODES: they travel on
  // the wire, and bindings/errors.cc and rhino/errors.py key on them.
  enum class Code : int {
    kOk = 0,
#define RHINO_STATUS_ENUMERATOR(name, number, python_class) k##name = number,
    RHINO_STATUS_CODES(RHINO_STATUS_ENUMERATOR)
#undef RHINO_STATUS_ENUMERATOR
  };

  Status() = default;
  static Status OK() { return Status(); }
  // One factory per row: Status::NotFound(msg), Status::Corruption(msg), ...
#define RHINO_STATUS_FACTORY(name, number, python_class) \
  static Status name(std::string msg) { return Status(Code::k##name, std::move(msg)); }
  RHINO_STATUS_CODES(RHINO_STATUS_FACTORY)
#undef RHINO_STATUS_FACTORY

  // Rebuilds a Status from a code received on the wire (docs/protocol.md §3).
  // An unknown code becomes IOError, keeping the number in the message.
  static Status FromCode(uint32_t code, std::string msg);

  // Maps an errno from a failed syscall to a Status; ENOSPC/EDQUOT/EFBIG become
  // NoSpace so that a full disk is reported as such, not as a generic I/O error.
  static Status FromErrno(int err, const std::string& context);

  bool ok() const { return code_ == Code::kOk; }
  bool IsNotFound() const { return code_ == Code::kNotFound; }
  bool IsBusy() const { return code_ == Code::kBusy; }
  bool IsAlreadyExists() const { return code_ == Code::kAlreadyExists; }
  bool IsStaleChainVersion() const { return code_ == Code::kStaleChainVersion; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  std::string ToString() const;

 private:
  Status(Code code, std::string msg) : code_(code), msg_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string msg_;
};

// One row of RHINO_STATUS_CODES, for what walks every code: ToString, the
// Python bindings (the exception table, rhino._core.status_codes()) and tests.
struct StatusCodeInfo {
  Status::Code code;
  const char* name;          // the factory's name, which ToString prints
  const char* python_class;  // the class it raises in rhino/errors.py
};
#define RHINO_STATUS_CODE_INFO(name, number, python_class) {Status::Code::k##name, #name, python_class},
inline constexpr StatusCodeInfo kStatusCodes[] = {RHINO_STATUS_CODES(RHINO_STATUS_CODE_INFO)};
#undef RHINO_STATUS_CODE_INFO

// Returns early from the enclosing function if `expr` is not ok.
#define RHINO_RETURN_IF_ERROR(expr)        \
  do {                                     \
    ::rhino::Status _rhino_s = (expr);     \
    if (!_rhino_s.ok()) return _rhino_s;   \
  } while (0)

}  // namespace rhino
