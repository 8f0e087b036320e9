// libFuzzer target for what a TLS listener reads before any frame (docs/protocol.md
// §2, "TLS"): the bytes a worker's or the coordinator's server feeds OpenSSL from a
// peer it has not authenticated yet. An SSL server object made from the listener's
// own context (net/tls.cc MakeTlsContext: TLS 1.3 only, client certificate
// required) reads the input from a memory BIO and runs its handshake. Garbage, a
// truncated or mutated ClientHello, a plaintext frame: each must end in an error or
// a wait for more bytes, never a crash or a sanitizer report, and never a completed
// handshake (the client's Finished needs keys no input can hold). The reason the
// connection would report (DescribeTlsFailure) is computed too.
//
// The certificates come from $RHINO_FUZZ_TLS_DIR (`make fuzz` writes them there
// with `rhino certs init`); seeds in fuzz/corpus/tls (fuzz/make_corpus.py: a real
// ClientHello and its truncations).
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "net/tls.h"

namespace {
rhino::net::TlsContext* g_ctx = nullptr;
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("RHINO_FUZZ_TLS_DIR");
  if (dir == nullptr) {
    std::fprintf(stderr, "set RHINO_FUZZ_TLS_DIR to a directory made by `rhino certs init DIR --hosts 127.0.0.1`\n");
    std::abort();
  }
  const std::string d(dir);
  rhino::TlsFiles files{d + "/127.0.0.1.pem", d + "/127.0.0.1.key", d + "/ca.pem"};
  g_ctx = new rhino::net::TlsContext();
  rhino::Status s = rhino::net::MakeTlsContext(files, g_ctx);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    std::abort();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SSL* ssl = SSL_new((*g_ctx)->native_handle());
  BIO* in = BIO_new(BIO_s_mem());
  BIO* out = BIO_new(BIO_s_mem());
  if (size > 0) BIO_write(in, data, static_cast<int>(size));
  BIO_set_mem_eof_return(in, -1);  // no more bytes yet: "want read", as a socket would say
  SSL_set_bio(ssl, in, out);
  SSL_set_accept_state(ssl);
  const int r = SSL_do_handshake(ssl);
  if (r == 1) std::abort();  // a handshake completed from bytes alone
  const int err = SSL_get_error(ssl, r);
  if (err == SSL_ERROR_SSL) {
    const unsigned long e = ERR_peek_error();
    const std::string why =
        rhino::net::DescribeTlsFailure(asio::error_code(static_cast<int>(e), asio::error::get_ssl_category()), ssl);
    if (why.empty()) std::abort();
  }
  ERR_clear_error();
  SSL_free(ssl);  // frees both BIOs
  return 0;
}
