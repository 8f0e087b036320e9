// CheckOpenStreamReq: the receive-side checks of an OpenStreamReq
// (docs/protocol.md §3 "A receiver checks", §4 step 1). Every name that could
// become a path must be refused before a byte of the stream is written.
#include "replication/manifest_check.h"

#include <string>
#include <vector>

#include "testing/test_util.h"

namespace rhino {
namespace {

constexpr uint32_t kMaxFrame = 1u << 20;
const std::string kSum = "00112233445566778899aabbccddeeff";
const std::string kSum2 = "ffeeddccbbaa99887766554433221100";

FileEntry File(const std::string& name, uint64_t size, const std::string& sum) {
  FileEntry f;
  f.name = name;
  f.size = size;
  f.checksum = sum;
  f.identity = sum + "-" + std::to_string(size);
  f.in_delta = true;
  return f;
}

Manifest GoodManifest() {
  Manifest m;
  m.operator_id = "q8";
  m.instance = 2;
  m.checkpoint_id = 17;
  m.has_parent = true;
  m.parent_id = 16;
  m.vnodes = {8, 9};
  m.files = {File("000007.sst", 4096, kSum), File("CURRENT", 16, kSum2)};
  return m;
}

OpenStreamReq Req(const Manifest& m) {
  OpenStreamReq r;
  r.operator_id = "q8";
  r.instance = 2;
  r.checkpoint_id = 17;
  r.chunk_bytes = 1u << 16;
  r.window = 16;
  r.downstream = {"10.0.0.2:7000", "[::1]:7001", "worker-3.example:65535"};
  r.manifest = m.Serialize();
  return r;
}

Status Check(const OpenStreamReq& r) {
  Manifest out;
  return CheckOpenStreamReq(r, kMaxFrame, &out);
}

TEST(ManifestCheckTest, AcceptsAWellFormedRequestAndReturnsItsManifest) {
  Manifest out;
  ASSERT_OK(CheckOpenStreamReq(Req(GoodManifest()), kMaxFrame, &out));
  EXPECT_EQ(out.operator_id, "q8");
  EXPECT_EQ(out.instance, 2u);
  EXPECT_EQ(out.checkpoint_id, 17u);
  ASSERT_EQ(out.files.size(), 2u);
  EXPECT_EQ(out.files[0].name, "000007.sst");
  EXPECT_EQ(out.files[1].identity, kSum2 + "-16");
  // No downstream (the tail of the chain) and no files are fine too.
  OpenStreamReq tail = Req(GoodManifest());
  tail.downstream.clear();
  EXPECT_OK(Check(tail));
  Manifest empty = GoodManifest();
  empty.files.clear();
  EXPECT_OK(Check(Req(empty)));
}

TEST(ManifestCheckTest, OperatorIdThatCouldEscapeTheStoreIsPathOutsideStore) {
  for (const std::string& id : std::vector<std::string>{"", "..", "../etc", ".q8", "q8/0", std::string(129, 'a')}) {
    SCOPED_TRACE("operator id '" + id + "'");
    Manifest m = GoodManifest();
    m.operator_id = id;
    OpenStreamReq r = Req(m);
    r.operator_id = id;
    EXPECT_CODE(Check(r), kPathOutsideStore);
  }
}

TEST(ManifestCheckTest, ChunkBytesMustBeOneToMaxFrameMinusSixteen) {
  OpenStreamReq r = Req(GoodManifest());
  r.chunk_bytes = 0;
  EXPECT_CODE(Check(r), kInvalidArgument);
  r.chunk_bytes = kMaxFrame - 15;
  EXPECT_CODE(Check(r), kInvalidArgument);
  r.chunk_bytes = kMaxFrame - 16;
  EXPECT_OK(Check(r));
  r.chunk_bytes = 1;
  EXPECT_OK(Check(r));
}

TEST(ManifestCheckTest, ZeroWindowOrABadDownstreamAddressIsInvalidArgument) {
  OpenStreamReq r = Req(GoodManifest());
  r.window = 0;
  EXPECT_CODE(Check(r), kInvalidArgument);
  for (const std::string& a : std::vector<std::string>{"", "host", ":7000", "host:", "host:70000", "host:7x",
                                                       "[::1]7000", "[::1:7000", "host:123456"}) {
    SCOPED_TRACE("downstream '" + a + "'");
    OpenStreamReq bad = Req(GoodManifest());
    bad.downstream = {"10.0.0.2:7000", a};
    EXPECT_CODE(Check(bad), kInvalidArgument);
  }
}

TEST(ManifestCheckTest, DamagedManifestIsCorruption) {
  OpenStreamReq r = Req(GoodManifest());
  r.manifest[r.manifest.size() / 2] ^= 0x20;
  EXPECT_CODE(Check(r), kCorruption);
  r.manifest = "";
  EXPECT_CODE(Check(r), kCorruption);
  r.manifest = Req(GoodManifest()).manifest.substr(0, 40);
  EXPECT_CODE(Check(r), kCorruption);
}

TEST(ManifestCheckTest, ManifestOfAnotherCheckpointIsInvalidArgument) {
  OpenStreamReq r = Req(GoodManifest());
  r.instance = 3;
  EXPECT_CODE(Check(r), kInvalidArgument);
  r = Req(GoodManifest());
  r.checkpoint_id = 18;
  EXPECT_CODE(Check(r), kInvalidArgument);
  Manifest other_op = GoodManifest();
  other_op.operator_id = "q9";
  EXPECT_CODE(Check(Req(other_op)), kInvalidArgument);  // the request still says q8
}

TEST(ManifestCheckTest, FileNameThatIsNotPlainIsPathOutsideStore) {
  for (const std::string& name : std::vector<std::string>{"", ".", "..", "../../pool/x", "a/b", "/etc/passwd",
                                                          std::string("a\0b", 3)}) {
    SCOPED_TRACE("file name of " + std::to_string(name.size()) + " bytes");
    Manifest m = GoodManifest();
    m.files[1].name = name;
    EXPECT_CODE(Check(Req(m)), kPathOutsideStore);
  }
}

TEST(ManifestCheckTest, DuplicateFileNameIsInvalidArgument) {
  Manifest m = GoodManifest();
  m.files[1] = File("000007.sst", 16, kSum2);
  EXPECT_CODE(Check(Req(m)), kInvalidArgument);
}

TEST(ManifestCheckTest, IdentityNotOfItsOwnFileIsPathOutsideStore) {
  auto with_identity = [](const std::string& identity) {
    Manifest m = GoodManifest();
    m.files[0].identity = identity;
    return Req(m);
  };
  // Another file's content (the same checksum with another size, another checksum).
  EXPECT_CODE(Check(with_identity(kSum + "-16")), kPathOutsideStore);
  EXPECT_CODE(Check(with_identity(kSum2 + "-4096")), kPathOutsideStore);
  // Not of the identity form at all.
  EXPECT_CODE(Check(with_identity("../../checkpoints/q8/2/x")), kPathOutsideStore);
  EXPECT_CODE(Check(with_identity(kSum + "-4096/..")), kPathOutsideStore);
  EXPECT_CODE(Check(with_identity("")), kPathOutsideStore);
  // An uppercase checksum matches its own entry but is not the identity form.
  Manifest upper = GoodManifest();
  upper.files[0] = File("000007.sst", 4096, "00112233445566778899AABBCCDDEEFF");
  EXPECT_CODE(Check(Req(upper)), kPathOutsideStore);
}

}  // namespace
}  // namespace rhino
