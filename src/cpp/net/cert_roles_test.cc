// Roles bound to a TLS certificate (net/cert_roles.h): the "rhino-role:" URI
// SANs read from certificates made here with OpenSSL, and the check a server
// makes of the role a peer proved against them.
#include "net/cert_roles.h"

#include <openssl/x509v3.h>

#include <memory>
#include <string>
#include <vector>

#include "testing/test_util.h"

namespace rhino::net {
namespace {

using X509Ptr = std::unique_ptr<X509, decltype(&X509_free)>;

// An (unsigned) certificate whose subject alternative names are `san` in
// OpenSSL's config syntax ("URI:rhino-role:task,IP:127.0.0.1"); none if empty.
X509Ptr MakeCert(const std::string& san) {
  X509Ptr cert(X509_new(), &X509_free);
  EXPECT_NE(cert, nullptr);
  X509_set_version(cert.get(), 2);
  if (!san.empty()) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, NID_subject_alt_name, san.c_str());
    EXPECT_NE(ext, nullptr) << san;
    EXPECT_EQ(X509_add_ext(cert.get(), ext, -1), 1);
    X509_EXTENSION_free(ext);
  }
  return cert;
}

using Roles = std::vector<std::string>;

TEST(CertRolesTest, ReadsEveryRoleUriAndNothingElse) {
  EXPECT_EQ(CertificateRoles(nullptr), Roles{});
  EXPECT_EQ(CertificateRoles(MakeCert("").get()), Roles{});  // no SAN at all
  EXPECT_EQ(CertificateRoles(MakeCert("IP:127.0.0.1,DNS:w1.example").get()), Roles{});
  EXPECT_EQ(CertificateRoles(MakeCert("URI:rhino-role:task,IP:127.0.0.1").get()), Roles{"task"});
  // `rhino certs init`'s host certificate
  EXPECT_EQ(CertificateRoles(MakeCert("IP:127.0.0.2,URI:rhino-role:admin,URI:rhino-role:coordinator,"
                                      "URI:rhino-role:worker")
                                 .get()),
            (Roles{"admin", "coordinator", "worker"}));
  // other URIs, and names that only look alike, are no roles
  EXPECT_EQ(CertificateRoles(MakeCert("URI:https://rhino-role/admin,URI:spiffe://x/rhino-role:admin,"
                                      "DNS:rhino-role.admin,email:rhino-role@admin.example")
                                 .get()),
            Roles{});
  // the scheme without regard to case (RFC 3986), the role as written
  EXPECT_EQ(CertificateRoles(MakeCert("URI:RHINO-ROLE:worker,URI:rhino-role:Admin").get()),
            (Roles{"worker", "Admin"}));
  EXPECT_EQ(CertificateRoles(MakeCert("URI:rhino-role:").get()), Roles{""});
}

TEST(CertRolesTest, AnUnmarkedCertificateAdmitsAnyRole) {
  for (PeerRole r : {PeerRole::kAdmin, PeerRole::kCoordinator, PeerRole::kWorker, PeerRole::kTask}) {
    EXPECT_OK(CheckCertificateRole({}, r, "rhino w1", "127.0.0.1:5000"));
  }
}

TEST(CertRolesTest, AMarkedCertificateAdmitsItsRolesOnly) {
  const Roles host = {"admin", "coordinator", "worker"};
  EXPECT_OK(CheckCertificateRole(host, PeerRole::kAdmin, "rhino w1", "p"));
  EXPECT_OK(CheckCertificateRole(host, PeerRole::kCoordinator, "rhino w1", "p"));
  EXPECT_OK(CheckCertificateRole(host, PeerRole::kWorker, "rhino w1", "p"));
  Status s = CheckCertificateRole(host, PeerRole::kTask, "rhino w1", "127.0.0.1:5000 (t)");
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_EQ(s.message(),
            "rhino w1 refused a connection from 127.0.0.1:5000 (t): its TLS certificate admits the roles "
            "admin, coordinator, worker only, not task");

  const Roles task = {"task"};
  EXPECT_OK(CheckCertificateRole(task, PeerRole::kTask, "rhino w1", "p"));
  for (PeerRole r : {PeerRole::kAdmin, PeerRole::kCoordinator, PeerRole::kWorker}) {
    s = CheckCertificateRole(task, r, "rhino coordinator", "127.0.0.1:6000");
    EXPECT_EQ(s.code(), Status::Code::kPermissionDenied) << RoleName(r);
    EXPECT_EQ(s.message(), std::string("rhino coordinator refused a connection from 127.0.0.1:6000: its TLS "
                                       "certificate admits the role task only, not ") +
                               RoleName(r));
  }
  // A role name differing in case, or unknown, admits nothing; it is shown printable.
  s = CheckCertificateRole({"Admin", "x\ny"}, PeerRole::kAdmin, "rhino w1", "p");
  EXPECT_EQ(s.code(), Status::Code::kPermissionDenied);
  EXPECT_NE(s.message().find("admits the roles Admin, x?y only, not admin"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace rhino::net
