// The coordinator's messages (docs/protocol.md §8): a worker, a Spark driver
// or a tool asks the coordinator (the control plane, design §2, written in
// Python) to do something by name, with a JSON body, and gets a JSON answer.
// They travel on the same framed, authenticated connections as the data plane
// (§1, §2), one request per stream id, answered on that stream, with chain
// version 0.
//
// Encode / Decode as in net/messages.h: Decode checks the shape (bounds,
// the method's alphabet, trailing bytes) and nothing else; whether `args` is a
// JSON document, and what it means, is for the server and its handler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "net/frame.h"
#include "net/service_messages.h"  // kMaxJsonBytes
#include "rhino/status.h"

namespace rhino {

// A method name is 1..64 bytes of [a-z_]: short, printable, and safe to put in
// a log line or a metric label without escaping.
constexpr size_t kMaxCoordMethodBytes = 64;
// CoordReq.args is at most this (like InstanceReq.args) ...
constexpr size_t kMaxCoordArgsBytes = kMaxJsonBytes;
// ... and CoordRsp.result at most this (like InstanceRsp.result: a placement
// table or a status of every instance can be larger than one request). A frame
// still holds at most max_frame_bytes, which is usually the smaller bound.
constexpr size_t kMaxCoordResultBytes = kMaxJsonBytes * 16;

// True if `method` is 1..kMaxCoordMethodBytes bytes of [a-z_].
bool IsValidCoordMethod(std::string_view method);

struct CoordReq {
  static constexpr MessageType kType = MessageType::kCoordReq;
  std::string method;  // [a-z_]{1,64}
  std::string args;    // a JSON document
  std::string Encode() const;
  // Corruption on a method outside [a-z_]{1,64}, args over kMaxCoordArgsBytes,
  // a field past the end or trailing bytes.
  static Status Decode(std::string_view payload, CoordReq* out);
};

struct CoordRsp {
  static constexpr MessageType kType = MessageType::kCoordRsp;
  uint32_t code = 0;    // a Status wire code (protocol §3); 0 = ok
  std::string message;  // why, when code != 0 (cut to kMaxMessageBytes by Encode)
  std::string result;   // JSON; empty when code != 0
  std::string Encode() const;
  static Status Decode(std::string_view payload, CoordRsp* out);
};

}  // namespace rhino
