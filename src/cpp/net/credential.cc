// rhino/credential.h: role names, the derived keys and the scopes' rules
// (docs/protocol.md §2, "Roles").
#include "rhino/credential.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "net/messages.h"

namespace rhino {
namespace {

constexpr size_t kMaxNamespaceBytes = 64;  // rhino/coordinator/naming.py

bool NamespaceChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

}  // namespace

const char* RoleName(PeerRole role) {
  switch (role) {
    case PeerRole::kAdmin: return "admin";
    case PeerRole::kCoordinator: return "coordinator";
    case PeerRole::kWorker: return "worker";
    case PeerRole::kTask: return "task";
  }
  return "unknown";
}

Status ParseRole(std::string_view name, PeerRole* out) {
  for (PeerRole r : {PeerRole::kAdmin, PeerRole::kCoordinator, PeerRole::kWorker, PeerRole::kTask}) {
    if (name == RoleName(r)) {
      *out = r;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown role '" + std::string(name.substr(0, 32)) +
                                 "' (admin, coordinator, worker or task)");
}

std::string CredentialKey(std::string_view root, PeerRole role, std::string_view scope) {
  std::string msg = "rhino-credential";
  msg.push_back('\0');
  msg.append(RoleName(role));
  msg.push_back('\0');
  msg.append(scope);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  static const unsigned char kEmpty = 0;  // HMAC wants a non-null key pointer, even for an empty key
  const void* key = root.empty() ? static_cast<const void*>(&kEmpty) : root.data();
  if (HMAC(EVP_sha256(), key, static_cast<int>(root.size()), reinterpret_cast<const unsigned char*>(msg.data()),
           msg.size(), out, &out_len) == nullptr) {
    return std::string();  // proves nothing: a mac under it never matches one under a real key
  }
  return std::string(reinterpret_cast<const char*>(out), out_len);
}

Status CheckScope(PeerRole role, std::string_view scope) {
  switch (role) {
    case PeerRole::kAdmin:
    case PeerRole::kCoordinator:
      if (!scope.empty()) {
        return Status::InvalidArgument(std::string("the ") + RoleName(role) + " role has no scope");
      }
      return Status::OK();
    case PeerRole::kTask:
      if (scope.size() > kMaxNamespaceBytes) {
        return Status::InvalidArgument("a task's namespace is at most 64 bytes");
      }
      for (char c : scope) {
        if (!NamespaceChar(c)) return Status::InvalidArgument("a task's namespace is [A-Za-z0-9_-]{0,64}");
      }
      return Status::OK();
    case PeerRole::kWorker:
      if (scope.empty() || scope.size() > kMaxWorkerIdBytes) {
        return Status::InvalidArgument("a worker's scope is its worker id: 1 to 256 bytes");
      }
      for (char c : scope) {
        if (static_cast<unsigned char>(c) < 0x21 || c == 0x7f) {
          return Status::InvalidArgument("a worker id has no spaces or control characters");
        }
      }
      return Status::OK();
  }
  return Status::InvalidArgument("unknown role");
}

std::string PeerIdentity::Describe() const {
  std::string out = RoleName(role);
  if (role == PeerRole::kTask) {
    out += scope.empty() ? " of the default namespace" : " of namespace " + scope;
  } else if (role == PeerRole::kWorker) {
    out += " " + scope;
  }
  out += " (" + (id.empty() ? std::string("?") : id) + " at " + (address.empty() ? std::string("?") : address) + ")";
  return out;
}

}  // namespace rhino
