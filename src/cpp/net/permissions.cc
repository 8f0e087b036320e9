#include "net/permissions.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>

namespace rhino::net {
namespace {

Status Denied(std::string_view server, const PeerIdentity& peer, const std::string& what, const std::string& why) {
  return Status::PermissionDenied(std::string(server) + " refused " + what + " from " + peer.Describe() + ": " + why);
}

// A task may touch the operators of its own namespace only.
Status OwnNamespace(std::string_view server, const PeerIdentity& peer, const std::string& what,
                    std::string_view operator_id) {
  std::string_view ns = NamespaceOf(operator_id);
  if (ns == peer.scope) return Status::OK();
  return Denied(server, peer, what,
                "operator " + std::string(operator_id) + " is in " +
                    (ns.empty() ? std::string("the default namespace") : "namespace " + std::string(ns)) +
                    ", and a task credential admits its own namespace only");
}

}  // namespace

std::string_view NamespaceOf(std::string_view operator_id) {
  size_t cut = operator_id.find("..");
  return cut == std::string_view::npos ? std::string_view() : operator_id.substr(0, cut);
}

Status PermitRequest(const PeerIdentity& peer, MessageType type, std::string_view operator_id,
                     std::string_view server, bool reader) {
  const std::string what = std::string(MessageTypeName(type)) + " for " + std::string(operator_id);
  switch (type) {
    case MessageType::kOpenStreamReq:
    case MessageType::kStoreQueryReq:
      if (peer.role == PeerRole::kTask) {
        return Denied(server, peer, what, "replication is for workers, the coordinator and the admin");
      }
      return Status::OK();
    case MessageType::kSessionOpenReq:
      if (peer.role == PeerRole::kWorker && !reader) {
        return Denied(server, peer, what, "a worker may open checkpoint readers (a base's reads), not sessions");
      }
      if (peer.role == PeerRole::kTask) return OwnNamespace(server, peer, what, operator_id);
      return Status::OK();
    default:
      return Denied(server, peer, what, "no role may send it to a worker");
  }
}

Status PermitInstanceAction(const PeerIdentity& peer, InstanceAction action, std::string_view operator_id,
                            std::string_view server) {
  if (peer.role == PeerRole::kAdmin || peer.role == PeerRole::kCoordinator) return Status::OK();
  const std::string what = std::string("InstanceReq ") + InstanceActionName(action) + " of " +
                           (operator_id.empty() ? std::string("(no operator)") : std::string(operator_id));
  const ActionAccess access = InstanceActionAccess(action);
  if (peer.role == PeerRole::kWorker) {
    if (access == ActionAccess::kWorkers) return Status::OK();  // discard_after: a primary cleans its chain (§7.3)
    return Denied(server, peer, what, "a worker may only ask another for discard_after (its chain's clean-up)");
  }
  if (access == ActionAccess::kTaskOwnNamespace) return OwnNamespace(server, peer, what, operator_id);
  return Denied(server, peer, what, "a task may only ask for the status of its own operators' instances");
}

void LogRefusal(const Status& why) {
  static std::atomic<uint64_t> refused{0};
  static std::mutex mu;
  static std::chrono::steady_clock::time_point last;
  const uint64_t n = refused.fetch_add(1) + 1;
  std::lock_guard<std::mutex> l(mu);
  const auto now = std::chrono::steady_clock::now();
  if (n > 1 && now - last < std::chrono::seconds(1)) return;
  last = now;
  std::fprintf(stderr, "rhino: permission denied: %s (%llu refused so far)\n", why.message().c_str(),
               static_cast<unsigned long long>(n));
}

}  // namespace rhino::net
