// Status: the error value every fallible Rhino call returns (LevelDB style).
//
// A Status is either ok() or carries a Code and a human-readable message.
// Errors never cross into Python as raw C++ exceptions: bindings/errors.cc maps
// each Code to one Python exception class, in one table.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace rhino {

class Status {
 public:
  // Stable numeric codes: bindings/errors.cc and rhino/errors.py key on them.
  enum class Code : int {
    kOk = 0,
    kNotFound = 1,         // a checkpoint, file or key that does not exist
    kCorruption = 2,       // checksum mismatch, truncated or malformed data
    kInvalidArgument = 3,  // a bad parameter (e.g. K not a power of two)
    kIOError = 4,          // the OS refused an operation
    kAlreadyExists = 5,    // a target that must not exist does
    kUnknownVnode = 6,     // a vnode this instance does not hold
    kKeyType = 7,          // a key of an unsupported type / dtype
    kPathOutsideStore = 8, // a path escaping the store directory
    kNoSpace = 9,          // ENOSPC / EDQUOT / EFBIG: the disk is full
    kBusy = 10,            // a lock is held by another process
    kTimeout = 11,         // a deadline passed (e.g. a chain did not ack in time)
    kPeerDead = 12,        // a peer closed its connection or stopped answering heartbeats
    kAborted = 13,         // a stream was aborted (by a peer, a cancel or a shutdown)
    kUnknownInstance = 14, // an instance the worker does not host (state service, protocol §7)
    kSessionBusy = 15,     // an instance already has an open session (protocol §7)
    kTlsFailed = 16,       // a TLS handshake failed: a certificate refused, or a plaintext peer (protocol §2)
    // Wire codes of docs/protocol.md §3: numbered apart so that they stay
    // stable whatever local codes are added above.
    kStaleChainVersion = 100,  // a frame of an older replica chain (fenced, protocol §5)
    kAuthFailed = 101,         // the peer does not know the shared secret (protocol §2)
    kStaleEpoch = 102,         // a request of an older configuration epoch (fenced, protocol §7.5)
  };

  Status() = default;
  static Status OK() { return Status(); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status InvalidArgument(std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); }
  static Status IOError(std::string msg) { return Status(Code::kIOError, std::move(msg)); }
  static Status AlreadyExists(std::string msg) { return Status(Code::kAlreadyExists, std::move(msg)); }
  static Status UnknownVnode(std::string msg) { return Status(Code::kUnknownVnode, std::move(msg)); }
  static Status KeyType(std::string msg) { return Status(Code::kKeyType, std::move(msg)); }
  static Status PathOutsideStore(std::string msg) { return Status(Code::kPathOutsideStore, std::move(msg)); }
  static Status NoSpace(std::string msg) { return Status(Code::kNoSpace, std::move(msg)); }
  static Status Busy(std::string msg) { return Status(Code::kBusy, std::move(msg)); }
  static Status Timeout(std::string msg) { return Status(Code::kTimeout, std::move(msg)); }
  static Status PeerDead(std::string msg) { return Status(Code::kPeerDead, std::move(msg)); }
  static Status Aborted(std::string msg) { return Status(Code::kAborted, std::move(msg)); }
  static Status StaleChainVersion(std::string msg) { return Status(Code::kStaleChainVersion, std::move(msg)); }
  static Status AuthFailed(std::string msg) { return Status(Code::kAuthFailed, std::move(msg)); }
  static Status UnknownInstance(std::string msg) { return Status(Code::kUnknownInstance, std::move(msg)); }
  static Status SessionBusy(std::string msg) { return Status(Code::kSessionBusy, std::move(msg)); }
  static Status TlsFailed(std::string msg) { return Status(Code::kTlsFailed, std::move(msg)); }
  static Status StaleEpoch(std::string msg) { return Status(Code::kStaleEpoch, std::move(msg)); }
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

// Returns early from the enclosing function if `expr` is not ok.
#define RHINO_RETURN_IF_ERROR(expr)        \
  do {                                     \
    ::rhino::Status _rhino_s = (expr);     \
    if (!_rhino_s.ok()) return _rhino_s;   \
  } while (0)

}  // namespace rhino
