#include "net/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "net/messages.h"

namespace rhino::net {
namespace {

std::string Hmac(std::string_view secret, std::string_view label, std::string_view a, std::string_view b) {
  std::string msg;
  msg.reserve(label.size() + a.size() + b.size());
  msg.append(label).append(a).append(b);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  // An empty key is legal for HMAC; OpenSSL wants a non-null pointer for it.
  static const unsigned char kEmpty = 0;
  const void* key = secret.empty() ? static_cast<const void*>(&kEmpty) : secret.data();
  if (HMAC(EVP_sha256(), key, static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &out_len) == nullptr) {
    return std::string();  // never equal to a real mac (MacEquals checks sizes)
  }
  return std::string(reinterpret_cast<const char*>(out), out_len);
}

}  // namespace

Status NewNonce(std::string* nonce) {
  nonce->assign(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce->data()), static_cast<int>(kNonceBytes)) != 1) {
    return Status::IOError("RAND_bytes failed: no randomness for an authentication nonce");
  }
  return Status::OK();
}

std::string ServerMac(std::string_view secret, std::string_view client_nonce, std::string_view server_nonce) {
  return Hmac(secret, "rhino-server", client_nonce, server_nonce);
}

std::string ClientMac(std::string_view secret, std::string_view server_nonce, std::string_view client_nonce) {
  return Hmac(secret, "rhino-client", server_nonce, client_nonce);
}

bool MacEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size() || a.size() != kMacBytes) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace rhino::net
