// libFuzzer target for the receive side of the data plane (docs/protocol.md
// §1, §3, §4 step 1, §7, §8): the frame decoder, every message decoder (the
// state service's sessions and the coordinator's messages included), and the
// manifest checks of an OpenStreamReq -- the code a worker runs on bytes from
// the network. Built with -fsanitize=fuzzer,address,undefined by `make fuzz`.
//
// Input: one mode byte, then a frame. With the mode's low bit set the frame is
// "re-sealed" first (length and both checksums recomputed), so that mutations
// get past the checksums into the payload decoders.
//
// An InstanceReq's JSON arguments are decoded too, as the arguments of its
// action (net/service_messages.h DecodeInstanceArgs), and a CoordReq's are
// checked and parsed as the coordinator does (net/json_bounds.h).
//
// Beyond "no crash, no sanitizer report", it checks two properties:
// - a frame that decodes re-encodes to the same bytes;
// - a message that decodes re-encodes to the same payload (the codec is
//   canonical: no trailing bytes, no alternative encodings).
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "net/coord_messages.h"
#include "net/frame.h"
#include "net/json_bounds.h"
#include "net/messages.h"
#include "net/service_messages.h"
#include "replication/manifest_check.h"
#include "rhino/manifest.h"

namespace {

using namespace rhino;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void Reseal(std::string* f) {
  if (f->size() < kFrameHeaderBytes) return;
  uint32_t len = static_cast<uint32_t>(f->size() - kFrameHeaderBytes);
  std::memcpy(&(*f)[12], &len, 4);  // little-endian hosts only, as the fuzzer runs on x86-64
  uint32_t pc = FrameChecksum(f->data() + kFrameHeaderBytes, len);
  std::memcpy(&(*f)[24], &pc, 4);
  uint32_t hc = FrameChecksum(f->data(), 28);
  std::memcpy(&(*f)[28], &hc, 4);
}

template <typename M>
void RoundTrip(std::string_view payload) {
  M m;
  if (M::Decode(payload, &m).ok()) Check(m.Encode() == payload);
}

void DecodeMessage(MessageType type, std::string_view payload) {
  switch (type) {
    case MessageType::kHelloReq: return RoundTrip<HelloReq>(payload);
    case MessageType::kHelloRsp: return RoundTrip<HelloRsp>(payload);
    case MessageType::kAuthReq: return RoundTrip<AuthReq>(payload);
    case MessageType::kAuthRsp: return RoundTrip<AuthRsp>(payload);
    case MessageType::kOpenStreamReq: {
      OpenStreamReq m;
      if (!OpenStreamReq::Decode(payload, &m).ok()) return;
      Check(m.Encode() == payload);
      Manifest mf;
      if (CheckOpenStreamReq(m, kDefaultMaxFrameBytes, &mf).ok()) {
        for (const auto& f : mf.files) Check(IsPlainFileName(f.name) && IsValidIdentity(f.identity));
      }
      return;
    }
    case MessageType::kOpenStreamRsp: return RoundTrip<OpenStreamRsp>(payload);
    case MessageType::kChunkReq: {
      ChunkReq m;
      if (!ChunkReq::Decode(payload, &m).ok()) return;
      std::string again;
      ChunkReq::AppendPrefix(&again, m.file_index, m.offset, static_cast<uint32_t>(m.data.size()));
      again.append(m.data);
      Check(again == payload);
      return;
    }
    case MessageType::kCreditRsp: return RoundTrip<CreditRsp>(payload);
    case MessageType::kCommitReq: return RoundTrip<CommitReq>(payload);
    case MessageType::kCommitRsp: return RoundTrip<CommitRsp>(payload);
    case MessageType::kAbortReq: return RoundTrip<AbortReq>(payload);
    case MessageType::kHeartbeatReq: return RoundTrip<HeartbeatReq>(payload);
    case MessageType::kHeartbeatRsp: return RoundTrip<HeartbeatRsp>(payload);
    case MessageType::kStoreQueryReq: return RoundTrip<StoreQueryReq>(payload);
    case MessageType::kStoreQueryRsp: return RoundTrip<StoreQueryRsp>(payload);
    case MessageType::kErrorRsp: return RoundTrip<ErrorRsp>(payload);
    case MessageType::kInstanceReq: {
      InstanceReq m;
      if (!InstanceReq::Decode(payload, &m).ok()) return;
      Check(m.Encode() == payload);
      DecodeInstanceArgsOf(static_cast<InstanceAction>(m.action), m.args);  // a Status, never a crash
      return;
    }
    case MessageType::kCoordReq: {
      // The coordinator hands the args to its handler only if they pass this
      // check (coord_server.cc); a document that passes is parsed and walked
      // as the handler would.
      CoordReq m;
      if (!CoordReq::Decode(payload, &m).ok()) return;
      Check(m.Encode() == payload);
      nlohmann::json j;
      if (ParseJsonBounded(m.args, kMaxCoordArgsDepth, "args", &j).ok()) (void)j.dump();
      return;
    }
    default: {
      // The state service's messages (protocol §7), sessions included, and
      // the coordinator's (§8).
      std::string again;
      if (DecodeServiceMessage(type, payload, &again).ok()) Check(again == payload);
      return;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string frame(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) Reseal(&frame);
  FrameHeader h;
  std::string_view payload;
  if (!DecodeFrame(frame, kDefaultMaxFrameBytes, &h, &payload).ok()) return 0;
  Check(EncodeFrame(h.type, h.stream_id, h.chain_version, payload) == frame);
  DecodeMessage(h.type, payload);
  return 0;
}
