// Mutual HMAC-SHA256 authentication over fresh nonces (docs/protocol.md §2),
// on OpenSSL. Pure helpers: the exchange itself is run by Connection.
#pragma once

#include <string>
#include <string_view>

#include "rhino/status.h"

namespace rhino::net {

// kNonceBytes (16) bytes from OpenSSL's CSPRNG (RAND_bytes).
Status NewNonce(std::string* nonce);

// HMAC(secret, "rhino-server" ‖ client_nonce ‖ server_nonce): proves to the
// client that the server knows the secret.
std::string ServerMac(std::string_view secret, std::string_view client_nonce,
                      std::string_view server_nonce);
// HMAC(secret, "rhino-client" ‖ server_nonce ‖ client_nonce). The labels and
// the nonce order differ, so neither side can replay the other's mac.
std::string ClientMac(std::string_view secret, std::string_view server_nonce,
                      std::string_view client_nonce);

// Constant-time comparison (CRYPTO_memcmp); false if the sizes differ.
bool MacEquals(std::string_view a, std::string_view b);

}  // namespace rhino::net
