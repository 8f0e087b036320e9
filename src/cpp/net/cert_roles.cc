#include "net/cert_roles.h"

#include <openssl/x509v3.h>
#include <strings.h>

#include <algorithm>

namespace rhino::net {

std::vector<std::string> CertificateRoles(X509* cert) {
  std::vector<std::string> out;
  if (cert == nullptr) return out;
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (names == nullptr) return out;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    if (n->type != GEN_URI) continue;
    const ASN1_STRING* s = n->d.uniformResourceIdentifier;
    // By length, not strlen: an embedded NUL must not cut a name short.
    std::string uri(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                    static_cast<size_t>(ASN1_STRING_length(s)));
    if (uri.size() < kRoleUriScheme.size() ||
        ::strncasecmp(uri.data(), kRoleUriScheme.data(), kRoleUriScheme.size()) != 0) {
      continue;
    }
    out.push_back(uri.substr(kRoleUriScheme.size()));
  }
  GENERAL_NAMES_free(names);
  return out;
}

Status CheckCertificateRole(const std::vector<std::string>& cert_roles, PeerRole role, std::string_view server,
                            std::string_view peer) {
  if (cert_roles.empty()) return Status::OK();
  if (std::find(cert_roles.begin(), cert_roles.end(), RoleName(role)) != cert_roles.end()) return Status::OK();
  std::string named;
  for (const std::string& r : cert_roles) {
    if (!named.empty()) named += ", ";
    // A certificate is anybody's text: keep the message printable and short.
    std::string shown = r.substr(0, 64);
    for (char& c : shown) {
      if (c < 0x20 || c > 0x7e) c = '?';
    }
    named += shown;
  }
  return Status::PermissionDenied(std::string(server) + " refused a connection from " + std::string(peer) +
                                  ": its TLS certificate admits the role" + (cert_roles.size() > 1 ? "s " : " ") +
                                  named + " only, not " + RoleName(role));
}

}  // namespace rhino::net
