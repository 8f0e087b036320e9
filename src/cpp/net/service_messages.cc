#include "net/service_messages.h"

#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>

#include "net/coord_messages.h"
#include "net/json_bounds.h"
#include "net/wire_codec.h"

namespace rhino {
namespace {

// Every key and value list holds at most this many items; a frame cannot
// carry more anyway (each item costs 4 bytes of length).
constexpr size_t kMaxItems = 1u << 26;

// The action names of §7.1, in one place.
struct ActionRow {
  const char* name;
  InstanceAction action;
  ActionAccess access;
};

constexpr ActionRow kInstanceActions[] = {
#define RHINO_ACTION_ROW(e, code, name, handler, access) {name, InstanceAction::e, ActionAccess::access},
    RHINO_INSTANCE_ACTIONS(RHINO_ACTION_ROW)
#undef RHINO_ACTION_ROW
};

}  // namespace

Status ParseInstanceAction(std::string_view name, InstanceAction* out) {
  for (const ActionRow& row : kInstanceActions) {
    if (name == row.name) {
      *out = row.action;
      return Status::OK();
    }
  }
  return Status::InvalidArgument("unknown instance action '" + std::string(name) + "'");
}

const char* InstanceActionName(InstanceAction action) {
  for (const ActionRow& row : kInstanceActions) {
    if (row.action == action) return row.name;
  }
  return "unknown";
}

ActionAccess InstanceActionAccess(InstanceAction action) {
  for (const ActionRow& row : kInstanceActions) {
    if (row.action == action) return row.access;
  }
  return ActionAccess::kInfrastructure;  // an unknown action is refused by the dispatch anyway
}

// ---- the field lists of §7's messages, in wire order (net/wire_codec.h) ----

template <class V>
void Fields(V& v, wire::Msg<V, InstanceReq>& m) {
  v.U8(m.action);
  v.Bytes(m.operator_id, kMaxOperatorIdBytes);
  v.U32(m.instance);
  v.U64(m.epoch);
  v.Bytes(m.args, kMaxJsonBytes);
}
RHINO_WIRE_MESSAGE(InstanceReq)

template <class V>
void Fields(V& v, wire::Msg<V, InstanceRsp>& m) {
  v.U32(m.code);
  v.Text(m.message);
  v.Bytes(m.result, kMaxJsonBytes * 16);
}
RHINO_WIRE_MESSAGE(InstanceRsp)

template <class V>
void Fields(V& v, wire::Msg<V, SessionOpenReq>& m) {
  v.Bytes(m.operator_id, kMaxOperatorIdBytes);
  v.U32(m.instance);
  v.U64(m.batch);
  v.U64(m.epoch);
  // The appended fields of a checkpoint reader, then of a session's attempt
  // fence: present only when set, so a frame decodes and re-encodes to the
  // same bytes. A fenced session sends the reader's fields as 0, 0, 0.
  bool appended = m.read_checkpoint || m.has_attempt;
  if (v.Trailing(appended)) {
    v.Bool(m.read_checkpoint, "read_checkpoint");
    v.Bool(m.has_checkpoint, "has_checkpoint");
    v.U64(m.checkpoint);
    if (v.Trailing(m.has_attempt)) {
      v.U64(m.attempt);
      v.Bool(m.has_committed, "has_committed");
      v.U64(m.committed);
    }
    v.Check([&m] {
      if (m.read_checkpoint) {
        return m.has_attempt ? Status::Corruption("a SessionOpenReq is both a checkpoint reader and a fenced session")
                             : Status::OK();
      }
      if (!m.has_attempt) return Status::Corruption("a SessionOpenReq carries reader fields with read = 0");
      if (m.has_checkpoint || m.checkpoint != 0) {
        return Status::Corruption("a fenced session's SessionOpenReq carries a checkpoint");
      }
      if (!m.has_committed && m.committed != 0) {
        return Status::Corruption("a SessionOpenReq carries a committed batch with has_committed = 0");
      }
      return Status::OK();
    });
  }
}
RHINO_WIRE_MESSAGE(SessionOpenReq)

template <class V>
void Fields(V& v, wire::Msg<V, SessionOpenRsp>& m) {
  v.U32(m.code);
  v.Text(m.message);
  v.Bool(m.has_version, "has_version");
  v.U64(m.version);
  v.Bool(m.rolled_back, "rolled_back");
  if (v.Trailing(m.reading)) {  // a checkpoint reader's answer
    v.U64(m.checkpoint);
    v.U32List(m.vnodes);
  }
}
RHINO_WIRE_MESSAGE(SessionOpenRsp)

template <class V>
void Fields(V& v, wire::Msg<V, GetReq>& m) {
  v.List(m.keys, kMaxItems, UINT32_MAX);
}
RHINO_WIRE_MESSAGE(GetReq)

namespace {

Status CheckFound(const GetRsp& m) {
  size_t hits = 0;
  for (char c : m.found) {
    if (c != 0 && c != 1) return Status::Corruption("GetRsp.found holds a byte other than 0 or 1");
    hits += static_cast<size_t>(c);
  }
  if (hits != m.values.size()) {
    return Status::Corruption("GetRsp has " + std::to_string(m.values.size()) + " values for " +
                              std::to_string(hits) + " found keys");
  }
  return Status::OK();
}

}  // namespace

template <class V>
void Fields(V& v, wire::Msg<V, GetRsp>& m) {
  v.U32(m.code);
  v.Text(m.message);
  v.Bytes(m.found);
  v.List(m.values, kMaxItems, UINT32_MAX);
  v.Check([&m] { return CheckFound(m); });
}
RHINO_WIRE_MESSAGE(GetRsp)

template <class V>
void Fields(V& v, wire::Msg<V, WriteReq>& m) {
  v.U8(m.op);
  v.List(m.keys, kMaxItems, UINT32_MAX);
  v.List(m.values, kMaxItems, UINT32_MAX);
}
RHINO_WIRE_MESSAGE(WriteReq)

template <class V>
void Fields(V& v, wire::Msg<V, SessionRsp>& m) {
  v.U32(m.code);
  v.Text(m.message);
  v.U64(m.count);
}
RHINO_WIRE_MESSAGE(SessionRsp)

template <class V>
void Fields(V& v, wire::Msg<V, ScanReq>& m) {
  v.Bool(m.has_vnode, "has_vnode");
  v.U32(m.vnode);
  v.Bytes(m.prefix);
  v.Bool(m.has_after, "has_after");
  v.U32(m.after_vnode);
  v.Bytes(m.after_key);
  v.U32(m.max_items);
}
RHINO_WIRE_MESSAGE(ScanReq)

template <class V>
void Fields(V& v, wire::Msg<V, ScanRsp>& m) {
  v.U32(m.code);
  v.Text(m.message);
  v.Bool(m.done, "done");
  v.U32(m.last_vnode);
  v.List(m.keys, kMaxItems, UINT32_MAX);
  v.List(m.values, kMaxItems, UINT32_MAX);
  v.Check([&m] {
    return m.keys.size() == m.values.size() ? Status::OK()
                                            : Status::Corruption("ScanRsp has more keys than values or fewer");
  });
}
RHINO_WIRE_MESSAGE(ScanRsp)

template <class V>
void Fields(V& v, wire::Msg<V, SessionCommitReq>& m) {
  v.U8(m.mode);
  v.TrailingI64(m.batch_time_ms);  // a payload of 2..8 bytes is Corruption
}
RHINO_WIRE_MESSAGE(SessionCommitReq)

template <class V>
void Fields(V& v, wire::Msg<V, SessionCommitRsp>& m) {
  v.U32(m.code);
  v.Text(m.message);
  v.U64(m.version);
  v.Bytes(m.stats, kMaxJsonBytes);
}
RHINO_WIRE_MESSAGE(SessionCommitRsp)

template <class V>
void Fields(V& v, wire::Msg<V, SessionAbortReq>& m) {
  v.Text(m.reason);
}
RHINO_WIRE_MESSAGE(SessionAbortReq)

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

namespace {

// An answer of type Rsp carrying `s`: its other fields are those of `r`, zero
// and empty unless the caller says otherwise.
template <class Rsp>
std::string ErrorPayload(const Status& s, Rsp r = Rsp()) {
  r.code = WireCode(s);
  r.message = std::string(wire::Cut(s.message()));
  return r.Encode();
}

}  // namespace

std::string ServiceErrorPayload(MessageType rsp, const Status& s) {
  switch (rsp) {
    case MessageType::kInstanceRsp: return ErrorPayload<InstanceRsp>(s);
    case MessageType::kSessionOpenRsp: return ErrorPayload<SessionOpenRsp>(s);
    case MessageType::kGetRsp: return ErrorPayload<GetRsp>(s);
    case MessageType::kSessionRsp: return ErrorPayload<SessionRsp>(s);
    case MessageType::kScanRsp: {
      ScanRsp r;
      r.done = true;  // nothing follows an error
      return ErrorPayload(s, r);
    }
    case MessageType::kSessionCommitRsp: return ErrorPayload<SessionCommitRsp>(s);
    default: return ErrorPayload<ErrorRsp>(s);  // the code and the message alone
  }
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
      json step = {{"op", op.kind == ReconfigOp::Kind::kImport ? "import" : "import_on_base"},
                   {"from_operator", op.from_operator},
                   {"from_instance", op.from_instance},
                   {"checkpoint", op.checkpoint},
                   {"vnodes", op.vnodes}};
      if (op.kind == ReconfigOp::Kind::kImportOnBase) step["hosts"] = op.hosts;
      out.push_back(std::move(step));
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
