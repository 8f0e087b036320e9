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
    case 0: return OK();
    case 1: case 2: case 3: case 4: case 5: case 6: case 7: case 8: case 9: case 10:
    case 11: case 12: case 13: case 14: case 15: case 16: case 100: case 101: case 102:
      return Status(static_cast<Code>(code), std::move(msg));
    default:
      return IOError("peer reported unknown error code " + std::to_string(code) + ": " + msg);
  }
}

std::string Status::ToString() const {
  const char* name = "Unknown";
  switch (code_) {
    case Code::kOk: name = "OK"; break;
    case Code::kNotFound: name = "NotFound"; break;
    case Code::kCorruption: name = "Corruption"; break;
    case Code::kInvalidArgument: name = "InvalidArgument"; break;
    case Code::kIOError: name = "IOError"; break;
    case Code::kAlreadyExists: name = "AlreadyExists"; break;
    case Code::kUnknownVnode: name = "UnknownVnode"; break;
    case Code::kKeyType: name = "KeyType"; break;
    case Code::kPathOutsideStore: name = "PathOutsideStore"; break;
    case Code::kNoSpace: name = "NoSpace"; break;
    case Code::kBusy: name = "Busy"; break;
    case Code::kTimeout: name = "Timeout"; break;
    case Code::kUnknownInstance: name = "UnknownInstance"; break;
    case Code::kSessionBusy: name = "SessionBusy"; break;
    case Code::kTlsFailed: name = "TlsFailed"; break;
    case Code::kStaleEpoch: name = "StaleEpoch"; break;
    case Code::kPeerDead: name = "PeerDead"; break;
    case Code::kAborted: name = "Aborted"; break;
    case Code::kStaleChainVersion: name = "StaleChainVersion"; break;
    case Code::kAuthFailed: name = "AuthFailed"; break;
  }
  return ok() ? std::string(name) : std::string(name) + ": " + msg_;
}

}  // namespace rhino
