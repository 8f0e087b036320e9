#include "rhino/service_messages.h"

#include <cstring>

#include "rhino/coord_messages.h"

namespace rhino {
namespace {

// Every key and value list holds at most this many items; a frame cannot
// carry more anyway (each item costs 4 bytes of length).
constexpr size_t kMaxItems = 1u << 26;

std::string_view Cut(const std::string& message) { return std::string_view(message).substr(0, kMaxMessageBytes); }

Status GetOperator(Decoder* d, std::string* op) { return d->GetBytes(op, kMaxOperatorIdBytes); }

Status GetBool(Decoder* d, bool* b) {
  uint8_t v = 0;
  RHINO_RETURN_IF_ERROR(d->GetU8(&v));
  if (v > 1) return Status::Corruption("a boolean field holds " + std::to_string(v));
  *b = v == 1;
  return Status::OK();
}

}  // namespace

const char* InstanceActionName(InstanceAction a) {
  switch (a) {
    case InstanceAction::kOpen: return "open";
    case InstanceAction::kClose: return "close";
    case InstanceAction::kTakeover: return "takeover";
    case InstanceAction::kFence: return "fence";
    case InstanceAction::kImport: return "import";
    case InstanceAction::kMoveVnodes: return "move_vnodes";
    case InstanceAction::kList: return "list";
    case InstanceAction::kStatus: return "status";
    case InstanceAction::kDiscardAfter: return "discard_after";
    case InstanceAction::kReconfigure: return "reconfigure";
    case InstanceAction::kReplicate: return "replicate";
  }
  return "unknown";
}

std::string InstanceReq::Encode() const {
  Encoder e;
  e.PutU8(action);
  e.PutBytes(operator_id);
  e.PutU32(instance);
  e.PutU64(epoch);
  e.PutBytes(args);
  return e.Finish();
}

Status InstanceReq::Decode(std::string_view payload, InstanceReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU8(&out->action));
  RHINO_RETURN_IF_ERROR(GetOperator(&d, &out->operator_id));
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->instance));
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->epoch));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->args, kMaxJsonBytes));
  return d.Done();
}

std::string InstanceRsp::Encode() const {
  Encoder e;
  e.PutU32(code);
  e.PutBytes(Cut(message));
  e.PutBytes(result);
  return e.Finish();
}

Status InstanceRsp::Decode(std::string_view payload, InstanceRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->code));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->message, kMaxMessageBytes));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->result, kMaxJsonBytes * 16));
  return d.Done();
}

std::string SessionOpenReq::Encode() const {
  Encoder e;
  e.PutBytes(operator_id);
  e.PutU32(instance);
  e.PutU64(batch);
  e.PutU64(epoch);
  return e.Finish();
}

Status SessionOpenReq::Decode(std::string_view payload, SessionOpenReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(GetOperator(&d, &out->operator_id));
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->instance));
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->batch));
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->epoch));
  return d.Done();
}

std::string SessionOpenRsp::Encode() const {
  Encoder e;
  e.PutU32(code);
  e.PutBytes(Cut(message));
  e.PutU8(has_version ? 1 : 0);
  e.PutU64(version);
  e.PutU8(rolled_back ? 1 : 0);
  return e.Finish();
}

Status SessionOpenRsp::Decode(std::string_view payload, SessionOpenRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->code));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->message, kMaxMessageBytes));
  RHINO_RETURN_IF_ERROR(GetBool(&d, &out->has_version));
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->version));
  RHINO_RETURN_IF_ERROR(GetBool(&d, &out->rolled_back));
  return d.Done();
}

std::string GetReq::Encode() const {
  Encoder e;
  e.PutBytesList(keys);
  return e.Finish();
}

Status GetReq::Decode(std::string_view payload, GetReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetBytesViewList(&out->keys, kMaxItems, UINT32_MAX));
  return d.Done();
}

Status GetRsp::Decode(std::string_view payload, GetRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->code));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->message, kMaxMessageBytes));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->found));
  RHINO_RETURN_IF_ERROR(d.GetBytesViewList(&out->values, kMaxItems, UINT32_MAX));
  RHINO_RETURN_IF_ERROR(d.Done());
  size_t hits = 0;
  for (char c : out->found) {
    if (c != 0 && c != 1) return Status::Corruption("GetRsp.found holds a byte other than 0 or 1");
    hits += static_cast<size_t>(c);
  }
  if (hits != out->values.size()) {
    return Status::Corruption("GetRsp has " + std::to_string(out->values.size()) + " values for " +
                              std::to_string(hits) + " found keys");
  }
  return Status::OK();
}

