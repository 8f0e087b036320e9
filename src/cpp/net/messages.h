// The messages of the data-plane protocol (docs/protocol.md §3): one
// XxxReq / XxxRsp struct per wire type, each with Encode (payload bytes) and
// Decode (bounds-checked; Corruption on any malformed payload, trailing bytes
// included). Framing is separate (net/frame.h).
//
// Decode validates the *shape* of a message (field lengths, list sizes); what
// a field means (is a file name plain, is a version stale) is checked by its
// receiver, e.g. ReplicaServer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "net/frame.h"
#include "rhino/status.h"

namespace rhino {

// Field limits enforced by Decode; generous for honest peers, small enough
// that a forged message cannot make a receiver allocate much.
constexpr size_t kMaxWorkerIdBytes = 256;
constexpr size_t kMaxAddressBytes = 256;
constexpr size_t kMaxChainLength = 16;
constexpr size_t kMaxMessageBytes = 64 << 10;
constexpr size_t kNonceBytes = 16;
constexpr size_t kMaxRoleBytes = 16;  // HelloReq.role: "coordinator" is the longest
constexpr size_t kMacBytes = 32;  // HMAC-SHA256

// Wire codes are Status::Code numbers (§3).
inline uint32_t WireCode(const Status& s) { return static_cast<uint32_t>(s.code()); }

struct HelloReq {
  static constexpr MessageType kType = MessageType::kHelloReq;
  uint32_t proto = kProtocolVersion;
  std::string worker_id;
  std::string client_nonce;
  // Appended (issue 46): the role the client proves and its scope (protocol §2,
  // "Roles"; rhino/credential.h). Absent: the first handshake, in which the
  // client proves the cluster's root secret itself, as admin.
  bool has_role = false;
  std::string role;   // at most kMaxRoleBytes
  std::string scope;  // at most kMaxWorkerIdBytes
  std::string Encode() const;
  static Status Decode(std::string_view payload, HelloReq* out);
};

struct HelloRsp {
  static constexpr MessageType kType = MessageType::kHelloRsp;
  std::string worker_id;
  std::string server_nonce;
  std::string server_mac;
  std::string Encode() const;
  static Status Decode(std::string_view payload, HelloRsp* out);
};

struct AuthReq {
  static constexpr MessageType kType = MessageType::kAuthReq;
  std::string client_mac;
  std::string Encode() const;
  static Status Decode(std::string_view payload, AuthReq* out);
};

struct AuthRsp {
  static constexpr MessageType kType = MessageType::kAuthRsp;
  bool ok = false;
  std::string Encode() const;
  static Status Decode(std::string_view payload, AuthRsp* out);
};

// §4 step 1. `window` (credits the sender asks for) is a v1 addition to the
// table of §3; each member grants min(window, its own limit).
struct OpenStreamReq {
  static constexpr MessageType kType = MessageType::kOpenStreamReq;
  std::string operator_id;
  uint32_t instance = 0;
  uint64_t checkpoint_id = 0;
  uint32_t chunk_bytes = 0;
  uint32_t window = 0;
  std::vector<std::string> downstream;  // "host:port" of w(i+1) ... wr
  std::string manifest;                 // Manifest::Serialize() bytes
  std::string Encode() const;
  static Status Decode(std::string_view payload, OpenStreamReq* out);
};

// `member_needed_files/bytes` are [|need_i|, |need_(i+1)|, ..., |need_r|]: each
// member prepends its own figures to its successor's, so the primary learns
// what every member of the chain was missing (a v1 addition to §3).
struct OpenStreamRsp {
  static constexpr MessageType kType = MessageType::kOpenStreamRsp;
  uint32_t code = 0;
  std::string message;
  std::vector<uint32_t> needed;  // manifest file indexes, ascending
  uint32_t credits = 0;
  std::vector<uint32_t> member_needed_files;
  std::vector<uint64_t> member_needed_bytes;
  std::string Encode() const;
  static Status Decode(std::string_view payload, OpenStreamRsp* out);
};

// The data of a chunk views the frame payload it was decoded from: keep the
// payload alive as long as `data` is used (the forwarding path reuses the
// payload bytes as they are, under a new header).
struct ChunkReq {
  static constexpr MessageType kType = MessageType::kChunkReq;
  static constexpr size_t kPrefixBytes = 16;  // u32 file_index, u64 offset, u32 length
  uint32_t file_index = 0;
  uint64_t offset = 0;
  std::string_view data;
  // Appends the fields before `data` to *out; the caller appends the bytes.
  static void AppendPrefix(std::string* out, uint32_t file_index, uint64_t offset, uint32_t length);
  static Status Decode(std::string_view payload, ChunkReq* out);
};

struct CreditRsp {
  static constexpr MessageType kType = MessageType::kCreditRsp;
  uint32_t credits = 0;
  std::string Encode() const;
  static Status Decode(std::string_view payload, CreditRsp* out);
};

struct CommitReq {
  static constexpr MessageType kType = MessageType::kCommitReq;
  std::string Encode() const { return std::string(); }
  static Status Decode(std::string_view payload, CommitReq* out);
};

struct CommitRsp {
  static constexpr MessageType kType = MessageType::kCommitRsp;
  uint32_t code = 0;
  std::string message;
  std::string Encode() const;
  static Status Decode(std::string_view payload, CommitRsp* out);
};

struct AbortReq {
  static constexpr MessageType kType = MessageType::kAbortReq;
  std::string reason;
  std::string Encode() const;
  static Status Decode(std::string_view payload, AbortReq* out);
};

struct HeartbeatReq {
  static constexpr MessageType kType = MessageType::kHeartbeatReq;
  uint64_t nonce = 0;
  std::string Encode() const;
  static Status Decode(std::string_view payload, HeartbeatReq* out);
};

struct HeartbeatRsp {
  static constexpr MessageType kType = MessageType::kHeartbeatRsp;
  uint64_t nonce = 0;
  std::string Encode() const;
  static Status Decode(std::string_view payload, HeartbeatRsp* out);
};

struct StoreQueryReq {
  static constexpr MessageType kType = MessageType::kStoreQueryReq;
  std::string operator_id;
  uint32_t instance = 0;
  std::string Encode() const;
  static Status Decode(std::string_view payload, StoreQueryReq* out);
};

struct StoreQueryRsp {
  static constexpr MessageType kType = MessageType::kStoreQueryRsp;
  uint32_t code = 0;
  std::string message;
  std::vector<uint64_t> checkpoints;
  std::string Encode() const;
  static Status Decode(std::string_view payload, StoreQueryRsp* out);
};

struct ErrorRsp {
  static constexpr MessageType kType = MessageType::kErrorRsp;
  uint32_t code = 0;
  std::string message;
  static ErrorRsp From(const Status& s) { return ErrorRsp{WireCode(s), s.message()}; }
  std::string Encode() const;
  static Status Decode(std::string_view payload, ErrorRsp* out);
};

}  // namespace rhino
