#include "net/messages.h"

#include "net/wire_codec.h"

namespace rhino {
namespace {

// Upper bound on manifest indexes in a needed list: a manifest with more
// files than this does not fit in a frame anyway.
constexpr size_t kMaxListItems = 1 << 20;

}  // namespace

// ---- the field lists of §3's messages, in wire order (net/wire_codec.h) ----

template <class V>
void Fields(V& v, wire::Msg<V, HelloReq>& m) {
  v.U32(m.proto);
  v.Bytes(m.worker_id, kMaxWorkerIdBytes);
  v.Bytes(m.client_nonce, kNonceBytes);
  if (v.Trailing(m.has_role)) {
    v.Bytes(m.role, kMaxRoleBytes);
    v.Bytes(m.scope, kMaxWorkerIdBytes);
  }
}
RHINO_WIRE_MESSAGE(HelloReq)

template <class V>
void Fields(V& v, wire::Msg<V, HelloRsp>& m) {
  v.Bytes(m.worker_id, kMaxWorkerIdBytes);
  v.Bytes(m.server_nonce, kNonceBytes);
  v.Bytes(m.server_mac, kMacBytes);
}
RHINO_WIRE_MESSAGE(HelloRsp)

template <class V>
void Fields(V& v, wire::Msg<V, AuthReq>& m) {
  v.Bytes(m.client_mac, kMacBytes);
}
RHINO_WIRE_MESSAGE(AuthReq)

template <class V>
void Fields(V& v, wire::Msg<V, AuthRsp>& m) {
  v.Bool(m.ok, "ok");
}
RHINO_WIRE_MESSAGE(AuthRsp)

template <class V>
void Fields(V& v, wire::Msg<V, OpenStreamReq>& m) {
  v.Bytes(m.operator_id, kMaxWorkerIdBytes);
  v.U32(m.instance);
  v.U64(m.checkpoint_id);
  v.U32(m.chunk_bytes);
  v.U32(m.window);
  v.List(m.downstream, kMaxChainLength, kMaxAddressBytes);
  v.Bytes(m.manifest);
}
RHINO_WIRE_MESSAGE(OpenStreamReq)

template <class V>
void Fields(V& v, wire::Msg<V, OpenStreamRsp>& m) {
  v.U32(m.code);
  v.Text(m.message);
  v.U32List(m.needed, kMaxListItems);
  v.U32(m.credits);
  v.U32List(m.member_needed_files, kMaxChainLength);
  v.U64List(m.member_needed_bytes, kMaxChainLength);
}
RHINO_WIRE_MESSAGE(OpenStreamRsp)

// The sender writes a chunk's fields with AppendPrefix and then the data, so
// that the data is never copied into an encoder (net/messages.h).
template <class V>
void Fields(V& v, wire::Msg<V, ChunkReq>& m) {
  v.U32(m.file_index);
  v.U64(m.offset);
  v.Bytes(m.data);
}

void ChunkReq::AppendPrefix(std::string* out, uint32_t file_index, uint64_t offset, uint32_t length) {
  Encoder e(kPrefixBytes);
  e.PutU32(file_index);
  e.PutU64(offset);
  e.PutU32(length);
  out->append(e.buffer());
}

Status ChunkReq::Decode(std::string_view payload, ChunkReq* out) { return wire::Decode(payload, out); }

template <class V>
void Fields(V& v, wire::Msg<V, CreditRsp>& m) {
  v.U32(m.credits);
}
RHINO_WIRE_MESSAGE(CreditRsp)

template <class V>
void Fields(V&, wire::Msg<V, CommitReq>&) {}

Status CommitReq::Decode(std::string_view payload, CommitReq* out) { return wire::Decode(payload, out); }

template <class V>
void Fields(V& v, wire::Msg<V, CommitRsp>& m) {
  v.U32(m.code);
  v.Text(m.message);
}
RHINO_WIRE_MESSAGE(CommitRsp)

template <class V>
void Fields(V& v, wire::Msg<V, AbortReq>& m) {
  v.Text(m.reason);
}
RHINO_WIRE_MESSAGE(AbortReq)

template <class V>
void Fields(V& v, wire::Msg<V, HeartbeatReq>& m) {
  v.U64(m.nonce);
}
RHINO_WIRE_MESSAGE(HeartbeatReq)

template <class V>
void Fields(V& v, wire::Msg<V, HeartbeatRsp>& m) {
  v.U64(m.nonce);
}
RHINO_WIRE_MESSAGE(HeartbeatRsp)

template <class V>
void Fields(V& v, wire::Msg<V, StoreQueryReq>& m) {
  v.Bytes(m.operator_id, kMaxWorkerIdBytes);
  v.U32(m.instance);
}
RHINO_WIRE_MESSAGE(StoreQueryReq)

template <class V>
void Fields(V& v, wire::Msg<V, StoreQueryRsp>& m) {
  v.U32(m.code);
  v.Text(m.message);
  v.U64List(m.checkpoints, kMaxListItems);
}
RHINO_WIRE_MESSAGE(StoreQueryRsp)

template <class V>
void Fields(V& v, wire::Msg<V, ErrorRsp>& m) {
  v.U32(m.code);
  v.Text(m.message);
}
RHINO_WIRE_MESSAGE(ErrorRsp)

}  // namespace rhino