std::string GetRsp::Encode() const {
  Encoder e;
  e.PutU32(code);
  e.PutBytes(Cut(message));
  e.PutBytes(found);
  e.PutBytesList(values);
  return e.Finish();
}

std::string WriteReq::Encode() const {
  Encoder e;
  e.PutU8(op);
  e.PutBytesList(keys);
  e.PutBytesList(values);
  return e.Finish();
}

Status WriteReq::Decode(std::string_view payload, WriteReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU8(&out->op));
  RHINO_RETURN_IF_ERROR(d.GetBytesViewList(&out->keys, kMaxItems, UINT32_MAX));
  RHINO_RETURN_IF_ERROR(d.GetBytesViewList(&out->values, kMaxItems, UINT32_MAX));
  return d.Done();
}

std::string SessionRsp::Encode() const {
  Encoder e;
  e.PutU32(code);
  e.PutBytes(Cut(message));
  e.PutU64(count);
  return e.Finish();
}

Status SessionRsp::Decode(std::string_view payload, SessionRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->code));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->message, kMaxMessageBytes));
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->count));
  return d.Done();
}

std::string ScanReq::Encode() const {
  Encoder e;
  e.PutU8(has_vnode ? 1 : 0);
  e.PutU32(vnode);
  e.PutBytes(prefix);
  e.PutU8(has_after ? 1 : 0);
  e.PutU32(after_vnode);
  e.PutBytes(after_key);
  e.PutU32(max_items);
  return e.Finish();
}

Status ScanReq::Decode(std::string_view payload, ScanReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(GetBool(&d, &out->has_vnode));
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->vnode));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->prefix));
  RHINO_RETURN_IF_ERROR(GetBool(&d, &out->has_after));
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->after_vnode));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->after_key));
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->max_items));
  return d.Done();
}

Status ScanRsp::Decode(std::string_view payload, ScanRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->code));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->message, kMaxMessageBytes));
  RHINO_RETURN_IF_ERROR(GetBool(&d, &out->done));
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->last_vnode));
  RHINO_RETURN_IF_ERROR(d.GetBytesViewList(&out->keys, kMaxItems, UINT32_MAX));
  RHINO_RETURN_IF_ERROR(d.GetBytesViewList(&out->values, kMaxItems, UINT32_MAX));
  RHINO_RETURN_IF_ERROR(d.Done());
  if (out->keys.size() != out->values.size()) return Status::Corruption("ScanRsp has more keys than values or fewer");
  return Status::OK();
}

std::string ScanRsp::Encode() const {
  Encoder e;
  e.PutU32(code);
  e.PutBytes(Cut(message));
  e.PutU8(done ? 1 : 0);
  e.PutU32(last_vnode);
  e.PutBytesList(keys);
  e.PutBytesList(values);
  return e.Finish();
}

std::string SessionCommitReq::Encode() const {
  Encoder e;
  e.PutU8(mode);
  return e.Finish();
}

Status SessionCommitReq::Decode(std::string_view payload, SessionCommitReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU8(&out->mode));
  return d.Done();
}

std::string SessionCommitRsp::Encode() const {
  Encoder e;
  e.PutU32(code);
  e.PutBytes(Cut(message));
  e.PutU64(version);
  e.PutBytes(stats);
  return e.Finish();
}

Status SessionCommitRsp::Decode(std::string_view payload, SessionCommitRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->code));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->message, kMaxMessageBytes));
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->version));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->stats, kMaxJsonBytes));
  return d.Done();
}

std::string SessionAbortReq::Encode() const {
  Encoder e;
  e.PutBytes(Cut(reason));
  return e.Finish();
}

Status SessionAbortReq::Decode(std::string_view payload, SessionAbortReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->reason, kMaxMessageBytes));
  return d.Done();
}

GetRspBuilder::GetRspBuilder(size_t n_hint) { found_.reserve(n_hint); }

void GetRspBuilder::Add(bool found, std::string_view value) {
  found_.push_back(found ? 1 : 0);
  if (found) {
    values_.PutBytes(value);
    values_bytes_ += 4 + value.size();
    ++count_;
  }
}

std::string GetRspBuilder::Finish() {
  Encoder e(SizeWith(0));
  e.PutU32(0);
  e.PutBytes("");
  e.PutBytes(found_);
  e.PutU32(count_);
  e.buffer().append(values_.buffer());
  return e.Finish();
}

