// Credentials and roles (docs/protocol.md §2, "Roles"; issue 46).
//
// A peer proves one role in the §2 handshake, not the cluster's secret itself:
//
// - admin: the operator of the cluster (the CLI); every request;
// - coordinator: the control plane's requests to workers (open, takeover,
//   fence, reconfigure, discard, drop, bulk copies, status);
// - worker: chain replication and its clean-up on other workers, and, at the
//   coordinator, register and heartbeat as its own id only (its scope);
// - task: a Spark job's driver and tasks: sessions, checkpoint readers and
//   status of the operators of its own namespace (its scope) only, and the
//   job's batch calls at the coordinator.
//
// The key a role proves is derived from the cluster's root secret, so that a
// server, which holds the root, can check any role, and a holder of one
// role's key learns nothing of another's:
//
//   CredentialKey(root, role, scope) = HMAC-SHA256(root, "rhino-credential" 0x00 role 0x00 scope)
//
// A Spark task gets only its job's task key (never the root), so user code in
// a task can do no more than its job may.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "rhino/status.h"

namespace rhino {

enum class PeerRole : uint8_t { kAdmin = 0, kCoordinator = 1, kWorker = 2, kTask = 3 };

// "admin", "coordinator", "worker", "task".
const char* RoleName(PeerRole role);
// InvalidArgument for any other name.
Status ParseRole(std::string_view name, PeerRole* out);

// The key that `role` with `scope` proves (above); 32 bytes.
std::string CredentialKey(std::string_view root, PeerRole role, std::string_view scope);

// InvalidArgument unless `scope` fits `role`: a task's is a namespace
// ([A-Za-z0-9_-]{0,64}; empty: the default namespace), a worker's its worker id
// ([A-Za-z0-9_.:-]{1,128}), the admin's and the coordinator's empty.
Status CheckScope(PeerRole role, std::string_view scope);

// What a client proves in the handshake.
struct Credential {
  PeerRole role = PeerRole::kAdmin;
  std::string scope;
  std::string key;    // CredentialKey(root, role, scope); or, when `root`, the root secret itself
  bool root = false;  // the first handshake's form: no role named, the root proved as is (admin)

  // The credential of `role` with `scope`, derived from the cluster's root secret.
  static Credential FromRoot(std::string_view root, PeerRole role, std::string scope) {
    return Credential{role, scope, CredentialKey(root, role, scope), false};
  }
  // The admin as a holder of the root proves it: the handshake of before roles,
  // which every server takes as admin.
  static Credential Root(std::string root) { return Credential{PeerRole::kAdmin, "", std::move(root), true}; }
};

// Who a server's peer proved to be in the handshake.
struct PeerIdentity {
  PeerRole role = PeerRole::kAdmin;
  std::string scope;
  std::string id;       // the peer's name in HelloReq (a worker id, "spark-task-…"): informative
  std::string address;  // "ip:port" (or the Unix socket), for messages
  // "task of namespace jobA (spark-task-12 at 127.0.0.1:5000)", for errors and logs.
  std::string Describe() const;
};

}  // namespace rhino
