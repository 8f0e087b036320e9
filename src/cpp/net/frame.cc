#include "net/frame.h"

#include <xxhash.h>
// Bulk hashing (chunks, whole files) through libxxhash's run-time dispatch to
// its AVX2/AVX-512 kernels; the plain entry points are built for baseline
// x86-64 (SSE2). Same hash values either way (the XXH3 spec).
#include <xxh_x86dispatch.h>

#include <cstring>

namespace rhino {
namespace {

void StoreU16(char* p, uint16_t v) {
  p[0] = static_cast<char>(v & 0xff);
  p[1] = static_cast<char>(v >> 8);
}
void StoreU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void StoreU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint16_t LoadU16(const char* p) {
  return static_cast<uint16_t>(static_cast<uint8_t>(p[0]) | (static_cast<uint8_t>(p[1]) << 8));
}
uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}
uint64_t LoadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// Header layout, protocol.md §1.
constexpr size_t kOffMagic = 0, kOffVersion = 4, kOffType = 5, kOffFlags = 6, kOffStream = 8,
                 kOffLength = 12, kOffChain = 16, kOffPayloadSum = 24, kOffHeaderSum = 28;

}  // namespace

bool IsKnownMessageType(uint8_t type) {
  return type >= static_cast<uint8_t>(MessageType::kHelloReq) &&
         type <= static_cast<uint8_t>(kLastMessageType);
}

const char* MessageTypeName(MessageType type) {
  switch (type) {
    case MessageType::kHelloReq: return "HelloReq";
    case MessageType::kHelloRsp: return "HelloRsp";
    case MessageType::kAuthReq: return "AuthReq";
    case MessageType::kAuthRsp: return "AuthRsp";
    case MessageType::kOpenStreamReq: return "OpenStreamReq";
    case MessageType::kOpenStreamRsp: return "OpenStreamRsp";
    case MessageType::kChunkReq: return "ChunkReq";
    case MessageType::kCreditRsp: return "CreditRsp";
    case MessageType::kCommitReq: return "CommitReq";
    case MessageType::kCommitRsp: return "CommitRsp";
    case MessageType::kAbortReq: return "AbortReq";
    case MessageType::kHeartbeatReq: return "HeartbeatReq";
    case MessageType::kHeartbeatRsp: return "HeartbeatRsp";
    case MessageType::kStoreQueryReq: return "StoreQueryReq";
    case MessageType::kStoreQueryRsp: return "StoreQueryRsp";
    case MessageType::kErrorRsp: return "ErrorRsp";
    case MessageType::kInstanceReq: return "InstanceReq";
    case MessageType::kInstanceRsp: return "InstanceRsp";
    case MessageType::kSessionOpenReq: return "SessionOpenReq";
    case MessageType::kSessionOpenRsp: return "SessionOpenRsp";
    case MessageType::kGetReq: return "GetReq";
    case MessageType::kGetRsp: return "GetRsp";
    case MessageType::kWriteReq: return "WriteReq";
    case MessageType::kSessionRsp: return "SessionRsp";
    case MessageType::kScanReq: return "ScanReq";
    case MessageType::kScanRsp: return "ScanRsp";
    case MessageType::kSessionCommitReq: return "SessionCommitReq";
    case MessageType::kSessionCommitRsp: return "SessionCommitRsp";
    case MessageType::kSessionAbortReq: return "SessionAbortReq";
    case MessageType::kCoordReq: return "CoordReq";
    case MessageType::kCoordRsp: return "CoordRsp";
  }
  return "Unknown";
}

uint32_t FrameChecksum(const void* data, size_t n) {
  return static_cast<uint32_t>(XXH3_64bits(data, n) & 0xffffffffu);
}

void EncodeFrameHeader(MessageType type, uint32_t stream_id, uint64_t chain_version,
                       std::string_view payload, char* out) {
  StoreU32(out + kOffMagic, kFrameMagic);
  out[kOffVersion] = static_cast<char>(kProtocolVersion);
  out[kOffType] = static_cast<char>(type);
  StoreU16(out + kOffFlags, 0);
  StoreU32(out + kOffStream, stream_id);
  StoreU32(out + kOffLength, static_cast<uint32_t>(payload.size()));
  StoreU64(out + kOffChain, chain_version);
  StoreU32(out + kOffPayloadSum, FrameChecksum(payload.data(), payload.size()));
  StoreU32(out + kOffHeaderSum, FrameChecksum(out, kOffHeaderSum));
}

