#include "rhino/messages.h"

namespace rhino {
namespace {

// Upper bound on manifest indexes in a needed list: a manifest with more
// files than this does not fit in a frame anyway.
constexpr size_t kMaxListItems = 1 << 20;

// A message is informative only: cut it rather than fail to report an error.
std::string_view Cut(const std::string& message) {
  return std::string_view(message).substr(0, kMaxMessageBytes);
}

}  // namespace

std::string HelloReq::Encode() const {
  Encoder e;
  e.PutU32(proto);
  e.PutBytes(worker_id);
  e.PutBytes(client_nonce);
  return e.Finish();
}

Status HelloReq::Decode(std::string_view payload, HelloReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->proto));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->worker_id, kMaxWorkerIdBytes));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->client_nonce, kNonceBytes));
  return d.Done();
}

std::string HelloRsp::Encode() const {
  Encoder e;
  e.PutBytes(worker_id);
  e.PutBytes(server_nonce);
  e.PutBytes(server_mac);
  return e.Finish();
}

Status HelloRsp::Decode(std::string_view payload, HelloRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->worker_id, kMaxWorkerIdBytes));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->server_nonce, kNonceBytes));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->server_mac, kMacBytes));
  return d.Done();
}

std::string AuthReq::Encode() const {
  Encoder e;
  e.PutBytes(client_mac);
  return e.Finish();
}

Status AuthReq::Decode(std::string_view payload, AuthReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->client_mac, kMacBytes));
  return d.Done();
}

std::string AuthRsp::Encode() const {
  Encoder e;
  e.PutU8(ok ? 1 : 0);
  return e.Finish();
}

Status AuthRsp::Decode(std::string_view payload, AuthRsp* out) {
  Decoder d(payload);
  uint8_t v = 0;
  RHINO_RETURN_IF_ERROR(d.GetU8(&v));
  if (v > 1) return Status::Corruption("AuthRsp.ok is neither 0 nor 1");
  out->ok = v == 1;
  return d.Done();
}

std::string OpenStreamReq::Encode() const {
  Encoder e(manifest.size() + 256);
  e.PutBytes(operator_id);
  e.PutU32(instance);
  e.PutU64(checkpoint_id);
  e.PutU32(chunk_bytes);
  e.PutU32(window);
  e.PutStrList(downstream);
  e.PutBytes(manifest);
  return e.Finish();
}

Status OpenStreamReq::Decode(std::string_view payload, OpenStreamReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->operator_id, kMaxWorkerIdBytes));
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->instance));
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->checkpoint_id));
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->chunk_bytes));
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->window));
  RHINO_RETURN_IF_ERROR(d.GetStrList(&out->downstream, kMaxChainLength, kMaxAddressBytes));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->manifest));
  return d.Done();
}

std::string OpenStreamRsp::Encode() const {
  Encoder e;
  e.PutU32(code);
  e.PutBytes(Cut(message));
  e.PutU32List(needed);
  e.PutU32(credits);
  e.PutU32List(member_needed_files);
  e.PutU64List(member_needed_bytes);
  return e.Finish();
}

Status OpenStreamRsp::Decode(std::string_view payload, OpenStreamRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->code));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->message, kMaxMessageBytes));
  RHINO_RETURN_IF_ERROR(d.GetU32List(&out->needed, kMaxListItems));
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->credits));
  RHINO_RETURN_IF_ERROR(d.GetU32List(&out->member_needed_files, kMaxChainLength));
  RHINO_RETURN_IF_ERROR(d.GetU64List(&out->member_needed_bytes, kMaxChainLength));
  return d.Done();
}

void ChunkReq::AppendPrefix(std::string* out, uint32_t file_index, uint64_t offset, uint32_t length) {
  Encoder e(kPrefixBytes);
  e.PutU32(file_index);
  e.PutU64(offset);
  e.PutU32(length);
  out->append(e.buffer());
}

Status ChunkReq::Decode(std::string_view payload, ChunkReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->file_index));
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->offset));
  RHINO_RETURN_IF_ERROR(d.GetBytesView(&out->data));
  return d.Done();
}

std::string CreditRsp::Encode() const {
  Encoder e;
  e.PutU32(credits);
  return e.Finish();
}

Status CreditRsp::Decode(std::string_view payload, CreditRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->credits));
  return d.Done();
}

Status CommitReq::Decode(std::string_view payload, CommitReq* out) {
  (void)out;
  return Decoder(payload).Done();
}

std::string CommitRsp::Encode() const {
  Encoder e;
  e.PutU32(code);
  e.PutBytes(Cut(message));
  return e.Finish();
}

Status CommitRsp::Decode(std::string_view payload, CommitRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->code));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->message, kMaxMessageBytes));
  return d.Done();
}

std::string AbortReq::Encode() const {
  Encoder e;
  e.PutBytes(Cut(reason));
  return e.Finish();
}

Status AbortReq::Decode(std::string_view payload, AbortReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->reason, kMaxMessageBytes));
  return d.Done();
}

std::string HeartbeatReq::Encode() const {
  Encoder e;
  e.PutU64(nonce);
  return e.Finish();
}

Status HeartbeatReq::Decode(std::string_view payload, HeartbeatReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->nonce));
  return d.Done();
}

std::string HeartbeatRsp::Encode() const {
  Encoder e;
  e.PutU64(nonce);
  return e.Finish();
}

Status HeartbeatRsp::Decode(std::string_view payload, HeartbeatRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->nonce));
  return d.Done();
}

std::string StoreQueryReq::Encode() const {
  Encoder e;
  e.PutBytes(operator_id);
  e.PutU32(instance);
  return e.Finish();
}

Status StoreQueryReq::Decode(std::string_view payload, StoreQueryReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->operator_id, kMaxWorkerIdBytes));
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->instance));
  return d.Done();
}

std::string StoreQueryRsp::Encode() const {
  Encoder e;
  e.PutU32(code);
  e.PutBytes(Cut(message));
  e.PutU64List(checkpoints);
  return e.Finish();
}

Status StoreQueryRsp::Decode(std::string_view payload, StoreQueryRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->code));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->message, kMaxMessageBytes));
  RHINO_RETURN_IF_ERROR(d.GetU64List(&out->checkpoints, kMaxListItems));
  return d.Done();
}

std::string ErrorRsp::Encode() const {
  Encoder e;
  e.PutU32(code);
  e.PutBytes(Cut(message));
  return e.Finish();
}

Status ErrorRsp::Decode(std::string_view payload, ErrorRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->code));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->message, kMaxMessageBytes));
  return d.Done();
}

}  // namespace rhino
