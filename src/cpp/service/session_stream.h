// SessionStream: one client's session on one hosted instance for one
// micro-batch (docs/protocol.md §7.2): it listens to the stream the session
// was opened on and handles its Get/Write/Scan frames, then its commit or
// abort, in order, on the instance's strand (§7.6).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "net/connection.h"
#include "net/service_messages.h"
#include "service/hosted_instance.h"

namespace rhino {

// What every session of a worker shares; owned by the state service.
struct SessionEnv {
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;  // one answer's budget
  uint64_t max_session_bytes = 1ull << 30;           // uncommitted writes one session may hold
  net::ConnectionCounters* counters = nullptr;       // frames rejected
  // The epoch fence of §7.5: StaleEpoch if `epoch` is below the highest seen.
  std::function<Status(const std::string& op, uint32_t instance, uint64_t epoch)> check_epoch;
};

class SessionStream : public net::StreamListener, public std::enable_shared_from_this<SessionStream> {
 public:
  // `env` must outlive the stream; `token` is unique to this session.
  SessionStream(const SessionEnv* env, const std::shared_ptr<net::Connection>& conn, uint32_t stream_id,
                std::shared_ptr<HostedInstance> inst, uint64_t token);

  void OnFrame(const FrameHeader& h, std::shared_ptr<std::string> payload) override;
  void OnConnectionClosed(const Status&) override;

  // Runs the open on the instance's strand (the listener is attached already,
  // so frames the client pipelines after the open queue up behind it).
  void Open(const SessionOpenReq& req);

  // The answers to a GetReq and to a ScanReq from `reads`, at most `budget`
  // bytes each (§7.2); a checkpoint reader (service/checkpoint_reader.h)
  // answers with them too.
  static Status AnswerGet(const SessionBatch& reads, size_t budget, const GetReq& req, std::string* out);
  static Status AnswerScan(const SessionBatch& reads, size_t budget, const ScanReq& req, std::string* out);

 private:
  void Send(MessageType type, std::string payload);
  void Reply(MessageType rsp_type, const Status& s);
  void Malformed(const char* what, const Status& s);
  void End();

  void Handle(const FrameHeader& h, const std::string& payload);  // on the strand
  void OnGet(const std::string& payload);
  void OnWrite(const std::string& payload);
  void OnScan(const std::string& payload);
  void OnCommit(const std::string& payload);
  void OnAbort(const std::string& payload);
  Status ApplyWrite(const WriteReq& req);  // REQUIRES: mu held

  const SessionEnv* const env_;
  std::weak_ptr<net::Connection> conn_;
  const uint32_t stream_id_;
  std::shared_ptr<HostedInstance> inst_;
  const uint64_t token_;
};

}  // namespace rhino
