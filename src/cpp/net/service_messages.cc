#include "rhino/service_messages.h"

#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>

#include "rhino/coord_messages.h"
#include "net/json_bounds.h"

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

namespace {

// The action names of §7.1, in one place.
constexpr std::pair<const char*, InstanceAction> kInstanceActions[] = {
    {"open", InstanceAction::kOpen},
    {"close", InstanceAction::kClose},
    {"takeover", InstanceAction::kTakeover},
    {"fence", InstanceAction::kFence},
    {"import", InstanceAction::kImport},
    {"move_vnodes", InstanceAction::kMoveVnodes},
    {"list", InstanceAction::kList},
    {"status", InstanceAction::kStatus},
    {"discard_after", InstanceAction::kDiscardAfter},
    {"reconfigure", InstanceAction::kReconfigure},
    {"replicate", InstanceAction::kReplicate},
    {"compact", InstanceAction::kCompact},
};

}  // namespace

Status ParseInstanceAction(std::string_view name, InstanceAction* out) {
  for (const auto& [n, a] : kInstanceActions) {
    if (name == n) {
      *out = a;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown instance action '" + std::string(name) + "'");
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
  if (read_checkpoint) {
    e.PutU8(1);
    e.PutU8(has_checkpoint ? 1 : 0);
    e.PutU64(checkpoint);
  }
  return e.Finish();
}

Status SessionOpenReq::Decode(std::string_view payload, SessionOpenReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(GetOperator(&d, &out->operator_id));
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->instance));
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->batch));
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->epoch));
  if (d.remaining() > 0) {
    // The appended fields of a checkpoint reader: present only for one, so a
    // frame decodes and re-encodes to the same bytes.
    RHINO_RETURN_IF_ERROR(GetBool(&d, &out->read_checkpoint));
    if (!out->read_checkpoint) return Status::Corruption("a SessionOpenReq carries reader fields with read = 0");
    RHINO_RETURN_IF_ERROR(GetBool(&d, &out->has_checkpoint));
    RHINO_RETURN_IF_ERROR(d.GetU64(&out->checkpoint));
  }
  return d.Done();
}

std::string SessionOpenRsp::Encode() const {
  Encoder e;
  e.PutU32(code);
  e.PutBytes(Cut(message));
  e.PutU8(has_version ? 1 : 0);
  e.PutU64(version);
  e.PutU8(rolled_back ? 1 : 0);
  if (reading) {
    e.PutU64(checkpoint);
    e.PutU32List(vnodes);
  }
  return e.Finish();
}

Status SessionOpenRsp::Decode(std::string_view payload, SessionOpenRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->code));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->message, kMaxMessageBytes));
  RHINO_RETURN_IF_ERROR(GetBool(&d, &out->has_version));
  RHINO_RETURN_IF_ERROR(d.GetU64(&out->version));
  RHINO_RETURN_IF_ERROR(GetBool(&d, &out->rolled_back));
  if (d.remaining() > 0) {  // a checkpoint reader's answer
    out->reading = true;
    RHINO_RETURN_IF_ERROR(d.GetU64(&out->checkpoint));
    RHINO_RETURN_IF_ERROR(d.GetU32List(&out->vnodes));
  }
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
  if (batch_time_ms) e.PutU64(static_cast<uint64_t>(*batch_time_ms));
  return e.Finish();
}

Status SessionCommitReq::Decode(std::string_view payload, SessionCommitReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU8(&out->mode));
  out->batch_time_ms.reset();
  if (d.remaining() > 0) {  // the optional trailing field (a payload of 2..8 bytes is Corruption)
    uint64_t t = 0;
    RHINO_RETURN_IF_ERROR(d.GetU64(&t));
    out->batch_time_ms = static_cast<int64_t>(t);
  }
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

// ---- InstanceReq arguments (§7.1) ----

