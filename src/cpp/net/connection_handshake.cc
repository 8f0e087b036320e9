// Connection's handshake (protocol §2): the client's HelloReq, the server's
// HelloRsp with its proof, the client's AuthReq, the roles a key and a
// certificate admit, and the ready handler once it is done. Transport setup
// (TCP, Unix socket, TLS) is connection.cc's; frames after it are
// connection_read.cc's and connection_write.cc's.
#include "net/connection.h"

#include <mutex>
#include <string>

#include "net/auth.h"
#include "net/cert_roles.h"
#include "net/messages.h"
#include "net/permissions.h"

namespace rhino::net {

void Connection::SendHello() {
  BeginSession();
  // Client side of §2: HelloReq with a fresh nonce.
  Status s = NewNonce(&client_nonce_);
  if (!s.ok()) {
    DoClose(s);
    return;
  }
  HelloReq hello;
  hello.worker_id = options_.worker_id;
  hello.client_nonce = client_nonce_;
  if (!options_.credential.key.empty() && !options_.credential.root) {  // a role's key (§2, "Roles")
    hello.has_role = true;
    hello.role = RoleName(options_.credential.role);
    hello.scope = options_.credential.scope;
  }
  SendNow(MessageType::kHelloReq, 0, hello.Encode());
}

void Connection::HandleHandshake(const FrameHeader& h, const std::string& payload) {
  if (h.type == MessageType::kErrorRsp) {
    ErrorRsp e;
    Status s = ErrorRsp::Decode(payload, &e);
    DoClose(s.ok() ? Status::FromCode(e.code, remote_ + ": " + e.message) : s);
    return;
  }
  if (role_ == Role::kServer && h.type == MessageType::kHelloReq && !hello_done_) {
    HelloReq req;
    Status s = HelloReq::Decode(payload, &req);
    if (s.ok() && req.proto != kProtocolVersion) {
      s = Status::InvalidArgument("unsupported protocol " + std::to_string(req.proto));
    }
    if (s.ok() && req.client_nonce.size() != kNonceBytes) s = Status::Corruption("client nonce is not 16 bytes");
    if (s.ok()) s = NewNonce(&server_nonce_);
    if (!s.ok()) {
      Reject(0, s);
      return;
    }
    // The key the client proves: its role's, derived from the root secret
    // this server holds (§2, "Roles"); without a role, the root itself, as
    // admin (the first handshake's form).
    PeerRole role = PeerRole::kAdmin;
    if (req.has_role) {
      s = ParseRole(req.role, &role);
      if (s.ok()) s = CheckScope(role, req.scope);
      if (!s.ok()) {
        Reject(0, Status::InvalidArgument("HelloReq: " + s.message()));
        return;
      }
      server_key_ = CredentialKey(options_.secret, role, req.scope);
    } else {
      server_key_ = options_.secret;
    }
    {
      std::lock_guard<std::mutex> l(peer_mu_);
      peer_id_ = req.worker_id;
      peer_role_ = role;
      peer_scope_ = req.has_role ? req.scope : std::string();
    }
    client_nonce_ = req.client_nonce;
    hello_done_ = true;
    HelloRsp rsp;
    rsp.worker_id = options_.worker_id;
    rsp.server_nonce = server_nonce_;
    rsp.server_mac = ServerMac(server_key_, client_nonce_, server_nonce_);
    SendNow(MessageType::kHelloRsp, 0, rsp.Encode());
    return;
  }
  if (role_ == Role::kServer && h.type == MessageType::kAuthReq && hello_done_) {
    OnAuthReq(payload);
    return;
  }
  if (role_ == Role::kClient && h.type == MessageType::kHelloRsp && !hello_done_) {
    HelloRsp rsp;
    Status s = HelloRsp::Decode(payload, &rsp);
    if (!s.ok()) {
      Reject(0, s);
      return;
    }
    // Mutual authentication: talk only to a server that knows the secret too.
    if (rsp.server_nonce.size() != kNonceBytes ||
        !MacEquals(rsp.server_mac, ServerMac(Key(), client_nonce_, rsp.server_nonce))) {
      if (counters_ != nullptr) counters_->auth_failures.fetch_add(1);
      DoClose(Status::AuthFailed("authentication failed: server " + remote_ + " does not know the shared secret"));
      return;
    }
    {
      std::lock_guard<std::mutex> l(peer_mu_);
      peer_id_ = rsp.worker_id;
    }
    hello_done_ = true;
    AuthReq req;
    req.client_mac = ClientMac(Key(), rsp.server_nonce, client_nonce_);
    SendNow(MessageType::kAuthReq, 0, req.Encode());
    return;
  }
  if (role_ == Role::kClient && h.type == MessageType::kAuthRsp && hello_done_) {
    AuthRsp rsp;
    Status s = AuthRsp::Decode(payload, &rsp);
    if (!s.ok()) {
      Reject(0, s);
      return;
    }
    if (!rsp.ok) {
      DoClose(Status::AuthFailed("server " + remote_ + " refused our authentication"));
      return;
    }
    state_.store(State::kOpen);
    FinishHandshake(Status::OK());
    return;
  }
  // §2: any other frame before AuthRsp closes the connection.
  Reject(0, Status::Corruption(std::string(MessageTypeName(h.type)) + " before authentication completed"));
}

void Connection::OnAuthReq(const std::string& payload) {
  AuthReq req;
  Status s = AuthReq::Decode(payload, &req);
  if (!s.ok()) {
    Reject(0, s);
    return;
  }
  if (!MacEquals(req.client_mac, ClientMac(server_key_, server_nonce_, client_nonce_))) {
    if (counters_ != nullptr) counters_->auth_failures.fetch_add(1);
    CloseWithError(0, Status::AuthFailed("authentication failed: peer " + remote_ +
                                         " does not know the shared secret (or the key of the role it named)"));
    return;
  }
  // The role is proved; under TLS the peer's certificate must admit it too (§2, "TLS").
  PeerRole proved;
  {
    std::lock_guard<std::mutex> l(peer_mu_);
    proved = peer_role_;
  }
  s = CheckCertificateAdmits(proved);
  if (!s.ok()) {
    LogRefusal(s);
    CloseWithError(0, s);
    return;
  }
  AuthRsp rsp;
  rsp.ok = true;
  SendNow(MessageType::kAuthRsp, 0, rsp.Encode());
  state_.store(State::kOpen);
  FinishHandshake(Status::OK());
}

Status Connection::CheckCertificateAdmits(PeerRole role) {
  if (!tls_) return Status::OK();  // plaintext, or a Unix socket: the keys alone
  X509* cert = SSL_get0_peer_certificate(tls_->native_handle());  // not ours to free
  std::string peer = remote_;
  {
    std::lock_guard<std::mutex> l(peer_mu_);
    if (!peer_id_.empty()) peer += " (" + peer_id_ + ")";
  }
  return CheckCertificateRole(CertificateRoles(cert), role, "rhino " + options_.worker_id, peer);
}

void Connection::FinishHandshake(const Status& s) {
  if (ready_) {
    auto r = std::move(ready_);
    ready_ = nullptr;
    r(s);
  }
}

}  // namespace rhino::net
