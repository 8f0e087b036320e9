// FrameDispatcher: where a worker sends the frames its replica server does not
// claim (docs/protocol.md §1: a frame on a stream no listener holds). The
// replica server (replication/) handles the data plane's own requests, §3-§4;
// everything else comes here and goes by type:
// - the state service's types (§7) to the StateService, if the worker has one;
// - the coordinator's (§8), which a worker never serves, close the connection
//   with an error, so a confused peer learns at once instead of timing out;
// - anything else is a late frame of a stream that has already ended (a chunk
//   or credit in flight when it aborted) and is dropped.
//
// It lives in worker/ because it is the one place that knows both the data
// plane and the state service: replication/ never includes service/
// (docs/design.md, "Include layering").
#pragma once

#include <memory>
#include <string>

#include "net/connection.h"

namespace rhino {

class StateService;

class FrameDispatcher {
 public:
  // `service` may be null (a worker without a state directory); both pointers
  // must outlive the dispatcher.
  FrameDispatcher(std::string worker_id, StateService* service, net::ConnectionCounters* counters);

  // The replica server's handler for unclaimed frames (on the connection's strand).
  std::shared_ptr<net::StreamListener> Dispatch(const std::shared_ptr<net::Connection>& conn, const FrameHeader& h,
                                                std::shared_ptr<std::string> payload);

 private:
  const std::string worker_id_;
  StateService* const service_;
  net::ConnectionCounters* const counters_;
};

}  // namespace rhino
