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

std::string Status::ToString() const {
  static const char* kNames[] = {"OK",           "NotFound",         "Corruption", "InvalidArgument",
                                 "IOError",      "AlreadyExists",    "UnknownVnode", "KeyType",
                                 "PathOutsideStore", "NoSpace",      "Busy"};
  int c = static_cast<int>(code_);
  std::string name = (c >= 0 && c < static_cast<int>(sizeof(kNames) / sizeof(kNames[0])))
                         ? kNames[c] : "Unknown";
  return ok() ? name : name + ": " + msg_;
}

}  // namespace rhino