std::string EncodeFrame(MessageType type, uint32_t stream_id, uint64_t chain_version,
                        std::string_view payload) {
  std::string out(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(type, stream_id, chain_version, payload, out.data());
  out.append(payload.data(), payload.size());
  return out;
}

Status DecodeFrameHeader(const char* data, uint32_t max_frame_bytes, FrameHeader* out,
                         bool* header_intact) {
  if (header_intact != nullptr) *header_intact = false;
  // §1 step 1: nothing in a header is trusted, least of all `length`, before
  // its checksum holds.
  uint32_t want = LoadU32(data + kOffHeaderSum);
  uint32_t got = FrameChecksum(data, kOffHeaderSum);
  if (want != got) return Status::Corruption("frame header checksum mismatch");
  if (header_intact != nullptr) *header_intact = true;
  FrameHeader h;
  h.stream_id = LoadU32(data + kOffStream);
  h.length = LoadU32(data + kOffLength);
  h.chain_version = LoadU64(data + kOffChain);
  h.payload_checksum = LoadU32(data + kOffPayloadSum);
  *out = h;  // stream id and chain version are usable for an ErrorRsp from here on
  // Step 2.
  if (LoadU32(data + kOffMagic) != kFrameMagic) return Status::Corruption("bad frame magic");
  uint8_t version = static_cast<uint8_t>(data[kOffVersion]);
  if (version != kProtocolVersion) {
    return Status::Corruption("unsupported protocol version " + std::to_string(version));
  }
  if (LoadU16(data + kOffFlags) != 0) return Status::Corruption("reserved frame flags are set");
  // Step 3: before any payload buffer exists.
  if (h.length > max_frame_bytes) {
    return Status::Corruption("frame length " + std::to_string(h.length) + " exceeds max_frame_bytes " +
                              std::to_string(max_frame_bytes));
  }
  // Step 4.
  uint8_t type = static_cast<uint8_t>(data[kOffType]);
  if (!IsKnownMessageType(type)) return Status::Corruption("unknown message type " + std::to_string(type));
  out->type = static_cast<MessageType>(type);
  return Status::OK();
}

Status CheckFramePayload(const FrameHeader& header, std::string_view payload) {
  if (payload.size() != header.length) return Status::Corruption("payload length does not match the header");
  if (FrameChecksum(payload.data(), payload.size()) != header.payload_checksum) {
    return Status::Corruption("frame payload checksum mismatch");
  }
  return Status::OK();
}

Status DecodeFrame(std::string_view data, uint32_t max_frame_bytes, FrameHeader* header,
                   std::string_view* payload) {
  if (data.size() < kFrameHeaderBytes) {
    return Status::Corruption("truncated frame: " + std::to_string(data.size()) + " bytes < 32-byte header");
  }
  RHINO_RETURN_IF_ERROR(DecodeFrameHeader(data.data(), max_frame_bytes, header));
  size_t have = data.size() - kFrameHeaderBytes;
  if (have < header->length) {
    return Status::Corruption("truncated frame payload: " + std::to_string(have) + " of " +
                              std::to_string(header->length) + " bytes");
  }
  if (have > header->length) return Status::Corruption("trailing bytes after the frame payload");
  *payload = data.substr(kFrameHeaderBytes);
  return CheckFramePayload(*header, *payload);
}

// ---- Encoder ----

void Encoder::PutU32(uint32_t v) {
  char b[4];
  StoreU32(b, v);
  buf_.append(b, 4);
}

void Encoder::PutU64(uint64_t v) {
  char b[8];
  StoreU64(b, v);
  buf_.append(b, 8);
}

void Encoder::PutBytes(std::string_view v) {
  PutU32(static_cast<uint32_t>(v.size()));
  buf_.append(v.data(), v.size());
}

void Encoder::PutU32List(const std::vector<uint32_t>& v) {
  PutU32(static_cast<uint32_t>(v.size()));
  for (uint32_t x : v) PutU32(x);
}

void Encoder::PutU64List(const std::vector<uint64_t>& v) {
  PutU32(static_cast<uint32_t>(v.size()));
  for (uint64_t x : v) PutU64(x);
}

void Encoder::PutStrList(const std::vector<std::string>& v) {
  PutU32(static_cast<uint32_t>(v.size()));
  for (const auto& s : v) PutBytes(s);
}

void Encoder::PutBytesList(const std::vector<std::string_view>& v) {
  size_t total = 4;
  for (const auto& s : v) total += 4 + s.size();
  buf_.reserve(buf_.size() + total);
  PutU32(static_cast<uint32_t>(v.size()));
  for (const auto& s : v) PutBytes(s);
}

// ---- Decoder ----

Status Decoder::Need(size_t n, const char* what) const {
  if (remaining() < n) {
    return Status::Corruption(std::string("payload field ") + what + " runs past the end (" +
                              std::to_string(n) + " bytes needed, " + std::to_string(remaining()) + " left)");
  }
  return Status::OK();
}

Status Decoder::GetU8(uint8_t* v) {
  RHINO_RETURN_IF_ERROR(Need(1, "u8"));
  *v = static_cast<uint8_t>(data_[pos_]);
  pos_ += 1;
  return Status::OK();
}

Status Decoder::GetU32(uint32_t* v) {
  RHINO_RETURN_IF_ERROR(Need(4, "u32"));
  *v = LoadU32(data_.data() + pos_);
  pos_ += 4;
  return Status::OK();
}

Status Decoder::GetU64(uint64_t* v) {
  RHINO_RETURN_IF_ERROR(Need(8, "u64"));
  *v = LoadU64(data_.data() + pos_);
  pos_ += 8;
  return Status::OK();
}

Status Decoder::GetBytesView(std::string_view* v, size_t max_len) {
  uint32_t n = 0;
  RHINO_RETURN_IF_ERROR(GetU32(&n));
  if (n > max_len) {
    return Status::Corruption("payload field of " + std::to_string(n) + " bytes exceeds its limit of " +
                              std::to_string(max_len));
  }
  RHINO_RETURN_IF_ERROR(Need(n, "bytes"));
  *v = data_.substr(pos_, n);
  pos_ += n;
  return Status::OK();
}

Status Decoder::GetBytes(std::string* v, size_t max_len) {
  std::string_view view;
  RHINO_RETURN_IF_ERROR(GetBytesView(&view, max_len));
  v->assign(view.data(), view.size());
  return Status::OK();
}

Status Decoder::GetCount(uint32_t* n, size_t min_item_bytes, size_t max_count, const char* what) {
  RHINO_RETURN_IF_ERROR(GetU32(n));
  if (*n > max_count) {
    return Status::Corruption(std::string(what) + " of " + std::to_string(*n) + " items exceeds its limit of " +
                              std::to_string(max_count));
  }
  // Every item takes at least min_item_bytes, so a count the payload cannot
  // hold is forged: reject it before reserving anything.
  if (static_cast<uint64_t>(*n) * min_item_bytes > remaining()) {
    return Status::Corruption(std::string(what) + " count " + std::to_string(*n) + " runs past the end");
  }
  return Status::OK();
}

Status Decoder::GetU32List(std::vector<uint32_t>* v, size_t max_count) {
  uint32_t n = 0;
  RHINO_RETURN_IF_ERROR(GetCount(&n, 4, max_count, "list<u32>"));
  v->clear();
  v->reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t x = 0;
    RHINO_RETURN_IF_ERROR(GetU32(&x));
    v->push_back(x);
  }
  return Status::OK();
}