std::string EncodeGetRsp(const std::vector<uint8_t>& found, const std::vector<std::string_view>& values, size_t count) {
  size_t hits = 0, bytes = 0;
  for (size_t i = 0; i < count; ++i) {
    if (found[i]) {
      ++hits;
      bytes += 4 + values[i].size();
    }
  }
  std::string out;
  out.resize(4 + 4 + 4 + count + 4 + bytes);
  char* p = out.data();
  auto u32 = [&p](uint32_t v) {
    for (int k = 0; k < 4; ++k) *p++ = static_cast<char>((v >> (8 * k)) & 0xff);
  };
  u32(0);  // code
  u32(0);  // message ""
  u32(static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i) *p++ = static_cast<char>(found[i] ? 1 : 0);
  u32(static_cast<uint32_t>(hits));
  for (size_t i = 0; i < count; ++i) {
    if (!found[i]) continue;
    u32(static_cast<uint32_t>(values[i].size()));
    std::memcpy(p, values[i].data(), values[i].size());
    p += values[i].size();
  }
  return out;
}

void ScanRspBuilder::Add(std::string_view key, std::string_view value) {
  keys_.PutBytes(key);
  values_.PutBytes(value);
  bytes_ += 8 + key.size() + value.size();
  ++count_;
}

std::string ScanRspBuilder::Finish(bool done, uint32_t last_vnode) {
  Encoder e(SizeWith(0, 0));
  e.PutU32(0);
  e.PutBytes("");
  e.PutU8(done ? 1 : 0);
  e.PutU32(last_vnode);
  e.PutU32(count_);
  e.buffer().append(keys_.buffer());
  e.PutU32(count_);
  e.buffer().append(values_.buffer());
  return e.Finish();
}

std::string ServiceErrorPayload(MessageType rsp, const Status& s) {
  Encoder e;
  e.PutU32(WireCode(s));
  e.PutBytes(Cut(s.message()));
  switch (rsp) {
    case MessageType::kInstanceRsp: e.PutBytes(""); break;
    case MessageType::kSessionOpenRsp: e.PutU8(0); e.PutU64(0); e.PutU8(0); break;
    case MessageType::kGetRsp: e.PutBytes(""); e.PutU32(0); break;
    case MessageType::kSessionRsp: e.PutU64(0); break;
    case MessageType::kScanRsp: e.PutU8(1); e.PutU32(0); e.PutU32(0); e.PutU32(0); break;
    case MessageType::kSessionCommitRsp: e.PutU64(0); e.PutBytes(""); break;
    default: break;
  }
  return e.Finish();
}

namespace {

template <typename M>
Status ReEncode(std::string_view payload, std::string* out) {
  M m;
  RHINO_RETURN_IF_ERROR(M::Decode(payload, &m));
  *out = m.Encode();
  return Status::OK();
}

}  // namespace

Status DecodeServiceMessage(MessageType type, std::string_view payload, std::string* reencoded) {
  reencoded->clear();
  switch (type) {
    case MessageType::kInstanceReq: return ReEncode<InstanceReq>(payload, reencoded);
    case MessageType::kInstanceRsp: return ReEncode<InstanceRsp>(payload, reencoded);
    case MessageType::kSessionOpenReq: return ReEncode<SessionOpenReq>(payload, reencoded);
    case MessageType::kSessionOpenRsp: return ReEncode<SessionOpenRsp>(payload, reencoded);
    case MessageType::kGetReq: return ReEncode<GetReq>(payload, reencoded);
    case MessageType::kGetRsp: return ReEncode<GetRsp>(payload, reencoded);
    case MessageType::kWriteReq: return ReEncode<WriteReq>(payload, reencoded);
    case MessageType::kSessionRsp: return ReEncode<SessionRsp>(payload, reencoded);
    case MessageType::kScanReq: return ReEncode<ScanReq>(payload, reencoded);
    case MessageType::kScanRsp: return ReEncode<ScanRsp>(payload, reencoded);
    case MessageType::kSessionCommitReq: return ReEncode<SessionCommitReq>(payload, reencoded);
    case MessageType::kSessionCommitRsp: return ReEncode<SessionCommitRsp>(payload, reencoded);
    case MessageType::kSessionAbortReq: return ReEncode<SessionAbortReq>(payload, reencoded);
    // The coordinator's (protocol §8): not the state service's, but decoded
    // here so that the fuzz target and decode_frame cover them too.
    case MessageType::kCoordReq: return ReEncode<CoordReq>(payload, reencoded);
    case MessageType::kCoordRsp: return ReEncode<CoordRsp>(payload, reencoded);
    default: return Status::OK();
  }
}

}  // namespace rhino
