#include "worker/frame_dispatcher.h"

#include "net/frame.h"
#include "service/state_service.h"

namespace rhino {

FrameDispatcher::FrameDispatcher(std::string worker_id, StateService* service, net::ConnectionCounters* counters)
    : worker_id_(std::move(worker_id)), service_(service), counters_(counters) {}

std::shared_ptr<net::StreamListener> FrameDispatcher::Dispatch(const std::shared_ptr<net::Connection>& conn,
                                                               const FrameHeader& h,
                                                               std::shared_ptr<std::string> payload) {
  if (service_ != nullptr && StateService::Handles(h.type)) return service_->OnUnclaimed(conn, h, std::move(payload));
  switch (h.type) {
    case MessageType::kCoordReq:
    case MessageType::kCoordRsp:
      // The coordinator's messages (protocol §8) are never for a worker: a
      // peer that sends one is confused, and is told so rather than left to
      // wait for an answer until its timeout.
      if (counters_ != nullptr) counters_->frames_rejected.fetch_add(1);
      conn->CloseWithError(h.stream_id, Status::Corruption(std::string("unexpected ") + MessageTypeName(h.type) +
                                                           " sent to worker " + worker_id_));
      return nullptr;
    default:
      // A late frame of a stream that has already finished (a chunk or a
      // credit in flight when it aborted): nothing to do.
      return nullptr;
  }
}

}  // namespace rhino