Status Decoder::GetU64List(std::vector<uint64_t>* v, size_t max_count) {
  uint32_t n = 0;
  RHINO_RETURN_IF_ERROR(GetCount(&n, 8, max_count, "list<u64>"));
  v->clear();
  v->reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    uint64_t x = 0;
    RHINO_RETURN_IF_ERROR(GetU64(&x));
    v->push_back(x);
  }
  return Status::OK();
}

Status Decoder::GetStrList(std::vector<std::string>* v, size_t max_count, size_t max_len) {
  uint32_t n = 0;
  RHINO_RETURN_IF_ERROR(GetCount(&n, 4, max_count, "list<str>"));
  v->clear();
  v->reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::string s;
    RHINO_RETURN_IF_ERROR(GetBytes(&s, max_len));
    v->push_back(std::move(s));
  }
  return Status::OK();
}

Status Decoder::GetBytesViewList(std::vector<std::string_view>* v, size_t max_count, size_t max_len) {
  uint32_t n = 0;
  RHINO_RETURN_IF_ERROR(GetCount(&n, 4, max_count, "list<bytes>"));
  v->clear();
  v->reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view s;
    RHINO_RETURN_IF_ERROR(GetBytesView(&s, max_len));
    v->push_back(s);
  }
  return Status::OK();
}

Status Decoder::Done() const {
  if (remaining() != 0) {
    return Status::Corruption(std::to_string(remaining()) + " unexpected trailing bytes in the payload");
  }
  return Status::OK();
}

}  // namespace rhino
