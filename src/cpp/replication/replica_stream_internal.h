// What the replica stream's files share (replica_stream.cc,
// replica_stream_receive.cc, replica_stream_finish.cc). Internal.
#pragma once

#include <xxhash.h>

#include <cstdio>
#include <string>

#include "rhino/manifest.h"

namespace rhino::replica_stream_internal {

// A 128-bit XXH3 as the 32 hex digits a manifest's checksum is written in.
inline std::string Hex128(XXH128_hash_t h) {
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return hex;
}

// The same files by name and content identity, in the same order: a
// checkpoint this member already holds is the one being sent.
inline bool SameFiles(const Manifest& a, const Manifest& b) {
  if (a.files.size() != b.files.size()) return false;
  for (size_t i = 0; i < a.files.size(); ++i) {
    if (a.files[i].name != b.files[i].name || a.files[i].identity != b.files[i].identity) return false;
  }
  return true;
}

}  // namespace rhino::replica_stream_internal
