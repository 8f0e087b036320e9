// Frames of the data-plane protocol (docs/protocol.md §1) and the payload
// codec every message uses (§3).
//
// Everything here is a pure function of its input bytes: no I/O, no global
// state. That is what lets the decoder be fuzzed (fuzz/frame_fuzzer.cc,
// `make fuzz`). Every malformed input is a Status (Corruption), never UB.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rhino/status.h"

namespace rhino {

// protocol.md §3: the message types. Values are wire numbers; never reuse one.
enum class MessageType : uint8_t {
  kHelloReq = 1,
  kHelloRsp = 2,
  kAuthReq = 3,
  kAuthRsp = 4,
  kOpenStreamReq = 5,
  kOpenStreamRsp = 6,
  kChunkReq = 7,
  kCreditRsp = 8,
  kCommitReq = 9,
  kCommitRsp = 10,
  kAbortReq = 11,
  kHeartbeatReq = 12,
  kHeartbeatRsp = 13,
  kStoreQueryReq = 14,
  kStoreQueryRsp = 15,
  kErrorRsp = 16,
  // The state service (protocol §7): instances hosted by a worker, sessions.
  kInstanceReq = 17,
  kInstanceRsp = 18,
  kSessionOpenReq = 19,
  kSessionOpenRsp = 20,
  kGetReq = 21,
  kGetRsp = 22,
  kWriteReq = 23,
  kSessionRsp = 24,
  kScanReq = 25,
  kScanRsp = 26,
  kSessionCommitReq = 27,
  kSessionCommitRsp = 28,
  kSessionAbortReq = 29,
  // The coordinator (protocol §8): a named request with a JSON body, and its answer.
  kCoordReq = 30,
  kCoordRsp = 31,
};
// The highest known type. Code that gives a range of types a meaning (e.g.
// StateService::Handles) names its own bounds rather than using this.
constexpr MessageType kLastMessageType = MessageType::kCoordRsp;

bool IsKnownMessageType(uint8_t type);
const char* MessageTypeName(MessageType type);

constexpr uint32_t kFrameMagic = 0x314E4852;  // "RHN1" in memory order
constexpr uint8_t kProtocolVersion = 1;
constexpr size_t kFrameHeaderBytes = 32;
constexpr uint32_t kDefaultMaxFrameBytes = (4u << 20) + (4u << 10);  // 4 MiB + 4 KiB
// The largest max_frame_bytes a worker accepts: one frame's payload is one buffer.
constexpr uint32_t kMaxFrameBytesLimit = 256u << 20;
// The largest payload a listener reads from a peer before it has authenticated
// (protocol §2): the largest handshake frame, a HelloReq, is under 300 bytes.
// A bigger frame closes the connection before anything is allocated for it, so
// an unauthenticated peer costs a listener a few hundred bytes, not
// max_frame_bytes (issue 46).
constexpr uint32_t kMaxHandshakeFrameBytes = 1024;
// The default bounds on the connections one listener holds at once (protocol
// §2, "Connection limits"; net/connection_limiter.h). 0 = no bound.
constexpr uint32_t kDefaultMaxConnections = 1024;               // open, per listener
constexpr uint32_t kDefaultMaxUnauthenticatedConnections = 256;  // handshakes in progress, per listener
constexpr uint32_t kDefaultMaxConnectionsPerPeer = 512;          // per peer IP address, per listener
constexpr uint32_t kDefaultMaxUnauthenticatedPerPeer = 64;       // handshakes per peer IP address, per listener
// Streams one peer may hold open on one connection it opened (sessions,
// replication streams, readers, coordinator requests in flight; protocol §1).
constexpr uint32_t kDefaultMaxStreamsPerConnection = 1024;
// Bytes of frames one connection a worker or the coordinator accepted may
// hold queued for a peer that reads them too slowly; over it the connection
// stops reading that peer's requests until half is sent (protocol §2).
// 64 MiB: 16 frames of the default max_frame_bytes, so a reader that keeps
// up never meets it, while 1024 connections that each hit it cost 64 GiB at
// worst rather than without bound. 0 = no bound.
constexpr uint64_t kDefaultMaxOutboundBytes = uint64_t{64} << 20;
// The default bounds on what authenticated peers can make a worker's state
// service hold (protocol §7.1, "Bounds"). 0 = no bound.
constexpr uint32_t kDefaultMaxInstances = 4096;         // hosted instances (a RocksDB open each)
constexpr uint32_t kDefaultMaxCheckpointReaders = 64;   // open readers (a hard-link restore and an open each)

struct FrameHeader {
  MessageType type = MessageType::kErrorRsp;
  uint32_t stream_id = 0;  // 0 = connection-level
  uint32_t length = 0;     // payload bytes
  uint64_t chain_version = 0;
  uint32_t payload_checksum = 0;
};

// Low 32 bits of XXH3_64: the checksum of both header and payload (§1).
uint32_t FrameChecksum(const void* data, size_t n);

// Writes the 32-byte header for `payload` into `out` (which must hold
// kFrameHeaderBytes), computing length and both checksums.
void EncodeFrameHeader(MessageType type, uint32_t stream_id, uint64_t chain_version,
                       std::string_view payload, char* out);
// Header + payload, as one string (for small frames and tests).
std::string EncodeFrame(MessageType type, uint32_t stream_id, uint64_t chain_version,
                        std::string_view payload);

// Steps 1-4 of §1's receive-side validation on exactly kFrameHeaderBytes bytes:
// header checksum, magic/version/flags, length <= max_frame_bytes, known type.
// Corruption on any failure; *header_intact tells whether the header checksum
// held (so that the receiver may answer on the frame's stream).
Status DecodeFrameHeader(const char* data, uint32_t max_frame_bytes, FrameHeader* out,
                         bool* header_intact = nullptr);
// Step 5: the payload checksum.
Status CheckFramePayload(const FrameHeader& header, std::string_view payload);
// The whole of steps 1-5 on one complete frame: `data` must be exactly one
// header plus its payload. *payload views into `data`.
Status DecodeFrame(std::string_view data, uint32_t max_frame_bytes, FrameHeader* header,
                   std::string_view* payload);

// ---- payload codec (§3): little-endian fixed-width integers; str and bytes as
// u32 length + bytes; list<T> as u32 count + items.
class Encoder {
 public:
  Encoder() = default;
  explicit Encoder(size_t reserve) { buf_.reserve(reserve); }

