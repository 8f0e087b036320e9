// The messages of the state service (docs/protocol.md §7): a client hosts,
// takes over and fences instances on a worker (InstanceReq), and reads and
// writes one instance for one micro-batch in a session (SessionOpenReq, then
// Get/Write/Scan, then SessionCommitReq or SessionAbortReq). They travel on
// the same framed, authenticated connections as the data plane (§1, §2),
// over TCP or a Unix domain socket, with chain version 0 in the frame header:
// fencing is by the configuration epoch each request carries.
//
// Encode / Decode as in net/messages.h: Decode checks the shape (bounds,
// list counts, trailing bytes) and nothing else; the service checks meaning.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/frame.h"
#include "net/messages.h"
#include "rhino/partitioner.h"
#include "rhino/status.h"

namespace rhino {

constexpr size_t kMaxOperatorIdBytes = 128;
// InstanceReq.args and InstanceRsp.result are JSON objects of this size at most.
constexpr size_t kMaxJsonBytes = 1 << 20;

// Who may ask for an instance action, besides the admin and the coordinator
// (docs/protocol.md §2, "Roles"; net/permissions.h applies it).
enum class ActionAccess : uint8_t {
  kInfrastructure,    // nobody else
  kWorkers,           // workers too (a primary cleans its chain, §7.3)
  kTaskOwnNamespace,  // tasks too, for the operators of their own namespace
};

// The instance actions (§7.1), one row each; adding an action is a row here, its
// handler (a StateService method of that name, service/instance_actions.cc), and
// its Python client call (rhino/client/client.py). The rows generate the
// InstanceAction enum, the names ParseInstanceAction accepts, the role table's
// entries and the service's dispatch.
//   X(enumerator, wire code, wire name, StateService handler, ActionAccess)
#define RHINO_INSTANCE_ACTIONS(X)                                                                                   \
  /* host (create or open) the instance under `epoch` */                                                            \
  X(kOpen, 1, "open", OpenInstance, kInfrastructure)                                                                \
  /* stop hosting it (its files stay) */                                                                            \
  X(kClose, 2, "close", CloseInstance, kInfrastructure)                                                             \
  /* host it from a checkpoint of this worker's replica store (failover) */                                         \
  X(kTakeover, 3, "takeover", TakeoverInstance, kInfrastructure)                                                    \
  /* raise the instance's epoch here without hosting it */                                                          \
  X(kFence, 4, "fence", FenceInstance, kInfrastructure)                                                             \
  /* import vnodes from a checkpoint in the replica store into a hosted instance */                                 \
  X(kImport, 5, "import", ImportVnodes, kInfrastructure)                                                            \
  /* export vnodes of one hosted instance and import them into another */                                           \
  X(kMoveVnodes, 6, "move_vnodes", MoveVnodes, kInfrastructure)                                                     \
  /* the instances hosted here (operator_id empty) */                                                               \
  X(kList, 7, "list", ListInstances, kInfrastructure)                                                               \
  /* one instance: epoch, version, checkpoints, replication of a checkpoint */                                      \
  X(kStatus, 8, "status", InstanceStatus, kTaskOwnNamespace)                                                        \
  /* drop this store's checkpoints of the instance newer than `after` (re-execution) */                             \
  X(kDiscardAfter, 9, "discard_after", DiscardAfter, kWorkers)                                                      \
  /* a handover's drops and imports at the barrier after batch `version` (design §4) */                             \
  X(kReconfigure, 10, "reconfigure", Reconfigure, kInfrastructure)                                                  \
  /* send a checkpoint of this store to other workers (a bulk copy: chain repair, scale-out) */                     \
  X(kReplicate, 11, "replicate", ReplicateTo, kInfrastructure)                                                      \
  /* a full compaction of the hosted instance's vnodes, through the TTL filter */                                   \
  X(kCompact, 12, "compact", CompactInstance, kInfrastructure)                                                      \
  /* remove every trace of the instance here: live state, checkpoints, standby, fences */                           \
  X(kDrop, 13, "drop", DropInstance, kInfrastructure)

// What an InstanceReq asks (§7.1).
enum class InstanceAction : uint8_t {
#define RHINO_ACTION_ENUMERATOR(e, code, name, handler, access) e = code,
  RHINO_INSTANCE_ACTIONS(RHINO_ACTION_ENUMERATOR)
#undef RHINO_ACTION_ENUMERATOR
};
// The action named `name` ("open", "move_vnodes", ...: the names of §7.1,
// which the Python client uses); InvalidArgument for any other name.
Status ParseInstanceAction(std::string_view name, InstanceAction* out);
// The wire name of an action ("unknown" for a code that is none).
const char* InstanceActionName(InstanceAction action);
// Who may ask for it besides the admin and the coordinator.
ActionAccess InstanceActionAccess(InstanceAction action);

struct InstanceReq {
  static constexpr MessageType kType = MessageType::kInstanceReq;
  uint8_t action = 0;
  std::string operator_id;
  uint32_t instance = 0;
  uint64_t epoch = 0;
  std::string args;  // JSON object
  std::string Encode() const;
  static Status Decode(std::string_view payload, InstanceReq* out);
};

struct InstanceRsp {
  static constexpr MessageType kType = MessageType::kInstanceRsp;
  uint32_t code = 0;
  std::string message;
  std::string result;  // JSON
  std::string Encode() const;
  static Status Decode(std::string_view payload, InstanceRsp* out);
};

struct SessionOpenReq {
  static constexpr MessageType kType = MessageType::kSessionOpenReq;
  std::string operator_id;
  uint32_t instance = 0;
  uint64_t batch = 0;
  uint64_t epoch = 0;
  // A checkpoint reader (protocol §7.9) instead of a session: read committed
  // checkpoint `checkpoint` (the newest unless has_checkpoint) of this
  // worker's own store; batch and epoch are not used. Encoded after the
  // fields above only when set, so a session's frame is as before.
  bool read_checkpoint = false;
  bool has_checkpoint = false;
  uint64_t checkpoint = 0;
  // A session's attempt fence (protocol §7.2 step 1, issue 46): the token the
  // coordinator's begin_batch gave the batch's attempt, and the operator's last
  // committed batch as the attempt began. Encoded after the reader fields
  // (then 0, 0, 0) only when has_attempt.
  bool has_attempt = false;
  uint64_t attempt = 0;
  bool has_committed = false;
  uint64_t committed = 0;
  std::string Encode() const;
  static Status Decode(std::string_view payload, SessionOpenReq* out);
};

struct SessionOpenRsp {
  static constexpr MessageType kType = MessageType::kSessionOpenRsp;
  uint32_t code = 0;
  std::string message;
  bool has_version = false;  // the version the session sees (batch - 1), if any
  uint64_t version = 0;
  bool rolled_back = false;  // the live state was ahead and was restored to batch - 1
  // The answer to a checkpoint reader's open, encoded after the fields above
  // only then: the checkpoint it reads and its vnodes, ascending.
  bool reading = false;
  uint64_t checkpoint = 0;
  std::vector<uint32_t> vnodes;
  std::string Encode() const;
  static Status Decode(std::string_view payload, SessionOpenRsp* out);
};

// Looks keys up. Encoding views the caller's keys; decoding views the payload.
struct GetReq {
  static constexpr MessageType kType = MessageType::kGetReq;
  std::vector<std::string_view> keys;
  std::string Encode() const;
  static Status Decode(std::string_view payload, GetReq* out);
};

// The answers for the first found.size() keys of the request, in order (at
// most one frame's worth: the client asks again for the rest).
struct GetRsp {
  static constexpr MessageType kType = MessageType::kGetRsp;
  uint32_t code = 0;
  std::string message;
  std::string found;                     // one byte (0/1) per answered key
  std::vector<std::string_view> values;  // the values of the found keys, in order
  std::string Encode() const;  // the server builds it with GetRspBuilder instead
  static Status Decode(std::string_view payload, GetRsp* out);
};

enum class WriteOp : uint8_t { kPut = 1, kDelete = 2 };

struct WriteReq {
  static constexpr MessageType kType = MessageType::kWriteReq;
  uint8_t op = 0;
  std::vector<std::string_view> keys;
  std::vector<std::string_view> values;  // puts only
  std::string Encode() const;
  static Status Decode(std::string_view payload, WriteReq* out);
};

// The answer to a WriteReq or a SessionAbortReq.
struct SessionRsp {
  static constexpr MessageType kType = MessageType::kSessionRsp;
  uint32_t code = 0;
  std::string message;
  uint64_t count = 0;
  std::string Encode() const;
  static Status Decode(std::string_view payload, SessionRsp* out);
};

struct ScanReq {
  static constexpr MessageType kType = MessageType::kScanReq;
  bool has_vnode = false;
  uint32_t vnode = 0;
  std::string prefix;
  bool has_after = false;  // resume strictly after (after_vnode, after_key)
  uint32_t after_vnode = 0;
  std::string after_key;
  uint32_t max_items = 0;  // 0 = as many as fit in one frame
  std::string Encode() const;
  static Status Decode(std::string_view payload, ScanReq* out);
};

struct ScanRsp {
  static constexpr MessageType kType = MessageType::kScanRsp;
  uint32_t code = 0;
  std::string message;
  bool done = false;             // nothing after the last entry
  uint32_t last_vnode = 0;       // the vnode of the last entry (the cursor)
  std::vector<std::string_view> keys;
  std::vector<std::string_view> values;
  std::string Encode() const;  // the server builds it with ScanRspBuilder instead
  static Status Decode(std::string_view payload, ScanRsp* out);
};

enum class CommitMode : uint8_t { kBarrier = 0, kAsync = 1 };

struct SessionCommitReq {
  static constexpr MessageType kType = MessageType::kSessionCommitReq;
  uint8_t mode = 0;
  // The batch's time, the instance's new TTL clock (docs/protocol.md §7.2
  // step 3). Encoded after `mode` only when set, so a payload of `mode` alone
  // (every client before it) still decodes, as "keep the clock".
  std::optional<int64_t> batch_time_ms;
  std::string Encode() const;
  static Status Decode(std::string_view payload, SessionCommitReq* out);
};

struct SessionCommitRsp {
  static constexpr MessageType kType = MessageType::kSessionCommitRsp;
  uint32_t code = 0;
  std::string message;
  uint64_t version = 0;
  std::string stats;  // JSON: timings, bytes, replication state
  std::string Encode() const;
  static Status Decode(std::string_view payload, SessionCommitRsp* out);
};

struct SessionAbortReq {
  static constexpr MessageType kType = MessageType::kSessionAbortReq;
  std::string reason;
  std::string Encode() const;
  static Status Decode(std::string_view payload, SessionAbortReq* out);
};

// ---- the arguments of each InstanceReq action (§7.1) ----
//
// InstanceReq.args is a JSON object; DecodeInstanceArgs parses it into the
// action's struct, and this is the one place that knows the field names. An
// absent or null field keeps the default below; a field of the wrong type,
// or a required one missing, is InvalidArgument naming the field. As for the
// binary messages, decoding checks the shape only: the service checks meaning
// (operator ids, vnode ranges, epochs).

// One step of a reconfiguration (a handover at the barrier after batch b,
// design §4 step 4; §7.4): drop vnodes, or import them by hard links from a
// checkpoint of another instance held in this worker's replica store. An
// import replaces the vnode's column family if one is there: the coordinator's
// routing table, not this worker, says who owns a vnode.
// kImportOnBase takes the vnodes on a base, the origin's checkpoint, read
// through on `hosts` until it lands (the early hand-over, design §4.1).
struct ReconfigOp {
  enum class Kind { kDrop, kImport, kImportOnBase };
  Kind kind = Kind::kDrop;
  std::vector<uint32_t> vnodes;
  std::string from_operator;       // kImport and kImportOnBase
  uint32_t from_instance = 0;      // kImport and kImportOnBase
  uint64_t checkpoint = 0;         // kImport and kImportOnBase
  std::vector<std::string> hosts;  // kImportOnBase only: "host:port" of the workers holding the checkpoint
};
constexpr size_t kMaxBaseHosts = 16;

// Reconfiguration steps as JSON: [{"op": "drop", "vnodes": [...]},
// {"op": "import", "from_operator": ..., "from_instance": ..., "checkpoint": ...,
// "vnodes": [...]}, {"op": "import_on_base", ... as import ..., "hosts": [...]}, ...] (§7.4). The parser also checks the operator ids,
// since a step may be kept and run again (instance.json's redo).
Status ParseReconfigOps(std::string_view text, std::vector<ReconfigOp>* out);
std::string ReconfigOpsJson(const std::vector<ReconfigOp>& ops);

struct NoArgs {};  // close, fence, list, compact, drop: any JSON object

struct OpenArgs {
  PartitionerOptions partitioner;  // num_key_groups, num_vnodes, seed
  std::vector<uint32_t> vnodes;    // empty: all
  std::vector<std::string> chain;  // "host:port" of w1..wr
  uint64_t chain_version = 0;
};

struct TakeoverArgs {
  std::optional<uint64_t> checkpoint;  // none: the newest in this worker's store
  std::vector<std::string> chain;
  uint64_t chain_version = 0;
  std::optional<uint64_t> redo_version;
  std::vector<ReconfigOp> redo;  // read only with redo_version
};

struct ImportArgs {
  std::string from_operator;  // required, as all four
  uint32_t from_instance = 0;
  uint64_t checkpoint = 0;
  std::vector<uint32_t> vnodes;
};

struct MoveVnodesArgs {
  std::string to_operator;  // required, as all four
  uint32_t to_instance = 0;
  uint64_t to_epoch = 0;
  std::vector<uint32_t> vnodes;
};

struct StatusArgs {
  std::optional<uint64_t> checkpoint;  // the replication state of this one
  // Wait for a hosted instance that a commit or another request holds; false:
  // answer `busy` at once (a task polling for a new epoch, protocol.md §7.1).
  bool wait = true;
};

struct DiscardAfterArgs {
  std::optional<uint64_t> after;  // none: every checkpoint
};

struct ReconfigureArgs {
  uint64_t version = 0;  // required
  std::vector<ReconfigOp> ops;  // required
  double timeout_s = 120;
};

struct ReplicateArgs {
  std::vector<std::string> to;  // required
  uint64_t chain_version = 0;   // required
  std::optional<uint64_t> checkpoint;  // none: the newest
  double timeout_s = 600;
};

Status DecodeInstanceArgs(std::string_view json, NoArgs* out);
Status DecodeInstanceArgs(std::string_view json, OpenArgs* out);
Status DecodeInstanceArgs(std::string_view json, TakeoverArgs* out);
Status DecodeInstanceArgs(std::string_view json, ImportArgs* out);
Status DecodeInstanceArgs(std::string_view json, MoveVnodesArgs* out);
Status DecodeInstanceArgs(std::string_view json, StatusArgs* out);
Status DecodeInstanceArgs(std::string_view json, DiscardAfterArgs* out);
Status DecodeInstanceArgs(std::string_view json, ReconfigureArgs* out);
Status DecodeInstanceArgs(std::string_view json, ReplicateArgs* out);
// The JSON of discard_after's arguments: a primary sends it to its chain (§7.3).
std::string EncodeInstanceArgs(const DiscardAfterArgs& args);
// Decodes `json` as the arguments of `action` (for the fuzz target).
Status DecodeInstanceArgsOf(InstanceAction action, std::string_view json);

// Builds the payload of a GetRsp / ScanRsp incrementally, so that the server
// never copies values twice (encoded straight from RocksDB's pinned slices).
class GetRspBuilder {
 public:
  explicit GetRspBuilder(size_t n_hint);
  // Bytes the payload would have with one more value of `len` bytes.
  size_t SizeWith(size_t len) const { return 4 + 4 + 4 + found_.size() + 1 + 4 + values_bytes_ + 4 + len; }
  void Add(bool found, std::string_view value);
  std::string Finish();
 private:
  std::string found_;
  Encoder values_;
  uint32_t count_ = 0;
  size_t values_bytes_ = 0;
};

// The payload of a GetRsp answering found[0..count) with their values, sized
// exactly before anything is copied (each value is copied once).
std::string EncodeGetRsp(const std::vector<uint8_t>& found, const std::vector<std::string_view>& values, size_t count);

class ScanRspBuilder {
 public:
  size_t SizeWith(size_t klen, size_t vlen) const { return 4 + 4 + 1 + 4 + 8 + bytes_ + 8 + klen + vlen; }
  void Add(std::string_view key, std::string_view value);
  size_t count() const { return count_; }
  std::string Finish(bool done, uint32_t last_vnode);
 private:
  Encoder keys_, values_;
  uint32_t count_ = 0;
  size_t bytes_ = 0;
};

// An error answer of type `rsp` (a …Rsp of this file) carrying `s`.
std::string ServiceErrorPayload(MessageType rsp, const Status& s);

// Decodes a payload of any type of this file, or of net/coord_messages.h,
// and re-encodes it (for the fuzz target, fuzz/frame_fuzzer.cc):
// *reencoded is empty if `type` is none of those.
Status DecodeServiceMessage(MessageType type, std::string_view payload, std::string* reencoded);

}  // namespace rhino
