#include "rhino/status.h"

#include <cerrno>
#include <cstring>

namespace rhino {

Status Status::FromErrno(int err, const std::string& context) {
  std::string msg = context + ": " + std::strerror(err);
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return NoSpace(msg);
    case ENOENT:
      return NotFound(msg);
    case EEXIST:
      return AlreadyExists(msg);
    default:
      return IOError(msg);
  }
}

Status Status::FromCode(uint32_t code, std::string msg) {
  switch (code) {
    case 0:
      return OK();
    // A case per row: two rows with one number are a duplicate case, which
    // does not compile.
#define RHINO_STATUS_CASE(name, number, python_class) case number:
    RHINO_STATUS_CODES(RHINO_STATUS_CASE)
#undef RHINO_STATUS_CASE
      return Status(static_cast<Code>(code), std::move(msg));
    default:
      return IOError("peer reported unknown error code " + std::to_string(code) + ": " + msg);
  }
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  const char* name = "Unknown";  // not printed: a Status only holds a row's code (FromCode checks)
  for (const StatusCodeInfo& row : kStatusCodes)
    if (row.code == code_) name = row.name;
  return std::string(name) + ": " + msg_;
}

}  // namespace rhino
