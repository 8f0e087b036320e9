// Roles bound to a TLS certificate (docs/protocol.md §2, "TLS" and "Roles";
// issue 46): a certificate names the roles it admits as URI subject
// alternative names "rhino-role:<role>", one per role ("rhino-role:task").
// `rhino certs init` writes them (a host's certificate: admin, coordinator,
// worker; its task certificate: task), and a company CA can issue the same.
//
// Under TLS a server admits the role a client proves in the §2 handshake
// only if the client's certificate names it, or names no role at all (a CA
// that does not mark roles: the binding then rests on the keys alone).
#pragma once

#include <openssl/x509.h>

#include <string>
#include <string_view>
#include <vector>

#include "rhino/credential.h"
#include "rhino/status.h"

namespace rhino::net {

// The URI scheme of a role SAN; matched without regard to case, as URI
// schemes are (RFC 3986), the role name after it exactly.
inline constexpr std::string_view kRoleUriScheme = "rhino-role:";

// The roles `cert` names, in the order of its SANs, as written (a name that is
// no role is kept: it admits none). Empty when it names none, or `cert` is null.
std::vector<std::string> CertificateRoles(X509* cert);

// OK when a certificate naming `cert_roles` admits `role`: it names none, or
// names this one. Else PermissionDenied naming the server, the peer, the
// certificate's roles and the role asked ("worker w1 refused a connection
// from 127.0.0.1:5000 (spark-task-3): its TLS certificate admits the role
// task only, not admin").
Status CheckCertificateRole(const std::vector<std::string>& cert_roles, PeerRole role, std::string_view server,
                            std::string_view peer);

}  // namespace rhino::net
