// The primary's side of chain replication (docs/protocol.md §4; Rhino paper
// §4.2.2 phase 2): stream the delta of one checkpoint of one instance, from
// the primary's replica store, down a chain of workers w1 -> ... -> wr.
//
// The primary sends only the files w1 says it needs, never without a credit,
// and marks the checkpoint complete only when w1's CommitRsp{ok} arrives
// within the timeout (§4 step 5). Any failure aborts the stream down the
// chain; the caller may retry on a new chain with a higher chain version.
//
// QueryStore asks a worker which checkpoints of an instance it holds.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "net/frame.h"
#include "net/tls.h"
#include "rhino/credential.h"
#include "rhino/status.h"

namespace rhino {

class ReplicaStore;
struct ReplicationResult;

struct ReplicateOptions {
  uint32_t chunk_bytes = 1 << 20;  // bytes per ChunkReq (protocol §4 step 2)
  uint32_t window = 16;            // credits asked for; members may grant fewer
  uint32_t timeout_ms = 30000;     // from the call until w1's CommitRsp
  uint32_t heartbeat_ms = 500;
  uint32_t peer_timeout_ms = 3000;
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;
  std::string client_id = "primary";  // our name in the handshake
  net::TlsContext tls;                 // null = plaintext (protocol §2, "TLS")
  // Called once, on the replication's own thread, when it ends (after Wait
  // would return). Must not destroy the handle from inside.
  std::function<void(const ReplicationResult&)> on_done;
};

enum class ReplicationState { kConnecting, kOpening, kTransferring, kCommitting, kComplete, kFailed };
const char* ReplicationStateName(ReplicationState s);

struct ReplicationProgress {
  ReplicationState state = ReplicationState::kConnecting;
  uint64_t bytes_sent = 0;    // chunk bytes handed to the socket
  uint64_t bytes_total = 0;   // bytes of the files w1 needs
  uint32_t files_sent = 0;
  uint32_t files_total = 0;   // files w1 needs
  uint32_t credits = 0;       // credits we hold (may send that many chunks now)
  uint32_t in_flight = 0;     // chunks sent whose credit has not come back
};

struct ReplicationResult {
  Status status;
  uint64_t checkpoint_id = 0;
  uint64_t bytes_sent = 0;
  uint32_t files_sent = 0;
  double seconds = 0;
  // What each member w1..wr lacked when the stream opened (protocol §3,
  // OpenStreamRsp.member_needed_*): files and bytes.
  std::vector<uint32_t> member_needed_files;
  std::vector<uint64_t> member_needed_bytes;
};

// A replication running on its own threads. Destroying the handle cancels
// the replication if it is still running, and waits for it to end.
class ReplicationHandle {
 public:
  class Job;
  explicit ReplicationHandle(std::shared_ptr<Job> job);
  ~ReplicationHandle();
  ReplicationHandle(const ReplicationHandle&) = delete;
  ReplicationHandle& operator=(const ReplicationHandle&) = delete;

  ReplicationProgress Progress() const;
  bool Done() const;
  // Waits until done or `timeout_ms` passes (< 0: no limit). True, with
  // *result filled in, if the replication has ended.
  bool Wait(int64_t timeout_ms, ReplicationResult* result) const;
  // Aborts the replication (the chain discards what it staged).
  void Cancel();

 private:
  std::shared_ptr<Job> job_;
};

// Starts replicating checkpoint `checkpoint_id` of (operator_id, instance),
// committed in the open replica `store`, to `chain` ("host:port" of w1..wr).
// The store must outlive the handle (destroying the handle waits for the
// replication to end). Returns at once; errors found before any I/O (bad
// arguments) are returned here, all others end up in the result.
Status ReplicateCheckpoint(const ReplicaStore* store, const std::string& operator_id, uint32_t instance,
                           uint64_t checkpoint_id, const std::vector<std::string>& chain, uint64_t chain_version,
                           const Credential& credential, const ReplicateOptions& options,
                           std::unique_ptr<ReplicationHandle>* out);

// Asks the worker at `address` for the committed checkpoints of an instance.
// `credential`: the role to prove (protocol §2, "Roles").
Status QueryStore(const std::string& address, const Credential& credential, const std::string& operator_id,
                  uint32_t instance, uint32_t timeout_ms, std::vector<uint64_t>* checkpoints,
                  const net::TlsContext& tls = nullptr);

}  // namespace rhino
