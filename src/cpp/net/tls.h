// TLS on a Connection (docs/protocol.md §2, "TLS"): the context built once per
// process role from TlsFiles, and the words for a failed handshake.
#pragma once

#include <asio.hpp>
#include <asio/ssl.hpp>

#include <memory>
#include <string>

#include "rhino/status.h"
#include "rhino/tls.h"

namespace rhino::net {

using TlsContext = std::shared_ptr<asio::ssl::context>;

// A TLS 1.3-only context that presents `files`' certificate and requires the
// peer's, verified against `files.ca_file`. Every file is read now: a missing
// or unreadable file, a key that does not match the certificate, or a CA file
// without a certificate is InvalidArgument naming the file. `files` not
// enabled: *out is null (plaintext).
Status MakeTlsContext(const TlsFiles& files, TlsContext* out);

// Why a handshake failed, in words a user can act on: the certificate
// verification result when there is one ("certificate has expired", "IP
// address mismatch", "unable to get local issuer certificate"), else
// OpenSSL's reason ("wrong version number": a plaintext peer).
std::string DescribeTlsFailure(const asio::error_code& ec, SSL* ssl);

}  // namespace rhino::net
