#include "net/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <fstream>

namespace rhino::net {
namespace {

Status Readable(const std::string& path, const char* what) {
  if (path.empty()) return Status::InvalidArgument(std::string("TLS needs ") + what + " as well");
  std::ifstream f(path);
  if (!f.good()) return Status::InvalidArgument(std::string("cannot read the TLS ") + what + " " + path);
  return Status::OK();
}

std::string OpenSslReason() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "no reason given";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

}  // namespace

Status MakeTlsContext(const TlsFiles& files, TlsContext* out) {
  out->reset();
  if (!files.enabled()) return Status::OK();
  Status s = Readable(files.cert_file, "certificate (cert_file)");
  if (s.ok()) s = Readable(files.key_file, "private key (key_file)");
  if (s.ok()) s = Readable(files.ca_file, "CA certificate (ca_file)");
  if (!s.ok()) return s;
  auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls);
  SSL_CTX* native = ctx->native_handle();
  ERR_clear_error();
  // TLS 1.3 only: every cipher suite it has is AEAD with forward secrecy.
  if (SSL_CTX_set_min_proto_version(native, TLS1_3_VERSION) != 1) {
    return Status::InvalidArgument("this OpenSSL cannot do TLS 1.3: " + OpenSslReason());
  }
  // No compression, no resumption: connections are long-lived, and a worker restart
  // gets a full handshake (with both certificates checked again). In TLS 1.3 a server
  // still sends tickets after the handshake unless their number is 0.
  SSL_CTX_set_options(native, SSL_OP_NO_COMPRESSION | SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_num_tickets(native, 0);
  SSL_CTX_set_session_cache_mode(native, SSL_SESS_CACHE_OFF);
  if (SSL_CTX_use_certificate_chain_file(native, files.cert_file.c_str()) != 1) {
    return Status::InvalidArgument("the TLS certificate " + files.cert_file + " is not a PEM certificate: " +
                                   OpenSslReason());
  }
  if (SSL_CTX_use_PrivateKey_file(native, files.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    const std::string reason = OpenSslReason();
    if (reason.find("key values mismatch") != std::string::npos) {  // OpenSSL 3 checks the pair here
      return Status::InvalidArgument("the TLS key " + files.key_file + " does not belong to the certificate " +
                                     files.cert_file);
    }
    return Status::InvalidArgument("the TLS key " + files.key_file + " is not a PEM private key: " + reason);
  }
  if (SSL_CTX_check_private_key(native) != 1) {
    return Status::InvalidArgument("the TLS key " + files.key_file + " does not belong to the certificate " +
                                   files.cert_file);
  }
  if (SSL_CTX_load_verify_locations(native, files.ca_file.c_str(), nullptr) != 1) {
    return Status::InvalidArgument("the TLS CA file " + files.ca_file + " holds no PEM certificate: " +
                                   OpenSslReason());
  }
  // Mutual: a server asks for the client's certificate and refuses a client without one.
  SSL_CTX_set_verify(native, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  *out = std::move(ctx);
  return Status::OK();
}

std::string DescribeTlsFailure(const asio::error_code& ec, SSL* ssl) {
  if (ssl != nullptr) {
    long v = SSL_get_verify_result(ssl);
    if (v != X509_V_OK) return std::string("certificate refused: ") + X509_verify_cert_error_string(v);
  }
  std::string what = ec.message();
  if (ec.category() == asio::error::get_ssl_category()) {
    const char* reason = ERR_reason_error_string(static_cast<unsigned long>(ec.value()));
    if (reason != nullptr) what = reason;
  }
  if (what.find("wrong version number") != std::string::npos || what.find("http request") != std::string::npos ||
      what.find("packet length too long") != std::string::npos) {
    what += " (the peer does not speak TLS)";
  }
  return what;
}

}  // namespace rhino::net
