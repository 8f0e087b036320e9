#include "net/coord_messages.h"

#include "net/wire_codec.h"

namespace rhino {

bool IsValidCoordMethod(std::string_view method) {
  if (method.empty() || method.size() > kMaxCoordMethodBytes) return false;
  for (char c : method) {
    if (!((c >= 'a' && c <= 'z') || c == '_')) return false;
  }
  return true;
}

// ---- the field lists of §8's messages, in wire order (net/wire_codec.h) ----

template <class V>
void Fields(V& v, wire::Msg<V, CoordReq>& m) {
  v.Bytes(m.method, kMaxCoordMethodBytes);
  // Checked here rather than by the server: a method name ends up in logs and
  // error messages, so nothing outside the alphabet gets past the decoder.
  v.Check([&m] {
    return IsValidCoordMethod(m.method) ? Status::OK()
                                        : Status::Corruption("CoordReq.method must be 1 to " +
                                                             std::to_string(kMaxCoordMethodBytes) + " bytes of [a-z_]");
  });
  v.Bytes(m.args, kMaxCoordArgsBytes);
}
RHINO_WIRE_MESSAGE(CoordReq)

template <class V>
void Fields(V& v, wire::Msg<V, CoordRsp>& m) {
  v.U32(m.code);
  v.Text(m.message);
  v.Bytes(m.result, kMaxCoordResultBytes);
}
RHINO_WIRE_MESSAGE(CoordRsp)

}  // namespace rhino
