#include "rhino/coord_messages.h"

#include "rhino/messages.h"  // kMaxMessageBytes

namespace rhino {

bool IsValidCoordMethod(std::string_view method) {
  if (method.empty() || method.size() > kMaxCoordMethodBytes) return false;
  for (char c : method) {
    if (!((c >= 'a' && c <= 'z') || c == '_')) return false;
  }
  return true;
}

std::string CoordReq::Encode() const {
  Encoder e(8 + method.size() + args.size());
  e.PutBytes(method);
  e.PutBytes(args);
  return e.Finish();
}

Status CoordReq::Decode(std::string_view payload, CoordReq* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->method, kMaxCoordMethodBytes));
  // Checked here rather than by the server: a method name ends up in logs and
  // error messages, so nothing outside the alphabet gets past the decoder.
  if (!IsValidCoordMethod(out->method)) {
    return Status::Corruption("CoordReq.method must be 1 to " + std::to_string(kMaxCoordMethodBytes) +
                              " bytes of [a-z_]");
  }
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->args, kMaxCoordArgsBytes));
  return d.Done();
}

std::string CoordRsp::Encode() const {
  const std::string_view msg = std::string_view(message).substr(0, kMaxMessageBytes);
  Encoder e(4 + 8 + msg.size() + result.size());
  e.PutU32(code);
  e.PutBytes(msg);
  e.PutBytes(result);
  return e.Finish();
}

Status CoordRsp::Decode(std::string_view payload, CoordRsp* out) {
  Decoder d(payload);
  RHINO_RETURN_IF_ERROR(d.GetU32(&out->code));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->message, kMaxMessageBytes));
  RHINO_RETURN_IF_ERROR(d.GetBytes(&out->result, kMaxCoordResultBytes));
  return d.Done();
}

}  // namespace rhino
