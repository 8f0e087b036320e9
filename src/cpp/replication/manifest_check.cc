#include "replication/manifest_check.h"

#include <set>

#include "net/address.h"

namespace rhino {

Status CheckOpenStreamReq(const OpenStreamReq& req, uint32_t max_frame_bytes, Manifest* out) {
  if (!IsValidOperatorId(req.operator_id)) {
    return Status::PathOutsideStore("operator id '" + req.operator_id +
                                    "' is not [A-Za-z0-9_.-]{1,128} without a leading '.'");
  }
  if (req.chunk_bytes == 0 || req.chunk_bytes > max_frame_bytes - ChunkReq::kPrefixBytes) {
    return Status::InvalidArgument("chunk_bytes " + std::to_string(req.chunk_bytes) + " is not in [1, " +
                                   std::to_string(max_frame_bytes - ChunkReq::kPrefixBytes) + "]");
  }
  if (req.window == 0) return Status::InvalidArgument("window must be at least 1");
  for (const auto& a : req.downstream) {
    std::string host;
    uint16_t port = 0;
    RHINO_RETURN_IF_ERROR(net::ParseAddress(a, &host, &port));
  }
  Manifest m;
  Status s = Manifest::Parse(req.manifest, &m);
  if (!s.ok()) return Status::Corruption("OpenStreamReq carries a bad manifest: " + s.message());
  if (m.operator_id != req.operator_id || m.instance != req.instance || m.checkpoint_id != req.checkpoint_id) {
    return Status::InvalidArgument("the manifest describes " + m.operator_id + "/" + std::to_string(m.instance) +
                                   " checkpoint " + std::to_string(m.checkpoint_id) + ", not the requested " +
                                   req.operator_id + "/" + std::to_string(req.instance) + " checkpoint " +
                                   std::to_string(req.checkpoint_id));
  }
  std::set<std::string> names;
  for (const auto& f : m.files) {
    if (!IsPlainFileName(f.name)) {
      std::string shown;
      for (char c : f.name) shown += (c == '\0') ? std::string("\\0") : std::string(1, c);
      return Status::PathOutsideStore("file name '" + shown + "' is not a plain file name");
    }
    if (!names.insert(f.name).second) return Status::InvalidArgument("file name '" + f.name + "' appears twice");
    if (!IsValidIdentity(f.identity) || f.identity != f.checksum + "-" + std::to_string(f.size)) {
      return Status::PathOutsideStore("file '" + f.name + "' has identity '" + f.identity +
                                      "', which is not '<checksum>-<size>' of that file");
    }
  }
  *out = std::move(m);
  return Status::OK();
}

}  // namespace rhino