  void PutU8(uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void PutU32(uint32_t v);
  void PutU64(uint64_t v);
  void PutBytes(std::string_view v);  // also str
  void PutU32List(const std::vector<uint32_t>& v);
  void PutU64List(const std::vector<uint64_t>& v);
  void PutStrList(const std::vector<std::string>& v);
  void PutBytesList(const std::vector<std::string_view>& v);

  std::string& buffer() { return buf_; }
  std::string Finish() { return std::move(buf_); }

 private:
  std::string buf_;
};

// Reads fields from a payload; every read is bounds-checked and a field that
// runs past the end is Corruption. The Decoder views `data`, which must
// outlive it and every string_view it hands out.
class Decoder {
 public:
  explicit Decoder(std::string_view data) : data_(data) {}

  Status GetU8(uint8_t* v);
  Status GetU32(uint32_t* v);
  Status GetU64(uint64_t* v);
  // A length-prefixed field of at most `max_len` bytes.
  Status GetBytes(std::string* v, size_t max_len = UINT32_MAX);
  Status GetBytesView(std::string_view* v, size_t max_len = UINT32_MAX);
  // Lists: a count that cannot fit in the remaining bytes is rejected before
  // anything is allocated, so a forged count never causes a huge allocation.
  Status GetU32List(std::vector<uint32_t>* v, size_t max_count = UINT32_MAX);
  Status GetU64List(std::vector<uint64_t>* v, size_t max_count = UINT32_MAX);
  Status GetStrList(std::vector<std::string>* v, size_t max_count, size_t max_len);
  // A list of byte strings viewed in place (no copy): the data must outlive *v.
  Status GetBytesViewList(std::vector<std::string_view>* v, size_t max_count, size_t max_len);
  // Corruption if bytes are left over: a well-formed payload is consumed exactly.
  Status Done() const;

  size_t remaining() const { return data_.size() - pos_; }

 private:
  Status Need(size_t n, const char* what) const;
  Status GetCount(uint32_t* n, size_t min_item_bytes, size_t max_count, const char* what);

  std::string_view data_;
  size_t pos_ = 0;
};

}  // namespace rhino