namespace {

using json = nlohmann::json;

// The request's JSON arguments; InvalidArgument names the field at fault.
// Bounded in depth before any DOM is built (net/json_bounds.h says why).
Status ParseArgs(std::string_view text, json* out) {
  if (text.empty()) {
    *out = json::object();
    return Status::OK();
  }
  RHINO_RETURN_IF_ERROR(ParseJsonBounded(text, kMaxInstanceArgsDepth, "the request's arguments", out));
  if (!out->is_object()) return Status::InvalidArgument("the request's arguments are not a JSON object");
  return Status::OK();
}

bool Present(const json& args, const char* name) {
  auto it = args.find(name);
  return it != args.end() && !it->is_null();
}

template <typename T>
Status Arg(const json& args, const char* name, T* out, bool required) {
  if (!Present(args, name)) {
    return required ? Status::InvalidArgument(std::string("missing argument '") + name + "'") : Status::OK();
  }
  try {
    *out = args.at(name).get<T>();
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string("argument '") + name + "' has the wrong type: " + e.what());
  }
  return Status::OK();
}

template <typename T>
Status OptionalArg(const json& args, const char* name, std::optional<T>* out) {
  if (!Present(args, name)) return Status::OK();
  T v{};
  RHINO_RETURN_IF_ERROR(Arg(args, name, &v, true));
  *out = v;
  return Status::OK();
}

}  // namespace

Status ParseReconfigOps(std::string_view text, std::vector<ReconfigOp>* out) {
  out->clear();
  json j;
  RHINO_RETURN_IF_ERROR(ParseJsonBounded(text, kMaxInstanceArgsDepth, "the reconfiguration steps", &j));
  return ParseReconfigOps(j, out);
}

std::string ReconfigOpsJson(const std::vector<ReconfigOp>& ops) {
  json out = json::array();
  for (const auto& op : ops) {
    if (op.kind == ReconfigOp::Kind::kDrop) {
      out.push_back({{"op", "drop"}, {"vnodes", op.vnodes}});
    } else {
      out.push_back({{"op", "import"},
                     {"from_operator", op.from_operator},
                     {"from_instance", op.from_instance},
                     {"checkpoint", op.checkpoint},
                     {"vnodes", op.vnodes}});
    }
  }
  return out.dump();
}

Status DecodeInstanceArgs(std::string_view text, NoArgs*) {
  json args;
  return ParseArgs(text, &args);
}

Status DecodeInstanceArgs(std::string_view text, OpenArgs* out) {
  json args;
  RHINO_RETURN_IF_ERROR(ParseArgs(text, &args));
  RHINO_RETURN_IF_ERROR(Arg(args, "num_key_groups", &out->partitioner.num_key_groups, false));
  RHINO_RETURN_IF_ERROR(Arg(args, "num_vnodes", &out->partitioner.num_vnodes, false));
  RHINO_RETURN_IF_ERROR(Arg(args, "seed", &out->partitioner.seed, false));
  RHINO_RETURN_IF_ERROR(Arg(args, "vnodes", &out->vnodes, false));
  RHINO_RETURN_IF_ERROR(Arg(args, "chain", &out->chain, false));
  return Arg(args, "chain_version", &out->chain_version, false);
}

Status DecodeInstanceArgs(std::string_view text, TakeoverArgs* out) {
  json args;
  RHINO_RETURN_IF_ERROR(ParseArgs(text, &args));
  RHINO_RETURN_IF_ERROR(Arg(args, "chain", &out->chain, false));
  RHINO_RETURN_IF_ERROR(Arg(args, "chain_version", &out->chain_version, false));
  RHINO_RETURN_IF_ERROR(OptionalArg(args, "checkpoint", &out->checkpoint));
  RHINO_RETURN_IF_ERROR(OptionalArg(args, "redo_version", &out->redo_version));
  // The redo belongs to its version: without one there is nothing to redo.
  if (out->redo_version && args.contains("redo")) return ParseReconfigOps(args["redo"], &out->redo);
  return Status::OK();
}

Status DecodeInstanceArgs(std::string_view text, ImportArgs* out) {
  json args;
  RHINO_RETURN_IF_ERROR(ParseArgs(text, &args));
  RHINO_RETURN_IF_ERROR(Arg(args, "from_operator", &out->from_operator, true));
  RHINO_RETURN_IF_ERROR(Arg(args, "from_instance", &out->from_instance, true));
  RHINO_RETURN_IF_ERROR(Arg(args, "checkpoint", &out->checkpoint, true));
  return Arg(args, "vnodes", &out->vnodes, true);
}

