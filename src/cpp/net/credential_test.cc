// Roles and their keys (docs/protocol.md §2, "Roles"): the derivation against
// OpenSSL's HMAC computed here from the documented formula, and the scopes.
#include "rhino/credential.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <string>

#include "testing/test_util.h"

namespace rhino {
namespace {

std::string Hmac(const std::string& key, const std::string& msg) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(msg.data()),
       msg.size(), out, &n);
  return std::string(reinterpret_cast<const char*>(out), n);
}

TEST(CredentialTest, KeyIsTheDocumentedHmac) {
  const std::string root = "cluster-root-secret";
  EXPECT_EQ(CredentialKey(root, PeerRole::kTask, "jobA"), Hmac(root, std::string("rhino-credential\0task\0jobA", 26)));
  EXPECT_EQ(CredentialKey(root, PeerRole::kAdmin, ""), Hmac(root, std::string("rhino-credential\0admin\0", 23)));
  EXPECT_EQ(CredentialKey(root, PeerRole::kWorker, "w1").size(), 32u);
}

TEST(CredentialTest, EveryRoleAndScopeHasItsOwnKey) {
  const std::string root = "r";
  const std::string task_a = CredentialKey(root, PeerRole::kTask, "a");
  EXPECT_NE(task_a, CredentialKey(root, PeerRole::kTask, "b"));
  EXPECT_NE(task_a, CredentialKey(root, PeerRole::kTask, ""));
  EXPECT_NE(task_a, CredentialKey("other-root", PeerRole::kTask, "a"));
  EXPECT_NE(CredentialKey(root, PeerRole::kAdmin, ""), CredentialKey(root, PeerRole::kCoordinator, ""));
  EXPECT_NE(CredentialKey(root, PeerRole::kWorker, "w1"), CredentialKey(root, PeerRole::kWorker, "w2"));
  // The root itself is never a role's key.
  EXPECT_NE(CredentialKey(root, PeerRole::kAdmin, ""), root);
}

TEST(CredentialTest, RoleNamesRoundTripAndOthersAreRefused) {
  for (PeerRole r : {PeerRole::kAdmin, PeerRole::kCoordinator, PeerRole::kWorker, PeerRole::kTask}) {
    PeerRole back = PeerRole::kAdmin;
    ASSERT_OK(ParseRole(RoleName(r), &back));
    EXPECT_EQ(back, r);
  }
  PeerRole out;
  EXPECT_CODE(ParseRole("root", &out), kInvalidArgument);
  EXPECT_CODE(ParseRole("", &out), kInvalidArgument);
  EXPECT_CODE(ParseRole("Admin", &out), kInvalidArgument);
}

TEST(CredentialTest, ScopesFitTheirRoles) {
  EXPECT_OK(CheckScope(PeerRole::kAdmin, ""));
  EXPECT_CODE(CheckScope(PeerRole::kAdmin, "x"), kInvalidArgument);
  EXPECT_CODE(CheckScope(PeerRole::kCoordinator, "x"), kInvalidArgument);
  EXPECT_OK(CheckScope(PeerRole::kTask, ""));  // the default namespace
  EXPECT_OK(CheckScope(PeerRole::kTask, "job_A-1"));
  EXPECT_OK(CheckScope(PeerRole::kTask, std::string(64, 'n')));
  EXPECT_CODE(CheckScope(PeerRole::kTask, std::string(65, 'n')), kInvalidArgument);
  EXPECT_CODE(CheckScope(PeerRole::kTask, "a..b"), kInvalidArgument);  // '.' would let a scope reach into another
  EXPECT_CODE(CheckScope(PeerRole::kWorker, ""), kInvalidArgument);
  EXPECT_OK(CheckScope(PeerRole::kWorker, "w1"));
  EXPECT_OK(CheckScope(PeerRole::kWorker, "127.0.0.2:7000"));
  EXPECT_CODE(CheckScope(PeerRole::kWorker, "w 1"), kInvalidArgument);
  EXPECT_CODE(CheckScope(PeerRole::kWorker, std::string(257, 'w')), kInvalidArgument);
}

TEST(CredentialTest, FromRootDerivesTheKeyAndDescribeNamesTheRole) {
  Credential c = Credential::FromRoot("root", PeerRole::kTask, "jobA");
  EXPECT_EQ(c.role, PeerRole::kTask);
  EXPECT_EQ(c.scope, "jobA");
  EXPECT_EQ(c.key, CredentialKey("root", PeerRole::kTask, "jobA"));
  PeerIdentity p{PeerRole::kTask, "jobA", "spark-task-7", "127.0.0.1:5000"};
  EXPECT_EQ(p.Describe(), "task of namespace jobA (spark-task-7 at 127.0.0.1:5000)");
  PeerIdentity d{PeerRole::kTask, "", "t", "a"};
  EXPECT_EQ(d.Describe(), "task of the default namespace (t at a)");
}

}  // namespace
}  // namespace rhino
