// StateClient: a client of a worker's state service (docs/protocol.md §7):
// one authenticated connection, over a Unix domain socket (a client on the
// worker's host) or TCP (a client elsewhere), with the same messages. The
// same client talks to the coordinator (§8, Coord), which authenticates
// connections as a worker does.
//
// Requests block the calling thread until their answer arrives or the
// request timeout passes; bindings release the GIL around them. Batches larger
// than one frame are split into several frames, sent back to back, and their
// answers collected in order.
//
// Thread-safety: one StateClient may serve several threads (each request has
// its own stream); a ClientSession is used by one thread at a time. Close()
// from any thread fails the calls in flight with Aborted.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "net/coord_messages.h"
#include "net/frame.h"
#include "net/service_messages.h"
#include "rhino/credential.h"
#include "rhino/status.h"
#include "rhino/tls.h"

namespace rhino {

struct StateClientOptions {
  std::string client_id = "client";
  // What the client proves (protocol §2): `credential`, a role's key, when it
  // has one; else the cluster's root `secret` itself, as admin.
  std::string secret;
  Credential credential;
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;
  uint32_t heartbeat_ms = 500;
  uint32_t peer_timeout_ms = 3000;
  uint32_t request_timeout_ms = 120000;  // one request, e.g. a barrier commit
  std::string local_bind_host;           // TCP only: our end's address (e.g. this host's 127.0.0.N)
  TlsFiles tls;                          // TCP only: mutual TLS (rhino/tls.h); none = plaintext
};

class ClientSession;

class StateClient {
 public:
  // `address` is "host:port" (TCP) or a Unix socket path: "unix:/path" or any
  // path containing '/'.
  static Status Connect(const std::string& address, const StateClientOptions& options,
                        std::shared_ptr<StateClient>* out);
  ~StateClient();
  StateClient(const StateClient&) = delete;
  StateClient& operator=(const StateClient&) = delete;

  // An InstanceReq (§7.1); *result is the answer's JSON.
  Status Instance(InstanceAction action, const std::string& operator_id, uint32_t instance, uint64_t epoch,
                  const std::string& args_json, std::string* result_json);
  // A CoordReq (§8) to a coordinator: `method` ([a-z_]{1,64}) with a JSON
  // document as args; *result_json is the answer's JSON. A non-zero code in
  // the CoordRsp is returned as a Status with that code and message. A bad
  // method or oversized args are InvalidArgument, refused here before anything
  // is sent (a coordinator would close the connection for a bad method).
  Status Coord(const std::string& method, const std::string& args_json, std::string* result_json);
  // Opens a session for batch `batch` at `epoch` (§7.2), with the attempt
  // fence when `attempt` is set: the token begin_batch gave the attempt, and
  // `committed`, the operator's last committed batch then (§7.2 step 1).
  Status OpenSession(const std::string& operator_id, uint32_t instance, uint64_t batch, uint64_t epoch,
                     std::unique_ptr<ClientSession>* out, SessionOpenRsp* info,
                     std::optional<uint64_t> attempt = std::nullopt, std::optional<uint64_t> committed = std::nullopt);
  // Opens a checkpoint reader (§7.9): a session that reads committed
  // checkpoint `checkpoint` (the newest if unset) of the worker's own replica
  // store, and takes no writes. info->checkpoint and ->vnodes say what it reads.
  Status ReadCheckpoint(const std::string& operator_id, uint32_t instance, std::optional<uint64_t> checkpoint,
                        std::unique_ptr<ClientSession>* out, SessionOpenRsp* info);
  void Close();
  bool is_open() const;
  const std::string& address() const { return address_; }
  bool is_unix() const { return unix_; }
  uint32_t max_frame_bytes() const { return options_.max_frame_bytes; }

  class Impl;

 private:
  friend class ClientSession;
  StateClient() = default;
  Status Open(const SessionOpenReq& req, std::unique_ptr<ClientSession>* out, SessionOpenRsp* info);
  std::string address_;
  bool unix_ = false;
  StateClientOptions options_;
  std::shared_ptr<Impl> impl_;
};

class ClientSession {
 public:
  ~ClientSession();  // aborts the session if it is still open
  ClientSession(const ClientSession&) = delete;
  ClientSession& operator=(const ClientSession&) = delete;

  // fn(i, found, value, frame) for every key, in no particular order. The
  // value views `frame`, the answer it arrived in: keep that shared pointer
  // to use the value after the call (no copy is made here).
  Status Get(const std::vector<std::string_view>& keys,
             const std::function<void(size_t, bool, std::string_view, const std::shared_ptr<std::string>&)>& fn);
  Status Put(const std::vector<std::string_view>& keys, const std::vector<std::string_view>& values);
  Status Delete(const std::vector<std::string_view>& keys);
  // One page of a scan: entries after the request's cursor (§7.3).
  Status ScanPage(const ScanReq& req, ScanRsp* out, std::shared_ptr<std::string>* payload);
  // One page of each of several scans in one round trip: every ScanReq is
  // sent back to back, then every answer read, in order. (*out)[i] views
  // (*payloads)[i]. Every answer is read even if one fails (the stream stays
  // in step); the first failure is returned.
  Status ScanMany(const std::vector<ScanReq>& reqs, std::vector<ScanRsp>* out,
                  std::vector<std::shared_ptr<std::string>>* payloads);
  // `batch_time_ms` (if set) becomes the instance's TTL clock with the commit.
  Status Commit(CommitMode mode, std::optional<int64_t> batch_time_ms, SessionCommitRsp* out);
  Status Abort(const std::string& reason);
  bool open() const { return open_; }
  uint64_t batch() const { return batch_; }
  // The request/answer exchanges this session has waited for, its open
  // included: requests sent back to back and then answered count once (a
  // batch split into frames, ScanMany), and so does each further wave a call
  // had to send after an answer arrived (a get's re-ask for the values that
  // did not fit in one frame).
  uint64_t round_trips() const { return round_trips_; }

 private:
  friend class StateClient;
  ClientSession() = default;
  Status Write(WriteOp op, const std::vector<std::string_view>& keys, const std::vector<std::string_view>* values);
  std::shared_ptr<StateClient::Impl> impl_;
  uint32_t stream_id_ = 0;
  uint64_t batch_ = 0;
  bool open_ = false;
  uint32_t frame_budget_ = 0;  // payload bytes per request frame
  uint64_t round_trips_ = 0;
};

}  // namespace rhino
