// TlsFiles: where a process's TLS identity is (docs/protocol.md §2, "TLS").
//
// With a certificate set, every TCP connection the process opens or accepts
// runs TLS 1.3 with mutual authentication: each side presents its
// certificate, and each refuses a peer whose certificate does not chain to
// `ca_file` or has expired; a client also refuses a server whose certificate
// does not name the host it dialled. The shared-secret handshake of §2 then
// runs inside the TLS channel, as authorization. Unix sockets never use TLS
// (owner-only files, the secret suffices).
#pragma once

#include <string>

namespace rhino {

struct TlsFiles {
  std::string cert_file;  // PEM: this host's certificate (and any intermediates after it)
  std::string key_file;   // PEM: its private key
  std::string ca_file;    // PEM: the CA certificate(s) peers' certificates must chain to
  bool enabled() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
};

}  // namespace rhino
