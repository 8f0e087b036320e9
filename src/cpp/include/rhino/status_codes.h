// RHINO_STATUS_CODES: the one list of Rhino's status codes (issue 44).
//
// Everything in C++ that enumerates the codes is generated from it: the
// Status::Code enum and its factories (status.h), the names of
// Status::ToString and the codes Status::FromCode accepts (status.cc), and the
// code -> exception table of bindings/errors.cc, which
// rhino._core.status_codes() also hands to Python. What cannot be generated,
// the classes of rhino/errors.py and the table of docs/protocol.md §3,
// tests/test_status_codes.py checks against it: a new code is a row here, its
// class there and its line in that table.
//
// A row is X(Name, number, "PythonClass"): Status::Code::kName = number, made
// by Status::Name(msg), raised in Python as rhino.errors.PythonClass. The
// numbers travel on the wire (docs/protocol.md §3): never renumber a row or
// reuse a number; two rows with one number fail to compile (FromCode switches
// on them). kOk (0) is not a row: it has no message, no factory taking one and
// no exception.
//
// The row comments are /* */ because a // comment would swallow the line's
// trailing backslash.
#pragma once

#define RHINO_STATUS_CODES(X)                                                                                        \
  X(NotFound, 1, "NotFoundError")                     /* a checkpoint, file or key that does not exist */            \
  X(Corruption, 2, "CorruptionError")                 /* checksum mismatch, truncated or malformed data */           \
  X(InvalidArgument, 3, "InvalidArgumentError")       /* a bad parameter (e.g. K not a power of two) */              \
  X(IOError, 4, "RhinoIOError")                       /* the OS refused an operation */                              \
  X(AlreadyExists, 5, "AlreadyExistsError")           /* a target that must not exist does */                        \
  X(UnknownVnode, 6, "UnknownVnodeError")             /* a vnode this instance does not hold */                      \
  X(KeyType, 7, "KeyTypeError")                       /* a key of an unsupported type / dtype */                     \
  X(PathOutsideStore, 8, "PathOutsideStoreError")     /* a path escaping the store directory */                      \
  X(NoSpace, 9, "NoSpaceError")                       /* ENOSPC / EDQUOT / EFBIG: the disk is full */                \
  X(Busy, 10, "BusyError")                            /* a lock is held by another process */                        \
  X(Timeout, 11, "RhinoTimeoutError")                 /* a deadline passed (e.g. a chain did not ack in time) */     \
  X(PeerDead, 12, "PeerDeadError")                    /* a peer closed its connection or missed its heartbeats */    \
  X(Aborted, 13, "AbortedError")                      /* a stream was aborted (by a peer, a cancel, a shutdown) */   \
  X(UnknownInstance, 14, "UnknownInstanceError")      /* an instance the worker does not host (protocol §7) */       \
  X(SessionBusy, 15, "SessionBusyError")              /* an instance already has an open session (protocol §7) */    \
  X(TlsFailed, 16, "TLSError")                        /* a TLS handshake failed: a refused certificate, plaintext */ \
  X(OperatorRunning, 17, "OperatorRunningError")      /* a query runs the operator: not dropped (protocol §8.2) */  \
  X(ResourceExhausted, 18, "ResourceExhaustedError")  /* a bound on what a peer may hold was hit (protocol §2) */  \
  X(PermissionDenied, 19, "PermissionDeniedError")    /* the peer's role may not make this request (§2 Roles) */   \
  /* Wire codes of docs/protocol.md §3: numbered apart so that they stay stable */                                   \
  /* whatever local codes are added above. */                                                                        \
  X(StaleChainVersion, 100, "StaleChainVersionError") /* a frame of an older replica chain (fenced, §5) */           \
  X(AuthFailed, 101, "AuthFailedError")               /* the peer does not know the shared secret (§2) */            \
  X(StaleEpoch, 102, "StaleEpochError")               /* a request of an older configuration epoch (fenced, §7.5) */ \
  X(StaleAttempt, 103, "StaleAttemptError")           /* a session of a superseded attempt or committed batch (§7.2) */