Status DecodeInstanceArgs(std::string_view text, MoveVnodesArgs* out) {
  json args;
  RHINO_RETURN_IF_ERROR(ParseArgs(text, &args));
  RHINO_RETURN_IF_ERROR(Arg(args, "to_operator", &out->to_operator, true));
  RHINO_RETURN_IF_ERROR(Arg(args, "to_instance", &out->to_instance, true));
  RHINO_RETURN_IF_ERROR(Arg(args, "to_epoch", &out->to_epoch, true));
  return Arg(args, "vnodes", &out->vnodes, true);
}

Status DecodeInstanceArgs(std::string_view text, StatusArgs* out) {
  json args;
  RHINO_RETURN_IF_ERROR(ParseArgs(text, &args));
  RHINO_RETURN_IF_ERROR(Arg(args, "wait", &out->wait, false));
  return OptionalArg(args, "checkpoint", &out->checkpoint);
}

Status DecodeInstanceArgs(std::string_view text, DiscardAfterArgs* out) {
  json args;
  RHINO_RETURN_IF_ERROR(ParseArgs(text, &args));
  return OptionalArg(args, "after", &out->after);
}

std::string EncodeInstanceArgs(const DiscardAfterArgs& args) {
  return json{{"after", args.after ? json(*args.after) : json(nullptr)}}.dump();
}

Status DecodeInstanceArgs(std::string_view text, ReconfigureArgs* out) {
  json args;
  RHINO_RETURN_IF_ERROR(ParseArgs(text, &args));
  RHINO_RETURN_IF_ERROR(Arg(args, "version", &out->version, true));
  RHINO_RETURN_IF_ERROR(Arg(args, "timeout_s", &out->timeout_s, false));
  if (!args.contains("ops")) return Status::InvalidArgument("reconfigure needs 'ops'");
  return ParseReconfigOps(args["ops"], &out->ops);
}

Status DecodeInstanceArgs(std::string_view text, ReplicateArgs* out) {
  json args;
  RHINO_RETURN_IF_ERROR(ParseArgs(text, &args));
  RHINO_RETURN_IF_ERROR(Arg(args, "to", &out->to, true));
  RHINO_RETURN_IF_ERROR(Arg(args, "chain_version", &out->chain_version, true));
  RHINO_RETURN_IF_ERROR(Arg(args, "timeout_s", &out->timeout_s, false));
  return OptionalArg(args, "checkpoint", &out->checkpoint);
}

namespace {

template <typename Args>
Status DecodeAs(std::string_view text) {
  Args args;
  return DecodeInstanceArgs(text, &args);
}

}  // namespace

Status DecodeInstanceArgsOf(InstanceAction action, std::string_view text) {
  switch (action) {
    case InstanceAction::kOpen: return DecodeAs<OpenArgs>(text);
    case InstanceAction::kTakeover: return DecodeAs<TakeoverArgs>(text);
    case InstanceAction::kImport: return DecodeAs<ImportArgs>(text);
    case InstanceAction::kMoveVnodes: return DecodeAs<MoveVnodesArgs>(text);
    case InstanceAction::kStatus: return DecodeAs<StatusArgs>(text);
    case InstanceAction::kDiscardAfter: return DecodeAs<DiscardAfterArgs>(text);
    case InstanceAction::kReconfigure: return DecodeAs<ReconfigureArgs>(text);
    case InstanceAction::kReplicate: return DecodeAs<ReplicateArgs>(text);
    default: return DecodeAs<NoArgs>(text);
  }
}

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
    // here so that the fuzz target covers them too.
    case MessageType::kCoordReq: return ReEncode<CoordReq>(payload, reencoded);
    case MessageType::kCoordRsp: return ReEncode<CoordRsp>(payload, reencoded);
    default: return Status::OK();
  }
}

}  // namespace rhino
