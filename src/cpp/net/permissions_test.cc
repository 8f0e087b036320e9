// The role table of docs/protocol.md §2, "Roles", cell by cell: what each
// role may ask a worker, and a task only within its own namespace.
#include "net/permissions.h"

#include <string>
#include <vector>

#include "testing/test_util.h"

namespace rhino::net {
namespace {

const std::vector<InstanceAction> kEveryAction = {
    InstanceAction::kOpen,     InstanceAction::kClose,        InstanceAction::kTakeover,
    InstanceAction::kFence,    InstanceAction::kImport,       InstanceAction::kMoveVnodes,
    InstanceAction::kList,     InstanceAction::kStatus,       InstanceAction::kDiscardAfter,
    InstanceAction::kReconfigure, InstanceAction::kReplicate, InstanceAction::kCompact,
    InstanceAction::kDrop};

PeerIdentity Peer(PeerRole role, std::string scope = "") { return PeerIdentity{role, scope, "p", "127.0.0.1:1"}; }

TEST(PermissionsTest, NamespaceIsWhatComesBeforeTheFirstSeparator) {
  EXPECT_EQ(NamespaceOf("counts"), "");
  EXPECT_EQ(NamespaceOf("jobA..counts"), "jobA");
  EXPECT_EQ(NamespaceOf("jobA..a..b"), "jobA");
  EXPECT_EQ(NamespaceOf("a.b"), "");
}

TEST(PermissionsTest, AdminAndCoordinatorMayAskAWorkerAnything) {
  for (PeerRole r : {PeerRole::kAdmin, PeerRole::kCoordinator}) {
    for (InstanceAction a : kEveryAction) EXPECT_OK(PermitInstanceAction(Peer(r), a, "jobA..op", "worker w1"));
    for (MessageType t : {MessageType::kOpenStreamReq, MessageType::kStoreQueryReq, MessageType::kSessionOpenReq}) {
      EXPECT_OK(PermitRequest(Peer(r), t, "jobA..op", "worker w1"));
    }
  }
}

TEST(PermissionsTest, AWorkerReplicatesAndCleansItsChainOnly) {
  PeerIdentity w = Peer(PeerRole::kWorker, "w2");
  EXPECT_OK(PermitRequest(w, MessageType::kOpenStreamReq, "op", "worker w1"));
  EXPECT_OK(PermitRequest(w, MessageType::kStoreQueryReq, "op", "worker w1"));
  EXPECT_CODE(PermitRequest(w, MessageType::kSessionOpenReq, "op", "worker w1"), kPermissionDenied);
  // A checkpoint reader, for a base it reads through to (design §4.1).
  EXPECT_OK(PermitRequest(w, MessageType::kSessionOpenReq, "op", "worker w1", /*reader=*/true));
  for (InstanceAction a : kEveryAction) {
    if (a == InstanceAction::kDiscardAfter) {
      EXPECT_OK(PermitInstanceAction(w, a, "op", "worker w1"));
    } else {
      EXPECT_CODE(PermitInstanceAction(w, a, "op", "worker w1"), kPermissionDenied);
    }
  }
}

TEST(PermissionsTest, ATaskHasSessionsReadersAndStatusOfItsOwnNamespaceOnly) {
  PeerIdentity t = Peer(PeerRole::kTask, "jobA");
  EXPECT_OK(PermitRequest(t, MessageType::kSessionOpenReq, "jobA..counts", "worker w1"));
  EXPECT_OK(PermitInstanceAction(t, InstanceAction::kStatus, "jobA..counts", "worker w1"));
  EXPECT_CODE(PermitRequest(t, MessageType::kSessionOpenReq, "jobB..counts", "worker w1"), kPermissionDenied);
  EXPECT_CODE(PermitRequest(t, MessageType::kSessionOpenReq, "counts", "worker w1"), kPermissionDenied);
  EXPECT_CODE(PermitRequest(t, MessageType::kSessionOpenReq, "jobAB..counts", "worker w1"), kPermissionDenied);
  EXPECT_CODE(PermitRequest(t, MessageType::kOpenStreamReq, "jobA..counts", "worker w1"), kPermissionDenied);
  EXPECT_CODE(PermitRequest(t, MessageType::kStoreQueryReq, "jobA..counts", "worker w1"), kPermissionDenied);
  for (InstanceAction a : kEveryAction) {
    if (a == InstanceAction::kStatus) continue;
    EXPECT_CODE(PermitInstanceAction(t, a, "jobA..counts", "worker w1"), kPermissionDenied);
  }
  EXPECT_CODE(PermitInstanceAction(t, InstanceAction::kStatus, "jobB..counts", "worker w1"), kPermissionDenied);
  // The default namespace's task: operators without a namespace only.
  PeerIdentity d = Peer(PeerRole::kTask, "");
  EXPECT_OK(PermitRequest(d, MessageType::kSessionOpenReq, "counts", "worker w1"));
  EXPECT_CODE(PermitRequest(d, MessageType::kSessionOpenReq, "jobA..counts", "worker w1"), kPermissionDenied);
}

TEST(PermissionsTest, ARefusalNamesTheRequestThePeerAndTheServer) {
  Status s = PermitInstanceAction(Peer(PeerRole::kTask, "jobA"), InstanceAction::kFence, "jobA..counts", "worker w1");
  ASSERT_EQ(s.code(), Status::Code::kPermissionDenied);
  for (const char* part : {"worker w1", "fence", "jobA..counts", "task of namespace jobA"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message() << " lacks " << part;
  }
}

}  // namespace
}  // namespace rhino::net
