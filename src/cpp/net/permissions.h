// The role table of docs/protocol.md §2, "Roles" (issue 46): which requests
// a worker serves to which role. One function per kind of request, called
// where the request is first decoded, before it touches anything; a refusal
// is a PermissionDenied naming the request and the peer, logged by
// LogRefusal, and the worker serves on.
//
//   request (protocol §3)           admin  coordinator  worker  task
//   OpenStreamReq (replication)       ✓        ✓          ✓
//   StoreQueryReq                     ✓        ✓          ✓
//   InstanceReq discard_after         ✓        ✓          ✓     (a primary cleans its chain, §7.3)
//   InstanceReq status                ✓        ✓                  own namespace
//   InstanceReq, any other action     ✓        ✓
//   SessionOpenReq, a session         ✓        ✓                  own namespace
//   SessionOpenReq, a reader          ✓        ✓          ✓     own namespace
//
// A worker reads a checkpoint of another worker's store for a vnode it took
// on a base (the early hand-over, issue 48: design §4.1); it never opens a
// session, which writes.
//
// A task's namespace is its credential's scope; an operator's is the part of
// its id before the first "..", none for an id without one (the default
// namespace, rhino/coordinator/naming.py).
#pragma once

#include <string>
#include <string_view>

#include "net/frame.h"
#include "net/service_messages.h"
#include "rhino/credential.h"
#include "rhino/status.h"

namespace rhino::net {

// The namespace of an operator id: before its first "..", else "" (the default).
std::string_view NamespaceOf(std::string_view operator_id);

// OpenStreamReq, StoreQueryReq, SessionOpenReq (a session, or a checkpoint
// reader if `reader`).
Status PermitRequest(const PeerIdentity& peer, MessageType type, std::string_view operator_id,
                     std::string_view server, bool reader = false);
// InstanceReq.
Status PermitInstanceAction(const PeerIdentity& peer, InstanceAction action, std::string_view operator_id,
                            std::string_view server);

// Logs a refusal on stderr, at most once a second for the process, with the
// number refused so far: a flood of refused requests must not flood the log.
void LogRefusal(const Status& why);

}  // namespace rhino::net
